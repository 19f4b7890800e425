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
        self.assertIsInstance(env, wrappers.BatchRescaleAction)
        self.assertIsInstance(env.env, wrappers.BatchRescaleObservation)
        observ, _ = env.reset(seed=0)
        np.testing.assert_allclose(observ, [[0, 7, 0.5], [0, 7, 0.5]])
        np.testing.assert_allclose(env.single_action_space.low, [-1, -1])
        env.step(np.array([[1, 1], [-1, -1]], np.float32))
        np.testing.assert_allclose(env.unwrapped.envs[0].actions, [[4, 1]])
        np.testing.assert_allclose(env.unwrapped.envs[1].actions, [[0, -1]])


_DEFAULT_WRAPPERS = ('range_normalize', 'ClipAction')


def _gymnasium_vector_wrappers(env, names=_DEFAULT_WRAPPERS):
    """`names` applied to a VectorEnv as before: Gymnasium's vector wrappers."""
    for name in names:
        if name == 'ClipAction':
            env = vector_wrappers.ClipAction(env)
            continue
        bounds = wrappers._unit_bounds(env.single_observation_space, None, 'observation')
        if bounds:
            env = vector_wrappers.RescaleObservation(env, *bounds)
        bounds = wrappers._unit_bounds(env.single_action_space, None, 'action')
        if bounds:
            env = vector_wrappers.RescaleAction(env, *bounds)
    return env


class BatchedVectorWrappersTest(absltest.TestCase):
    """The batched wrappers give what Gymnasium's vector wrappers give."""

    def assert_same_as_gymnasium(self, make_env, actions, names=_DEFAULT_WRAPPERS):
        """Steps `make_env()` wrapped in `names`, ours and Gymnasium's, with `actions`; returns
        both."""
        ours = wrappers.apply_wrappers(make_env(), names)
        theirs = _gymnasium_vector_wrappers(make_env(), names)
        self.addCleanup(ours.close)
        self.addCleanup(theirs.close)
        for name in ('observation_space', 'single_observation_space', 'action_space',
                     'single_action_space'):
            self.assertEqual(getattr(ours, name), getattr(theirs, name), name)
        self.assert_same(ours.reset(seed=0), theirs.reset(seed=0))
        for action in actions:  # Copies: Gymnasium's wrappers may write into the actions.
            self.assert_same(ours.step(action.copy()), theirs.step(action.copy()))
        return ours, theirs

    def assert_same(self, value, expected):
        """Equal (within float rounding) arrays of equal dtypes, nested in tuples, lists, dicts
        and object arrays."""
        if isinstance(expected, dict):
            self.assertEqual(value.keys(), expected.keys())
            value, expected = [value[key] for key in expected], list(expected.values())
        if isinstance(expected, (tuple, list)) or (
                isinstance(expected, np.ndarray) and expected.dtype == object):
            self.assertLen(value, len(expected))
            for item, expected_item in zip(value, expected, strict=True):
                self.assert_same(item, expected_item)
        else:
            self.assertEqual(np.asarray(value).dtype, np.asarray(expected).dtype)
            np.testing.assert_allclose(value, expected, rtol=1e-6)

    def test_pendulum(self):
        # Bounded observations and actions, rescaled; out-of-range actions, clipped; 5-step
        # episodes, autoreset.
        actions = np.random.default_rng(0).uniform(-1.5, 1.5, (12, 3, 1)).astype(np.float32)
        env, _ = self.assert_same_as_gymnasium(lambda: gym.make_vec(
            'Pendulum-v1', 3, vectorization_mode='sync', max_episode_steps=5), actions)
        self.assertIsInstance(env, wrappers.BatchClipAction)
        self.assertIsInstance(env.env, wrappers.BatchRescaleAction)
        self.assertIsInstance(env.env.env, wrappers.BatchRescaleObservation)
        np.testing.assert_allclose(env.single_observation_space.high, [1, 1, 1])

    def test_half_cheetah(self):
        # Unbounded float64 observations, left alone; actions already in [-1, 1].
        actions = np.random.default_rng(1).uniform(-1.5, 1.5, (6, 2, 6))
        env, _ = self.assert_same_as_gymnasium(
            lambda: gym.make_vec('HalfCheetah-v5', 2, vectorization_mode='sync'), actions)
        self.assertIsInstance(env.env, wrappers.BatchRescaleAction)
        self.assertIsInstance(env.env.env, gym.vector.SyncVectorEnv)
        self.assertEqual(env.observation_space.dtype, np.float64)

    def test_same_step_autoreset_refused_as_by_gymnasium(self):
        for wrap in (wrappers.range_normalize, _gymnasium_vector_wrappers):
            env = gym.make_vec('Pendulum-v1', 2, vectorization_mode='sync', vector_kwargs={
                'autoreset_mode': gym.vector.AutoresetMode.SAME_STEP})
            self.addCleanup(env.close)
            with self.assertRaisesRegex(ValueError, 'autoreset_mode to be NEXT_STEP or DISABLED'):
                wrap(env)

    def test_action_dtypes_and_unbounded_components(self):
        # The actions the environments receive: in the inner space's dtype, or where a wrapper
        # leaves the space unchanged (RescaleAction of [-1, 1], ClipAction of an unbounded Box)
        # in the agent's, as Gymnasium's wrappers pass them.
        for action_space in (None, gym.spaces.Box(-1, 1, (2,), np.float32), _unbounded_box()):
            for names in (_DEFAULT_WRAPPERS, ['range_normalize'], ['ClipAction']):
                for dtype in (np.float32, np.float64):
                    with self.subTest(action_space=action_space, names=names, dtype=dtype):
                        def make_env(action_space=action_space):
                            return gym.vector.SyncVectorEnv(
                                [lambda: _RecordingEnv(action_space=action_space)] * 2)

                        actions = np.array([[[5, -5], [0.5, 0.25]]] * 2, dtype)
                        ours, theirs = self.assert_same_as_gymnasium(make_env, actions, names)
                        self.assert_same([env.actions for env in ours.unwrapped.envs],
                                         [env.actions for env in theirs.unwrapped.envs])


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
        self.assertIsInstance(env, wrappers.BatchClipAction)
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
