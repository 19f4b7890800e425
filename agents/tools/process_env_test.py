"""Tests for ProcessEnv: the same episodes as in-process, and MuJoCo frames beside TensorFlow."""

import functools

import gymnasium as gym
import numpy as np
import tensorflow as tf
from absl.testing import absltest

from agents.tools import batch_env, process_env, rendering


class ProcessEnvTest(absltest.TestCase):

    def test_steps_like_the_environment_in_process(self):
        env = process_env.ProcessEnv(functools.partial(gym.make, 'Pendulum-v1'))
        self.addCleanup(env.close)
        local = gym.make('Pendulum-v1')
        self.assertEqual(env.observation_space, local.observation_space)
        self.assertEqual(env.action_space, local.action_space)
        self.assertEqual(env.metadata['render_fps'], 30)
        actions = np.random.default_rng(0).uniform(-2, 2, (205, 1)).astype(np.float32)
        for seed in (3, 4):
            observ, info = env.reset(seed=seed)
            expected, _ = local.reset(seed=seed)
            np.testing.assert_array_equal(observ, expected)
            self.assertEqual(info, {})
            length, truncated = 0, False
            while not truncated:
                observ, reward, terminated, truncated, _ = env.step(actions[length])
                expected, expected_reward, expected_terminated, expected_truncated, _ = (
                    local.step(actions[length]))
                length += 1
                np.testing.assert_array_equal(observ, expected)
                self.assertEqual((reward, terminated, truncated),
                                 (expected_reward, expected_terminated, expected_truncated))
            self.assertEqual(length, 200)  # Pendulum's time limit.

    def test_renders_mujoco_in_a_process_that_runs_tensorflow(self):
        # TensorFlow has run here; rendering MuJoCo through EGL in this process would crash.
        self.assertEqual(int(tf.reduce_sum(tf.ones([3]))), 3)
        env = process_env.ProcessEnv(functools.partial(
            batch_env.make_env, 'HalfCheetah-v5',
            {'render_mode': 'rgb_array', 'width': 96, 'height': 64},
            (rendering.configure_fast_rendering,)))
        self.addCleanup(env.close)
        self.assertEqual(env.render_mode, 'rgb_array')
        env.reset(seed=0)
        first = env.render()
        for _ in range(5):
            env.step(env.action_space.sample())
        frame = env.render()
        self.assertEqual((frame.shape, frame.dtype), ((64, 96, 3), np.uint8))
        self.assertGreater(frame.std(), 5)
        self.assertFalse(np.array_equal(first, frame))  # The cheetah moved.

    def test_errors_of_the_environment_reach_the_caller(self):
        env = process_env.ProcessEnv(functools.partial(gym.make, 'Pendulum-v1'))
        self.addCleanup(env.close)
        env.reset(seed=0)
        with self.assertRaisesRegex(ValueError, r'actions must have shape \(1, 1\)'):
            env.step(np.array([1.0, 2.0, 3.0], np.float32))


if __name__ == '__main__':
    absltest.main()
