"""Tests for envpool_env: EnvPool's environments with autoreset disabled.

Where resets differ from Gymnasium: EnvPool draws initial states from its own random number
generators, so the same seed starts other episodes than Gymnasium's environments do. The
dynamics tests therefore copy each of EnvPool's initial states into a Gymnasium environment
(Pendulum's angle and velocity from the observation; HalfCheetah's joint positions and
velocities from the observation, with the x position, which the observation leaves out and
EnvPool's reset infos give as 0, set to 0: the reward only uses its change) and then compare
every step.
"""

import collections
import sys
import types
import warnings
from unittest import mock

import gymnasium as gym
import numpy as np
import tensorflow as tf
from absl.testing import absltest, parameterized

from agents.tools import batch_env, envpool_env, in_graph_batch_env, simulate
from agents.tools import wrappers as wrappers_lib

# One EnvPool thread per pool: the tests stay light on a shared machine.
_KWARGS = {'num_threads': 1}


def _make(env_id, num_envs=2, seed=3, action_dtype=None, **kwargs):
    return envpool_env.EnvPoolBatchEnv(
        env_id, num_envs, seed=seed, env_kwargs={**_KWARGS, **kwargs},
        action_dtype=action_dtype)


def _sync_pendulum(env, observation):
    """Resets Gymnasium's Pendulum `env` (its time limit too) to the state `observation`
    ([cos, sin, angular velocity]) shows."""
    env.reset(seed=0)
    cos, sin, velocity = observation.astype(np.float64)
    env.unwrapped.state = np.array([np.arctan2(sin, cos), velocity])


def _set_cheetah(env, observation, x_position=0.0):
    """Sets Gymnasium's HalfCheetah `env` to the state `observation` shows."""
    nq = env.unwrapped.model.nq
    env.unwrapped.set_state(
        np.concatenate([[x_position], observation[:nq - 1]]), observation[nq - 1:])


class _RandomAlgorithm(simulate.Algorithm):
    """Uniform random actions in `space` (Box or Discrete)."""

    def __init__(self, space):
        self._space = space

    def perform(self, agent_indices, observ):
        del observ
        space, count = self._space, tf.shape(agent_indices)[0]
        if isinstance(space, gym.spaces.Discrete):
            action = tf.random.uniform(
                [count], space.start, space.start + space.n, tf.dtypes.as_dtype(space.dtype))
        else:
            shape = tf.concat([[count], space.shape], 0)
            action = tf.random.uniform(shape, space.low, space.high, space.dtype)
        return action, ()


class _ScriptedAtariSpec:
    """Stands for EnvPool's AtariEnvSpec."""

    def __init__(self, episodic_life):
        self.config = collections.namedtuple('Config', 'episodic_life frame_skip')(
            episodic_life, 4)


class _ScriptedAtariPool:
    """A stand-in for a sync EnvPool Atari pool whose games the actions script: action 1 loses
    a life, 2 scores 10 points, 0 does nothing; a game has 3 lives and a time limit of
    `max_steps` steps. Autoresets as EnvPool does (NEXT_STEP: the step after a lost life, with
    episodic life, goes on with the game, else starts a new one), a reset by id starts a new
    game, and `calls` records each reset and each step of some envs alone.

    The observation of an env is (its game's number, its lives)."""

    LIVES = 3

    def __init__(self, num_envs, episodic_life=False, reward_clip=False, max_steps=100):
        self.spec = _ScriptedAtariSpec(episodic_life)
        self.observation_space = gym.spaces.Box(0, 255, (2,), np.uint8)
        self.action_space = gym.spaces.Discrete(3)
        self._reward_clip, self._max_steps = reward_clip, max_steps
        self.games = np.zeros(num_envs, int)
        self.lives = np.zeros(num_envs, int)
        self.elapsed = np.zeros(num_envs, int)
        self.ended = np.zeros(num_envs, bool)
        self.life_lost = np.zeros(num_envs, bool)
        self.calls = []
        self._sent = None

    def _new_game(self, index):
        self.games[index] += 1
        self.lives[index], self.elapsed[index] = self.LIVES, 0
        self.ended[index] = self.life_lost[index] = False

    def _infos(self, ids, rewards):
        return {'env_id': ids.astype(np.int32), 'players': {'env_id': ids.astype(np.int32)},
                'lives': self.lives[ids].astype(np.int32), 'reward': rewards.astype(np.float32),
                'terminated': (self.lives[ids] == 0).astype(np.int32),
                'elapsed_step': self.elapsed[ids].astype(np.int32)}

    def _observations(self, ids):
        return np.stack([self.games[ids], self.lives[ids]], axis=1).astype(np.uint8)

    def reset(self, env_id=None):
        ids = np.arange(len(self.games)) if env_id is None else np.asarray(env_id)
        self.calls.append(('reset', ids.tolist()))
        for index in ids:
            self._new_game(index)
        return self._observations(ids), self._infos(ids, np.zeros(len(ids)))

    def send(self, actions, env_id=None):
        self._sent = (np.asarray(actions), env_id)

    def recv(self):
        actions, env_id = self._sent
        ids = np.arange(len(self.games)) if env_id is None else np.asarray(env_id)
        rewards = np.zeros(len(ids))
        terminations = np.zeros(len(ids), bool)
        truncations = np.zeros(len(ids), bool)
        for row, (index, action) in enumerate(zip(ids, actions, strict=True)):
            if self.ended[index]:  # EnvPool's autoreset step: the action is ignored.
                if self.life_lost[index]:
                    self.ended[index] = self.life_lost[index] = False
                else:
                    self._new_game(index)
                continue
            self.elapsed[index] += 1
            if action == 1:
                self.lives[index] -= 1
            rewards[row] = 10.0 * (action == 2)
            truncations[row] = self.elapsed[index] >= self._max_steps
            game_over = self.lives[index] == 0 or truncations[row]
            lost = self.spec.config.episodic_life and action == 1 and not game_over
            terminations[row] = self.lives[index] == 0 or lost
            self.ended[index] = terminations[row] or truncations[row]
            self.life_lost[index] = lost
        infos = self._infos(ids, rewards)
        if self._reward_clip:
            rewards = np.sign(rewards)
        return (self._observations(ids), rewards.astype(np.float32), terminations, truncations,
                infos)

    def step(self, actions, env_id=None):
        self.calls.append(('step', np.asarray(env_id).tolist()))
        self.send(actions, env_id)
        return self.recv()

    def close(self):
        pass


class ScriptedEpisodicLifeTest(absltest.TestCase):
    """The resets of an episodic-life pool against scripted games (no EnvPool)."""

    def _make(self, num_envs=2, game_log=None, **kwargs):
        pools = []

        def make(task_id, env_type, num_envs, batch_size, seed, **kwargs):
            del task_id, env_type, batch_size, seed
            pools.append(_ScriptedAtariPool(num_envs, **kwargs))
            return pools[-1]

        envpool = types.SimpleNamespace(
            list_all_envs=lambda: ['Scripted-v5'], make=make,
            atari=types.SimpleNamespace(AtariEnvSpec=_ScriptedAtariSpec))
        patcher = mock.patch.object(envpool_env, 'import_envpool', return_value=envpool)
        patcher.start()
        self.addCleanup(patcher.stop)
        env = envpool_env.EnvPoolBatchEnv('Scripted-v5', num_envs, seed=0, env_kwargs=kwargs,
                                          game_log=game_log)
        self.addCleanup(env.close)
        return env, pools

    def _play(self, env, *actions):
        """Steps `env` with each row of `actions` in turn; resets the envs that ended."""
        for row in actions:
            _, _, terminations, truncations, _ = env.step(np.array(row))
            done = terminations | truncations
            if done.any():
                env.reset(options={'reset_mask': done})

    def test_the_game_log_gets_whole_games_and_their_unclipped_scores(self):
        games = envpool_env.GameLog()
        env, _ = self._make(episodic_life=True, reward_clip=True, game_log=games)
        env.reset()
        # Env 0 scores 10 twice, loses a life (its episode ends, its game goes on), scores
        # again and loses its two other lives: one game of 6 steps, 30 points. Env 1 scores 20
        # (clipped: 2) and plays on.
        self._play(env, [2, 2], [2, 0], [1, 0], [2, 0], [1, 0])
        np.testing.assert_array_equal(games.take()[0], [])  # Lives ended, not games.
        self._play(env, [1, 2])
        scores, lengths = games.take()
        np.testing.assert_array_equal(scores, [30.0])
        np.testing.assert_array_equal(lengths, [6])
        self.assertEqual(scores.dtype, np.float64)
        self.assertEqual(lengths.dtype, np.int64)
        np.testing.assert_array_equal(games.take()[0], [])  # Taken.
        # A reset that starts a new game drops the unfinished one (env 1's 20 points).
        env.reset(options={'reset_mask': np.array([True, True])})
        self._play(env, [0, 1], [0, 1], [0, 1])
        scores, lengths = games.take()
        np.testing.assert_array_equal(scores, [0.0])
        np.testing.assert_array_equal(lengths, [3])

    def test_the_game_log_counts_a_game_cut_by_its_time_limit(self):
        games = envpool_env.GameLog()
        env, _ = self._make(num_envs=2, episodic_life=True, max_steps=3, game_log=games)
        env.reset()
        self._play(env, [2, 0], [1, 2], [0, 2], [2, 0])
        scores, lengths = games.take()
        np.testing.assert_array_equal(scores, [10.0, 20.0])  # In the order the games ended.
        np.testing.assert_array_equal(lengths, [3, 3])
        # A full reset (InGraphBatchEnv's, when all ended) starts new games: one step of each.
        env.reset()
        self._play(env, [2, 2])
        np.testing.assert_array_equal(games.take()[0], [])

    def test_a_lost_lifes_reset_goes_on_with_the_game(self):
        env, pools = self._make(episodic_life=True, reward_clip=True)
        pool = pools[0]
        observations, _ = env.reset()
        np.testing.assert_array_equal(observations, [[1, 3], [1, 3]])  # Game 1, 3 lives.
        # Env 0 loses a life, env 1 scores.
        observations, rewards, terminations, _, infos = env.step(np.array([1, 2]))
        np.testing.assert_array_equal(terminations, [True, False])
        np.testing.assert_array_equal(rewards, [0, 1])  # Clipped; info['reward'] is not.
        np.testing.assert_array_equal(infos['reward'], [0, 10])
        pool.calls.clear()
        observations, infos = env.reset(options={'reset_mask': np.array([True, False])})
        self.assertEqual(pool.calls, [('step', [0])])  # EnvPool's autoreset, not its reset.
        np.testing.assert_array_equal(observations, [[1, 2], [1, 3]])  # Same game, 2 lives.
        np.testing.assert_array_equal(infos['_lives'], [True, False])
        np.testing.assert_array_equal(infos['lives'], [2, 0])
        # Game over: a new game.
        for lives in (1, 0):
            _, _, terminations, _, infos = env.step(np.array([1, 0]))
            np.testing.assert_array_equal(terminations, [True, False])
            np.testing.assert_array_equal(infos['lives'], [lives, 3])
            pool.calls.clear()
            observations, _ = env.reset(options={'reset_mask': np.array([True, False])})
        self.assertEqual(pool.calls, [('reset', [0])])
        np.testing.assert_array_equal(observations, [[2, 3], [1, 3]])

    def test_a_full_reset_goes_on_with_games_of_lost_lives_only(self):
        # InGraphBatchEnv resets all envs with a full reset when all ended (always, for one).
        env, pools = self._make(num_envs=3, episodic_life=True)
        pool = pools[0]
        env.reset()
        env.step(np.array([1, 0, 1]))  # Envs 0 and 2 lose a life, env 1 goes on.
        pool.calls.clear()
        observations, infos = env.reset()
        self.assertEqual(pool.calls, [('reset', [1]), ('step', [0, 2])])
        np.testing.assert_array_equal(observations, [[1, 2], [2, 3], [1, 2]])
        np.testing.assert_array_equal(infos['_env_id'], [True, True, True])
        np.testing.assert_array_equal(infos['players']['env_id'], [0, 1, 2])
        env.step(np.array([0, 0, 0]))  # Allowed: every env was reset.
        # A seeded reset makes a new pool: new games, also after a lost life.
        env.step(np.array([1, 0, 0]))
        observations, _ = env.reset(seed=5)
        self.assertLen(pools, 2)
        self.assertEqual(pools[1].calls, [('reset', [0, 1, 2])])
        np.testing.assert_array_equal(observations, [[1, 3]] * 3)

    def test_a_time_limit_ends_the_game(self):
        env, pools = self._make(num_envs=1, episodic_life=True, max_steps=2)
        env.reset()
        env.step(np.array([0]))
        _, _, terminations, truncations, _ = env.step(np.array([1]))  # A life, and the time.
        self.assertEqual((terminations[0], truncations[0]), (False, True))
        pools[0].calls.clear()
        observations, _ = env.reset()
        self.assertEqual(pools[0].calls, [('reset', [0])])
        np.testing.assert_array_equal(observations, [[2, 3]])

    def test_without_episodic_life_an_episode_is_a_game(self):
        env, pools = self._make(num_envs=1)
        env.reset()
        for lives in (2, 1):
            _, _, terminations, _, infos = env.step(np.array([1]))
            self.assertEqual((terminations[0], infos['lives'][0]), (False, lives))
        _, _, terminations, _, _ = env.step(np.array([1]))
        self.assertTrue(terminations[0])
        pools[0].calls.clear()
        env.reset(options={'reset_mask': np.array([True])})
        self.assertEqual(pools[0].calls, [('reset', [0])])


class EnvPoolBatchEnvTest(parameterized.TestCase):

    def setUp(self):
        super().setUp()
        self.rng = np.random.default_rng(123)

    def _uniform(self, space, num_envs):
        return self.rng.uniform(space.low, space.high, (num_envs, *space.shape)).astype(
            space.dtype)

    @parameterized.parameters('Pendulum-v1', 'HalfCheetah-v5')
    def test_spaces_and_dtypes_are_gymnasiums(self, env_id):
        reference = gym.make(env_id)
        self.addCleanup(reference.close)
        env = _make(env_id, num_envs=3, action_dtype=reference.action_space.dtype)
        self.addCleanup(env.close)
        self.assertEqual(env.single_observation_space, reference.observation_space)
        self.assertEqual(env.single_action_space, reference.action_space)
        self.assertEqual(env.observation_space,
                         gym.vector.utils.batch_space(reference.observation_space, 3))
        self.assertEqual(env.action_space,
                         gym.vector.utils.batch_space(reference.action_space, 3))
        self.assertEqual(env.metadata['autoreset_mode'], gym.vector.AutoresetMode.DISABLED)
        observations, _ = env.reset()
        self.assertEqual(observations.shape, env.observation_space.shape)
        self.assertEqual(observations.dtype, reference.observation_space.dtype)
        observations, rewards, terminations, truncations, infos = env.step(
            self._uniform(env.single_action_space, 3))
        self.assertEqual(observations.dtype, reference.observation_space.dtype)
        self.assertEqual(rewards.dtype, np.float32)  # EnvPool's; BatchEnv's are float64.
        self.assertEqual((rewards.shape, terminations.shape, truncations.shape), ((3,),) * 3)
        self.assertEqual((terminations.dtype, truncations.dtype), (np.bool_, np.bool_))
        np.testing.assert_array_equal(infos['env_id'], [0, 1, 2])

    def test_pendulums_rounded_bounds_are_not_warned_about(self):
        # EnvPool gives its float32 observation space float64 bounds; Gymnasium's warning
        # about rounding them would show in every run.
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter('always')
            env = _make('Pendulum-v1')
            self.addCleanup(env.close)
            env.reset()
            env.reset(seed=7)  # A new pool.
            env.step(np.zeros((2, 1), np.float32))
        self.assertEqual([str(warning.message) for warning in caught], [])

    def test_half_cheetah_actions_are_float64_unless_asked(self):
        # Gymnasium's MuJoCo environments declare float32 actions, EnvPool float64.
        env = _make('HalfCheetah-v5')
        self.addCleanup(env.close)
        self.assertEqual(env.single_action_space, gym.spaces.Box(-1, 1, (6,), np.float64))
        self.assertEqual(env.single_observation_space.dtype, np.float64)
        with self.assertRaisesRegex(ValueError, 'action_dtype must be a float dtype'):
            _make('CartPole-v1', action_dtype=np.float32)

    def test_pendulum_matches_gymnasium_through_partial_resets(self):
        env = _make('Pendulum-v1')
        self.addCleanup(env.close)
        references = [gym.make('Pendulum-v1') for _ in range(2)]
        for reference in references:
            self.addCleanup(reference.close)
        observations, _ = env.reset(seed=3)
        for reference, observation in zip(references, observations, strict=True):
            _sync_pendulum(reference, observation)
        elapsed = np.zeros(2, int)
        for step in range(1, 261):
            if step == 61:  # Env 0 starts a new episode: from now on the two end apart.
                previous = observations
                observations, infos = env.reset(options={'reset_mask': np.array([True, False])})
                np.testing.assert_array_equal(observations[1], previous[1])
                np.testing.assert_array_equal(infos['_env_id'], [True, False])
                self.assertEqual(infos['elapsed_step'][0], 0)
                _sync_pendulum(references[0], observations[0])
                elapsed[0] = 0
            actions = self._uniform(env.single_action_space, 2)
            observations, rewards, terminations, truncations, infos = env.step(actions)
            elapsed += 1
            np.testing.assert_array_equal(infos['elapsed_step'], elapsed)
            for index, reference in enumerate(references):
                observation, reward, terminated, truncated, _ = reference.step(actions[index])
                np.testing.assert_allclose(observations[index], observation, atol=1e-5)
                np.testing.assert_allclose(rewards[index], reward, atol=1e-5)
                self.assertEqual((terminations[index], truncations[index]),
                                 (terminated, truncated))
            # Pendulum's 200-step time limit truncates env 1 at step 200, env 0 at step 260.
            np.testing.assert_array_equal(truncations, [step == 260, step == 200])
            np.testing.assert_array_equal(terminations, [False, False])
            if step == 200:
                with self.assertRaisesRegex(RuntimeError, r'envs \[1\] finished'):
                    env.step(actions)  # Not stepped: EnvPool would spend it on its autoreset.
                previous = observations
                observations, infos = env.reset(options={'reset_mask': np.array([False, True])})
                np.testing.assert_array_equal(observations[0], previous[0])
                self.assertFalse(np.array_equal(observations[1], previous[1]))
                np.testing.assert_array_equal(infos['_env_id'], [False, True])
                np.testing.assert_array_equal(infos['env_id'], [0, 1])
                _sync_pendulum(references[1], observations[1])
                # The next step is an ordinary one (elapsed_step 1, the action used): the
                # Gymnasium comparison above checks it.
                elapsed[1] = 0

    def test_half_cheetah_matches_gymnasium(self):
        env = _make('HalfCheetah-v5', seed=5, action_dtype=np.float32)
        self.addCleanup(env.close)
        references = [gym.make('HalfCheetah-v5') for _ in range(2)]
        for reference in references:
            self.addCleanup(reference.close)
            reference.reset(seed=0)
        observations, _ = env.reset()
        for reference, observation in zip(references, observations, strict=True):
            _set_cheetah(reference, observation)
        for step in range(1, 1001):
            if step > 20:
                # The dynamics are chaotic: 1e-13 apart (EnvPool links MuJoCo 3.6, Gymnasium
                # uses 4.0), the two drift apart after about 50 steps, as Gymnasium does against
                # itself. After 20 open-loop steps, each step starts from EnvPool's state.
                for reference, observation in zip(references, observations, strict=True):
                    _set_cheetah(reference, observation, reference.unwrapped.data.qpos[0])
            actions = self._uniform(env.single_action_space, 2)
            observations, rewards, terminations, truncations, _ = env.step(actions)
            for index, reference in enumerate(references):
                observation, reward, terminated, truncated, _ = reference.step(actions[index])
                np.testing.assert_allclose(observations[index], observation, atol=1e-9)
                np.testing.assert_allclose(rewards[index], reward, atol=1e-5)  # float32
                self.assertEqual((terminations[index], truncations[index]),
                                 (terminated, truncated))
        np.testing.assert_array_equal(truncations, [True, True])  # At the 1000-step limit.

    @parameterized.parameters(('CartPole-v1', {}), ('Pendulum-v1', {'max_episode_steps': 50}))
    def test_in_graph_rollout_matches_a_replay(self, env_id, kwargs):
        env = in_graph_batch_env.InGraphBatchEnv(_make(env_id, num_envs=4, **kwargs), seed=11)
        self.addCleanup(env.close)
        simulator = simulate.Simulator(env, _RandomAlgorithm(env.action_space))
        rollout = simulator.rollout(300)
        done = rollout.terminated.numpy() | rollout.truncated.numpy()
        # Several episodes, which (CartPole) end at different steps: partial resets.
        self.assertGreater(done.sum(), 4 * 5)
        self.assertTrue(rollout.first.numpy()[0].all())
        # The same seed and actions, stepped and reset in numpy.
        replay = _make(env_id, num_envs=4, seed=0, **kwargs)
        self.addCleanup(replay.close)
        observations, _ = replay.reset(seed=11)
        ended = np.zeros(4, bool)
        for step, actions in enumerate(rollout.action.numpy()):
            if ended.any():
                observations, _ = replay.reset(options={'reset_mask': ended})
            np.testing.assert_array_equal(rollout.observ[step], observations)
            observations, rewards, terminations, truncations, _ = replay.step(actions)
            np.testing.assert_array_equal(rollout.next_observ[step], observations)
            np.testing.assert_array_equal(rollout.reward[step], rewards)
            np.testing.assert_array_equal(rollout.terminated[step], terminations)
            np.testing.assert_array_equal(rollout.truncated[step], truncations)
            ended = terminations | truncations

    def test_default_wrappers_through_the_in_graph_env(self):
        # The runs' default wrappers, applied to the batch: spaces as the Gymnasium backend's.
        names = ('range_normalize', 'ClipAction')
        wrapped = wrappers_lib.apply_wrappers(_make('Pendulum-v1', num_envs=3), names)
        reference = wrappers_lib.apply_wrappers(gym.make('Pendulum-v1'), names)
        self.addCleanup(reference.close)
        self.assertEqual(wrapped.single_observation_space, reference.observation_space)
        self.assertEqual(wrapped.single_action_space, reference.action_space)
        env = in_graph_batch_env.InGraphBatchEnv(wrapped, seed=1)
        self.addCleanup(env.close)
        simulator = simulate.Simulator(
            env, _RandomAlgorithm(gym.spaces.Box(-1, 1, (1,), np.float32)))
        rollout = simulator.rollout(250)
        self.assertEqual(rollout.observ.shape, (250, 3, 3))
        self.assertTrue(np.all(np.abs(rollout.next_observ.numpy()) <= 1 + 1e-6))
        np.testing.assert_array_equal(rollout.truncated.numpy().sum(axis=0), [1, 1, 1])

    def test_seeds(self):
        env = _make('Pendulum-v1', num_envs=3)
        self.addCleanup(env.close)
        first, _ = env.reset(seed=5)
        env.step(np.zeros((3, 1), np.float32))
        unseeded, _ = env.reset()
        self.assertFalse(np.array_equal(unseeded, first))  # New episodes from the same pool.
        again, _ = env.reset(seed=5)  # A new pool: the same episodes.
        np.testing.assert_array_equal(again, first)
        listed, _ = env.reset(seed=[5, 6, 7])
        np.testing.assert_array_equal(listed, first)
        other = _make('Pendulum-v1', num_envs=1, seed=6)  # Env i gets seed + i.
        self.addCleanup(other.close)
        np.testing.assert_array_equal(other.reset()[0][0], first[1])
        # EnvPool's seeds are int32: larger ones (evaluation's 62-bit seeds) are folded.
        folded, _ = env.reset(seed=2**62 + 5)
        np.testing.assert_array_equal(folded, first)
        for seed, error in ((-1, ValueError), ([1, 2], ValueError), ([1, None, 2], TypeError),
                            ('5', TypeError)):
            with self.assertRaises(error):
                env.reset(seed=seed)
        with self.assertRaisesRegex(ValueError, 'takes no'):
            env.reset(seed=1, options={'reset_mask': np.array([True, False, False])})

    def test_order_of_calls(self):
        env = _make('Pendulum-v1')
        actions = np.zeros((2, 1), np.float32)
        with self.assertRaisesRegex(RuntimeError, 'full reset'):
            env.step(actions)
        env.reset(options={'reset_mask': np.array([True, False])})
        with self.assertRaisesRegex(RuntimeError, 'full reset'):
            env.step(actions)
        env.reset()
        env.step_async(actions)
        with self.assertRaises(gym.error.AlreadyPendingCallError):
            env.step_async(actions)
        with self.assertRaises(gym.error.AlreadyPendingCallError):
            env.reset()
        self.assertLen(env.step_wait(), 5)
        with self.assertRaises(gym.error.NoAsyncCallError):
            env.step_wait()
        env.cancel_wait('stopping')  # Nothing to cancel.
        self.assertIsNone(env.waiting())
        env.close(terminate=True)
        self.assertTrue(env.closed)
        with self.assertRaises(gym.error.ClosedEnvironmentError):
            env.reset()

    def test_partial_reset_puts_each_row_in_its_place(self):
        # Each env draws its initial states from its own generator, so a twin's second full
        # reset tells what the reset envs must show.
        env, twin = _make('Pendulum-v1', num_envs=3), _make('Pendulum-v1', num_envs=3)
        self.addCleanup(env.close)
        self.addCleanup(twin.close)
        first, _ = env.reset()
        twin.reset()
        second, _ = twin.reset()
        observations, infos = env.reset(options={'reset_mask': np.array([True, False, True])})
        np.testing.assert_array_equal(observations, [second[0], first[1], second[2]])
        np.testing.assert_array_equal(infos['_env_id'], [True, False, True])
        np.testing.assert_array_equal(infos['env_id'], [0, 0, 2])

    def test_reset_options_are_checked(self):
        env = _make('Pendulum-v1')
        self.addCleanup(env.close)
        for options, error in (
                ({'reset_mask': [True, False]}, TypeError),
                ({'reset_mask': np.array([True])}, ValueError),
                ({'reset_mask': np.array([1, 0])}, TypeError),
                ({'reset_mask': np.array([False, False])}, ValueError),
                ({'reset_mask': np.array([True, True]), 'other': 1}, ValueError)):
            with self.assertRaises(error):
                env.reset(options=options)

    def test_bad_actions_are_refused_before_envpool_sees_them(self):
        # BatchEnv's checks (batch_env.ActionChecker): EnvPool would read a wrong shape out of
        # bounds (or abort the process) and step with a Discrete action out of range. A twin
        # stepped with the good actions alone shows that nothing was stepped.
        for env_id, good, bad in (
                ('Pendulum-v1', np.array([[0.5], [-1.0], [2.0]], np.float32), (
                    (np.zeros((2, 1), np.float32), ValueError, r'shape \(3, 1\)'),
                    (np.zeros((3,), np.float32), ValueError, r'shape \(3, 1\)'),
                    (np.zeros((3, 2), np.float32), ValueError, r'shape \(3, 1\)'),
                    (np.full((3, 1), 'a'), TypeError, 'dtype <U1'))),
                ('CartPole-v1', np.array([1, 0, 1]), (
                    (np.array([0, 2, 1]), ValueError, r'env 1, np.int64\(2\).*outside'),
                    (np.array([0, -1, 1]), ValueError, r'env 1, np.int64\(-1\).*outside'),
                    (np.array([0.0, 1.0, 1.0]), TypeError, 'dtype float64'),
                    (np.array([[0], [1], [1]]), ValueError, r'shape \(3,\)')))):
            with self.subTest(env_id=env_id):
                env, twin = _make(env_id, num_envs=3), _make(env_id, num_envs=3)
                self.addCleanup(env.close)
                self.addCleanup(twin.close)
                env.reset()
                twin.reset()
                for actions, error_type, message in bad:
                    with self.assertRaisesRegex(
                            error_type, f'{message}.*{batch_env.NOTHING_STEPPED}'):
                        env.step(actions)
                self._assert_steps_alike(env, twin, good)

    def test_bad_box_values_found_while_envpool_steps_discard_the_step(self):
        # A Box action's NaN (which EnvPool passes on) or value out of bounds (which it clips)
        # is found while EnvPool steps with it: the step is discarded and a full reset asked
        # for, after which the envs step as a twin that never saw the bad action.
        good = np.array([[0.5], [-1.0], [2.0]], np.float32)
        for actions, message in (
                (np.array([[0.0], [np.nan], [0.0]]), r'env 1, .*is NaN'),
                (np.array([[0.0], [0.0], [2.5]]), r'env 2, .*outside.*'),
                (np.array([[-9.0], [0.0], [np.nan]], np.float32),
                 r'env 0, .*outside.* also for envs \[2\]')):
            with self.subTest(actions=actions.tolist()):
                env, twin = _make('Pendulum-v1', num_envs=3), _make('Pendulum-v1', num_envs=3)
                self.addCleanup(env.close)
                self.addCleanup(twin.close)
                env.reset()
                twin.reset()
                with self.assertRaises(ValueError) as raised:
                    env.step(actions)
                self.assertRegex(str(raised.exception), message)
                self.assertTrue(str(raised.exception).endswith(envpool_env.STEP_DISCARDED))
                with self.assertRaisesRegex(RuntimeError, r'needs a full reset\(\)'):
                    env.step(good)
                np.testing.assert_array_equal(env.reset()[0], twin.reset()[0])
                self._assert_steps_alike(env, twin, good)

    def _assert_steps_alike(self, env, twin, actions):
        for _ in range(3):
            stepped, expected = env.step(actions), twin.step(actions)
            for value, reference in zip(stepped[:4], expected[:4], strict=True):
                np.testing.assert_array_equal(value, reference)
            np.testing.assert_array_equal(stepped[4]['elapsed_step'],
                                          expected[4]['elapsed_step'])

    def test_missing_envpool_says_how_to_install_it(self):
        with mock.patch.dict(sys.modules, {'envpool': None}):
            with self.assertRaises(envpool_env.EnvPoolMissingError) as raised:
                envpool_env.EnvPoolBatchEnv('Pendulum-v1', 2)
        self.assertIsInstance(raised.exception, ImportError)
        self.assertEqual(
            str(raised.exception),
            "EnvPool is not installed; install it with: pip install 'batchppo[envpool]'")

    def test_bad_arguments(self):
        with self.assertRaisesRegex(ValueError, 'not an EnvPool task'):
            envpool_env.EnvPoolBatchEnv('Nope-v0', 2)
        with self.assertRaisesRegex(ValueError, 'num_envs must be'):
            envpool_env.EnvPoolBatchEnv('Pendulum-v1', 0)
        with self.assertRaisesRegex(ValueError, r"\['batch_size', 'seed'\] are set by"):
            envpool_env.EnvPoolBatchEnv(
                'Pendulum-v1', 2, env_kwargs={'batch_size': 1, 'seed': 1})
        with self.assertRaises(TypeError):  # EnvPool's own check.
            envpool_env.EnvPoolBatchEnv('Pendulum-v1', 2, env_kwargs={'no_such_kwarg': 1})
        with self.assertRaisesRegex(ValueError, "game_log is for Atari games, and "
                                                "'Pendulum-v1' is not one"):
            envpool_env.EnvPoolBatchEnv('Pendulum-v1', 2, game_log=envpool_env.GameLog())


    def test_atari_frames_render_and_config(self):
        env = _make('Pong-v5', render_mode='rgb_array')
        self.addCleanup(env.close)
        self.assertEqual(env.single_observation_space,
                         gym.spaces.Box(0, 255, (4, 84, 84), np.uint8))
        self.assertEqual(env.single_action_space, gym.spaces.Discrete(6))
        observations, _ = env.reset()
        self.assertEqual((observations.shape, observations.dtype), ((2, 4, 84, 84), np.uint8))
        observations, _, _, _, _ = env.step(np.array([0, 1]))
        self.assertEqual(observations.dtype, np.uint8)
        frames = env.render()
        self.assertEqual((frames.shape, frames.dtype), ((2, 210, 160, 3), np.uint8))
        self.assertEqual((env.config.frame_skip, env.config.stack_num), (4, 4))
        self.assertEqual(env.metadata['render_modes'], ['rgb_array'])

    def test_atari_lost_lives_continue_the_game_as_envpools_autoreset_does(self):
        # CleanRL trains on EnvPool's NEXT_STEP autoreset, whose step after a lost life goes on
        # with the same game. Our resets must give the same episodes: a twin pool of the same
        # seed, autoresetting, sees the same frames, rewards, lives and ends at every step.
        import envpool  # noqa: PLC0415 (the module imports without it)
        kwargs = {**_KWARGS, 'episodic_life': True, 'reward_clip': True}
        env = envpool_env.EnvPoolBatchEnv('Breakout-v5', 1, seed=4, env_kwargs=kwargs)
        self.addCleanup(env.close)
        twin = envpool.make('Breakout-v5', env_type='gymnasium', num_envs=1, batch_size=1,
                            seed=4, **kwargs)
        self.addCleanup(twin.close)
        observations, _ = env.reset()
        np.testing.assert_array_equal(observations, twin.reset()[0])
        ended, starts = False, []
        for step in range(2000):
            if [lives for lives, _ in starts].count(5) == 2:  # Two whole games.
                break
            actions = self.rng.integers(0, 4, 1).astype(np.int32)
            if ended:
                # Masked and full resets alike (InGraphBatchEnv resets all with a full one).
                observations, infos = (env.reset() if step % 2 else
                                       env.reset(options={'reset_mask': np.array([True])}))
                twin_observations, reward, _, _, twin_infos = twin.step(actions)  # Ignored.
                np.testing.assert_array_equal(observations, twin_observations)
                self.assertEqual(reward[0], 0)
                starts.append((int(infos['lives'][0]), int(infos['elapsed_step'][0])))
                self.assertEqual(starts[-1], (twin_infos['lives'][0],
                                              twin_infos['elapsed_step'][0]))
            stepped, expected = env.step(actions), twin.step(actions)
            for value, reference in zip(stepped[:4], expected[:4], strict=True):
                np.testing.assert_array_equal(value, reference)
            ended = bool(stepped[2][0] or stepped[3][0])
        # Two games of 5 lives: each lost life's reset goes on with the game (the step count
        # too); the game over's starts a new one.
        self.assertEqual([lives for lives, _ in starts], [4, 3, 2, 1, 5, 4, 3, 2, 1, 5])
        self.assertEqual([elapsed > 0 for _, elapsed in starts], [True] * 4 + [False] +
                         [True] * 4 + [False])
        # Why the reset of a lost life is EnvPool's autoreset step: its reset by id starts a
        # new game.
        lost = None
        while lost is None:
            _, _, terminations, _, infos = twin.step(np.array([1], np.int32))
            if terminations[0] and not infos['terminated'][0]:  # A life lost, not the game.
                lost = infos['lives'][0]
        self.assertBetween(lost, 1, 4)
        self.assertEqual(twin.reset(np.array([0], np.int32))[1]['lives'][0], 5)


if __name__ == '__main__':
    absltest.main()
