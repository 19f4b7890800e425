"""Tests of the compiled training step on native environments, and of frames kept uint8 from
EnvPool's Atari to the update."""

import numpy as np
import tensorflow as tf
from absl.testing import absltest

from agents import envs
from agents.algorithms import off_policy_testing, shared_torso
from agents.algorithms.ppo import ppo
from agents.runs import environments, training_step
from agents.tools import in_graph_batch_env


class _RecordingPPO(ppo.PPO):
    """PPO that records the dtypes of the rollouts it is given."""

    def update(self, batch):
        self.observ_dtypes = (batch['observ'].dtype, batch['next_observ'].dtype)
        return super().update(batch)


def _step(iterations_per_call, **hyperparameters):
    env = envs.make('Pendulum-v1', num_envs=2, seed=0, wrappers=('range_normalize',))
    agent = off_policy_testing.OffPolicyTesting(
        env.observation_space.shape, 1, num_envs=2, learning_starts=0, train_freq=4,
        **hyperparameters)
    env_steps = tf.Variable(0, dtype=tf.int64)
    step = training_step.TrainingStep(agent, env, 4, env_steps, iterations_per_call,
                                      jit_compile=False)
    return step, agent, env_steps


class TrainingStepTest(absltest.TestCase):

    def test_one_call_runs_several_iterations(self):
        step, agent, env_steps = _step(3)
        iterations, report = step(True, 3)
        self.assertLen(iterations, 3)
        self.assertEqual(int(env_steps), 24)
        self.assertEqual(int(agent.buffer.added), 24)
        self.assertEqual(set(iterations[0].metrics), set(agent.TRAIN_METRICS))
        self.assertEqual(iterations[0].metrics['q_loss'].shape, (1,))
        np.testing.assert_array_equal(report['nonfinite'], [0])
        iterations, _ = step(False, 2)  # Fewer than the most.
        self.assertLen(iterations, 2)
        self.assertEqual(int(env_steps), 40)

    def test_a_nonfinite_iteration_is_undone_named_and_ends_the_call(self):
        step, agent, env_steps = _step(4, nonfinite_at_train=2)
        step(True, 1)
        # The networks and optimizers (acting in the rollout moves the generator on).
        networks = [variable for variable in step.undone_variables
                    if variable is not agent.random.state]
        before = [variable.numpy() for variable in networks]
        iterations, report = step(False, 3)
        self.assertLen(iterations, 1)  # Stopped after the undone one.
        code = int(report['nonfinite'][0])
        self.assertEqual(step.nonfinite_quantities[code - 1], 'q_loss')
        for saved, variable in zip(before, networks, strict=True):
            np.testing.assert_array_equal(saved, variable.numpy(), err_msg=variable.name)
        self.assertEqual(int(env_steps), 16)  # Its steps count; its transitions are kept.
        self.assertEqual(int(agent.buffer.added), 16)

    def test_atari_frames_stay_bytes_from_the_environment_to_the_update(self):
        for env_kwargs in (None, {'batch_size': 1}):  # One batch, and two groups of one.
            with self.subTest(env_kwargs=env_kwargs):
                self._check_frames_stay_bytes(env_kwargs)

    def _check_frames_stay_bytes(self, env_kwargs):
        env = in_graph_batch_env.InGraphBatchEnv(
            environments.make_envpool_training('Pong-v5', 2, env_kwargs, seed=0), seed=0)
        self.addCleanup(env.close)
        agent = _RecordingPPO(env.observation_space.shape, 6, 2,
                              policy_network=shared_torso.SharedTorsoCategoricalPolicy,
                              value_network=None, normalize_observ=False, num_minibatches=2,
                              num_epochs=1, jit_compile=False)
        step = training_step.TrainingStep(agent, env, 4, tf.Variable(0, dtype=tf.int64), 1,
                                          jit_compile=False)
        iterations, _ = step(True, 1)
        self.assertLen(iterations, 1)
        # A float copy of the frames anywhere before the update (the environment's variables,
        # the rollout) would be four times the bytes; the torso casts each minibatch.
        self.assertEqual(env.observ.dtype, tf.uint8)
        self.assertEqual(agent.observ_dtypes, (tf.uint8, tf.uint8))

    def test_copies_what_undoing_needs_and_no_replay_buffer(self):
        step, agent, _ = _step(1)
        copied = {variable.ref() for variable in step.undone_variables}
        self.assertFalse(copied & {variable.ref() for variable in agent.buffer.variables})
        self.assertIn(agent.policy.log_std.ref(), copied)
        self.assertEqual(step.nonfinite_quantities, None)  # Until traced.
        step.trace()
        self.assertEqual(step.nonfinite_quantities, [
            training_step.OBSERVATION, training_step.REWARD, 'q_loss', 'policy_loss',
            training_step.PARAMETER])


if __name__ == '__main__':
    absltest.main()
