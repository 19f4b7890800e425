"""Tests for in_graph_batch_env."""


import gymnasium as gym
import numpy as np
import tensorflow as tf
from absl.testing import absltest, parameterized

from agents.tools import gin_testing, in_graph_batch_env, mock_vector_env

_DISABLED = gym.vector.AutoresetMode.DISABLED


def _make(durations=(2, 3, 4), **kwargs):
    vector_env = mock_vector_env.MockVectorEnv(durations, **kwargs)
    return vector_env, in_graph_batch_env.InGraphBatchEnv(vector_env)


class InGraphBatchEnvTest(parameterized.TestCase):

    def test_variables_take_shapes_and_dtypes_from_spaces(self):
        _, env = _make(
            observation_space=gym.spaces.Box(-1, 1, (4,), np.float64),
            action_space=gym.spaces.Discrete(3))
        self.assertLen(env, 3)
        self.assertEqual(env.observ.shape, (3, 4))
        self.assertEqual(env.observ.dtype, tf.float64)
        self.assertEqual(env.action.shape, (3,))
        self.assertEqual(env.action.dtype, tf.int64)
        self.assertEqual(env.reward.dtype, tf.float32)
        # Every environment needs a reset before its first step.
        np.testing.assert_array_equal(env.terminated, [False] * 3)
        np.testing.assert_array_equal(env.truncated, [True] * 3)
        np.testing.assert_array_equal(env.done, [True] * 3)

    def test_discrete_observations(self):
        vector_env, env = _make(observation_space=gym.spaces.Discrete(5, start=1))
        self.assertEqual(env.observ.dtype, tf.int64)
        self.assertEqual(env.observ.shape, (3,))
        np.testing.assert_array_equal(tf.function(env.reset)(), [1, 1, 1])
        observ, *_ = tf.function(env.step)(tf.zeros((3, 1)))
        np.testing.assert_array_equal(observ, [2, 2, 2])
        np.testing.assert_array_equal(env.observ, [2, 2, 2])
        self.assertLen(vector_env.actions, 1)

    @parameterized.parameters(True, False)
    def test_reset_all_then_step(self, keep_thread_states):
        vector_env = mock_vector_env.MockVectorEnv([2, 3, 4])
        env = in_graph_batch_env.InGraphBatchEnv(
            vector_env, seed=7, keep_thread_states=keep_thread_states)
        reset, step = tf.function(env.reset), tf.function(env.step)
        observ = reset()
        np.testing.assert_array_equal(observ, [[0, 1, 0, 0], [1, 1, 0, 0], [2, 1, 0, 0]])
        np.testing.assert_array_equal(env.observ, observ)
        np.testing.assert_array_equal(env.done, [False] * 3)
        # A full reset is a plain reset, and the seed goes to the first reset only.
        self.assertEqual(vector_env.reset_seeds, [7])
        action = np.array([[0.5], [0.25], [-1.0]], np.float32)
        observ, reward, terminated, truncated = step(action)
        np.testing.assert_array_equal(vector_env.actions[-1], action)
        np.testing.assert_array_equal(
            observ, [[0, 1, 1, 0.5], [1, 1, 1, 0.25], [2, 1, 1, -1]])
        np.testing.assert_allclose(reward, [1.5, 2.25, 2.0])
        self.assertEqual(reward.dtype, tf.float32)
        np.testing.assert_array_equal(terminated, [False] * 3)
        np.testing.assert_array_equal(truncated, [False] * 3)
        for variable, value in [
                (env.observ, observ), (env.reward, reward), (env.action, action),
                (env.terminated, terminated), (env.truncated, truncated)]:
            np.testing.assert_array_equal(variable, value)
        reset()
        self.assertEqual(vector_env.reset_seeds, [7, None])

    def test_seed_next_reset_seeds_the_next_reset_only(self):
        vector_env = mock_vector_env.MockVectorEnv([2, 3, 4])
        env = in_graph_batch_env.InGraphBatchEnv(vector_env, seed=7)
        reset = tf.function(env.reset)
        reset()
        env.seed_next_reset(2**61)  # Also after a compiled reset: the seed is read when it runs.
        reset([1])
        reset()
        env.seed_next_reset(np.int64(3))
        reset()
        self.assertEqual(vector_env.reset_seeds, [7, 2**61, None, 3])
        self.assertFalse(env.state_in_variables)
        for seed, error in ((-1, ValueError), (1.0, TypeError), (True, TypeError)):
            with self.assertRaises(error):
                env.seed_next_reset(seed)

    def test_terminated_and_truncated_are_separate(self):
        vector_env, env = _make([1, 1, 2], terminates=[True, False, True])
        env.reset()
        _, _, terminated, truncated = tf.function(env.step)(tf.zeros((3, 1)))
        np.testing.assert_array_equal(terminated, [True, False, False])
        np.testing.assert_array_equal(truncated, [False, True, False])
        np.testing.assert_array_equal(env.done, [True, True, False])
        # The final observations stay until the reset.
        np.testing.assert_array_equal(env.observ[:, 2], [1, 1, 1])

    def test_partial_reset(self):
        vector_env, env = _make([1, 1, 1], terminates=[True, False, True])
        env.reset()
        env.step(tf.ones((3, 1)))
        before = env.observ.numpy()
        observ = tf.function(env.reset)(tf.constant([2, 1, 2], tf.int64))
        # Returned in the order of the indices; duplicates reset once.
        np.testing.assert_array_equal(observ, [[2, 2, 0, 0], [1, 2, 0, 0], [2, 2, 0, 0]])
        np.testing.assert_array_equal(vector_env.reset_masks[-1], [False, True, True])
        np.testing.assert_array_equal(env.observ[0], before[0])
        np.testing.assert_array_equal(env.observ[1:], [[1, 2, 0, 0], [2, 2, 0, 0]])
        np.testing.assert_array_equal(env.reward, [2, 0, 0])
        np.testing.assert_array_equal(env.terminated, [True, False, False])
        np.testing.assert_array_equal(env.truncated, [False, False, False])
        np.testing.assert_array_equal(vector_env.episodes, [1, 2, 2])

    def test_empty_reset_changes_nothing(self):
        vector_env, env = _make()
        observ = tf.function(env.reset)(tf.zeros((0,), tf.int32))
        self.assertEqual(observ.shape, (0, 4))
        self.assertEmpty(vector_env.reset_masks)
        np.testing.assert_array_equal(env.truncated, [True] * 3)

    def test_bad_reset_indices(self):
        vector_env, env = _make()
        reset = tf.function(env.reset)
        with self.assertRaisesRegex(tf.errors.OpError, r'must be in \[0, 3\), got \[0, 3\]'):
            reset(tf.constant([0, 3]))
        with self.assertRaisesRegex(tf.errors.OpError, r'got \[-1\]'):
            reset(tf.constant([-1]))
        with self.assertRaisesRegex(TypeError, 'reset indices must be integers'):
            env.reset([0.0])
        with self.assertRaisesRegex(ValueError, 'reset indices must be a vector'):
            env.reset([[0]])
        self.assertEmpty(vector_env.reset_masks)

    def test_step_before_reset_fails_without_touching_state(self):
        vector_env, env = _make()
        with self.assertRaisesRegex(tf.errors.OpError, r'environments \[0, 1, 2\].*reset'):
            tf.function(env.step)(tf.zeros((3, 1)))
        self.assertEmpty(vector_env.actions)
        np.testing.assert_array_equal(env.action, tf.zeros((3, 1)))
        np.testing.assert_array_equal(env.truncated, [True] * 3)

    def test_step_after_episode_end_fails(self):
        vector_env, env = _make([1, 2, 2])
        env.reset()
        env.step(tf.zeros((3, 1)))
        with self.assertRaisesRegex(tf.errors.OpError, r'environments \[0\]'):
            tf.function(env.step)(tf.zeros((3, 1)))
        self.assertLen(vector_env.actions, 1)
        env.reset([0])
        env.step(tf.zeros((3, 1)))
        self.assertLen(vector_env.actions, 2)

    def test_action_cast_within_kind(self):
        vector_env, env = _make()
        env.reset()
        env.step(tf.constant([[0.5], [0.25], [1.0]], tf.float64))
        self.assertEqual(vector_env.actions[-1].dtype, np.float32)
        self.assertEqual(env.action.dtype, tf.float32)

    def test_discrete_actions(self):
        vector_env, env = _make(action_space=gym.spaces.Discrete(4))
        env.reset()
        tf.function(env.step)(tf.constant([3, 0, 2], tf.int32))
        np.testing.assert_array_equal(vector_env.actions[-1], [3, 0, 2])
        self.assertEqual(vector_env.actions[-1].dtype, np.int64)
        with self.assertRaisesRegex(TypeError, 'action dtype float32 does not fit .* int64'):
            env.step(tf.zeros((3,)))

    def test_bad_actions(self):
        vector_env, env = _make()
        env.reset()
        with self.assertRaisesRegex(TypeError, 'action dtype int32 does not fit'):
            env.step(tf.zeros((3, 1), tf.int32))
        with self.assertRaisesRegex(ValueError, r'action shape \(3, 2\) does not match'):
            env.step(tf.zeros((3, 2)))
        with self.assertRaisesRegex(tf.errors.OpError, 'action contains NaN or infinity'):
            tf.function(env.step)(tf.constant([[0.0], [np.nan], [0.0]]))
        self.assertEmpty(vector_env.actions)
        np.testing.assert_array_equal(env.done, [False] * 3)

    def test_requires_disabled_autoreset(self):
        for mode in [gym.vector.AutoresetMode.NEXT_STEP, gym.vector.AutoresetMode.SAME_STEP]:
            vector_env = mock_vector_env.MockVectorEnv([1])
            vector_env.metadata = {'autoreset_mode': mode}
            with self.assertRaisesRegex(ValueError, 'AutoresetMode.DISABLED'):
                in_graph_batch_env.InGraphBatchEnv(vector_env)
        vector_env.metadata = {}
        with self.assertRaisesRegex(ValueError, 'autoreset_mode'):
            in_graph_batch_env.InGraphBatchEnv(vector_env)
        vector_env.metadata = {'autoreset_mode': 'Disabled'}
        in_graph_batch_env.InGraphBatchEnv(vector_env)

    def test_rejects_structured_spaces(self):
        space = gym.spaces.Dict({'a': gym.spaces.Discrete(2)})
        with self.assertRaisesRegex(TypeError, 'observation space must be one of'):
            _make(observation_space=space)
        with self.assertRaisesRegex(TypeError, 'action space must be one of'):
            _make(action_space=space)

    def test_observation_shape_mismatch(self):
        vector_env, env = _make()
        vector_env.single_observation_space = gym.spaces.Box(-1, 1, (5,))  # Lies to the mock.
        env = in_graph_batch_env.InGraphBatchEnv(vector_env)
        with self.assertRaisesRegex(tf.errors.OpError, r'reset returned .* \(3, 4\).*\(3, 5\)'):
            tf.function(env.reset)()

    def test_reset_inside_cond_runs_before_step(self):
        # TF orders stateful ops only through shared variables; a reset in a tf.cond must still
        # run before the following step, or the mock refuses the step.
        vector_env, env = _make([1, 2, 3])

        @tf.function
        def reset_finished_and_step():
            done = env.done
            tf.cond(
                tf.reduce_any(done),
                lambda: tf.size(env.reset(tf.cast(tf.where(done)[:, 0], tf.int32))),
                lambda: 0)
            return env.step(tf.zeros((3, 1)))

        for _ in range(12):
            reset_finished_and_step()
        np.testing.assert_array_equal(vector_env.episodes, [12, 6, 4])

    @parameterized.named_parameters(
        ('float32', 'Pendulum-v1', None),
        ('float64', 'HalfCheetah-v5', None),
        ('matrix', 'Pendulum-v1', (3, 1)),
        ('integer', 'FrozenLake-v1', None))
    def test_matches_raw_vector_env(self, env_id, observ_shape):
        # Observations of each dtype and rank, rewards and flags, across episode ends.
        def make_env():
            env = gym.make(env_id, max_episode_steps=5)
            return gym.wrappers.ReshapeObservation(env, observ_shape) if observ_shape else env

        def make_vector_env():
            return gym.vector.SyncVectorEnv([make_env] * 2, autoreset_mode=_DISABLED)

        reference = make_vector_env()
        reference_observ, _ = reference.reset(seed=5)
        env = in_graph_batch_env.InGraphBatchEnv(make_vector_env(), seed=5)
        self.assertEqual(env.observ.dtype, reference.single_observation_space.dtype)
        step, reset = tf.function(env.step), tf.function(env.reset)
        np.testing.assert_array_equal(reset(), reference_observ)
        reference.action_space.seed(3)
        for _ in range(12):
            actions = reference.action_space.sample()
            observ, reward, terminated, truncated = step(actions)
            reference_observ, reference_reward, *reference_done, _ = reference.step(actions)
            np.testing.assert_array_equal(observ, reference_observ)
            np.testing.assert_array_equal(env.observ, reference_observ)
            np.testing.assert_array_equal(reward, reference_reward.astype(np.float32))
            np.testing.assert_array_equal([terminated, truncated], reference_done)
            done = np.logical_or(*reference_done)
            if done.any():
                reset(np.flatnonzero(done))
                reference.reset(options={'reset_mask': done})

    def test_observations_survive_reuse_of_env_buffers(self):

        class BufferReusingEnv(mock_vector_env.MockVectorEnv):
            buffer = None

            def _observations(self):
                observ = super()._observations()
                if self.buffer is None:  # Aligned, so that TF may use it without a copy.
                    raw = np.zeros(observ.nbytes + 64, np.uint8)
                    start = -raw.ctypes.data % 64
                    self.buffer = raw[start:start + observ.nbytes].view(observ.dtype)
                    self.buffer = self.buffer.reshape(observ.shape)
                self.buffer[...] = observ
                return self.buffer

        env = in_graph_batch_env.InGraphBatchEnv(BufferReusingEnv([5, 5]))
        for step in [env.step, tf.function(env.step)]:  # Eager numpy functions alias outputs.
            initial = env.reset()
            first = step(tf.zeros((2, 1)))[0]
            step(tf.zeros((2, 1)))
            np.testing.assert_array_equal(initial[:, 2], [0, 0])
            np.testing.assert_array_equal(first[:, 2], [1, 1])
            np.testing.assert_array_equal(env.observ[:, 2], [2, 2])

    def test_close(self):
        vector_env, env = _make()
        env.close()
        self.assertTrue(vector_env.closed)


class GinBindingTest(gin_testing.BindingTestCase):
    """A binding of InGraphBatchEnv either takes effect where our code makes one, or is refused."""

    def test_bindings_of_arguments_the_caller_sets_are_refused(self):
        self.assert_bindings_refused('InGraphBatchEnv', in_graph_batch_env.NOT_GIN_BINDABLE)


if __name__ == '__main__':
    absltest.main()
