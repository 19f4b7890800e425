"""Tests for the environments of a run: both backends, seeds, and mistakes as ConfigErrors."""

import inspect
import sys
from unittest import mock

import gin
import gymnasium as gym
import numpy as np
import tensorflow as tf
from absl.testing import absltest

from agents.envs import native_batch_env
from agents.runs import environments, run_config
from agents.tools import batch_env, envpool_env, external_worker, in_graph_batch_env

# One EnvPool thread per pool: the tests stay light on a shared machine.
ENVPOOL_KWARGS = {'num_threads': 1}
MISSING_ENVPOOL = ("train.env_backend = 'envpool': EnvPool is not installed; install it with: "
                   "pip install 'batchppo[envpool]'")


class EnvironmentsTest(absltest.TestCase):

    def test_gymnasium_backend_trains_and_evaluates_on_separate_batches(self):
        with environments.Environments('Pendulum-v1', 'gymnasium', num_envs=3, eval_episodes=2,
                                       seed=5, mode='in_process') as envs:
            self.assertLen(envs.training, 3)
            self.assertLen(envs.evaluation, 2)
            # Bounded observations rescaled to [-1, 1] by the default wrappers.
            np.testing.assert_array_equal(envs.training.observation_space.high, [1, 1, 1])
            self.assertIsNotNone(envs.make_training)
            rebuilt = envs.make_training()
            try:
                self.assertEqual(rebuilt.num_envs, 3)
            finally:
                rebuilt.close()

    def test_native_backend_has_no_processes_to_rebuild(self):
        with environments.Environments('CartPole-v1', 'native', num_envs=4, eval_episodes=1,
                                       seed=0, wrappers=()) as envs:
            self.assertLen(envs.training, 4)
            self.assertLen(envs.evaluation, 1)
            self.assertIsNone(envs.make_training)
            self.assertIsInstance(envs.training.action_space, gym.spaces.Discrete)

    def test_envpool_backend_has_the_gymnasium_backends_spaces_and_seeds(self):
        # CartPole without wrappers, as configs/cartpole.gin (ClipAction needs a Box).
        for env_id, wrappers in (('Pendulum-v1', environments.DEFAULT_WRAPPERS),
                                 ('CartPole-v1', ()),
                                 ('HalfCheetah-v5', environments.DEFAULT_WRAPPERS),
                                 ('Hopper-v5', environments.DEFAULT_WRAPPERS)):
            observation_space, action_space = environments.spaces(env_id, wrappers=wrappers)
            with self.subTest(env_id=env_id), environments.Environments(
                    env_id, 'envpool', num_envs=3, eval_episodes=2, seed=5,
                    env_kwargs=ENVPOOL_KWARGS, wrappers=wrappers) as envs:
                self.assertLen(envs.training, 3)
                self.assertLen(envs.evaluation, 2)
                for env in (envs.training, envs.evaluation):
                    self.assertIsInstance(env.vector_env.unwrapped, envpool_env.EnvPoolBatchEnv)
                    # As the Gymnasium backend's: float32 Box actions (EnvPool's MuJoCo ones
                    # are float64), bounded observations rescaled to [-1, 1].
                    self.assertEqual(env.observation_space, observation_space)
                    self.assertEqual(env.action_space, action_space)
                # Env i of training starts from seed 5 + i, of evaluation from 1_000_005 + i.
                for env, seed in ((envs.training, 5),
                                  (envs.evaluation, 5 + environments.EVAL_SEED_OFFSET)):
                    twin = environments.make_envpool_env(
                        env_id, len(env), ENVPOOL_KWARGS, wrappers, seed=seed)
                    self.addCleanup(twin.close)
                    np.testing.assert_array_equal(env.reset().numpy(), twin.reset()[0])
                # Each evaluation reseeds (the evaluator's 62-bit seeds): the same episodes
                # for the same seed.
                starts = []
                for seed in (2**62 + 7, 2**62 + 7, 3):
                    envs.evaluation.seed_next_reset(seed)
                    starts.append(envs.evaluation.reset().numpy())
                np.testing.assert_array_equal(starts[0], starts[1])
                self.assertFalse(np.array_equal(starts[0], starts[2]))

    def test_envpool_training_environments_are_rebuilt_and_failures_kept(self):
        with environments.Environments('CartPole-v1', 'envpool', num_envs=2, eval_episodes=1,
                                       seed=0, env_kwargs=ENVPOOL_KWARGS, wrappers=()) as envs:
            old = envs.training.vector_env
            # Neither the stop signal's cancel nor the heartbeat's question waits for anyone.
            old.cancel_wait('stopping')
            self.assertIsNone(old.waiting())
            envs.training.reset()
            with self.assertRaisesRegex(ValueError, r'env 0, np.int64\(5\).*outside'):
                old.step(np.array([5, 0]))
            self.assertIsInstance(old.failure, ValueError)
            # A restart (faults.EnvironmentRestarts): a fresh pool, swapped in and reseeded.
            new = envs.make_training()
            self.assertIsNot(new.unwrapped, old.unwrapped)
            envs.training.replace_vector_env(new, seed=7919).close()
            self.assertIsNone(envs.training.vector_env.failure)
            observ = envs.training.reset().numpy()
            _, reward, _, _ = envs.training.step(np.array([0, 1], np.int32))
            np.testing.assert_array_equal(reward.numpy(), [1.0, 1.0])
            self.assertEqual(observ.shape, (2, 4))

    def test_envpool_batch_size_steps_the_training_environments_in_groups(self):
        with environments.Environments(
                'Pendulum-v1', 'envpool', num_envs=4, eval_episodes=2, seed=5,
                env_kwargs={**ENVPOOL_KWARGS, 'batch_size': 2}) as envs:
            self.assertEqual(envs.training.num_groups, 2)
            self.assertEqual(envs.evaluation.num_groups, 1)  # Evaluations step as one batch.
            # Env i starts from seed 5 + i, as in one pool of 4.
            twin = environments.make_envpool_env('Pendulum-v1', 4, ENVPOOL_KWARGS,
                                                 environments.DEFAULT_WRAPPERS, seed=5)
            self.addCleanup(twin.close)
            np.testing.assert_array_equal(envs.training.reset().numpy(), twin.reset()[0])
            # A restart rebuilds the groups.
            envs.training.replace_vector_env(envs.make_training(), seed=1).close()
            self.assertEqual(envs.training.num_groups, 2)
        for batch_size in (3, 0, 5, 2.0):
            with self.subTest(batch_size=batch_size), self.assertRaisesRegex(
                    run_config.ConfigError, rf"env_kwargs\['batch_size'\] = {batch_size!r} must "
                    'be a positive divisor of train.num_envs = 4'):
                environments.Environments('Pendulum-v1', 'envpool', num_envs=4,
                                          eval_episodes=1, seed=0,
                                          env_kwargs={'batch_size': batch_size})

    def test_envpool_mistakes_are_config_errors_naming_them(self):
        for arguments, message in (
                (dict(env_id='NoSuchEnv-v0'),
                 "^train.env_backend = 'envpool': 'NoSuchEnv-v0' is not an EnvPool task; "
                 r'envpool.list_all_envs\(\) lists them$'),
                (dict(env_id='Pong-v4'),
                 "^train.env_backend = 'envpool': 'Pong-v4' is not an EnvPool task; did you "
                 "mean 'Pong-v5'"),
                (dict(env_id='CheetahRun-v1'),  # dm_control's: neither Gymnasium's nor Atari.
                 "^train.env_backend = 'envpool': 'CheetahRun-v1' is an EnvPool task but not a "
                 r"Gymnasium one; this backend trains those of both \(evaluate and visualize "
                 r"play the policy in Gymnasium's environment\)$"),
                (dict(env_id='Pong-v5'),  # The default wrappers.
                 r"^cannot make environment 'Pong-v5': train.wrappers \['range_normalize', "
                 r"'ClipAction'\] do not fit Atari's uint8 frames and Discrete actions; leave "
                 r'them out \(train.wrappers = \[\], as the default has both\)$'),
                (dict(env_id='Pong-v5', wrappers=['ClipAction']),
                 r"^cannot make environment 'Pong-v5': train.wrappers \['ClipAction'\] do not"),
                (dict(env_id='Pong-v5', wrappers=(), env_kwargs={'no_such_argument': 1}),
                 "^cannot make environment 'Pong-v5': .*no_such_argument"),
                (dict(env_kwargs={'no_such_argument': 1}),
                 "^cannot make environment 'Pendulum-v1': .*no_such_argument"),
                (dict(env_kwargs={'seed': 1}),
                 r"^cannot make environment 'Pendulum-v1': env_kwargs \['seed'\] are set"),
                (dict(wrappers=('NoSuchWrapper',)),
                 "^cannot make environment 'Pendulum-v1': unknown vector wrapper "
                 "'NoSuchWrapper'")):
            arguments = {'env_id': 'Pendulum-v1', **arguments}
            with self.subTest(**arguments), \
                    self.assertRaisesRegex(run_config.ConfigError, message):
                environments.Environments(backend='envpool', num_envs=2, eval_episodes=1,
                                          seed=0, **arguments)
        with self.assertRaisesRegex(run_config.ConfigError, "'NoSuchEnv-v0' is not an EnvPool"):
            environments.check_env_id('NoSuchEnv-v0', 'envpool')
        environments.check_env_id('Hopper-v5', 'envpool')
        environments.check_env_id('Breakout-v5', 'envpool')

    def test_envpool_atari_frames_stay_uint8_in_the_in_graph_envs(self):
        for env_id, actions in (('Pong-v5', 6), ('Breakout-v5', 4)):
            with self.subTest(env_id=env_id), environments.Environments(
                    env_id, 'envpool', num_envs=2, eval_episodes=3, seed=0,
                    env_kwargs=ENVPOOL_KWARGS, wrappers=()) as envs:
                self.assertEqual(envs.training_episodes, ('life_return_clipped', 'life_length'))
                for env, num_envs in ((envs.training, 2), (envs.evaluation, 3)):
                    self.assertEqual(env.observation_space,
                                     gym.spaces.Box(0, 255, (4, 84, 84), np.uint8))
                    self.assertEqual(env.action_space, gym.spaces.Discrete(actions))
                    self.assertEqual(env.observ.dtype, tf.uint8)
                    observ = env.reset().numpy()
                    self.assertEqual((observ.shape, observ.dtype),
                                     ((num_envs, 4, 84, 84), np.uint8))
                    observ, _, _, _ = env.step(np.ones(num_envs, np.int32))
                    self.assertEqual((observ.shape, observ.dtype),
                                     ((num_envs, 4, 84, 84), np.uint8))

    def test_envpool_atari_trains_as_cleanrl_and_evaluates_whole_games(self):
        # The run's env_kwargs reach both; the evaluation's episodic_life and reward_clip are
        # off whatever they say.
        env_kwargs = {**ENVPOOL_KWARGS, 'noop_max': 10}
        for kwargs, training in ((env_kwargs, (True, True)),
                                 ({**env_kwargs, 'reward_clip': False}, (True, False)),
                                 ({**env_kwargs, 'episodic_life': True}, (True, True))):
            with self.subTest(kwargs=kwargs), environments.Environments(
                    'Pong-v5', 'envpool', num_envs=1, eval_episodes=1, seed=0,
                    env_kwargs=kwargs, wrappers=()) as envs:
                for env, expected in ((envs.training, training),
                                      (envs.evaluation, (False, False))):
                    config = env.vector_env.unwrapped.config
                    self.assertEqual((config.episodic_life, config.reward_clip), expected)
                    self.assertEqual((config.noop_max, config.num_threads), (10, 1))
                rebuilt = envs.make_training()
                self.addCleanup(rebuilt.close)
                self.assertEqual(rebuilt.unwrapped.config.episodic_life, True)

    def test_envpool_atari_training_logs_whole_games_where_episodes_are_lives(self):
        # Breakout's games, cut at 40 steps, of envs stepped in groups of 2 (EnvPool's async
        # mode) as the in-graph env steps them; the log outlives a rebuild of the envs.
        kwargs = {**ENVPOOL_KWARGS, 'max_episode_steps': 40, 'batch_size': 2}
        with environments.Environments('Breakout-v5', 'envpool', num_envs=4, eval_episodes=1,
                                       seed=0, env_kwargs=kwargs, wrappers=()) as envs:
            games = envs.training_games
            self.assertIsInstance(games, envpool_env.GameLog)
            envs.training.reset()
            for _ in range(41):
                done = envs.training.done.numpy()
                if done.any():
                    envs.training.reset(np.flatnonzero(done))
                envs.training.step(np.ones(4, np.int32))  # FIRE: the ball moves, lives go.
            scores, lengths = games.take()
            self.assertLen(scores, 4)  # Each env's first game, cut at 40 steps at the latest.
            self.assertTrue(((lengths > 0) & (lengths <= 40)).all(), lengths)
            rebuilt = envs.make_training()
            self.addCleanup(rebuilt.close)
            rebuilt.reset()
            for _ in range(40):
                _, _, terminated, truncated, _ = rebuilt.step(np.ones(4, np.int32))
                if (terminated & ~truncated).any():  # A lost life; a cut game ends the loop.
                    rebuilt.reset(options={'reset_mask': terminated & ~truncated})
            self.assertLen(games.take()[0], 4)
        for kwargs, env_id in (({'episodic_life': False, 'reward_clip': False}, 'Breakout-v5'),
                               ({}, 'Pendulum-v1')):
            with environments.Environments(
                    env_id, 'envpool', num_envs=1, eval_episodes=1, seed=0,
                    env_kwargs={**ENVPOOL_KWARGS, **kwargs}, wrappers=()) as envs:
                self.assertIsNone(envs.training_games)  # Episodes are games, or no games.

    def test_envpool_atari_evaluation_scores_whole_games_unclipped(self):
        # Training and evaluation environments of one seed play the same game under the same
        # actions: training's rewards are the evaluation's clipped, until training's episode
        # ends at the first lost life; the evaluation's episode goes on to the game's end.
        training = environments.make_envpool_env('SpaceInvaders-v5', 1, ENVPOOL_KWARGS, (),
                                                 seed=3)
        self.addCleanup(training.close)
        evaluation = environments.make_envpool_env('SpaceInvaders-v5', 1, ENVPOOL_KWARGS, (),
                                                   seed=3, evaluation=True)
        self.addCleanup(evaluation.close)
        training.reset()
        _, infos = evaluation.reset()
        lives = [infos['lives'][0]]
        rng = np.random.default_rng(0)
        training_ended, rewards, scores, steps = False, [], [], 0
        while True:
            actions = rng.integers(0, 6, 1)
            observ, reward, terminated, truncated, infos = evaluation.step(actions)
            steps += 1
            if not training_ended:
                training_observ, training_reward, training_ended, _, _ = training.step(actions)
                np.testing.assert_array_equal(training_observ, observ)
                self.assertEqual(training_reward[0], np.sign(reward[0]))
                training_ended = training_ended[0]
            rewards.append(reward[0])
            scores.append(infos['reward'][0])
            lives.append(infos['lives'][0])
            if terminated[0] or truncated[0]:
                break
        self.assertFalse(truncated[0])
        self.assertTrue(training_ended)
        self.assertEqual(infos['terminated'][0], 1)  # The game's end, at its last life.
        self.assertEqual((lives[0], lives[-1]), (3, 0))
        self.assertGreater(max(rewards), 1)  # Unclipped: 5 to 30 points an invader.
        self.assertEqual(rewards, scores)
        self.assertEqual(sum(rewards), sum(scores))

    def test_missing_envpool_says_how_to_install_it(self):
        with mock.patch.dict(sys.modules, {'envpool': None}):
            for make in (lambda: environments.check_env_id('Pendulum-v1', 'envpool'),
                         lambda: environments.Environments(
                             'Pendulum-v1', 'envpool', num_envs=2, eval_episodes=1, seed=0)):
                with self.assertRaises(run_config.ConfigError) as raised:
                    make()
                self.assertEqual(str(raised.exception), MISSING_ENVPOOL)
            # The other backends do not need it.
            environments.check_env_id('Pendulum-v1')

    def test_env_factory_applies_wrappers_and_make_kwargs(self):
        env = environments.env_factory('Pendulum-v1', {'g': 9.0}, ('ClipAction',),
                                       max_episode_steps=7)()
        try:
            self.assertEqual(env.unwrapped.g, 9.0)
            env.reset(seed=0)
            steps = 0
            truncated = False
            while not truncated:
                _, _, _, truncated, _ = env.step(env.action_space.sample())
                steps += 1
            self.assertEqual(steps, 7)
        finally:
            env.close()

    def test_action_size(self):
        self.assertEqual(environments.action_size(gym.spaces.Discrete(5)), 5)
        self.assertEqual(environments.action_size(gym.spaces.Box(-1, 1, (3,))), 3)
        with self.assertRaisesRegex(run_config.ConfigError, 'one-dimensional Box'):
            environments.action_size(gym.spaces.Box(-1, 1, (2, 2)))

    def test_mistakes_are_config_errors_naming_them(self):
        for arguments, message in (
                (dict(env_id='Pendulum-v1', env_kwargs={'no_such_argument': 1}),
                 "cannot make environment 'Pendulum-v1': .*no_such_argument"),
                (dict(env_id='Pendulum-v1', wrappers=('NoSuchWrapper',)),
                 "cannot make environment 'Pendulum-v1': .*NoSuchWrapper"),
                (dict(env_id='MountainCar-v0', backend='native'),
                 "no native environment for 'MountainCar-v0'"),
                (dict(env_id='Pendulum-v1', backend='native', env_kwargs={'g': 9.0}),
                 'native environments take no keyword arguments')):
            arguments = {'backend': 'gymnasium', 'mode': 'in_process', **arguments}
            with self.subTest(**arguments), \
                    self.assertRaisesRegex(run_config.ConfigError, message):
                environments.Environments(num_envs=2, eval_episodes=1, seed=0, **arguments)

    def test_unknown_env_id(self):
        environments.check_env_id('Pendulum-v1')
        for env_id, message in (('NoSuchEnv-v0', "unknown env id 'NoSuchEnv-v0'"),
                                ('no_such_module:Env-v0', "unknown env id 'no_such_module"),
                                (3, 'train.env_id must be a string, got 3')):
            with self.subTest(env_id=env_id), \
                    self.assertRaisesRegex(run_config.ConfigError, message):
                environments.check_env_id(env_id)


def _passed(cls, call):
    """The names of the arguments a recorded call of `cls` passed explicitly."""
    return set(inspect.signature(cls).bind(*call.args, **call.kwargs).arguments)


class GinBindingTest(absltest.TestCase):
    """A binding of the classes the run makes takes effect, unless the run passes that argument
    itself; those arguments are refused when the config is parsed (the classes' tests)."""

    def setUp(self):
        super().setUp()
        gin.clear_config()
        self.addCleanup(gin.clear_config)

    def test_batch_env_bindings_reach_the_training_environments(self):
        gin.parse_config([
            'BatchEnv.timeout = 7', 'BatchEnv.close_timeout = 2.5', 'BatchEnv.spin_seconds = 0.25',
            "BatchEnv.start_method = 'spawn'"])
        # The pool is a stand-in: what matters is what BatchEnv hands it.
        with mock.patch.object(external_worker, 'WorkerPool') as pool, \
                mock.patch.object(batch_env, 'BatchEnv', wraps=batch_env.BatchEnv) as made:
            env = environments.make_vector_env(
                environments.env_factory('Pendulum-v1'), 2, 'external', 1)
            env.close()
        self.assertEqual(env.unwrapped._timeout, 7)
        passed = inspect.signature(external_worker.WorkerPool).bind(
            *pool.call_args.args, **pool.call_args.kwargs).arguments
        self.assertEqual(
            {name: passed[name] for name in (
                'start_timeout', 'close_timeout', 'spin_seconds', 'start_method')},
            {'start_timeout': 7, 'close_timeout': 2.5, 'spin_seconds': 0.25,
             'start_method': 'spawn'})
        self.assertContainsSubset(_passed(batch_env.BatchEnv, made.call_args),
                                  batch_env.NOT_GIN_BINDABLE)

    def test_in_graph_batch_env_bindings_reach_both_batches(self):
        gin.parse_config(['InGraphBatchEnv.keep_thread_states = False',
                          "InGraphBatchEnv.name = 'bound_name'"])
        cls = in_graph_batch_env.InGraphBatchEnv
        with mock.patch.object(in_graph_batch_env, 'InGraphBatchEnv', wraps=cls) as made, \
                environments.Environments('Pendulum-v1', 'gymnasium', num_envs=2, eval_episodes=1,
                                          seed=0, mode='in_process') as envs:
            for env in (envs.training, envs.evaluation):
                self.assertIsInstance(env, cls)
                self.assertFalse(env._keep_thread_states)
                self.assertEqual(env.name, 'bound_name')
        self.assertLen(made.call_args_list, 2)
        for call in made.call_args_list:
            self.assertContainsSubset(_passed(cls, call), in_graph_batch_env.NOT_GIN_BINDABLE)

    def test_native_batch_env_bindings_reach_both_batches(self):
        gin.parse_config(["NativeBatchEnv.name = 'bound_name'"])
        cls = native_batch_env.NativeBatchEnv
        with mock.patch.object(native_batch_env, 'NativeBatchEnv', wraps=cls) as made, \
                environments.Environments('Pendulum-v1', 'native', num_envs=2, eval_episodes=1,
                                          seed=0) as envs:
            for env in (envs.training, envs.evaluation):
                self.assertIsInstance(env, cls)
                self.assertEqual(env.name, 'bound_name')
        self.assertLen(made.call_args_list, 2)
        for call in made.call_args_list:
            self.assertContainsSubset(_passed(cls, call), native_batch_env.NOT_GIN_BINDABLE)


if __name__ == '__main__':
    absltest.main()
