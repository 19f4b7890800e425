"""Tests for cartpole: Gymnasium's CartPole-v1 trajectories and the shared native env tests."""

import numpy as np
import tensorflow as tf
from absl.testing import absltest

from agents.envs import cartpole, native_batch_env, testing


def balance(observ):
    """Pushes towards where the pole falls: episodes last to the time limit."""
    x, x_dot, theta, theta_dot = np.moveaxis(observ, -1, 0)
    return (theta + 0.5 * theta_dot + 0.01 * x + 0.1 * x_dot > 0).astype(np.int64)


class CartPoleTest(testing.NativeEnvTests):

    NATIVE = cartpole.CartPole
    NUM_STEPS = 1200
    MIN_EPISODES = 8
    # The balanced pole is an unstable equilibrium: rounding differences grow.
    RESYNCED = ('balance',)

    def policies(self, space):
        return {
            # Short episodes ending in terminations.
            'random': testing.random_policy(space, 0),
            # Truncations at 500 steps and terminations from the random actions.
            'balance': testing.mixed_policy(balance, space, 0, random_fraction=0.05),
        }

    def test_time_limit_truncates_at_500_steps(self):
        env = native_batch_env.NativeBatchEnv(cartpole.CartPole(), 2)
        env.set_state(np.zeros((2, 4)), elapsed=[498, 0])
        _, _, terminated, truncated = env.step(np.array([0, 1]))
        np.testing.assert_array_equal(truncated, [False, False])
        _, _, terminated, truncated = env.step(np.array([1, 0]))
        np.testing.assert_array_equal(truncated, [True, False])
        np.testing.assert_array_equal(terminated, [False, False])

    def test_leaving_the_track_terminates_with_reward(self):
        native = cartpole.CartPole()
        _, reward, terminated = native.dynamics(
            tf.constant([[2.4, 1.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]], tf.float64),
            tf.constant([1, 1], tf.int64))
        np.testing.assert_array_equal(terminated, [True, False])
        np.testing.assert_array_equal(reward, [1.0, 1.0])

    def test_rejects_actions_out_of_range(self):
        env = native_batch_env.NativeBatchEnv(cartpole.CartPole(), 2)
        env.reset()
        with self.assertRaisesRegex(tf.errors.InvalidArgumentError, 'actions must be in'):
            env.step(np.array([1, 2]))
        with self.assertRaisesRegex(tf.errors.InvalidArgumentError, 'actions must be in'):
            env.step(np.array([-1, 0]))
        np.testing.assert_array_equal(env.elapsed.numpy(), [0, 0])


if __name__ == '__main__':
    absltest.main()
