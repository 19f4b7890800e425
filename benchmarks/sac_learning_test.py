"""Tests of the SAC benchmark: its settings table, their translation into SB3's SAC arguments,
the refusal of what SB3 cannot express, and the table it prints. No training runs here.
"""

import json
import math
import os
import re
import subprocess
import textwrap

from absl.testing import absltest

from agents.runs import run_config
from benchmarks import peer_runner, peers_testing, sac_learning, sb3_sac_runner, train_throughput

TASK = sac_learning.TASKS['pendulum']
# The settings key of each gin parameter the config may bind; IGNORED are bindings that do not
# concern SB3 (which algorithm, how BatchPPO steps its environments). A binding in neither fails
# the test: the reader must carry it.
GIN_KEYS = {
    **{f'train.{key}': key for key in sac_learning.TRAIN_KEYS},
    **{f'SAC.{key}': key for key in sb3_sac_runner.SETTINGS
       if key not in sac_learning.TRAIN_KEYS},
}
IGNORED = {'train.algorithm', 'train.env_mode', 'train.env_backend'}


def settings(num_envs=None, total_steps=None, bindings=()):
    return sac_learning.sac_settings(TASK, num_envs, total_steps, bindings)[0]


class SettingsTest(absltest.TestCase):

    def test_values_match_the_gin_file(self):
        path = run_config.find_gin_file(TASK.gin_file)
        found = settings()
        bound = peers_testing.gin_file_bindings(path)
        self.assertGreater(len(bound), 15)
        for name, value in bound.items():
            if name in IGNORED:
                continue
            self.assertIn(name, GIN_KEYS, f'{path} binds {name}, which the settings table '
                          'does not carry')
            expected = list(value) if isinstance(value, list | tuple) else value
            self.assertEqual(found[GIN_KEYS[name]], expected, name)
        self.assertEqual(sorted(found), sorted(sb3_sac_runner.SETTINGS))
        json.dumps(found)  # The SB3 runner gets it as JSON.

    def test_the_zoo_settings_and_the_defaults_of_unbound_parameters(self):
        found = settings()
        self.assertEqual(found['env_id'], 'Pendulum-v1')
        self.assertEqual((found['num_envs'], found['total_steps'], found['learning_rate']),
                         (1, 20480, 1e-3))
        self.assertEqual((found['eval_every_steps'], found['eval_episodes']), (2048, 10))
        self.assertEqual(found['wrappers'], ['range_normalize', 'ClipAction'])
        # Bound by no config: SAC's signature.
        self.assertEqual(found['target_update_interval'], 1)
        self.assertEqual(found['adam_epsilon'], 1e-8)
        self.assertEqual(found['activation'], 'relu')
        self.assertIsNone(found['actor_learning_rate'])
        self.assertIsNone(found['env_kwargs'])
        self.assertEqual(TASK.threshold, -200.0)

    def test_num_envs_keeps_one_gradient_step_per_env_step(self):
        found, _, bindings = sac_learning.sac_settings(TASK, 8, 4096)
        self.assertEqual((found['num_envs'], found['gradient_steps'], found['train_freq']),
                         (8, 8, 1))
        self.assertEqual(found['total_steps'], 4096)
        self.assertEqual(bindings, ['train.total_steps = 4096', 'train.num_envs = 8',
                                    'SAC.gradient_steps = 8'])
        # The config's own number of environments binds nothing more.
        self.assertEqual(sac_learning.sac_settings(TASK, 1)[2], [])
        files = [run_config.find_gin_file(TASK.gin_file)]
        self.assertEqual(sac_learning.our_backend(files, []), 'gymnasium')
        self.assertEqual(sac_learning.our_backend(files, ["train.env_backend = 'native'"]),
                         'native')
        # Scaled from whatever the configuration says.
        found = settings(4, bindings=['SAC.gradient_steps = 2'])
        self.assertEqual(found['gradient_steps'], 8)
        with self.assertRaisesRegex(run_config.ConfigError, 'whole number'):
            settings(3, bindings=['train.num_envs = 2'])

    def test_refuses_settings_sb3_cannot_express(self):
        cases = {
            'SAC.target_update_interval': ['SAC.target_update_interval = 2'],
            'SAC.actor_learning_rate': ['SAC.actor_learning_rate = 3e-4'],
            'SAC.adam_epsilon': ['SAC.adam_epsilon = 1e-5'],
            'SAC.activation': ["SAC.activation = 'elu'"],
            'train.wrappers': ["train.wrappers = ['ClipAction']"],
            'SAC.target_entropy': ["SAC.target_entropy = 'high'"],
        }
        for name, bindings in cases.items():
            with self.subTest(name=name), self.assertRaisesRegex(
                    run_config.ConfigError, f'^{re.escape(name)} = '):
                settings(bindings=bindings)
        # What SB3 can express after all: a per-part rate equal to the shared one, and another
        # epsilon when the temperature is fixed (SB3 then builds no temperature optimizer).
        self.assertEqual(settings(bindings=['SAC.critic_learning_rate = 1e-3'])[
            'critic_learning_rate'], 1e-3)
        found = settings(bindings=['SAC.learn_ent_coef = False', 'SAC.adam_epsilon = 1e-5'])
        self.assertEqual(found['adam_epsilon'], 1e-5)
        with self.assertRaisesRegex(run_config.ConfigError, 'not SAC'):
            settings(bindings=['train.algorithm = @PPO'])


class Sb3KwargsTest(absltest.TestCase):

    def test_pendulum(self):
        found = settings()
        self.assertEqual(sb3_sac_runner.sb3_sac_kwargs(found), {
            'learning_rate': 1e-3, 'buffer_size': 1_000_000, 'learning_starts': 100,
            'batch_size': 256, 'tau': 0.005, 'gamma': 0.99, 'train_freq': (1, 'step'),
            'gradient_steps': 1, 'target_update_interval': 1, 'ent_coef': 'auto_1.0',
            'target_entropy': 'auto',
            'policy_kwargs': {'net_arch': {'pi': [256, 256], 'qf': [256, 256]},
                              'activation_fn': 'relu', 'optimizer_kwargs': {'eps': 1e-8}}})
        self.assertEqual(sb3_sac_runner.iterations(found), (20480, 20480))

    def test_eight_envs(self):
        found = settings(8)
        kwargs = sb3_sac_runner.sb3_sac_kwargs(found)
        self.assertEqual((kwargs['train_freq'], kwargs['gradient_steps']), ((1, 'step'), 8))
        self.assertEqual(sb3_sac_runner.iterations(found), (2560, 20480))
        # A budget rounds up to whole iterations, as BatchPPO's loop does.
        self.assertEqual(sb3_sac_runner.iterations(dict(found, total_steps=20481)),
                         (2561, 20488))

    def test_the_temperature(self):
        base = settings()
        kwargs = sb3_sac_runner.sb3_sac_kwargs(dict(base, ent_coef_init=0.1,
                                                    target_entropy=-0.5))
        self.assertEqual(kwargs['ent_coef'], 'auto_0.1')
        self.assertEqual(float(kwargs['ent_coef'].split('_')[1]), 0.1)  # As SB3 parses it.
        self.assertEqual(kwargs['target_entropy'], -0.5)
        kwargs = sb3_sac_runner.sb3_sac_kwargs(dict(base, learn_ent_coef=False,
                                                    ent_coef_init=0.2, adam_epsilon=1e-5))
        self.assertEqual(kwargs['ent_coef'], 0.2)
        self.assertEqual(kwargs['policy_kwargs']['optimizer_kwargs'], {'eps': 1e-5})

    def test_refuses_what_sb3_cannot_express(self):
        base = settings()
        cases = {'activation': {'activation': 'elu'},
                 'wrappers': {'wrappers': []},
                 'gradient_steps': {'gradient_steps': 0},
                 'target_update_interval': {'target_update_interval': 4},
                 'ent_coef_learning_rate': {'ent_coef_learning_rate': 3e-4},
                 'adam_epsilon': {'adam_epsilon': 1e-4},
                 'target_entropy': {'target_entropy': True},
                 'ent_coef_init': {'ent_coef_init': 0.0},
                 'unknown keys': {'rollout_length': 8}}
        for name, change in cases.items():
            with self.subTest(name=name), self.assertRaisesRegex(
                    peer_runner.UnsupportedSetting, name):
                sb3_sac_runner.sb3_sac_kwargs(dict(base, **change))
        with self.assertRaisesRegex(peer_runner.UnsupportedSetting, 'missing keys'):
            sb3_sac_runner.sb3_sac_kwargs({key: base[key] for key in list(base)[1:]})

    def test_the_runner_refuses_before_importing_torch(self):
        with self.assertRaises(SystemExit) as context:
            sb3_sac_runner.main([f'--config={json.dumps(dict(settings(), activation="elu"))}',
                                 f'--logdir={self.create_tempdir().full_path}'])
        self.assertEqual(context.exception.code, 2)

    @peers_testing.needs_peers('SB3')
    def test_sb3_builds_the_model_as_translated(self):
        # Builds (never trains) SB3's SAC and its evaluator under the peers' python.
        script = textwrap.dedent('''
            import json, math, sys
            sys.path.insert(0, sys.argv[1])
            import sb3_sac_runner as runner
            import sb3_runner
            settings = json.loads(sys.argv[2])
            model, venv, total = runner.make_model(settings, 0)
            evaluator = sb3_runner.Evaluator(settings, runner._Unnormalized(), sys.argv[3], 0)
            actor, critic = model.actor, model.critic
            print(json.dumps({
                'actor_lr': actor.optimizer.defaults['lr'],
                'actor_eps': actor.optimizer.defaults['eps'],
                'critic_lr': critic.optimizer.defaults['lr'],
                'critic_eps': critic.optimizer.defaults['eps'],
                'ent_coef_lr': model.ent_coef_optimizer.defaults['lr'],
                'ent_coef': math.exp(model.log_ent_coef.item()),
                'target_entropy': model.target_entropy,
                'train_freq': [model.train_freq.frequency, model.train_freq.unit.value],
                'gradient_steps': model.gradient_steps, 'n_envs': model.n_envs,
                'n_critics': len(critic.q_networks),
                'actor_layers': [layer.out_features for layer in actor.latent_pi
                                 if hasattr(layer, 'out_features')],
                'critic_layers': [layer.out_features for layer in critic.q_networks[0]
                                  if hasattr(layer, 'out_features')],
                'activation': type(actor.latent_pi[1]).__name__,
                'buffer_size': model.buffer_size, 'learning_starts': model.learning_starts,
                'batch_size': model.batch_size, 'tau': model.tau, 'gamma': model.gamma,
                'total': total, 'action_high': model.action_space.high.tolist(),
                'eval_observ_high': evaluator._envs[0].observation_space.high.tolist()}))
        ''')
        logdir = self.create_tempdir().full_path
        for num_envs in (1, 8):
            with self.subTest(num_envs=num_envs):
                found = settings(num_envs)
                output = subprocess.run(
                    [peers_testing.PEERS_PYTHON, '-c', script, train_throughput.HERE,
                     json.dumps(found), logdir], capture_output=True, text=True, check=True,
                    env={k: v for k, v in os.environ.items() if k != 'PYTHONPATH'}).stdout
                built = json.loads(output.strip().splitlines()[-1])
                for key in ('actor_lr', 'critic_lr', 'ent_coef_lr'):
                    self.assertAlmostEqual(built[key], found['learning_rate'])
                self.assertEqual((built['actor_eps'], built['critic_eps']), (1e-8, 1e-8))
                self.assertAlmostEqual(built['ent_coef'], found['ent_coef_init'], places=6)
                self.assertEqual(built['target_entropy'], -1.0)
                self.assertEqual(built['train_freq'], [1, 'step'])
                self.assertEqual(built['gradient_steps'], num_envs)
                self.assertEqual(built['n_envs'], num_envs)
                self.assertEqual(built['n_critics'], 2)
                self.assertEqual(built['actor_layers'], [256, 256])
                self.assertEqual(built['critic_layers'], [256, 256, 1])
                self.assertEqual(built['activation'], 'ReLU')
                for key, value in (('buffer_size', 1_000_000), ('learning_starts', 100),
                                   ('batch_size', 256), ('tau', 0.005), ('gamma', 0.99)):
                    self.assertEqual(built[key], value, key)
                self.assertEqual(built['total'], 20480)
                self.assertEqual(built['action_high'], [1.0])
                self.assertEqual(built['eval_observ_high'], [1.0, 1.0, 1.0])


def _run(system, seed, returns, steps_per_sec, every=2048, wall_s=100.0):
    """A run as summarize_run leaves it, from evaluations at every, 2 * every, ... at a constant
    training speed."""
    evals = [{'step': (index + 1) * every, 'mean_return': value,
              'env_steps_per_sec': steps_per_sec, 'seen_s': 10.0 + index, 'wall_time_s': 1.0}
             for index, value in enumerate(returns)]
    run = train_throughput.summarize_run({'wall_s': wall_s, 'evals': evals, 'load_before': 1.5},
                                         TASK.threshold)
    run.update(task='pendulum', system=system, seed=seed)
    return run


class ReportTest(absltest.TestCase):

    def setUp(self):
        super().setUp()
        self.settings = dict(settings(), total_steps=8192)
        self.runs = [_run('ours', 0, [-900, -180, -150, -140], 300.0),
                     _run('sb3', 0, [-1000, -400, -190, -170], 100.0),
                     _run('ours', 1, [-700, -250, -199, -160], 240.0),
                     _run('sb3', 1, [-1100, -300, -250, -180], 120.0)]

    def test_summary(self):
        summary = sac_learning.summarize(self.runs, ['ours', 'sb3'], self.settings, -200.0)
        ours, sb3 = summary['ours'], summary['sb3']
        self.assertEqual(ours['steady_sps'], [300.0, 240.0])
        self.assertEqual(ours['median_steady_sps'], 270.0)
        self.assertEqual(ours['threshold_steps'], [4096, 6144])
        self.assertEqual(sb3['threshold_steps'], [6144, 8192])
        self.assertEqual(sb3['final_returns'], [-170, -180])
        self.assertEqual(summary['ratio'], {'per_seed': [3.0, 2.0], 'median': 2.5, 'min': 2.0,
                                            'max': 3.0})
        curve = summary['curves']
        self.assertEqual(curve['steps'], [2048, 4096, 6144, 8192])
        self.assertEqual(curve['ours']['median'], [-800, -215, -174.5, -150])
        self.assertEqual(curve['sb3']['min'], [-1100, -400, -250, -180])

    def test_report(self):
        summary = sac_learning.summarize(self.runs, ['ours', 'sb3'], self.settings, -200.0)
        timings = {'ours': {'per_call': 4.5, 'one_call': 3.25},
                   'sb3': {'per_call': 6.0, 'one_call': 5.75}}
        report = sac_learning.format_report(summary, ['ours', 'sb3'], self.settings,
                                            'pendulum', timings, [1.5, 2.0], 'native')
        self.assertIn('pendulum (Pendulum-v1, configs/sac_pendulum.gin): 1 env(s), 1 gradient '
                      'step(s) per iteration of 1 step(s) per env, 8,192 steps; ours on the '
                      'native backend, SB3 on Gymnasium\n', report)
        self.assertIn('\n      ours |            300.0, 240.0 |  270.0 |    3.70 |  2,048.0 |'
                      '      81.9 |           4,096, 6,144 |        -140.0, -160.0\n', report)
        self.assertIn('\n       sb3 |            100.0, 120.0 |  110.0 |    9.09 |', report)
        self.assertIn('|           6,144, 8,192 |        -170.0, -180.0\n', report)
        self.assertIn('\n  ours/sb3 |              3.00, 2.00 |   2.50 |', report)
        self.assertIn('\n  2,048 | -800.0 (-900 to -700) | -1,050.0 (-1,100 to -1,000)\n',
                      report)
        self.assertIn('\n    ours |          4.50 |             3.25\n', report)
        self.assertIn('Load average (1 min) at the runs\' starts: 1.5 to 2.0', report)
        run = sac_learning.format_run(self.runs[0], -200.0)
        self.assertEqual(run, 'ours seed 0: steady 300.0 steps/s, overall 81.9, final return '
                         '-140.0 at step 8,192, first reached -200 at step 4,096, wall 100.0 s '
                         '(load 1.5)')

    def test_a_system_alone(self):
        runs = [run for run in self.runs if run['system'] == 'ours']
        summary = sac_learning.summarize(runs, ['ours', 'sb3'], self.settings, -200.0)
        self.assertNotIn('sb3', summary)
        self.assertNotIn('ratio', summary)
        report = sac_learning.format_report(summary, ['ours', 'sb3'], self.settings, 'pendulum')
        self.assertNotIn('  ours/sb3 |', report)
        self.assertNotIn('gradient step alone', report)
        self.assertTrue(math.isfinite(summary['ours']['median_steady_sps']))


if __name__ == '__main__':
    absltest.main()
