"""Tests of the Atari benchmark: CleanRL's flags read from our config, the refusal of what
CleanRL's script cannot run, the runner's records and the report; with .venv-peers, a run of a
few iterations of each side (tiny sizes)."""

import json
import os
import subprocess
import sys

from absl.testing import absltest

from agents.algorithms import conv_torsos
from agents.runs import run_config
from benchmarks import atari_throughput, peers_testing, progress_speed

GIN_FILES = [run_config.find_gin_file('configs/atari_pong.gin')]
# CleanRL's defaults (ppo_atari_envpool.py's Args), which configs/atari.gin takes over.
CLEANRL_DEFAULTS = {
    'num-envs': 8, 'num-steps': 128, 'anneal-lr': True, 'update-epochs': 4,
    'num-minibatches': 4, 'learning-rate': 2.5e-4, 'gamma': 0.99, 'gae-lambda': 0.95,
    'clip-coef': 0.1, 'clip-vloss': True, 'ent-coef': 0.01, 'vf-coef': 0.5,
    'max-grad-norm': 0.5, 'norm-adv': True}


def cleanrl_args(*bindings):
    return atari_throughput.cleanrl_args(GIN_FILES, [*bindings, 'train.total_steps = 4096'])


class CleanRLArgsTest(absltest.TestCase):

    def test_the_config_is_cleanrls_settings(self):
        self.assertEqual(cleanrl_args(), dict(
            CLEANRL_DEFAULTS, **{'env-id': 'Pong-v5', 'total-timesteps': 4096}))

    def test_bindings_carry_over(self):
        args = cleanrl_args('train.num_envs = 2', 'train.rollout_length = 16',
                            'PPO.value_clip = None', 'PPO.learning_rate = 1e-3')
        self.assertEqual((args['num-envs'], args['num-steps'], args['clip-vloss'],
                          args['learning-rate']), (2, 16, False, 1e-3))

    def test_ours_may_step_in_groups(self):
        self.assertEqual(cleanrl_args("train.env_kwargs = {'batch_size': 4}")['num-envs'], 8)

    def test_refuses_what_cleanrl_cannot_run(self):
        for binding, named in (
                ('PPO.adam_epsilon = 1e-8', 'PPO.adam_epsilon'),
                ('PPO.value_clip = 0.2', 'PPO.value_clip'),
                ("train.env_kwargs = {'reward_clip': False}", 'train.env_kwargs'),
                ("train.env_kwargs = {'batch_size': 4, 'num_threads': 1}", 'num_threads'),
                ("train.wrappers = ['ClipAction']", 'train.wrappers'),
                ('PPO.early_stop_kl = 0.02', 'PPO.early_stop_kl'),
                ('SharedTorsoCategoricalPolicy.torso = @ImpalaCNN', 'torso'),
                ('PPO.num_minibatches = 3', 'multiple of PPO.num_minibatches')):
            with self.subTest(binding=binding):
                with self.assertRaisesRegex(atari_throughput.UnsupportedSetting, named):
                    cleanrl_args(binding)

    def test_torso_dtype_is_the_configs_resolved_here(self):
        native = 'bfloat16' if conv_torsos.native_bfloat16() else 'float32'
        for binding, expected in (("NatureCNN.compute_dtype = 'float32'", 'float32'),
                                  ("NatureCNN.compute_dtype = 'bfloat16'", 'bfloat16'),
                                  ("NatureCNN.compute_dtype = 'auto'", native)):
            with self.subTest(binding=binding):
                self.assertEqual(atari_throughput.torso_dtype(GIN_FILES, [binding]), expected)

    def test_command_passes_the_flags(self):
        command = atari_throughput.cleanrl_command(
            'py', {'num-envs': 8, 'norm-adv': True}, '/m.json', 1, 4096, 2)
        self.assertEqual(command, ['py', atari_throughput.RUNNER, '--num-envs=8',
                                   '--norm-adv=True', '--seed=1', '--warmup-steps=4096',
                                   '--torch-threads=2', '--metrics-file=/m.json'])


class ReportTest(absltest.TestCase):

    def test_cleanrl_speeds_after_the_warmup(self):
        metrics = {'iteration_ends': [[1024, 10.0], [2048, 12.0], [3072, 14.5], [4096, 16.0]],
                   'phases': [[9, 1, 1, 1], [0.5, 0.2, 0.2, 1.5], [0.6, 0.2, 0.3, 1.9],
                              [0.5, 0.2, 0.2, 1.0]]}
        speeds = atari_throughput.cleanrl_speeds(metrics, 2048)
        self.assertEqual(speeds['wall'], 2048 / 4.0)
        self.assertEqual(speeds['phases'], [0.55, 0.2, 0.25, 1.45])  # Iterations 3 and 4.

    def test_report_pairs_medians_and_phases(self):
        runs = [{'system': 'ours', 'pair': 0, 'wall': 600.0, 'train': 610.0, 'load_before': 1},
                {'system': 'cleanrl', 'pair': 0, 'wall': 400.0, 'load_before': 1.5},
                {'system': 'ours', 'pair': 1, 'wall': 500.0, 'train': 505.0, 'load_before': 1},
                {'system': 'cleanrl', 'pair': 1, 'wall': 500.0, 'load_before': 1}]
        report = atari_throughput.format_report(
            runs, {'ours': {'iteration': 1.8, 'rollout': 0.5, 'act': 0.2, 'env': 0.2,
                            'update': 1.3}})
        self.assertIn('1.50', report)
        self.assertIn('ours/CleanRL 1.25 (1.00 to 1.50)', report)
        self.assertIn('ours: 1.800  0.500 (0.200, 0.200)  1.300', report)


class RunTest(absltest.TestCase):

    @peers_testing.needs_peers('CleanRL\'s ppo_atari_envpool.py')
    def test_both_sides_run_and_report_their_iterations(self):
        # Two envs x 16 steps, 3 iterations a side: what runs, not how fast.
        workdir = self.create_tempdir().full_path
        output = os.path.join(workdir, 'out.json')
        subprocess.run(
            [sys.executable, '-m',
             'benchmarks.atari_throughput', '--pairs=1', '--steps=96', '--warmup_steps=32',
             '--gin_bindings=train.num_envs = 2', '--gin_bindings=train.rollout_length = 16',
             '--phase_repeats=1', f'--workdir={workdir}/runs', f'--output_json={output}',
             f'--peers_python={peers_testing.PEERS_PYTHON}'],
            check=True, cwd=run_config.PACKAGE_ROOT, capture_output=True,
            env=dict(os.environ, PYTHONPATH=run_config.PACKAGE_ROOT))
        with open(output) as f:
            result = json.load(f)
        ours, peer = result['runs']
        self.assertEqual((ours['system'], peer['system']), ('ours', 'cleanrl'))
        self.assertEqual(ours['points'], 3)
        self.assertEqual(peer['points'], 3)
        self.assertGreater(ours['wall'], 0)
        self.assertGreater(peer['wall'], 0)
        with open(os.path.join(workdir, 'runs', 'pair0-cleanrl.json')) as f:
            metrics = json.load(f)
        self.assertEqual(metrics['torch_threads'], 2)
        self.assertEqual(metrics['args']['num_envs'], 2)
        self.assertEqual(metrics['args']['env_id'], 'Pong-v5')
        self.assertLen(metrics['phases'], 3)
        self.assertEqual(set(result['phases']), {'ours', 'cleanrl'})
        self.assertGreater(result['phases']['ours']['update'], 0)
        self.assertEqual(progress_speed.steady_speed(
            [tuple(end) for end in metrics['iteration_ends']], 32), peer['wall'])


if __name__ == '__main__':
    absltest.main()
