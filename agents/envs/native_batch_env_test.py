"""Tests for native_batch_env: the InGraphBatchEnv interface over native envs."""


import gymnasium as gym
import numpy as np
import tensorflow as tf
from absl.testing import absltest, parameterized

from agents.envs import cartpole, native_batch_env, pendulum
from agents.tools import gin_testing, simulate, simulate_testing

NativeBatchEnv = native_batch_env.NativeBatchEnv


def _pendulum_env(num_envs=3, **kwargs):
    return NativeBatchEnv(pendulum.Pendulum(), num_envs, **kwargs)


def _snapshot(env):
    return {name: getattr(env, name).numpy() for name in (
        'state', 'elapsed', 'observ', 'action', 'reward', 'terminated', 'truncated', 'resets')}


class NativeBatchEnvTest(parameterized.TestCase):

    def assert_unchanged(self, env, before):
        for name, value in _snapshot(env).items():
            np.testing.assert_array_equal(value, before[name], err_msg=name)

    def test_interface_of_in_graph_batch_env(self):
        env = _pendulum_env(3)
        self.assertLen(env, 3)
        self.assertEqual(env.num_envs, 3)
        self.assertEqual(env.observation_space, pendulum.Pendulum.observation_space)
        self.assertIs(env.single_observation_space, env.observation_space)
        self.assertIs(env.single_action_space, env.action_space)
        self.assertEqual(env.observ.shape, (3, 3))
        self.assertEqual(env.observ.dtype, tf.float32)
        self.assertEqual(env.action.shape, (3, 1))
        # Every env needs a reset before its first step.
        np.testing.assert_array_equal(env.done, [True] * 3)
        np.testing.assert_array_equal(env.truncated, [True] * 3)
        env.close()

    def test_reset_some_keeps_the_others(self):
        env = _pendulum_env(4, seed=2)
        env.reset()
        env.step(np.ones((4, 1), np.float32))
        before = _snapshot(env)
        observ = env.reset([2, 0, 2])
        after = _snapshot(env)
        np.testing.assert_array_equal(observ, after['observ'][[2, 0, 2]])
        for index in (1, 3):
            np.testing.assert_array_equal(after['state'][index], before['state'][index])
            np.testing.assert_array_equal(after['elapsed'][index], 1)
            self.assertNotEqual(after['reward'][index], 0)
        for index in (0, 2):
            self.assertFalse((after['state'][index] == before['state'][index]).all())
            self.assertEqual(after['elapsed'][index], 0)
            self.assertEqual(after['reward'][index], 0)
        np.testing.assert_array_equal(after['observ'], pendulum.Pendulum().observe(
            tf.constant(after['state'])))
        self.assertEqual(after['resets'], before['resets'] + 1)

    def test_seed_next_reset_restarts_the_stream_of_reset_seeds(self):
        first, second = _pendulum_env(4, seed=1), _pendulum_env(4, seed=1)
        first.reset()
        first.reset([0, 2])
        first.seed_next_reset(2**40)
        first.reset()
        first.reset([1])
        second.seed_next_reset(2**40)
        second.reset()
        second.reset([1])
        # The same reset seeds from the same value, whatever came before.
        for name, value in _snapshot(first).items():
            np.testing.assert_array_equal(value, _snapshot(second)[name], err_msg=name)
        self.assertEqual(int(first.resets), 2**40 + 2)
        other = _pendulum_env(4, seed=1)
        other.seed_next_reset(2**40 + 1)
        other.reset()
        self.assertFalse((other.state.numpy() == second.state.numpy()).all())
        self.assertTrue(first.state_in_variables)
        for seed, error in ((-1, ValueError), (2**62, ValueError), (1.5, TypeError),
                            (False, TypeError)):
            with self.assertRaises(error):
                first.seed_next_reset(seed)

    def test_blocks_of_a_population_follow_their_own_seeds(self):
        blocks = _pendulum_env(6, seed=[3, 7])
        alone = [_pendulum_env(3, seed=3), _pendulum_env(3, seed=7)]

        def assert_blocks_match():
            np.testing.assert_array_equal(
                blocks.state.numpy(), np.concatenate([env.state.numpy() for env in alone]))

        for env in (blocks, *alone):
            env.reset()
        assert_blocks_match()
        for env, mask in ((blocks, [False, True, False, True, False, False]),
                          (alone[0], [False, True, False]), (alone[1], [True, False, False])):
            env.reset_mask(mask)
        assert_blocks_match()
        blocks.seed_next_reset([11, 2**40])
        alone[0].seed_next_reset(11)
        alone[1].seed_next_reset(2**40)
        for env in (blocks, *alone):
            env.reset()
        assert_blocks_match()
        np.testing.assert_array_equal(blocks.resets.numpy(), [12, 2**40 + 1])
        blocks.seed_next_reset(5)  # One value for every block.
        np.testing.assert_array_equal(blocks.resets.numpy(), [5, 5])
        with self.assertRaisesRegex(ValueError, '3 seeds for 2 blocks'):
            blocks.seed_next_reset([1, 2, 3])
        with self.assertRaisesRegex(ValueError, 'do not split into 4 blocks'):
            _pendulum_env(6, seed=[1, 2, 3, 4])
        with self.assertRaisesRegex(TypeError, 'list of integers'):
            _pendulum_env(6, seed=[1, 2.5])

    def test_reset_mask_equals_reset_indices(self):
        first, second = _pendulum_env(4, seed=1), _pendulum_env(4, seed=1)
        first.reset([1, 3])
        second.reset_mask([False, True, False, True])
        for name, value in _snapshot(first).items():
            np.testing.assert_array_equal(value, _snapshot(second)[name], err_msg=name)

    def test_steps_report_gymnasium_flags_and_time_limit(self):
        env = NativeBatchEnv(cartpole.CartPole(), 3)
        # Near the limit and falling, near the limit and upright, fresh and falling.
        falling = [0.0, 0.0, 0.2094, 2.0]
        env.set_state(np.array([falling, [0.0] * 4, falling]), elapsed=[499, 499, 0])
        _, reward, terminated, truncated = env.step(np.array([1, 1, 1]))
        np.testing.assert_array_equal(terminated, [True, False, True])
        # Gymnasium's TimeLimit truncates at the limit whether or not the episode terminated.
        np.testing.assert_array_equal(truncated, [True, True, False])
        np.testing.assert_array_equal(reward, [1, 1, 1])
        np.testing.assert_array_equal(env.elapsed, [500, 500, 1])

    def test_stepping_an_ended_episode_is_an_error(self):
        env = _pendulum_env(2)
        with self.assertRaisesRegex(tf.errors.InvalidArgumentError, 'reset them first'):
            env.step(np.zeros((2, 1), np.float32))
        env.reset([0])
        before = _snapshot(env)
        with self.assertRaisesRegex(tf.errors.InvalidArgumentError, 'reset them first'):
            env.step(np.zeros((2, 1), np.float32))
        self.assert_unchanged(env, before)

    def test_without_checks_ended_episodes_step_on(self):
        env = _pendulum_env(2, check_inputs=False)
        env.reset([0])
        env.step(np.zeros((2, 1), np.float32))
        np.testing.assert_array_equal(env.elapsed, [1, 1])

    @parameterized.parameters([[[-1]], [[3]], [[0, 5]]])
    def test_rejects_out_of_range_indices(self, indices):
        env = _pendulum_env(3)
        env.reset()
        before = _snapshot(env)
        with self.assertRaisesRegex(tf.errors.InvalidArgumentError, 'indices must be'):
            env.reset(indices)
        with self.assertRaisesRegex(tf.errors.InvalidArgumentError, 'indices must be'):
            env.set_state(np.zeros((len(indices), 2)), indices)
        self.assert_unchanged(env, before)

    def test_rejects_indices_of_another_kind_or_rank(self):
        env = _pendulum_env(3)
        with self.assertRaisesRegex(TypeError, 'indices must be integers'):
            env.reset([0.0, 1.0])
        with self.assertRaisesRegex(ValueError, 'indices must be a vector'):
            env.reset([[0, 1]])
        with self.assertRaisesRegex(ValueError, 'reset mask must be a bool vector of 3'):
            env.reset_mask([True, False])
        with self.assertRaisesRegex(ValueError, 'reset mask must be a bool vector'):
            env.reset_mask([1, 0, 1])

    def test_set_state_checks_shapes_and_elapsed(self):
        env = _pendulum_env(3)
        env.reset()
        before = _snapshot(env)
        with self.assertRaisesRegex(ValueError, 'state shape'):
            env.set_state(np.zeros((2, 2)))
        with self.assertRaisesRegex(ValueError, 'state shape'):
            env.set_state(np.zeros((3, 3)))
        with self.assertRaisesRegex(tf.errors.InvalidArgumentError, 'elapsed must be >= 0'):
            env.set_state(np.zeros((3, 2)), elapsed=-1)
        self.assert_unchanged(env, before)
        observ = env.set_state(np.array([[0.0, 1.0]]), [1], elapsed=7)
        np.testing.assert_allclose(observ, [[1.0, 0.0, 1.0]])
        np.testing.assert_array_equal(env.elapsed, [0, 7, 0])
        np.testing.assert_array_equal(env.done, [False] * 3)

    @parameterized.parameters(0, -2, 1.5, True, None)
    def test_rejects_bad_batch_sizes(self, num_envs):
        with self.assertRaisesRegex(ValueError, 'num_envs must be a positive integer'):
            NativeBatchEnv(pendulum.Pendulum(), num_envs)

    def test_rejects_bad_constructor_arguments(self):
        with self.assertRaisesRegex(TypeError, 'must be a native_env.NativeEnv'):
            NativeBatchEnv(gym.make('Pendulum-v1'), 2)
        with self.assertRaisesRegex(TypeError, 'seed must be an integer'):
            NativeBatchEnv(pendulum.Pendulum(), 2, seed='0')
        with self.assertRaisesRegex(ValueError, r"unknown wrapper 'NormalizeReward'.*known"):
            NativeBatchEnv(pendulum.Pendulum(), 2, wrappers=['NormalizeReward'])
        with self.assertRaisesRegex(TypeError, 'single name'):
            NativeBatchEnv(pendulum.Pendulum(), 2, wrappers='ClipAction')
        with self.assertRaisesRegex(TypeError, 'ClipAction requires a Box'):
            NativeBatchEnv(cartpole.CartPole(), 2, wrappers=['ClipAction'])
        with self.assertRaisesRegex(ValueError, 'dtype must be one of'):
            pendulum.Pendulum(tf.float16)

    def test_wrappers_rescale_and_clip_like_gymnasium(self):
        env = _pendulum_env(2, wrappers=['range_normalize', 'ClipAction'])
        self.assertEqual(env.action_space, gym.spaces.Box(-np.inf, np.inf, (1,), np.float32))
        np.testing.assert_array_equal(env.observation_space.high, [1, 1, 1])
        # Clipped to [-1, 1] first, then scaled to the torque range.
        np.testing.assert_allclose(env.env_action([[1.5], [-0.25]]), [[2.0], [-0.5]])
        env.set_state(np.array([[0.0, 4.0], [np.pi / 2, -8.0]]))
        np.testing.assert_allclose(env.observ, [[1, 0, 0.5], [0, 1, -1]], atol=1e-7)

    def test_simulator_rollout_compiles_with_xla_and_agrees(self):
        rollouts = []
        for jit_compile in (False, True):
            env = _pendulum_env(5, seed=4)
            simulator = simulate.Simulator(env, simulate_testing.ConstantAlgorithm([0.7]))
            rollout = tf.function(
                lambda simulator=simulator: simulator.rollout(250), jit_compile=jit_compile,
                autograph=False)
            rollouts.append(tf.nest.map_structure(np.asarray, rollout()))
        graph, xla = rollouts
        np.testing.assert_array_equal(xla.first, graph.first)
        np.testing.assert_array_equal(xla.truncated, graph.truncated)
        self.assertTrue(graph.truncated[199].all())
        np.testing.assert_allclose(xla.observ, graph.observ, rtol=0, atol=1e-5)
        np.testing.assert_allclose(xla.episode_return, graph.episode_return, rtol=1e-5)


class GinBindingTest(gin_testing.BindingTestCase):
    """A binding of NativeBatchEnv either takes effect where our code makes one, or is refused."""

    def test_bindings_of_arguments_the_caller_sets_are_refused(self):
        self.assert_bindings_refused('NativeBatchEnv', native_batch_env.NOT_GIN_BINDABLE)


if __name__ == '__main__':
    absltest.main()
