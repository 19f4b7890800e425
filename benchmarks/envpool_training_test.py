"""Tests of the EnvPool training benchmark: the two sides' bindings, the report, and a run of a
few iterations of each side (Pendulum, tiny sizes)."""

import json
import os
import subprocess
import sys

from absl.testing import absltest

from agents.runs import run_config, run_settings
from benchmarks import envpool_training


class SidesTest(absltest.TestCase):

    def test_the_sides_differ_only_in_the_backend(self):
        gin_files = [run_config.find_gin_file('configs/cheetah.gin')]
        settings = {}
        for side in envpool_training.SIDES:
            run_config.load(gin_files, envpool_training.side_bindings(
                side, ['train.num_envs = 4'], 2048))
            settings[side] = run_settings.from_gin()
        self.assertEqual(settings['envpool'].env_backend, 'envpool')
        self.assertEqual(settings['gymnasium'].env_backend, 'gymnasium')
        self.assertEqual(settings['gymnasium'].env_mode, 'hybrid')  # configs/mujoco.gin's.
        for side in envpool_training.SIDES:
            self.assertEqual((settings[side].num_envs, settings[side].total_steps), (4, 2048))

    def test_report_pairs_and_ratios(self):
        runs = [{'side': 'envpool', 'pair': 0, 'wall': 3000.0, 'train': 3100.0,
                 'load_before': 1.0},
                {'side': 'gymnasium', 'pair': 0, 'wall': 2000.0, 'train': 2000.0,
                 'load_before': 1.2}]
        report = envpool_training.format_report(runs)
        self.assertIn('envpool/gymnasium: 1.50 (1.50 to 1.50) by the wall clock, 1.55', report)


class RunTest(absltest.TestCase):

    def test_both_sides_run(self):
        workdir = self.create_tempdir().full_path
        output = os.path.join(workdir, 'out.json')
        subprocess.run(
            [sys.executable, '-m',
             'benchmarks.envpool_training', '--gin_file=configs/pendulum.gin', '--pairs=1',
             '--steps=256', '--warmup_steps=64', '--gin_bindings=train.num_envs = 2',
             '--gin_bindings=train.rollout_length = 32', "--gin_bindings=train.env_mode = "
             "'in_process'", '--gin_bindings=train.eval_episodes = 1',
             # The update uncompiled: XLA's and Grappler's work would outlast these runs.
             '--gin_bindings=PPO.num_minibatches = 4', '--gin_bindings=PPO.jit_compile = False',
             '--gin_bindings=train.optimize_graphs = False',
             f'--workdir={workdir}/runs', f'--output_json={output}'],
            check=True, cwd=run_config.PACKAGE_ROOT, capture_output=True,
            env=dict(os.environ, PYTHONPATH=run_config.PACKAGE_ROOT))
        with open(output) as f:
            runs = json.load(f)['runs']
        self.assertEqual([run['side'] for run in runs], ['envpool', 'gymnasium'])
        for run in runs:
            self.assertEqual(run['points'], 4)
            self.assertGreater(run['wall'], 0)
            # The training clock counts in whole steps/s of the run's mean speed, too coarse for
            # runs this short to give a speed every time.
            self.assertIn('train', run)


if __name__ == '__main__':
    absltest.main()
