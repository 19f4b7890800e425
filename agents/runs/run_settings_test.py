"""Tests of the run's settings: read from gin, derived values, and validation that builds
nothing."""

import gin
from absl.testing import absltest, parameterized

from agents.algorithms import algorithm, off_policy_testing, registry
from agents.runs import run_config, run_settings

BASE = "train.algorithm = @PPO\ntrain.env_id = 'Pendulum-v1'\ntrain.total_steps = 4096\n"


class RunSettingsTest(parameterized.TestCase):

    def setUp(self):
        super().setUp()
        gin.clear_config()
        self.addCleanup(gin.clear_config)

    def settings(self, config='', **overrides):
        gin.parse_config(BASE + config)
        return run_settings.from_gin(**overrides)

    def test_reads_gin_with_overrides(self):
        settings = self.settings('train.num_envs = 8', rollout_length=64)
        self.assertIs(settings.algorithm_class, registry.ALGORITHMS['PPO'])
        self.assertEqual((settings.num_envs, settings.rollout_length, settings.seed), (8, 64, 0))
        with self.assertRaises(AttributeError):  # Frozen.
            settings.num_envs = 2

    def test_missing_algorithm_or_environment(self):
        gin.parse_config("train.env_id = 'Pendulum-v1'\ntrain.total_steps = 10")
        with self.assertRaisesRegex(run_config.ConfigError, '^no algorithm: bind'):
            run_settings.from_gin()
        gin.clear_config()
        gin.parse_config('train.algorithm = @PPO\ntrain.total_steps = 10')
        with self.assertRaisesRegex(run_config.ConfigError, '^no environment: bind'):
            run_settings.from_gin()

    @parameterized.parameters(
        (dict(num_envs=0), 'train.num_envs must be a positive integer, got 0'),
        (dict(seed=-1), 'train.seed must be a non-negative integer'),
        (dict(env_backend='jax'),
         "train.env_backend must be one of 'gymnasium', 'native', 'envpool'; got 'jax'"),
        (dict(env_backend='envpool', env_id='NoSuchEnv-v0'),
         "train.env_backend = 'envpool': 'NoSuchEnv-v0' is not an EnvPool task"),
        (dict(env_backend='envpool', num_workers=2),
         "train.num_workers = 2 does not apply to train.env_backend = 'envpool', which steps "
         "in EnvPool's threads: set train.env_kwargs = {'num_threads': n} instead"),
        (dict(env_backend='envpool', jit_compile=True),
         "train.jit_compile = True needs train.env_backend = 'native'"),
        (dict(log_every_secs=0), 'train.log_every_secs must be a positive number'),
        (dict(jit_compile=True), 'train.jit_compile = True needs train.env_backend'),
        (dict(population=2), 'train.population > 1 needs'),
        (dict(population=2, env_backend='native', population_members=[{}]),
         'train.population_members must be a list of 2 dicts'),
        (dict(population=2, env_backend='native', population_members=[{}, {'PPO.x': 1}]),
         r"train.population_members\[1\] is \{'PPO.x': 1\}: a member may bind only"),
        (dict(population_members=[{}]), 'train.population_members needs train.population > 1'),
        (dict(env_id='NoSuchEnv-v0'), 'NoSuchEnv-v0'),
        (dict(algorithm=int), 'train.algorithm must name an algorithm'),
        (dict(not_a_setting=1), "train: .*'not_a_setting'"),
    )
    def test_validation_names_the_setting(self, overrides, message):
        with self.assertRaisesRegex(run_config.ConfigError, message):
            self.settings(**overrides)

    def test_an_algorithm_without_populations(self):
        with self.assertRaisesRegex(run_config.ConfigError, 'train.population = 2: '
                                    'OffPolicyTesting does not train as a population'):
            self.settings(population=2, env_backend='native',
                          algorithm=off_policy_testing.OffPolicyTesting)

    def test_derived_values(self):
        settings = self.settings(num_envs=4, rollout_length=8, eval_every_steps=100)
        on_policy, off_policy = algorithm.OnPolicy(), algorithm.OffPolicy(100, 2, 1)
        self.assertEqual(settings.iteration_length(on_policy), 8)
        self.assertEqual(settings.iteration_length(off_policy), 2)
        self.assertEqual(settings.num_iterations(on_policy), 4096 // 32)
        self.assertEqual(settings.calls_of(on_policy), 1)  # Gymnasium: one per call.
        self.assertFalse(settings.compiles_with_xla())
        self.assertTrue(settings.optimizes_graphs())
        native = run_settings.RunSettings(**dict(vars(settings), env_backend='native'))
        self.assertEqual(native.calls_of(on_policy), 4)  # Up to the next evaluation.
        self.assertEqual(native.calls_of(off_policy), 13)
        self.assertFalse(native.compiles_with_xla())  # A small lone run.
        self.assertTrue(run_settings.RunSettings(**dict(vars(native), num_envs=128))
                        .compiles_with_xla())
        # An off-policy run's many short iterations compile with XLA at any size.
        off = run_settings.RunSettings(
            **dict(vars(native), algorithm=off_policy_testing.OffPolicyTesting))
        self.assertTrue(off.compiles_with_xla())
        self.assertFalse(run_settings.RunSettings(**dict(vars(off), env_backend='gymnasium'))
                         .compiles_with_xla())

    def test_envpool_backend(self):
        # Steps through Python as the Gymnasium backend does: one on-policy iteration per
        # call, Grappler, no XLA. The configs' env_mode (a Gymnasium setting) is ignored.
        settings = self.settings("train.env_mode = 'hybrid'", env_backend='envpool')
        self.assertFalse(settings.native)
        self.assertEqual(settings.calls_of(algorithm.OnPolicy()), 1)
        self.assertFalse(settings.compiles_with_xla())
        self.assertTrue(settings.optimizes_graphs())

    def test_member_overrides(self):
        settings = self.settings(
            population=2, env_backend='native', seed=3,
            population_members=[{}, {'train.seed': 9, 'PPO.learning_rate': 1e-3}])
        members, bindings = settings.member_overrides()
        self.assertEqual(members, [{'seed': 3}, {'seed': 10 - 1, 'learning_rate': 1e-3}])
        self.assertEqual(bindings, [{'train.seed': 3},
                                    {'train.seed': 9, 'PPO.learning_rate': 1e-3}])


if __name__ == '__main__':
    absltest.main()
