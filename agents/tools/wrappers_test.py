"""Tests for wrappers."""

import gin
import gymnasium as gym
import numpy as np
from absl.testing import absltest
from gymnasium.wrappers import vector as vector_wrappers

from agents.tools import wrappers


class _RecordingEnv(gym.Env):
    """Returns a fixed observation and remembers the actions it receives."""

    def __init__(self, observation_space=None, action_space=None, observ=None):
        self.observation_space = observation_space or gym.spaces.Box(
            np.array([0, -np.inf, -2], np.float32), np.array([10, np.inf, 2], np.float32))
        self.action_space = action_space or gym.spaces.Box(
            np.array([0, -1], np.float32), np.array([4, 1], np.float32))
        self._observ = np.array([5, 7, 1], np.float32) if observ is None else observ
        self.actions = []

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return self._observ, {}

    def step(self, action):
        self.actions.append(np.array(action))
        return self._observ, 0.0, False, False, {}


def _unbounded_box(dims=2):
    return gym.spaces.Box(-np.inf, np.inf, (dims,), np.float32)


class RangeNormalizeTest(absltest.TestCase):

    def test_rescales_bounded_observation_components(self):
        env = wrappers.range_normalize(_RecordingEnv())
        np.testing.assert_allclose(env.observation_space.low, [-1, -np.inf, -1])
        np.testing.assert_allclose(env.observation_space.high, [1, np.inf, 1])
        observ, _ = env.reset(seed=0)
        np.testing.assert_allclose(observ, [0, 7, 0.5])  # 5 in [0, 10], 7 kept, 1 in [-2, 2].
        self.assertEqual(observ.dtype, np.float32)

    def test_maps_actions_back_to_the_original_range(self):
        inner = _RecordingEnv()
        env = wrappers.range_normalize(inner)
        np.testing.assert_allclose(env.action_space.low, [-1, -1])
        np.testing.assert_allclose(env.action_space.high, [1, 1])
        env.reset(seed=0)
        env.step(np.array([-1, 1], np.float32))
        env.step(np.array([1, 0], np.float32))
        np.testing.assert_allclose(inner.actions, [[0, 1], [4, 0]])

    def test_leaves_unbounded_and_discrete_spaces_alone(self):
        inner = _RecordingEnv(_unbounded_box(3), gym.spaces.Discrete(3))
        self.assertIs(wrappers.range_normalize(inner), inner)

    def test_false_skips_normalization(self):
        inner = _RecordingEnv()
        self.assertIs(wrappers.range_normalize(inner, observ=False, action=False), inner)
        env = wrappers.range_normalize(inner, observ=False)
        self.assertEqual(env.observation_space, inner.observation_space)
        np.testing.assert_allclose(env.action_space.high, [1, 1])

    def test_true_requires_finite_bounds(self):
        with self.assertRaisesRegex(ValueError, 'observation range'):
            wrappers.range_normalize(_RecordingEnv(), observ=True)
        with self.assertRaisesRegex(ValueError, 'action range'):
            wrappers.range_normalize(
                _RecordingEnv(action_space=gym.spaces.Discrete(2)), action=True)
        env = wrappers.range_normalize(_RecordingEnv(), action=True)
        np.testing.assert_allclose(env.action_space.low, [-1, -1])

    def test_rejects_invalid_flags(self):
        with self.assertRaisesRegex(ValueError, 'observation must be None, True or False'):
            wrappers.range_normalize(_RecordingEnv(), observ='yes')

    def test_vector_env(self):
        env = gym.vector.SyncVectorEnv([_RecordingEnv, _RecordingEnv])
        env = wrappers.range_normalize(env)
        self.assertIsInstance(env, vector_wrappers.RescaleAction)
        observ, _ = env.reset(seed=0)
        np.testing.assert_allclose(observ, [[0, 7, 0.5], [0, 7, 0.5]])
        np.testing.assert_allclose(env.single_action_space.low, [-1, -1])
        env.step(np.array([[1, 1], [-1, -1]], np.float32))
        np.testing.assert_allclose(env.unwrapped.envs[0].actions, [[4, 1]])
        np.testing.assert_allclose(env.unwrapped.envs[1].actions, [[0, -1]])


class ApplyWrappersTest(absltest.TestCase):

    def tearDown(self):
        gin.clear_config()
        super().tearDown()

    def test_no_wrappers_returns_env(self):
        env = _RecordingEnv()
        self.assertIs(wrappers.apply_wrappers(env), env)

    def test_names_and_kwargs_apply_innermost_first(self):
        inner = _RecordingEnv()
        env = wrappers.apply_wrappers(inner, [
            ('TimeLimit', {'max_episode_steps': 2}), 'range_normalize', 'ClipAction'])
        self.assertIsInstance(env, gym.wrappers.ClipAction)
        self.assertIsInstance(env.env, gym.wrappers.RescaleAction)
        self.assertTrue(np.isinf(env.action_space.high).all())
        env.reset(seed=0)
        *_, truncated, _ = env.step(np.array([5, -5], np.float32))
        self.assertFalse(truncated)
        *_, truncated, _ = env.step(np.array([0, 0], np.float32))
        self.assertTrue(truncated)
        # Clipped to [-1, 1] and then mapped to the original range.
        np.testing.assert_allclose(inner.actions, [[4, -1], [2, 0]])

    def test_callables(self):
        env = wrappers.apply_wrappers(
            _RecordingEnv(), [lambda env: gym.wrappers.TimeLimit(env, 1)])
        self.assertIsInstance(env, gym.wrappers.TimeLimit)

    def test_vector_env_gets_vector_wrappers(self):
        env = gym.vector.SyncVectorEnv([_RecordingEnv, _RecordingEnv])
        env = wrappers.apply_wrappers(env, ['NormalizeObservation', 'ClipAction'])
        self.assertIsInstance(env, vector_wrappers.ClipAction)
        self.assertIsInstance(env.env, vector_wrappers.NormalizeObservation)

    def test_unknown_name(self):
        with self.assertRaisesRegex(ValueError, "unknown wrapper 'Clip'.*ClipAction"):
            wrappers.apply_wrappers(_RecordingEnv(), ['Clip'])
        env = gym.vector.SyncVectorEnv([_RecordingEnv])
        with self.assertRaisesRegex(ValueError, "unknown vector wrapper 'TimeLimit'"):
            wrappers.apply_wrappers(env, ['TimeLimit'])
        with self.assertRaisesRegex(ValueError, "unknown wrapper 'vector'"):
            wrappers.apply_wrappers(_RecordingEnv(), ['vector'])

    def test_malformed_entries(self):
        with self.assertRaisesRegex(TypeError, 'a wrapper must be'):
            wrappers.apply_wrappers(_RecordingEnv(), [3])
        with self.assertRaisesRegex(TypeError, 'a wrapper must be'):
            wrappers.apply_wrappers(_RecordingEnv(), [('TimeLimit', 3)])
        with self.assertRaisesRegex(TypeError, 'wrapper name must be a string'):
            wrappers.apply_wrappers(_RecordingEnv(), [(3, {})])
        with self.assertRaisesRegex(TypeError, 'single wrapper'):
            wrappers.apply_wrappers(_RecordingEnv(), 'ClipAction')

    def test_gin_configuration(self):
        gin.parse_config("""
            apply_wrappers.wrappers = [
                ('TimeLimit', {'max_episode_steps': 1}),
                @range_normalize,
                ('DtypeObservation', {'dtype': 'float64'}),
            ]
            range_normalize.action = False
        """)
        inner = _RecordingEnv()
        env = wrappers.apply_wrappers(inner)
        self.assertEqual(env.observation_space.dtype, np.float64)
        self.assertEqual(env.action_space, inner.action_space)
        observ, _ = env.reset(seed=0)
        np.testing.assert_allclose(observ, [0, 7, 0.5])
        self.assertTrue(env.step(np.array([1, 0], np.float32))[3])


if __name__ == '__main__':
    absltest.main()
