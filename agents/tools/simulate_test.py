"""Tests for simulate."""

import gin
import gymnasium as gym
import numpy as np
import tensorflow as tf
from absl.testing import absltest, parameterized

from agents.tools import (
    batch_env,
    in_graph_batch_env,
    mock_vector_env,
    pipelined_env,
    simulate,
    simulate_testing,
)

_ACTION = 0.5


class _RecordingAlgorithm(simulate.Algorithm):
    """Acts constantly and counts the protocol calls per environment in variables.

    `steps` is a per-environment state like that of a recurrent policy: zeroed by
    begin_episode, read and advanced by perform, so its value reveals whether the hooks ran
    in the right order. Without `experience` (see _ExperiencingAlgorithm), rollouts take the
    path that derives episode statistics after the loop.
    """

    def __init__(self, num_envs, action=_ACTION):
        self.begins = tf.Variable(tf.zeros(num_envs, tf.int32))
        self.ends = tf.Variable(tf.zeros(num_envs, tf.int32))
        self.steps = tf.Variable(tf.zeros(num_envs, tf.int32))
        self.action = action

    def begin_episode(self, agent_indices):
        self.begins.scatter_add(tf.IndexedSlices(tf.ones_like(agent_indices), agent_indices))
        self.steps.scatter_update(tf.IndexedSlices(tf.zeros_like(agent_indices), agent_indices))

    def perform(self, agent_indices, observ):
        steps = tf.gather(self.steps, agent_indices)
        self.steps.assign_add(tf.ones_like(self.steps))
        action = tf.fill([tf.size(agent_indices), 1], self.action)
        return action, {'steps': steps, 'nested': (observ[:, 2] * 2,)}

    def end_episode(self, agent_indices):
        self.ends.scatter_add(tf.IndexedSlices(tf.ones_like(agent_indices), agent_indices))


class _ExperiencingAlgorithm(_RecordingAlgorithm):
    """Also sums the rewards of the transitions it experiences, and their episode returns."""

    def __init__(self, num_envs, action=_ACTION):
        super().__init__(num_envs, action)
        self.experienced_reward = tf.Variable(tf.zeros(num_envs, tf.float32))
        self.experienced_return = tf.Variable(tf.zeros(num_envs, tf.float32))

    def experience(self, agent_indices, transition):
        self.experienced_reward.scatter_add(
            tf.IndexedSlices(transition.reward, agent_indices))
        self.experienced_return.scatter_add(
            tf.IndexedSlices(transition.episode_return, agent_indices))


def _make(durations=(1, 2, 3), terminates=(True, False, True), algorithm=None,
          experience=True):
    vector_env = mock_vector_env.MockVectorEnv(durations, terminates)
    env = in_graph_batch_env.InGraphBatchEnv(vector_env)
    if algorithm is None:
        algorithm_type = _ExperiencingAlgorithm if experience else _RecordingAlgorithm
        algorithm = algorithm_type(len(durations))
    return vector_env, simulate.Simulator(env, algorithm), algorithm


def _expected_rollout(durations, terminates, num_steps, action=_ACTION):
    """What the mock environments give over a rollout from scratch, as numpy arrays [T, N]."""
    durations = np.asarray(durations)
    time = np.arange(num_steps)[:, None]
    step = time % durations  # Steps taken in the episode before this one.
    episode = time // durations + 1
    index = np.broadcast_to(np.arange(len(durations)), step.shape)
    ended = step + 1 == durations
    return dict(
        observ=np.stack([index, episode, step, np.where(step == 0, 0, action)], -1),
        next_observ=np.stack([index, episode, step + 1, np.full(step.shape, action)], -1),
        reward=np.broadcast_to(index + 1 + action, step.shape),
        terminated=ended & np.asarray(terminates),
        truncated=ended & ~np.asarray(terminates),
        first=step == 0,
        episode_length=step + 1,
        episode_return=(step + 1) * (index + 1 + action),
        steps=step)


class _NativeTFEnv(tf.Module):
    """The InGraphBatchEnv interface in pure TF ops: episodes of env i last i + 1 steps."""

    num_groups = 1

    def __init__(self, num_envs):
        super().__init__()
        self.observ = tf.Variable(tf.zeros(num_envs))
        self.terminated = tf.Variable(tf.zeros(num_envs, tf.bool))
        self.truncated = tf.Variable(tf.ones(num_envs, tf.bool))
        self.resets = tf.Variable(0)
        self._limit = tf.range(1, num_envs + 1, dtype=tf.float32)

    def __len__(self):
        return self._limit.shape[0]

    def step(self, action):
        observ = self.observ + 1
        terminated = observ >= self._limit
        self.observ.assign(observ)
        self.terminated.assign(terminated)
        self.truncated.assign(tf.zeros_like(terminated))
        return observ, action[:, 0] + observ, terminated, self.truncated.value()

    def reset(self, indices):
        self.resets.assign_add(1)
        self.observ.scatter_update(tf.IndexedSlices(tf.zeros_like(indices, tf.float32), indices))
        done = tf.zeros_like(indices, tf.bool)
        self.terminated.scatter_update(tf.IndexedSlices(done, indices))
        self.truncated.scatter_update(tf.IndexedSlices(done, indices))
        return tf.gather(self.observ, indices)


class SimulatorTest(parameterized.TestCase):

    def assert_transitions_equal(self, rollout, expected):
        for field in ['observ', 'next_observ', 'reward', 'terminated', 'truncated', 'first',
                      'episode_length', 'episode_return']:
            np.testing.assert_allclose(getattr(rollout, field), expected[field], err_msg=field)
        np.testing.assert_array_equal(rollout.extras['steps'], expected['steps'])
        np.testing.assert_array_equal(rollout.extras['nested'][0], 2 * expected['observ'][..., 2])

    @parameterized.named_parameters(('experience', True), ('statistics_afterwards', False))
    def test_rollout_matches_mock_environments(self, experience):
        durations, terminates = (1, 2, 3), (True, False, True)
        vector_env, simulator, algorithm = _make(durations, terminates, experience=experience)
        rollout = simulator.rollout(7)
        self.assertIsInstance(rollout, simulate.Transition)
        self.assertEqual(rollout.observ.shape, (7, 3, 4))
        self.assertEqual(rollout.action.shape, (7, 3, 1))
        self.assertEqual(rollout.episode_length.dtype, tf.int32)
        self.assert_transitions_equal(rollout, _expected_rollout(durations, terminates, 7))
        np.testing.assert_allclose(rollout.action, np.full((7, 3, 1), _ACTION))
        np.testing.assert_allclose(np.stack(vector_env.actions), np.full((7, 3, 1), _ACTION))
        # Episodes begin at steps 0, 2, 4... of env 1, and only finished ones end.
        np.testing.assert_array_equal(algorithm.begins, [7, 4, 3])
        np.testing.assert_array_equal(algorithm.ends, [7, 3, 2])
        if experience:
            np.testing.assert_allclose(
                algorithm.experienced_reward, np.sum(rollout.reward, axis=0), rtol=1e-6)
            np.testing.assert_allclose(
                algorithm.experienced_return, np.sum(rollout.episode_return, axis=0), rtol=1e-6)
        np.testing.assert_allclose(simulator.score, rollout.episode_return[-1])
        np.testing.assert_array_equal(simulator.length, rollout.episode_length[-1])

    @parameterized.named_parameters(('experience', True), ('statistics_afterwards', False))
    def test_completed_episodes_are_read_with_done_mask(self, experience):
        _, simulator, _ = _make((2, 3), (True, False), experience=experience)
        rollout = simulator.rollout(6)
        done = np.logical_or(rollout.terminated, rollout.truncated)
        returns = tf.boolean_mask(rollout.episode_return, done)
        lengths = tf.boolean_mask(rollout.episode_length, done)
        # Row-major order: step 1 (env 0), step 2 (env 1), step 3 (env 0), step 5 (both).
        np.testing.assert_array_equal(lengths, [2, 3, 2, 2, 3])
        np.testing.assert_allclose(returns, [3, 7.5, 3, 3, 7.5])

    @parameterized.named_parameters(('experience', True), ('statistics_afterwards', False))
    def test_rollouts_continue_episodes(self, experience):
        durations, terminates = (2, 3, 5), (False, True, False)
        vector_env, simulator, algorithm = _make(durations, terminates, experience=experience)
        parts = [
            simulator.rollout(4), simulator.rollout(1), simulator.rollout(2), simulator.step()]
        parts[-1] = tf.nest.map_structure(lambda x: x[None], parts[-1])
        rollout = tf.nest.map_structure(lambda *xs: tf.concat(xs, 0), *parts)
        self.assert_transitions_equal(rollout, _expected_rollout(durations, terminates, 8))
        # Episodes that ended at the end of a rollout are reset by the next call only.
        np.testing.assert_array_equal(vector_env.episodes, [4, 3, 2])
        np.testing.assert_array_equal(algorithm.begins, [4, 3, 2])

    @parameterized.named_parameters(('experience', True), ('statistics_afterwards', False))
    def test_forced_reset_aborts_running_episodes(self, experience):
        vector_env, simulator, algorithm = _make(
            (2, 3, 4), (True, True, True), experience=experience)
        simulator.rollout(3)
        rollout = simulator.rollout(2, reset=True)
        np.testing.assert_array_equal(rollout.first, [[True] * 3, [False, False, False]])
        np.testing.assert_array_equal(rollout.episode_length, [[1, 1, 1], [2, 2, 2]])
        np.testing.assert_allclose(rollout.episode_return[0], [1.5, 2.5, 3.5])
        np.testing.assert_array_equal(vector_env.episodes, [3, 2, 2])
        np.testing.assert_array_equal(algorithm.begins, [3, 2, 2])
        # Only the episodes that finished on their own were ended, not the aborted ones.
        np.testing.assert_array_equal(algorithm.ends, [2, 1, 0])
        np.testing.assert_array_equal(rollout.extras['steps'], [[0, 0, 0], [1, 1, 1]])

    def test_reset_as_tensor(self):
        _, simulator, algorithm = _make()
        simulator.step()
        transition = simulator.step(reset=tf.constant([False, True, False]))
        np.testing.assert_array_equal(transition.first, [True, True, False])
        np.testing.assert_array_equal(algorithm.begins, [2, 2, 1])

    def test_step_inside_outer_function(self):
        _, simulator, _ = _make()

        @tf.function
        def two_steps():
            first = simulator.step()
            return first.reward + simulator.step().reward

        np.testing.assert_allclose(two_steps(), [3, 5, 7])

    def test_algorithm_may_create_variables_on_first_use(self):

        class LazyAlgorithm(simulate.Algorithm):
            scale = None

            def perform(self, agent_indices, observ):
                if self.scale is None:
                    self.scale = tf.Variable(0.25)
                return self.scale * tf.ones([tf.size(agent_indices), 1]), ()

        _, simulator, _ = _make(algorithm=LazyAlgorithm())
        rollout = simulator.rollout(3)
        np.testing.assert_allclose(rollout.action, np.full((3, 3, 1), 0.25))
        self.assertEqual(rollout.extras, ())

    def test_native_tf_environment(self):
        env = _NativeTFEnv(3)
        simulator = simulate.Simulator(
            env, simulate_testing.ConstantAlgorithm(np.array([0.5], 'f')))
        rollout = simulator.rollout(4)
        np.testing.assert_array_equal(rollout.next_observ, [[1, 1, 1], [1, 2, 2], [1, 1, 3],
                                                            [1, 2, 1]])
        np.testing.assert_array_equal(rollout.episode_length, rollout.next_observ)
        np.testing.assert_allclose(rollout.episode_return, [[1.5, 1.5, 1.5], [1.5, 4, 4],
                                                            [1.5, 1.5, 7.5], [1.5, 4, 1.5]])
        # Resets ran only on the steps where some episode had ended.
        self.assertEqual(int(env.resets), 4)

    def test_discrete_actions_and_observations(self):
        vector_env = mock_vector_env.MockVectorEnv(
            [2, 3], observation_space=gym.spaces.Discrete(3),
            action_space=gym.spaces.Discrete(4))
        env = in_graph_batch_env.InGraphBatchEnv(vector_env)
        simulator = simulate.Simulator(env, simulate_testing.ConstantAlgorithm(np.int32(3)))
        rollout = simulator.rollout(4)
        self.assertEqual(rollout.observ.dtype, tf.int64)
        self.assertEqual(rollout.action.dtype, tf.int32)
        np.testing.assert_array_equal(rollout.observ, [[0, 0], [1, 1], [0, 2], [1, 0]])
        np.testing.assert_array_equal(np.stack(vector_env.actions), np.full((4, 2), 3))
        np.testing.assert_allclose(rollout.reward, np.full((4, 2), [4, 5]))

    def test_rejects_bad_arguments(self):
        _, simulator, _ = _make()
        with self.assertRaisesRegex(ValueError, 'num_steps must be >= 1'):
            simulator.rollout(0)
        with self.assertRaisesRegex(TypeError, 'num_steps must be a Python int'):
            simulator.rollout(2.0)
        with self.assertRaisesRegex(TypeError, 'must be a simulate.Algorithm'):
            simulate.Simulator(simulator._env, lambda observ: observ)
        incomplete = simulate.Simulator(simulator._env, simulate.Algorithm())
        with self.assertRaisesRegex(NotImplementedError, 'must implement perform'):
            incomplete.step()

    def test_environment_errors_surface_and_state_survives(self):
        vector_env, simulator, _ = _make((2, 2, 2))
        simulator.step()
        nan_policy = simulate.Simulator(
            simulator._env, _RecordingAlgorithm(3, action=float('nan')))
        with self.assertRaisesRegex(tf.errors.OpError, 'NaN'):
            nan_policy.step()
        self.assertLen(vector_env.actions, 1)
        transition = simulator.step()
        np.testing.assert_array_equal(transition.episode_length, [2, 2, 2])

    def test_pendulum_rollout_matches_raw_vector_env(self):
        def make_vector_env():
            envs = [lambda: gym.make('Pendulum-v1', max_episode_steps=4)] * 2
            return gym.vector.SyncVectorEnv(
                envs, autoreset_mode=gym.vector.AutoresetMode.DISABLED)

        env = in_graph_batch_env.InGraphBatchEnv(make_vector_env(), seed=3)
        simulator = simulate.Simulator(
            env, simulate_testing.ConstantAlgorithm(np.array([1.0], 'f')))
        rollout = simulator.rollout(6)
        reference = make_vector_env()
        observ, _ = reference.reset(seed=3)
        rewards = []
        for step in range(6):
            np.testing.assert_allclose(rollout.observ[step], observ, rtol=1e-6)
            observ, reward, _, truncated, _ = reference.step(np.ones((2, 1), np.float32))
            np.testing.assert_allclose(rollout.next_observ[step], observ, rtol=1e-6)
            rewards.append(reward)
            if truncated.all():
                observ, _ = reference.reset()
        np.testing.assert_allclose(rollout.reward, rewards, rtol=1e-5)
        np.testing.assert_array_equal(rollout.truncated[:, 0], [0, 0, 0, 1, 0, 0])
        np.testing.assert_allclose(
            rollout.episode_return[3], np.sum(rewards[:4], axis=0), rtol=1e-5)


class _ObservationAlgorithm(simulate.Algorithm):
    """Pendulum torques that depend on the observation alone, and a count of begun episodes."""

    def __init__(self, num_envs):
        self.begins = tf.Variable(tf.zeros(num_envs, tf.int32))

    def begin_episode(self, agent_indices):
        self.begins.scatter_add(tf.IndexedSlices(tf.ones_like(agent_indices), agent_indices))

    def perform(self, agent_indices, observ):
        return 2.0 * tf.tanh(observ[:, 2:]), {'observ_sum': tf.reduce_sum(observ, 1)}


def _pendulums(num_envs):
    """`num_envs` Gymnasium Pendulums of 7-step episodes, in-process, autoreset disabled."""
    return batch_env.BatchEnv(
        [lambda: gym.make('Pendulum-v1', max_episode_steps=7)] * num_envs, mode='in_process',
        autoreset_mode=gym.vector.AutoresetMode.DISABLED)


class PipelinedRolloutTest(parameterized.TestCase):

    @parameterized.parameters(1, 2, 10)
    def test_groups_give_the_rollout_of_one_batch(self, num_steps):
        rollouts = {}
        for name, vector_env in (
                ('batch', _pendulums(4)),
                ('groups', pipelined_env.PipelinedVectorEnv([_pendulums(2), _pendulums(2)]))):
            env = in_graph_batch_env.InGraphBatchEnv(vector_env, seed=5)
            self.addCleanup(env.close)
            self.assertEqual(env.num_groups, 1 if name == 'batch' else 2)
            algorithm = _ObservationAlgorithm(4)
            simulator = simulate.Simulator(env, algorithm)
            # Two rollouts: the second goes on with the episodes in flight.
            rollouts[name] = [simulator.rollout(num_steps), simulator.rollout(num_steps),
                              algorithm.begins.numpy()]
        for (first, second) in zip(rollouts['batch'][:2], rollouts['groups'][:2], strict=True):
            for field in simulate.Transition._fields:
                tf.nest.map_structure(
                    lambda a, b, field=field: np.testing.assert_array_equal(a, b, err_msg=field),
                    getattr(first, field), getattr(second, field))
        np.testing.assert_array_equal(rollouts['batch'][2], rollouts['groups'][2])
        if num_steps == 10:  # Episodes of 7 steps ended and began again inside the rollouts.
            self.assertTrue(rollouts['groups'][0].truncated.numpy().any())
            np.testing.assert_array_equal(rollouts['groups'][2], [3, 3, 3, 3])

    def test_algorithms_that_experience_each_step_are_refused(self):
        env = in_graph_batch_env.InGraphBatchEnv(
            pipelined_env.PipelinedVectorEnv([_pendulums(1), _pendulums(1)]), seed=0)
        self.addCleanup(env.close)
        simulator = simulate.Simulator(env, _ExperiencingAlgorithm(2))
        with self.assertRaisesRegex(ValueError, 'step it as one batch'):
            simulator.rollout(2)


class EpisodeStatisticsTest(parameterized.TestCase):
    """A rollout's returns and lengths, derived after its loop, against running sums."""

    @staticmethod
    def running_sums(first, reward, score, length):
        scores, lengths = [], []
        with np.errstate(invalid='ignore'):  # inf - inf is NaN, as it should be.
            for starts, rewards in zip(first, reward, strict=True):
                score = np.where(starts, np.float32(0), score) + rewards
                length = np.where(starts, 0, length) + 1
                scores.append(score)
                lengths.append(length)
        return np.array(scores), np.array(lengths)

    @parameterized.named_parameters(('finite', False), ('with_nan_and_infinities', True))
    def test_matches_running_sums(self, nonfinite):
        rng = np.random.default_rng(0)
        for _ in range(50):
            num_steps, num_envs = rng.integers(1, 12), rng.integers(1, 5)
            first = rng.random((num_steps, num_envs)) < 0.3
            reward = (rng.normal(size=(num_steps, num_envs)) * 10).astype(np.float32)
            score = rng.normal(size=num_envs).astype(np.float32)
            length = rng.integers(0, 50, num_envs).astype(np.int32)
            if nonfinite:
                bad = rng.random(reward.shape) < 0.15
                reward[bad] = rng.choice([np.nan, np.inf, -np.inf], bad.sum())
                score[0] = rng.choice([np.nan, np.inf, -np.inf])
            returns, lengths = simulate._episode_statistics(
                tf.constant(first), tf.constant(reward), tf.constant(score),
                tf.constant(length))
            expected_returns, expected_lengths = self.running_sums(first, reward, score, length)
            np.testing.assert_array_equal(lengths, expected_lengths)
            # NaN where the running sum is NaN, the same infinity where it is infinite.
            np.testing.assert_allclose(returns, expected_returns, rtol=1e-5, atol=1e-4)


class NeutralActionTest(parameterized.TestCase):

    @parameterized.parameters(
        (gym.spaces.Box(np.array([-1, 0, -np.inf], 'f'), np.array([3, np.inf, np.inf], 'f')),
         [1, 0, 0]),
        (gym.spaces.Box(np.array([1.0], 'f'), np.array([np.inf], 'f')), [1]),
        (gym.spaces.Discrete(3, start=2), 2),
        (gym.spaces.MultiDiscrete([3, 4], start=[1, 0]), [1, 0]),
        (gym.spaces.MultiBinary(2), [0, 0]),
    )
    def test_neutral_action(self, space, expected):
        action = simulate_testing.neutral_action(space)
        np.testing.assert_array_equal(action, expected)
        self.assertTrue(space.contains(action))

    def test_neutral_action_rejects_structured_spaces(self):
        with self.assertRaisesRegex(TypeError, 'no neutral action'):
            simulate_testing.neutral_action(gym.spaces.Tuple([gym.spaces.Discrete(2)]))


class GinTest(absltest.TestCase):
    """The run constructs its simulators with explicit arguments: no binding may pretend to
    set them."""

    def tearDown(self):
        gin.clear_config()
        super().tearDown()

    def test_simulator_bindings_are_refused(self):
        for binding in ['Simulator.name = "train"', 'Simulator.env = None',
                        'simulate.Simulator.algorithm = None']:
            with self.subTest(binding=binding), self.assertRaisesRegex(
                    ValueError, "No configurable matching '(simulate\\.)?Simulator'"):
                gin.parse_config(binding)


if __name__ == '__main__':
    absltest.main()
