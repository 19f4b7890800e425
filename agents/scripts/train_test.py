"""End-to-end tests of the train binary: a short run, resume, and every kind of bad input."""

import json
import os
import subprocess
import sys

from absl.testing import absltest

from agents.scripts import run_config

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY = ['--gin_bindings=train.total_steps = 256', '--gin_bindings=train.num_envs = 4',
        '--gin_bindings=train.rollout_length = 64', '--gin_bindings=train.eval_every_steps = 256',
        '--gin_bindings=train.eval_episodes = 1', "--gin_bindings=train.env_mode = 'in_process'",
        '--gin_bindings=PPO.num_minibatches = 4']


def run_train(*args, cwd=None):
    env = dict(os.environ, PYTHONPATH=ROOT)
    if cwd:
        env['BUILD_WORKING_DIRECTORY'] = cwd
    return subprocess.run([sys.executable, '-m', 'agents.scripts.train', *args], env=env,
                          capture_output=True, text=True, timeout=600, check=False)


def snapshot(directory):
    files = {}
    for parent, _, names in os.walk(directory):
        for name in names:
            path = os.path.join(parent, name)
            with open(path, 'rb') as f:
                files[os.path.relpath(path, directory)] = f.read()
    return files


class TrainBinaryTest(absltest.TestCase):

    def test_trains_into_a_relative_logdir_and_resumes(self):
        cwd = self.create_tempdir().full_path
        first = run_train('--gin_file=configs/pendulum.gin', '--logdir=runs/a', *TINY, cwd=cwd)
        self.assertEqual(first.returncode, 0, first.stderr[-3000:])
        logdir = os.path.join(cwd, 'runs', 'a')
        for name in ('config.gin', 'operative_config.gin', 'metrics.jsonl', 'checkpoints'):
            self.assertTrue(os.path.exists(os.path.join(logdir, name)), name)
        with open(os.path.join(logdir, 'metrics.jsonl')) as f:
            record = json.loads(f.readline())
        self.assertContainsSubset(
            ['step', 'mean_return', 'std_return', 'episodes', 'env_steps_per_sec', 'wall_time_s'],
            list(record))
        self.assertIn('Done:', first.stderr)
        # The libraries' routine lines of saving and of finding included gin files are gone.
        for noise in ('Sharding callback', 'Writing fingerprint', 'Assets written',
                      'Path not found', 'system_path_file_exists'):
            self.assertNotIn(noise, first.stderr)
        # The same command again finds the finished run and changes nothing.
        before = snapshot(os.path.join(logdir, 'checkpoints'))
        second = run_train('--gin_file=configs/pendulum.gin', '--logdir=runs/a', *TINY, cwd=cwd)
        self.assertEqual(second.returncode, 0, second.stderr[-3000:])
        self.assertIn('Resumed from', second.stderr)
        self.assertEqual(snapshot(os.path.join(logdir, 'checkpoints')), before)

    def assert_fails(self, result, message):
        self.assertNotEqual(result.returncode, 0)
        self.assertIn(message, result.stderr)

    def test_imports_leave_the_garbage_collector_on_with_their_objects_frozen(self):
        # Collection pauses only while TensorFlow loads; left off, a long run would never free
        # its cyclic garbage.
        probe = ('import gc; from agents.scripts import train; '
                 'print(gc.isenabled(), gc.get_freeze_count())')
        result = subprocess.run(
            [sys.executable, '-c', probe], env=dict(os.environ, PYTHONPATH=ROOT),
            capture_output=True, text=True, timeout=600, check=True)
        enabled, frozen = result.stdout.split()
        self.assertEqual(enabled, 'True')
        self.assertGreater(int(frozen), 100_000)

    def test_missing_gin_file(self):
        self.assert_fails(run_train('--gin_file=nope.gin', cwd=self.create_tempdir().full_path),
                          "train: error: gin file 'nope.gin' not found")

    def test_unknown_binding(self):
        cwd = self.create_tempdir().full_path
        result = run_train('--gin_file=configs/pendulum.gin', '--gin_bindings=NoSuchThing.x = 1',
                           '--logdir=run', cwd=cwd)
        self.assert_fails(result, 'train: error: invalid gin configuration')
        self.assertIn('NoSuchThing', result.stderr)
        self.assertEqual(os.listdir(cwd), [])

    def test_unknown_env_id(self):
        cwd = self.create_tempdir().full_path
        result = run_train('--gin_file=configs/pendulum.gin',
                           "--gin_bindings=train.env_id = 'NoSuchEnv-v0'", '--logdir=run', cwd=cwd)
        self.assert_fails(result, "train: error: unknown env id 'NoSuchEnv-v0'")
        self.assertEqual(os.listdir(cwd), [])

    def test_unwritable_logdir(self):
        blocker = self.create_tempfile('file').full_path
        result = run_train('--gin_file=configs/pendulum.gin', f'--logdir={blocker}/run')
        self.assert_fails(result, 'train: error: cannot write to logdir')

    def test_logdir_of_another_config_is_untouched(self):
        logdir = self.create_tempdir().full_path
        run_config.prepare_logdir(logdir, 'train.env_id = "CartPole-v1"\n')
        with open(os.path.join(logdir, 'metrics.jsonl'), 'w') as f:
            f.write('{"step": 1}\n')
        before = snapshot(logdir)
        result = run_train('--gin_file=configs/pendulum.gin', f'--logdir={logdir}')
        self.assert_fails(result, 'holds a run of a different configuration')
        self.assertEqual(snapshot(logdir), before)


if __name__ == '__main__':
    absltest.main()
