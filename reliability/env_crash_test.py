"""Environment crashes: a worker process dies or an environment raises mid-rollout.

With `train.on_env_failure = 'restart'` (the default) the trainer rebuilds the training
environments, logs which failed and that the episodes in flight were dropped, redoes the
iteration and finishes; a worker that keeps crashing stops the run after
`train.max_env_restarts` restarts between checkpoints. With 'stop' the run stops at once with an
error naming the environment. The faults come from reliability/faulty_envs.py, stepping
in real worker processes of the train binary, which runs in a fork of this process
(harness.run_module_forked) that imported TensorFlow once: the binary's own code from flag
parsing to exit status and output.
"""

import os
import re

import gymnasium as gym
import numpy as np
import tensorflow as tf
from absl.testing import absltest

from agents.tools import batch_env, in_graph_batch_env, simulate, simulate_testing
from reliability import harness


class EnvCrashTest(harness.TrainerTestCase):

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        harness.preload(pipelines=False)

    def train(self, fault, **overrides):
        return harness.run_train(*harness.faulty_workers_run(self.logdir, fault, **overrides))

    def test_dead_worker_is_restarted_and_the_run_finishes(self):
        # One environment (of whichever worker gets there first) kills its worker process with
        # SIGKILL at its 200th step, in the second and last iteration, once.
        result = self.train(dict(fault='kill', at_step=200, workers_only=True,
                                 once_marker=os.path.join(self.root, 'crashed')),
                            train__total_steps=1024)
        self.assertEqual(result.returncode, 0, result.stderr[-5000:])
        self.assertRegex(
            result.stderr, r'Training environment failure: BatchEnv worker process \d \(pid \d+\)'
            r' hosting envs \[\d, \d\] died unexpectedly \(killed by SIGKILL\) \(in the iteration'
            r' after step 512\)\. Restarting all 4 training environments with seed \d+ \(restart'
            r' 1 of at most 3 between checkpoints\); the episodes in flight were dropped and the'
            r' iteration is redone\.')
        self.assertLen(re.findall('Restarting all', result.stderr), 1)
        self.assertEqual([record['step'] for record in harness.metrics(self.logdir)],
                         [512, 1024])
        self.assertIn('Done: 1024 steps', result.stderr)

    def test_worker_that_keeps_crashing_stops_after_bounded_restarts(self):
        # Every environment exits its worker at its 50th step: every new worker dies too.
        result = self.train(dict(fault='exit', at_step=50, workers_only=True))
        self.assertEqual(result.returncode, 1, result.stderr[-5000:])
        self.assertLen(re.findall(r'restart \d of at most 3', result.stderr), 3)
        self.assertRegex(
            result.stderr, r'train: error: Training environment failure: BatchEnv worker process'
            r' \d \(pid \d+\) hosting envs \[\d, \d\] died unexpectedly \(exit code 3\) \(in the '
            r'iteration after step 0\), after 3 restarts of the training environments since the '
            r'last checkpoint \(train.max_env_restarts = 3\); the run stopped; no checkpoint was '
            r'saved yet\.')
        self.assertEqual(harness.checkpoint_state(self.logdir), ([], None))

    def test_stop_policy_names_the_environment_and_keeps_the_checkpoint(self):
        result = self.train({'fault': 'raise', 'at_step': 200, 'workers_only': True,
                             'once_marker': os.path.join(self.root, 'raised')},
                            train__on_env_failure='stop')
        self.assertEqual(result.returncode, 1, result.stderr[-5000:])
        self.assertRegex(
            result.stderr, r"train: error: Training environment failure: Environment [0-3] failed"
            r" in step: RuntimeError: injected failure at step 200 \(in the iteration after step"
            r" 512\); the run stopped \(train.on_env_failure = 'stop'\); the last checkpoint "
            r"\(step 512\) is intact\. Rerun the same command to resume\.")
        self.assertNotIn('Restarting', result.stderr)
        self.assertEqual(harness.checkpoint_state(self.logdir), ([512], 512))
        self.assertIsNone(harness.checkpoint_problem(self.logdir, 512))


class ReplaceVectorEnvTest(absltest.TestCase):
    """The in-graph env's swap, which the restarts rely on, in one process."""

    def make(self, num_envs=3, env_id='CartPole-v1'):
        return batch_env.BatchEnv(
            [lambda: gym.make(env_id)] * num_envs, mode='in_process',
            autoreset_mode=gym.vector.AutoresetMode.DISABLED)

    def test_compiled_rollout_goes_on_in_the_new_env_after_resets(self):
        env = in_graph_batch_env.InGraphBatchEnv(self.make(), seed=0)
        simulator = simulate.Simulator(env, simulate_testing.ConstantAlgorithm(np.int64(1)))
        first = simulator.rollout(5)
        self.assertTrue(first.first.numpy()[0].all())
        self.assertFalse(first.first.numpy()[1:].any())
        old_env = env.vector_env
        replacement = self.make()
        self.assertIs(env.replace_vector_env(replacement, seed=7), old_env)
        self.assertIs(env.vector_env, replacement)
        np.testing.assert_array_equal(env.truncated.numpy(), [True] * 3)
        # The same compiled rollout now steps the new env, starting with a seeded reset.
        second = simulator.rollout(5)
        self.assertTrue(second.first.numpy()[0].all())
        expected, _ = self.make().reset(seed=7)
        np.testing.assert_allclose(second.observ.numpy()[0], expected)
        old_env.close()
        env.close()

    def test_request_reset_starts_new_episodes(self):
        env = in_graph_batch_env.InGraphBatchEnv(self.make(2), seed=0)
        simulator = simulate.Simulator(env, simulate_testing.ConstantAlgorithm(np.int64(0)))
        simulator.rollout(3)
        env.request_reset()
        self.assertTrue(simulator.rollout(2).first.numpy()[0].all())
        self.assertTrue(tf.reduce_all(simulator.length == 2))
        env.close()

    def test_mismatched_env_is_refused(self):
        env = in_graph_batch_env.InGraphBatchEnv(self.make(3), seed=0)
        for other in (self.make(2), self.make(3, 'Acrobot-v1')):
            with self.assertRaisesRegex(ValueError, 'does not match the old one'):
                env.replace_vector_env(other)
            other.close()
        self.assertEqual(env.vector_env.num_envs, 3)
        env.close()


if __name__ == '__main__':
    absltest.main()
