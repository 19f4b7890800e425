"""Tests of the building blocks of BatchEnv: buffers, info merging and EnvGroup."""

import functools

import gymnasium as gym
import numpy as np
from absl.testing import absltest, parameterized

from agents.tools import env_group, external_worker

AutoresetMode = gym.vector.AutoresetMode


class _Batcher:
    """Gymnasium's info batching for `num_envs` envs, the reference of merge_infos."""

    _add_info = gym.vector.VectorEnv._add_info

    def __init__(self, num_envs):
        self.num_envs = num_envs

    def batch(self, infos_by_env):
        infos = {}
        for index, info in enumerate(infos_by_env):
            infos = self._add_info(infos, info, index)
        return infos


# Infos of 5 envs with the kinds of values gymnasium batches differently.
ENV_INFOS = [
    {'x': 1.5, 'count': 3, 'flag': True},
    {},
    {'x': np.float32(2.5), 'vector': np.arange(3.0), 'name': 'b'},
    {'final_obs': np.ones(2), 'final_info': {'x': 4.0, 'inner': {'y': 1}}},
    {'count': 7, 'final_obs': np.zeros(2), 'final_info': {'z': np.int8(2)}, 'name': 'e'},
]


class StepBuffersTest(absltest.TestCase):

    def test_layout_dtypes_shapes_and_views(self):
        observation_space = gym.spaces.Box(-1.0, 1.0, (2, 3), np.float32)
        action_space = gym.spaces.Discrete(4)
        memory = bytearray(env_group.StepBuffers.nbytes(5, observation_space, action_space))
        buffers = env_group.StepBuffers.create(5, observation_space, action_space, memory)
        self.assertEqual(buffers.observations.shape, (5, 2, 3))
        self.assertEqual(buffers.observations.dtype, np.float32)
        self.assertEqual(buffers.actions.shape, (5,))
        self.assertEqual(buffers.actions.dtype, np.int64)
        self.assertEqual(buffers.rewards.dtype, np.float64)
        self.assertEqual(buffers.terminations.dtype, np.bool_)
        # Every field views the same memory, without overlap.
        again = env_group.StepBuffers.create(5, observation_space, action_space, memory)
        for array in (buffers.actions, buffers.observations, buffers.rewards,
                      buffers.terminations, buffers.truncations):
            array[...] = 1
        for array in (again.actions, again.observations, again.rewards, again.terminations,
                      again.truncations):
            self.assertTrue((array == 1).all())
        rows = buffers.slice(2, 4)
        rows.rewards[:] = 9.0
        np.testing.assert_array_equal(again.rewards, [1, 1, 9, 9, 1])

    def test_rejects_structured_spaces(self):
        space = gym.spaces.Dict({'a': gym.spaces.Discrete(2)})
        with self.assertRaisesRegex(TypeError, 'observation spaces of types'):
            env_group.StepBuffers.create(2, space, gym.spaces.Discrete(2))


# Infos of 5 envs that all report the same numeric keys, as MuJoCo envs do.
UNIFORM_INFOS = [
    {'x': index + 0.5, 'count': index, 'reward': np.float32(index), 'ok': index % 2 == 0}
    for index in range(5)]


# Like UNIFORM_INFOS, but env 3 reports a float count (so its group's infos are not uniform).
MIXED_INFOS = [dict(info) for info in UNIFORM_INFOS]
MIXED_INFOS[3]['count'] = 3.0


class InfoBatchingTest(parameterized.TestCase):

    @parameterized.product(
        infos=['ENV_INFOS', 'UNIFORM_INFOS', 'MIXED_INFOS'],
        group_sizes=[[5], [2, 3], [1, 1, 1, 1, 1], [4, 1]])
    def test_batching_in_groups_equals_gymnasium_batching(self, infos, group_sizes):
        infos = globals()[infos]
        expected = _Batcher(5).batch(infos)
        worker_infos, start = [], 0
        for size in group_sizes:
            events = [(row, info) for row, info in enumerate(infos[start:start + size]) if info]
            payload = external_worker.pack_events(env_group.InfoBatcher(size), events)
            if payload:
                worker_infos.append((start, payload))
            start += size
        self._assert_same(external_worker.merge_worker_infos(worker_infos, 5), expected)
        events = [(row, info) for row, info in enumerate(infos) if info]
        self._assert_same(env_group.InfoBatcher(5).batch(events), expected)

    def test_uniform_numeric_infos_become_columns(self):
        events = list(enumerate(UNIFORM_INFOS))
        columns = env_group.InfoBatcher(5).columns(events)
        self.assertEqual(columns.dtype.names, ('x', 'count', 'reward', 'ok'))
        np.testing.assert_array_equal(columns['count'], range(5))
        self.assertIsNone(env_group.InfoBatcher(5).columns(list(enumerate(MIXED_INFOS))))
        self.assertIsNone(env_group.InfoBatcher(6).columns(events))  # Not every env.
        self.assertIsNone(env_group.InfoBatcher(5).columns(list(enumerate(ENV_INFOS))))

    def _assert_same(self, actual, expected):
        self.assertEqual(sorted(actual), sorted(expected))
        for key, value in expected.items():
            if isinstance(value, dict):
                self._assert_same(actual[key], value)
            elif value.dtype == object:
                self.assertEqual(actual[key].dtype, object, key)
                for item, expected_item in zip(actual[key], value, strict=True):
                    np.testing.assert_array_equal(item, expected_item)
            else:
                self.assertEqual(actual[key].dtype, value.dtype, key)
                np.testing.assert_array_equal(actual[key], value, key)
                self.assertTrue(actual[key].flags.writeable, key)


class EnvGroupTest(absltest.TestCase):

    def _group(self, num_envs, autoreset_mode, first_index=0):
        envs = env_group.create_envs(
            [functools.partial(gym.make, 'CartPole-v1', max_episode_steps=3)] * num_envs,
            first_index)
        buffers = env_group.StepBuffers.create(
            num_envs, envs[0].observation_space, envs[0].action_space)
        group = env_group.EnvGroup(envs, buffers, autoreset_mode, first_index=first_index)
        self.addCleanup(group.close)
        return group, buffers

    def test_next_step_autoreset_resets_on_the_step_after_the_end(self):
        group, buffers = self._group(2, AutoresetMode.NEXT_STEP)
        group.reset(seeds=[0, 1])
        for _ in range(3):
            group.step()
        np.testing.assert_array_equal(buffers.truncations, [True, True])
        group.step()  # The autoreset step.
        np.testing.assert_array_equal(buffers.rewards, [0.0, 0.0])
        np.testing.assert_array_equal(buffers.truncations, [False, False])

    def test_reset_of_some_rows_leaves_the_others(self):
        group, buffers = self._group(3, AutoresetMode.DISABLED)
        group.reset(seeds=[0, 1, 2])
        group.step()
        before = buffers.observations.copy()
        group.reset(seeds=[5, 5, 5], rows=[1])
        np.testing.assert_array_equal(buffers.observations[[0, 2]], before[[0, 2]])
        self.assertFalse((buffers.observations[1] == before[1]).all())

    def test_errors_name_the_index_in_the_batch(self):
        group, buffers = self._group(2, AutoresetMode.NEXT_STEP, first_index=4)
        group.reset()
        buffers.actions[:] = [0, 5]  # CartPole asserts that actions are in its space.
        with self.assertRaisesRegex(env_group.EnvError, 'Environment 5 failed in step') as error:
            group.step()
        self.assertEqual(error.exception.env_index, 5)
        self.assertIn('Original traceback', str(error.exception))

    def test_create_envs_rejects_differing_spaces(self):
        with self.assertRaisesRegex(env_group.EnvError, 'Environment 3 has observation space'):
            env_group.create_envs(
                [functools.partial(gym.make, 'CartPole-v1'),
                 functools.partial(gym.make, 'Pendulum-v1')],
                first_index=2, observation_space=gym.make('CartPole-v1').observation_space,
                action_space=gym.make('CartPole-v1').action_space)


if __name__ == '__main__':
    absltest.main()
