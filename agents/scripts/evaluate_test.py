"""Tests of the evaluate binary: metrics of exported policies and checkpoints, bad input."""

import json
import os
import tempfile

import numpy as np
from absl.testing import absltest, flagsaver

from agents.scripts import evaluate, testing_utils
from agents.storage import file_io, gcs_testing


def run_with_bucket(emulator, tmpdir, *args):
    """Runs the evaluate binary against `emulator`, with temporary directory `tmpdir`."""
    return testing_utils.run_script('evaluate', *args, env=emulator.environment(
        dict(os.environ, TMPDIR=tmpdir)))


class EvaluateTest(absltest.TestCase):

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.logdir = testing_utils.train_tiny_run(
            os.path.join(tempfile.mkdtemp(dir=absltest.TEST_TMPDIR.value), 'run'),
            bindings=testing_utils.UNCOMPILED)
        cls.policy = os.path.join(cls.logdir, 'policy', '512')

    def evaluate(self, **flags):
        """Runs evaluate in this process; returns the metrics it wrote."""
        output = os.path.join(self.create_tempdir().full_path, 'metrics.json')
        with flagsaver.flagsaver(output=output, **flags):
            evaluate.main(['evaluate'])
        with open(output) as f:
            return json.load(f)

    def test_exported_policy_from_the_command_line(self):
        output = os.path.join(self.create_tempdir().full_path, 'metrics.json')
        result = testing_utils.run_script('evaluate', f'--policy={self.policy}',
                                          '--num_episodes=3', '--seed=7', f'--output={output}')
        self.assertEqual(result.returncode, 0, result.stderr[-3000:])
        with open(output) as f:
            metrics = json.load(f)
        self.assertEqual(json.loads(result.stdout), metrics)
        self.assertEqual(
            {key: metrics[key] for key in ('policy', 'step', 'env_id', 'seed', 'num_episodes')},
            {'policy': self.policy, 'step': 512, 'env_id': 'Pendulum-v1', 'seed': 7,
             'num_episodes': 3})
        returns = np.array(metrics['returns'])
        self.assertLen(returns, 3)
        self.assertEqual(metrics['lengths'], [200] * 3)
        self.assertAlmostEqual(metrics['mean_return'], returns.mean())
        self.assertAlmostEqual(metrics['std_return'], returns.std())
        self.assertEqual((metrics['min_return'], metrics['max_return']),
                         (returns.min(), returns.max()))
        self.assertEqual((metrics['mean_length'], metrics['min_length'], metrics['max_length']),
                         (200.0, 200, 200))
        self.assertIn('Episode 3/3', result.stderr)

    def test_checkpoint_and_its_export_score_alike(self):
        by_policy = self.evaluate(policy=self.policy, num_episodes=2, seed=3)
        by_checkpoint = self.evaluate(logdir=self.logdir, num_episodes=2, seed=3)
        self.assertEqual(by_checkpoint['checkpoint'],
                         os.path.join(self.logdir, 'checkpoints', 'ckpt-512'))
        # Equal up to float rounding: one policy, run as two programs (checkpoint and export).
        np.testing.assert_allclose(by_policy['returns'], by_checkpoint['returns'], rtol=1e-5)
        earlier = self.evaluate(logdir=self.logdir, checkpoint='256', num_episodes=2, seed=3)
        self.assertEqual(earlier['step'], 256)
        self.assertNotEqual(earlier['returns'], by_checkpoint['returns'])
        # Explicitly the environment trained on is the default one.
        same = self.evaluate(policy=self.policy, num_episodes=2, seed=3, env_id='Pendulum-v1')
        self.assertEqual(same['returns'], by_policy['returns'])

    def assert_fails(self, message, **flags):
        with flagsaver.flagsaver(**flags):
            with self.assertRaises(SystemExit) as raised:
                evaluate.main(['evaluate'])
        self.assertIn('evaluate: error: ', str(raised.exception.code))
        self.assertRegex(str(raised.exception.code), message)

    def test_bad_input_fails_clearly_and_writes_nothing(self):
        directory = self.create_tempdir()
        output = os.path.join(directory.full_path, 'metrics.json')
        self.assert_fails('MountainCarContinuous-v0 has observation space',
                          policy=self.policy, env_id='MountainCarContinuous-v0', output=output)
        # The run's wrappers do not even apply: ClipAction needs Box actions.
        self.assert_fails("cannot make environment 'CartPole-v1': ClipAction requires a Box",
                          logdir=self.logdir, env_id='CartPole-v1', output=output)
        self.assert_fails("cannot make environment 'NoSuchEnv-v0'", policy=self.policy,
                          env_id='NoSuchEnv-v0', output=output)
        self.assert_fails('exactly one of --policy and --logdir', output=output)
        self.assert_fails('exactly one of --policy and --logdir', policy=self.policy,
                          logdir=self.logdir, output=output)
        self.assert_fails('--checkpoint goes with --logdir', policy=self.policy,
                          checkpoint='256', output=output)
        self.assert_fails('holds no exported policy', policy=self.logdir, output=output)
        fresh = directory.mkdir('run')
        fresh.create_file('config.gin', content="train.env_id = 'Pendulum-v1'\n")
        self.assert_fails('holds no checkpoint yet', logdir=fresh.full_path, output=output)
        self.assert_fails('--num_episodes must be positive', policy=self.policy,
                          num_episodes=0, output=output)
        self.assert_fails('is a directory', policy=self.policy, output=directory.full_path)
        self.assertEqual(sorted(os.listdir(directory.full_path)), ['run'])
        self.assertEqual(os.listdir(os.path.join(directory.full_path, 'run')), ['config.gin'])

    def test_policy_and_run_in_a_bucket(self):
        emulator = self.enter_context(gcs_testing.GcsEmulator(buckets=('runs',)))
        tmpdir = self.create_tempdir().full_path
        file_io.upload_tree(self.logdir, 'gs://runs/run')
        by_policy = run_with_bucket(emulator, tmpdir, '--policy=gs://runs/run/policy/512',
                                    '--num_episodes=2', '--seed=3',
                                    '--output=gs://runs/eval/metrics.json')
        self.assertEqual(by_policy.returncode, 0, by_policy.stderr[-3000:])
        metrics = json.loads(emulator.objects('runs', 'eval/')['eval/metrics.json'])
        self.assertEqual(json.loads(by_policy.stdout), metrics)
        self.assertEqual((metrics['policy'], metrics['step'], metrics['num_episodes']),
                         ('gs://runs/run/policy/512', 512, 2))
        by_checkpoint = run_with_bucket(emulator, tmpdir, '--logdir=gs://runs/run',
                                        '--num_episodes=2', '--seed=3')
        self.assertEqual(by_checkpoint.returncode, 0, by_checkpoint.stderr[-3000:])
        from_run = json.loads(by_checkpoint.stdout)
        self.assertEqual((from_run['logdir'], from_run['checkpoint'], from_run['step']),
                         ('gs://runs/run', 'gs://runs/run/checkpoints/ckpt-512', 512))
        np.testing.assert_allclose(from_run['returns'], metrics['returns'], rtol=1e-5)
        for result in (by_policy, by_checkpoint):
            self.assertNotIn('batchppo-copy-', result.stderr)  # URLs, never the local copies.
        self.assertEmpty(testing_utils.local_copies(tmpdir))  # They are gone.

    def test_missing_bucket_fails_in_one_line(self):
        emulator = self.enter_context(gcs_testing.GcsEmulator(buckets=('runs',)))
        tmpdir = self.create_tempdir().full_path
        result = run_with_bucket(emulator, tmpdir, '--logdir=gs://missing-bucket/run')
        self.assertNotEqual(result.returncode, 0)
        errors = testing_utils.error_lines(result.stderr)
        self.assertLen(errors, 1, result.stderr[-3000:])
        self.assertRegex(errors[0], r'^evaluate: error: bucket missing-bucket of '
                         r'gs://missing-bucket/run does not exist')
        self.assertNotIn('Traceback', result.stderr)
        self.assertEqual(result.stdout, '')
        self.assertEmpty(testing_utils.local_copies(tmpdir))
        # An output there is refused before any episode runs.
        self.assert_fails('^evaluate: error: bucket missing-bucket of .* does not exist',
                          policy=self.policy, output='gs://missing-bucket/eval/metrics.json')
        self.assertEqual(emulator.objects('runs'), {})


if __name__ == '__main__':
    absltest.main()
