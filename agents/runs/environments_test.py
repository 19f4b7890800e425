"""Tests for the environments of a run: both backends, seeds, and mistakes as ConfigErrors."""

import inspect
from unittest import mock

import gin
import gymnasium as gym
import numpy as np
from absl.testing import absltest

from agents.envs import native_batch_env
from agents.runs import environments, run_config
from agents.tools import batch_env, external_worker, in_graph_batch_env


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
