"""Tests for the registry of algorithms: every entry is an algorithm, every config names one."""

import functools
import glob
import os

import gin
from absl.testing import absltest

from agents.algorithms import algorithm, registry
from agents.runs import loop, run_config


class _Lone(algorithm.OnPolicyAlgorithm):
    """An algorithm that does not train as a population (MEMBER_HYPERPARAMETERS None)."""


class RegistryTest(absltest.TestCase):

    def tearDown(self):
        gin.clear_config()
        super().tearDown()

    def test_entries_are_algorithms_under_their_gin_names(self):
        self.assertNotEmpty(registry.ALGORITHMS)
        for name, cls in registry.ALGORITHMS.items():
            with self.subTest(name=name):
                self.assertTrue(issubclass(cls, algorithm.Algorithm))
                gin.clear_config()
                gin.parse_config(f'train.algorithm = @{name}')
                self.assertIs(gin.query_parameter('train.algorithm').scoped_configurable_fn,
                              cls)

    def test_member_hyperparameters_are_what_members_may_set(self):
        shared = ('learning_rate', 'entropy_coef', 'discount', 'gae_lambda')
        expected = {'A2C': shared, 'PPO': ('clip_ratio',) + shared, 'SAC': None}
        self.assertEqual(set(expected), set(registry.ALGORITHMS))
        with self.assertRaisesRegex(ValueError,
                                    '^SAC does not train as a population; A2C, PPO do$'):
            registry.member_hyperparameters(registry.ALGORITHMS['SAC'])
        for name, cls in registry.ALGORITHMS.items():
            if expected[name] is None:
                continue
            with self.subTest(name=name):
                self.assertEqual(registry.member_hyperparameters(cls), expected[name])
                self.assertIs(registry.member_hyperparameters(cls), cls.MEMBER_HYPERPARAMETERS)
                # Gin may pass a function that builds the class.
                builder = functools.wraps(cls)(lambda *args, cls=cls, **kwargs: cls())
                self.assertEqual(registry.member_hyperparameters(builder), expected[name])
                gin.clear_config()
                gin.parse_config(f'train.algorithm = @{name}')
                named = gin.query_parameter('train.algorithm').scoped_configurable_fn
                self.assertEqual(registry.member_hyperparameters(named), expected[name])

    def test_member_hyperparameters_refuse_what_does_not_train_as_a_population(self):
        for refused, name in ((_Lone, '_Lone'), (algorithm.Algorithm, 'Algorithm'),
                              (dict, 'dict'), (functools.wraps(_Lone)(lambda: None), '_Lone')):
            with self.subTest(name=name):
                with self.assertRaisesRegex(
                        ValueError, f'^{name} does not train as a population; A2C, PPO do$'):
                    registry.member_hyperparameters(refused)

    def test_every_bundled_task_config_names_a_registered_algorithm(self):
        configs = sorted(glob.glob(os.path.join(run_config.BUNDLED_CONFIGS, '*.gin')))
        tasks = 0
        for path in configs:
            gin.clear_config()
            run_config.load([path], [])
            try:
                gin.query_parameter('train.env_id')
            except ValueError:
                continue  # Included by task configs (base.gin), or added to one (ppo_kl.gin).
            tasks += 1
            with self.subTest(config=os.path.basename(path)):
                loop.check_config()
                named = gin.query_parameter('train.algorithm').scoped_configurable_fn
                self.assertIn(named, registry.ALGORITHMS.values())
        self.assertGreater(tasks, 5)

    def test_a_config_without_an_algorithm_is_refused(self):
        gin.parse_config("train.env_id = 'Pendulum-v1'")
        with self.assertRaisesRegex(run_config.ConfigError, 'no algorithm: bind '
                                    'train.algorithm in the config, e.g. train.algorithm = @PPO'):
            loop.check_config()

    def test_a_config_naming_something_else_is_refused(self):
        gin.parse_config("train.algorithm = @FeedForwardValue\ntrain.env_id = 'Pendulum-v1'")
        with self.assertRaisesRegex(run_config.ConfigError, 'train.algorithm must name an '
                                    'algorithm .*, got FeedForwardValue'):
            loop.check_config()


if __name__ == '__main__':
    absltest.main()
