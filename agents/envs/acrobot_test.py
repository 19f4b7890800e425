"""Tests for acrobot: Gymnasium's Acrobot-v1 trajectories and the shared native env tests."""

import math

import numpy as np
import tensorflow as tf
from absl.testing import absltest

from agents.envs import acrobot, testing


def swing(observ):
    """Torque along the second joint's motion: reaches the line in about 100 steps."""
    return np.where(observ[:, 5] > 0, 2, 0).astype(np.int64)


class AcrobotTest(testing.NativeEnvTests):

    NATIVE = acrobot.Acrobot
    NUM_STEPS = 1100
    MIN_EPISODES = 8
    # Energetic swings are chaotic: rounding differences grow within an episode.
    RESYNCED = ('swing',)

    def policies(self, space):
        return {
            # Chaotic motion up to the time limit: float64 keeps it on Gymnasium's trajectory.
            'random': testing.random_policy(space, 0),
            'swing': testing.mixed_policy(swing, space, 0, random_fraction=0.1),
        }

    def test_wrap_shifts_by_whole_periods(self):
        values = np.array([-10.0, -math.pi - 0.1, -math.pi, 0.3, math.pi, math.pi + 0.1, 12.0])
        expected = []
        for x in values:  # Gymnasium's loops.
            while x > math.pi:
                x -= 2 * math.pi
            while x < -math.pi:
                x += 2 * math.pi
            expected.append(x)
        np.testing.assert_allclose(
            acrobot.wrap(tf.constant(values), -math.pi, math.pi), expected, rtol=0, atol=1e-12)

    def test_float32_drifts_from_gymnasium_over_an_episode(self):
        # Why float64 is the default: the same comparison in float32 fails.
        trajectories = testing.compare_with_gymnasium(
            acrobot.Acrobot(tf.float32), 4, 600, testing.random_policy(
                acrobot.Acrobot.action_space, 0))
        error = np.abs(trajectories.native['observ'] - trajectories.gym['observ']).max()
        self.assertGreater(error, 1e-3)


if __name__ == '__main__':
    absltest.main()
