"""Tests for envpool_atari: which tasks are Atari's, their settings, and one game as a
Gymnasium environment, in this process and in a worker (as visualize plays it)."""

import functools
import pickle

import gymnasium as gym
import numpy as np
from absl.testing import absltest

from agents.tools import envpool_atari, process_env, rendering

# One EnvPool thread per pool: the tests stay light on a shared machine.
_KWARGS = {'num_threads': 1}


class SettingsTest(absltest.TestCase):

    def test_atari_tasks(self):
        for env_id in ('Pong-v5', 'Breakout-v5', 'SpaceInvaders-v5'):
            self.assertTrue(envpool_atari.is_atari_task(env_id), env_id)
        # Gymnasium's task in EnvPool, dm_control's, and no task.
        for env_id in ('CartPole-v1', 'CheetahRun-v1', 'Pong-v4'):
            self.assertFalse(envpool_atari.is_atari_task(env_id), env_id)

    def test_training_defaults_yield_and_evaluation_overrides_win(self):
        self.assertEqual(envpool_atari.training_kwargs(),
                         {'episodic_life': True, 'reward_clip': True})
        self.assertEqual(
            envpool_atari.training_kwargs({'reward_clip': False, 'num_threads': 2}),
            {'episodic_life': True, 'reward_clip': False, 'num_threads': 2})
        self.assertEqual(
            envpool_atari.evaluation_kwargs({'episodic_life': True, 'num_threads': 2}),
            {'episodic_life': False, 'reward_clip': False, 'num_threads': 2})
        self.assertEqual(envpool_atari.evaluation_kwargs(None),
                         {'episodic_life': False, 'reward_clip': False})
        # Training's groups (EnvPool's async mode) are not evaluation's: one batch.
        self.assertEqual(envpool_atari.evaluation_kwargs({'batch_size': 4}),
                         {'episodic_life': False, 'reward_clip': False})


class AtariEnvTest(absltest.TestCase):

    def _make(self, env_id='Breakout-v5', **kwargs):
        env = envpool_atari.make_env(
            env_id, envpool_atari.evaluation_kwargs({**_KWARGS, **kwargs}))
        self.addCleanup(env.close)
        return env

    def test_training_episodes_are_named_by_what_they_are(self):
        self.assertEqual(envpool_atari.training_episodes(),
                         ('life_return_clipped', 'life_length'))
        self.assertEqual(envpool_atari.training_episodes({'reward_clip': False}),
                         ('life_return', 'life_length'))
        self.assertEqual(envpool_atari.training_episodes(
            {'episodic_life': False, 'reward_clip': False}), ('episode_return', 'episode_length'))

    def test_a_seeded_episode_is_a_whole_game_with_its_score(self):
        env = self._make()
        self.assertEqual(env.observation_space, gym.spaces.Box(0, 255, (4, 84, 84), np.uint8))
        self.assertEqual(env.action_space, gym.spaces.Discrete(4))
        first, info = env.reset(seed=3)
        self.assertEqual((first.shape, first.dtype), ((4, 84, 84), np.uint8))
        self.assertEqual(info['lives'], 5)
        rng = np.random.default_rng(0)
        rewards, scores, lives = [], [], set()
        terminated = truncated = False
        while not (terminated or truncated):
            observ, reward, terminated, truncated, info = env.step(rng.integers(0, 4))
            self.assertEqual(observ.dtype, np.uint8)
            self.assertIsInstance(reward, float)
            rewards.append(reward)
            scores.append(float(info['reward']))
            lives.add(int(info['lives']))
        # Every life in one episode, every point counted: the game's score.
        self.assertEqual(lives, {5, 4, 3, 2, 1, 0})
        self.assertEqual((terminated, truncated, info['terminated']), (True, False, 1))
        self.assertEqual(rewards, scores)
        with self.assertRaisesRegex(RuntimeError, 'reset'):
            env.step(0)
        again, _ = env.reset(seed=3)
        np.testing.assert_array_equal(again, first)
        other, _ = env.reset(seed=4)
        self.assertFalse(np.array_equal(other, first))

    def test_renders_the_screen_in_real_time(self):
        env = self._make(render_mode='rgb_array')
        env.reset(seed=0)
        frame = env.render()
        self.assertEqual((frame.shape, frame.dtype), ((210, 160, 3), np.uint8))
        self.assertEqual(env.render_mode, 'rgb_array')
        # 60 Atari frames a second, `frame_skip` of them a step.
        self.assertEqual(env.metadata, {'render_modes': ['rgb_array'], 'render_fps': 15.0})
        self.assertEqual(self._make(frame_skip=2).metadata['render_fps'], 30.0)

    def test_plays_in_a_worker_process_as_visualize_runs_it(self):
        factory = functools.partial(
            envpool_atari.make_env, 'Pong-v5',
            envpool_atari.evaluation_kwargs({**_KWARGS, 'render_mode': 'rgb_array'}),
            (rendering.configure_fast_rendering,))  # Leaves a game as it is.
        env = process_env.ProcessEnv(pickle.loads(pickle.dumps(factory)))
        self.addCleanup(env.close)
        self.assertEqual(env.metadata['render_fps'], 15.0)
        observ, _ = env.reset(seed=1)
        self.assertEqual((observ.shape, observ.dtype), ((4, 84, 84), np.uint8))
        observ, reward, terminated, _, _ = env.step(np.int64(2))
        self.assertEqual((observ.dtype, reward, terminated), (np.uint8, 0.0, False))
        frame = env.render()
        self.assertEqual((frame.shape, frame.dtype), ((210, 160, 3), np.uint8))

    def test_bad_arguments(self):
        with self.assertRaisesRegex(ValueError, "'CartPole-v1' is not one of EnvPool's Atari"):
            envpool_atari.AtariEnv('CartPole-v1')
        with self.assertRaisesRegex(ValueError, "render_mode must be None or 'rgb_array'"):
            envpool_atari.AtariEnv('Pong-v5', {'render_mode': 'human'})
        env = self._make('Pong-v5')
        with self.assertRaisesRegex(ValueError, 'take no options'):
            env.reset(options={'reset_mask': np.array([True])})
        env.reset()
        with self.assertRaisesRegex(ValueError, 'outside'):
            env.step(6)
        with self.assertRaisesRegex(ValueError, 'wrapper'):
            envpool_atari.make_env('Pong-v5', _KWARGS, ('NoSuchWrapper',))


if __name__ == '__main__':
    absltest.main()
