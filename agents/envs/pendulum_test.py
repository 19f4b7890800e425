"""Tests for pendulum: Gymnasium's Pendulum-v1 trajectories and the shared native env tests."""

import math

import numpy as np
import tensorflow as tf
from absl.testing import absltest

from agents.envs import native_batch_env, pendulum, testing


class PendulumTest(testing.NativeEnvTests):

    NATIVE = pendulum.Pendulum
    NUM_STEPS = 1000  # 20 episodes of 200 steps.
    MIN_EPISODES = 16

    def policies(self, space):
        # Beyond the torque limit too: Gymnasium clips the torque, costs included.
        return {'random': testing.random_policy(space, 0, scale=1.5)}

    def test_angle_normalize_wraps_like_python_modulo(self):
        angles = np.array([-7.0, -math.pi, -1.0, 0.0, 1.0, math.pi, 3 * math.pi + 0.5, 20.0])
        expected = (angles + np.pi) % (2 * np.pi) - np.pi
        np.testing.assert_array_equal(pendulum.angle_normalize(tf.constant(angles)), expected)

    def test_upright_at_rest_costs_only_the_torque(self):
        native = pendulum.Pendulum()
        state, reward, terminated = native.dynamics(
            tf.constant([[0.0, 0.0]], tf.float64), tf.constant([[1.0]], tf.float32))
        self.assertAlmostEqual(float(reward[0]), -0.001, places=9)
        self.assertFalse(bool(terminated[0]))
        np.testing.assert_allclose(state, [[0.0075, 0.15]], rtol=1e-9)

    def test_rejects_nan_actions(self):
        env = native_batch_env.NativeBatchEnv(pendulum.Pendulum(), 2)
        env.reset()
        with self.assertRaisesRegex(tf.errors.InvalidArgumentError, 'NaN'):
            env.step(np.array([[0.0], [np.nan]], np.float32))
        np.testing.assert_array_equal(env.elapsed.numpy(), [0, 0])


if __name__ == '__main__':
    absltest.main()
