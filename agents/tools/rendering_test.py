"""Tests for headless rendering: backend defaults and fast MuJoCo settings without side effects."""

import os
import subprocess
import sys

import gymnasium as gym
import numpy as np
from absl.testing import absltest

from agents.tools import rendering

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def environment_after_import(**variables):
    """MUJOCO_GL and SDL_VIDEODRIVER after importing the module in a fresh process."""
    env = {key: value for key, value in os.environ.items()
           if key not in ('MUJOCO_GL', 'SDL_VIDEODRIVER', 'DISPLAY', 'WAYLAND_DISPLAY')}
    env.update(variables, PYTHONPATH=ROOT)
    code = ('import os; from agents.tools import rendering; '
            'print(os.environ.get("MUJOCO_GL"), os.environ.get("SDL_VIDEODRIVER"))')
    result = subprocess.run([sys.executable, '-c', code], env=env, capture_output=True,
                            text=True, timeout=120, check=True)
    return result.stdout.split()


class DefaultsTest(absltest.TestCase):

    def test_headless_defaults_and_the_users_choice_wins(self):
        self.assertEqual(environment_after_import(), ['egl', 'dummy'])
        self.assertEqual(environment_after_import(MUJOCO_GL='osmesa', SDL_VIDEODRIVER='x11'),
                         ['osmesa', 'x11'])
        self.assertEqual(environment_after_import(DISPLAY=':0'), ['egl', 'None'])


class ConfigureFastRenderingTest(absltest.TestCase):

    def test_mujoco_gets_cheap_settings_and_unchanged_physics(self):
        fast = rendering.configure_fast_rendering(
            gym.make('HalfCheetah-v5', render_mode='rgb_array', width=64, height=48))
        plain = gym.make('HalfCheetah-v5')
        model = fast.unwrapped.model
        self.assertEqual(model.vis.quality.shadowsize, 1024)
        self.assertEqual(model.vis.quality.offsamples, 0)
        self.assertFalse(model.light_castshadow.any())
        self.assertFalse(model.mat_reflectance.any())
        self.assertTrue(plain.unwrapped.model.mat_reflectance.any())  # It had reflections.
        observ_fast, _ = fast.reset(seed=3)
        observ_plain, _ = plain.reset(seed=3)
        actions = np.random.default_rng(0).uniform(-1, 1, (20, 6))
        for action in actions:
            observ_fast, reward_fast, *_ = fast.step(action)
            observ_plain, reward_plain, *_ = plain.step(action)
            self.assertEqual(reward_fast, reward_plain)
        np.testing.assert_array_equal(observ_fast, observ_plain)
        frame = fast.render()
        self.assertEqual((frame.shape, frame.dtype), ((48, 64, 3), np.uint8))
        self.assertGreater(frame.std(), 5)  # A scene, not a blank image.

    def test_settings_are_configurable(self):
        env = rendering.configure_fast_rendering(
            gym.make('HalfCheetah-v5'), shadow_size=2048, offscreen_samples=2, shadows=True,
            reflections=True)
        model = env.unwrapped.model
        self.assertEqual((model.vis.quality.shadowsize, model.vis.quality.offsamples), (2048, 2))
        self.assertTrue(model.light_castshadow.any())
        self.assertTrue(model.mat_reflectance.any())

    def test_other_environments_are_left_alone(self):
        env = gym.make('Pendulum-v1', render_mode='rgb_array')
        self.assertIs(rendering.configure_fast_rendering(env), env)
        env.reset(seed=0)
        self.assertEqual(env.render().shape, (500, 500, 3))


if __name__ == '__main__':
    absltest.main()
