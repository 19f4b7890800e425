"""Tests for mountain_car_continuous: Gymnasium's MountainCarContinuous-v0 trajectories and the
shared native env tests."""

import numpy as np
import tensorflow as tf
from absl.testing import absltest

from agents.envs import mountain_car_continuous, testing

MountainCarContinuous = mountain_car_continuous.MountainCarContinuous


def pump(observ):
    """Full throttle along the velocity: reaches the goal in about 110 steps."""
    return np.where(observ[:, 1:2] >= 0, 1.0, -1.0).astype(np.float32)


class MountainCarContinuousTest(testing.NativeEnvTests):

    NATIVE = MountainCarContinuous
    NUM_STEPS = 1100  # A truncation at 999 steps under the random policy.
    MIN_EPISODES = 4

    def policies(self, space):
        # Out-of-range actions too: clipped in the force, not in the reward. The pumping policy
        # reaches the goal (+100) and the left wall.
        return {
            'random': testing.random_policy(space, 0, scale=1.5),
            'pump': testing.mixed_policy(
                lambda observ: pump(observ) * 1.3, space, 0, random_fraction=0.2),
        }

    def test_goal_rewards_100_minus_the_action_cost(self):
        native = MountainCarContinuous()
        state = tf.constant([[0.449, 0.05, 1.0], [0.0, 0.01, 1.0]], tf.float64)
        next_state, reward, terminated = native.dynamics(
            state, tf.constant([[2.0], [0.5]], tf.float32))
        np.testing.assert_array_equal(terminated, [True, False])
        np.testing.assert_allclose(reward, [100 - 0.4, -0.025], rtol=1e-6)
        self.assertTrue((next_state.numpy()[:, 2] == 1).all())

    def test_left_wall_stops_the_car(self):
        native = MountainCarContinuous()
        state = tf.constant([[-1.19, -0.05, 1.0]], tf.float64)
        next_state, _, _ = native.dynamics(state, tf.constant([[-1.0]], tf.float32))
        np.testing.assert_allclose(next_state.numpy()[0, :2], [np.float32(-1.2), 0.0])

    def test_gym_state_dtype_tells_whether_a_step_was_taken(self):
        native = MountainCarContinuous()
        fresh = native.from_gym_state(np.array([-0.5, 0.0]))
        stepped = native.from_gym_state(np.array([-0.5, 0.0], np.float32))
        self.assertEqual(fresh[2], 0.0)
        self.assertEqual(stepped[2], 1.0)
        self.assertEqual(native.to_gym_state(stepped).dtype, np.float32)
        self.assertEqual(native.to_gym_state(fresh).dtype, np.float64)


if __name__ == '__main__':
    absltest.main()
