"""Tests of sweep specs: expansion into trials, stable ids, and every kind of bad spec."""

import textwrap

from absl.testing import absltest, parameterized

from pipelines import sweep_spec

BASE = """\
gin_files: [configs/pendulum.gin]
budget: {env_steps: 2048}
"""


def parse(text, base=BASE):
    """Parses `base` followed by `text` (dedented)."""
    return sweep_spec.parse(base + textwrap.dedent(text), 'spec.yaml')


class GridTest(absltest.TestCase):

    def test_expands_every_combination_with_every_seed(self):
        spec = parse("""
            seeds: [0, 7]
            grid:
              PPO.learning_rate: [3.0e-4, 1e-3]
              PPO.clip_ratio: [0.1, 0.2, 0.3]
            """)
        trials = spec.trials()
        self.assertLen(trials, 12)
        self.assertEqual([trial.index for trial in trials], list(range(12)))
        self.assertEqual([trial.seed for trial in trials[:4]], [0, 7, 0, 7])
        configurations = [trial.bindings for trial in trials[::2]]
        self.assertEqual(configurations, [
            {'PPO.clip_ratio': clip, 'PPO.learning_rate': lr}
            for clip in (0.1, 0.2, 0.3) for lr in (3e-4, 1e-3)])
        self.assertIsInstance(trials[0].bindings['PPO.learning_rate'], float)
        # Seeds of one configuration share its config id; configurations differ.
        self.assertEqual(trials[0].config_id, trials[1].config_id)
        self.assertLen({trial.config_id for trial in trials}, 6)
        self.assertEqual(trials[1].id, f'{trials[1].config_id}-seed7')
        self.assertEqual(trials[0].gin_bindings, (
            'train.total_steps = 2048', 'PPO.clip_ratio = 0.1', 'PPO.learning_rate = 0.0003'))

    def test_ids_are_stable(self):
        # A pinned id: a change here would orphan every existing sweep's results.
        spec = parse('grid: {PPO.learning_rate: [0.001]}\n')
        self.assertEqual(spec.trials()[0].id, 'd86c6918-seed0')

    def test_ids_ignore_formatting_and_order_but_not_values(self):
        one = parse("""
            bindings: {train.eval_episodes: 2, train.num_envs: 4}
            grid: {PPO.learning_rate: [0.001], PPO.clip_ratio: [0.2]}
            """)
        two = parse(base='', text="""
            # Reordered, with comments.
            grid:
              PPO.clip_ratio: [0.2]
              PPO.learning_rate: [1.0e-3]
            budget:
              env_steps: 2048
            bindings:
              train.num_envs: 4
              train.eval_episodes: 2
            gin_files:
              - configs/pendulum.gin
            """)
        three = parse("""
            bindings: {train.eval_episodes: 2, train.num_envs: 4}
            grid: {PPO.learning_rate: [0.002], PPO.clip_ratio: [0.2]}
            """)
        self.assertEqual([t.id for t in one.trials()], [t.id for t in two.trials()])
        self.assertEqual(one.canonical(), two.canonical())
        self.assertNotEqual(one.trials()[0].id, three.trials()[0].id)

    def test_without_grid_or_random_each_seed_is_a_trial(self):
        trials = parse('seeds: 3\n').trials()
        self.assertEqual([trial.seed for trial in trials], [0, 1, 2])
        self.assertEqual(trials[0].bindings, {})

    def test_gin_literals(self):
        spec = parse("""
            grid:
              train.env_id: [Pendulum-v1]
              PPO.policy_network: ['@FeedForwardGaussianPolicy']
              train.env_kwargs: [{g: 9.81}]
              train.wrappers: [[ClipAction]]
              PPO.value_clip: [null]
              train.anneal_learning_rate: [false]
            """)
        self.assertEqual(spec.trials()[0].gin_bindings[1:], (
            'PPO.policy_network = @FeedForwardGaussianPolicy', 'PPO.value_clip = None',
            'train.anneal_learning_rate = False', "train.env_id = 'Pendulum-v1'",
            "train.env_kwargs = {'g': 9.81}", "train.wrappers = ['ClipAction']"))


class RandomTest(absltest.TestCase):

    def sample(self, num_samples=8, seed=0):
        return parse(f"""
            random:
              num_samples: {num_samples}
              seed: {seed}
              parameters:
                PPO.learning_rate: {{log_uniform: [1e-5, 1e-2]}}
                PPO.clip_ratio: {{uniform: [0.1, 0.3]}}
                PPO.num_epochs: {{choice: [4, 10, 20]}}
            """).configurations()

    def test_deterministic_for_a_seed(self):
        first = self.sample()
        self.assertEqual(first, self.sample())
        self.assertNotEqual(first, self.sample(seed=1))
        self.assertLen(first, 8)
        # More samples keep the first ones.
        self.assertEqual(self.sample(num_samples=12)[:8], first)

    def test_values_follow_the_distributions(self):
        configurations = self.sample(num_samples=200)
        rates = [c['PPO.learning_rate'] for c in configurations]
        clips = [c['PPO.clip_ratio'] for c in configurations]
        epochs = [c['PPO.num_epochs'] for c in configurations]
        self.assertTrue(all(1e-5 <= rate <= 1e-2 for rate in rates))
        self.assertTrue(all(0.1 <= clip <= 0.3 for clip in clips))
        self.assertEqual(set(epochs), {4, 10, 20})
        # Log-uniform: about as many draws below 1e-3.5 as above.
        below = sum(rate < 10 ** -3.5 for rate in rates)
        self.assertBetween(below, 70, 130)
        self.assertTrue(all(len(f'{clip:.10g}'.rstrip('0')) <= 6 for clip in clips))

    def test_crossed_with_the_grid(self):
        spec = parse("""
            seeds: 2
            grid: {PPO.num_epochs: [4, 10]}
            random:
              num_samples: 3
              parameters: {PPO.learning_rate: {uniform: [0.0001, 0.001]}}
            """)
        configurations = spec.configurations()
        self.assertLen(configurations, 6)
        self.assertLen(spec.trials(), 12)
        self.assertEqual({c['PPO.num_epochs'] for c in configurations}, {4, 10})
        self.assertLen({c['PPO.learning_rate'] for c in configurations}, 3)

    def test_repeated_choices_become_one_configuration(self):
        spec = parse("""
            random:
              num_samples: 20
              parameters: {PPO.num_epochs: {choice: [4, 10]}}
            """)
        self.assertCountEqual(spec.configurations(),
                              [{'PPO.num_epochs': 4}, {'PPO.num_epochs': 10}])


class BadSpecTest(parameterized.TestCase):

    @parameterized.named_parameters(
        ('negative_budget', BASE.replace('2048', '-5'), 2, 'budget.env_steps must be a positive'),
        ('zero_budget', BASE.replace('2048', '0'), 2, 'budget.env_steps must be a positive'),
        ('fractional_budget', BASE.replace('2048', '10.5'), 2, 'positive integer'),
        ('negative_timeout', 'gin_files: [a.gin]\nbudget:\n  env_steps: 5\n  timeout_s: -1\n', 4,
         'budget.timeout_s must be a positive number'),
        ('missing_budget', 'gin_files: [a.gin]\n', 1, "missing field 'budget'"),
        ('missing_gin_files', 'budget: {env_steps: 5}\n', 1, "missing field 'gin_files'"),
        ('empty_gin_files', 'gin_files: []\nbudget: {env_steps: 5}\n', 1, 'gin_files must be'),
        ('empty_grid', BASE + 'seeds: 1\ngrid: {}\n', 4, 'empty grid'),
        ('empty_grid_values', BASE + 'grid:\n  PPO.clip_ratio: [0.1]\n  PPO.learning_rate: []\n',
         5, 'PPO.learning_rate needs a non-empty list'),
        ('scalar_grid_values', BASE + 'grid:\n  PPO.learning_rate: 0.1\n', 4, 'non-empty list'),
        ('repeated_grid_value', BASE + 'grid:\n  PPO.learning_rate: [0.1, 1.0e-1]\n', 4,
         'repeats a value'),
        ('unknown_distribution', BASE + 'random:\n  num_samples: 2\n  parameters:\n'
         '    PPO.clip_ratio: {uniform: [0.1, 0.3]}\n    PPO.learning_rate: {normal: [0, 1]}\n',
         7, "unknown distribution 'normal'; expected one of uniform, log_uniform, choice"),
        ('uniform_low_above_high', BASE + 'random:\n  num_samples: 2\n  parameters:\n'
         '    PPO.clip_ratio:\n      uniform: [0.3, 0.1]\n', 7, 'needs low < high'),
        ('uniform_one_bound', BASE + 'random:\n  num_samples: 2\n  parameters:\n'
         '    PPO.clip_ratio: {uniform: [0.3]}\n', 6, 'needs [low, high], two numbers'),
        ('log_uniform_of_zero', BASE + 'random:\n  num_samples: 2\n  parameters:\n'
         '    PPO.learning_rate: {log_uniform: [0, 0.1]}\n', 6, 'log_uniform needs 0 < low'),
        ('empty_choice', BASE + 'random:\n  num_samples: 2\n  parameters:\n'
         '    PPO.num_epochs: {choice: []}\n', 6, 'choice needs a non-empty list'),
        ('two_distributions', BASE + 'random:\n  num_samples: 2\n  parameters:\n'
         '    PPO.num_epochs: {choice: [1], uniform: [1, 2]}\n', 6, 'a distribution is one of'),
        ('zero_samples', BASE + 'random:\n  num_samples: 0\n  parameters:\n'
         '    PPO.num_epochs: {choice: [1]}\n', 4, 'random.num_samples must be a positive'),
        ('no_random_parameters', BASE + 'random:\n  num_samples: 3\n', 3,
         'random.parameters must map'),
        ('yaml_syntax_error', BASE + 'grid:\n  PPO.learning_rate: [0.1, 0.2\n  x: 1\n', 5,
         'invalid YAML'),
        ('yaml_bad_indentation', 'gin_files: [a.gin]\nbudget:\n  env_steps: 5\n timeout_s: 1\n',
         4, 'invalid YAML'),
        ('duplicate_key', BASE + 'seeds: 1\nseeds: 2\n', 4, "duplicate key 'seeds'"),
        ('unknown_field', BASE + 'seeds: 1\ngird: {PPO.learning_rate: [1]}\n', 4,
         "unknown field 'gird'"),
        ('unknown_budget_field', 'gin_files: [a.gin]\nbudget:\n  env_steps: 5\n  steps: 1\n', 4,
         "unknown budget field 'steps'"),
        ('not_a_parameter', BASE + 'grid:\n  learning_rate: [1]\n', 4,
         "'learning_rate' is not a gin parameter"),
        ('fixed_and_varied', BASE + 'bindings:\n  PPO.clip_ratio: 0.2\n'
         'grid:\n  PPO.clip_ratio: [0.1]\n', 6, 'both fixed in bindings and varied'),
        ('grid_and_random', BASE + 'grid:\n  PPO.clip_ratio: [0.1]\nrandom:\n  num_samples: 1\n'
         '  parameters:\n    PPO.clip_ratio: {uniform: [0.1, 0.2]}\n', 4,
         'varied by both grid and random'),
        ('budget_in_grid', BASE + 'grid:\n  train.total_steps: [1000]\n', 4,
         'train.total_steps is set by budget.env_steps'),
        ('seed_binding', BASE + 'bindings:\n  train.seed: 3\n', 4, 'train.seed is set by seeds'),
        ('repeated_seeds', BASE + 'seeds: [1, 1]\n', 3, 'seeds repeat'),
        ('negative_seed', BASE + 'seeds: [-1]\n', 3, 'seeds must be'),
        ('zero_seeds', BASE + 'seeds: 0\n', 3, 'seeds must be a positive count'),
        ('infinite_value', BASE + 'grid:\n  PPO.clip_ratio: [.inf]\n', 4, 'not a finite number'),
        ('not_a_mapping', '- gin_files\n', 1, 'a sweep spec is a mapping'),
    )
    def test_names_the_line(self, text, line, message):
        with self.assertRaises(sweep_spec.SpecError) as caught:
            sweep_spec.parse(text, 'spec.yaml')
        self.assertStartsWith(str(caught.exception), f'spec.yaml:{line}: ')
        self.assertIn(message, str(caught.exception))

    def test_unreadable_file(self):
        path = self.create_tempdir().full_path + '/nope.yaml'
        with self.assertRaisesRegex(sweep_spec.SpecError, 'nope.yaml: cannot read the sweep spec'):
            sweep_spec.load(path)


class CheckGinTest(parameterized.TestCase):
    """Parses with gin and the trainer's configurables, before any trial starts."""

    def test_a_valid_spec_passes(self):
        sweep_spec.check_gin(parse("""
            bindings: {train.eval_episodes: 2}
            grid:
              PPO.learning_rate: [0.001]
              train.env_kwargs: [{g: 9.81}]
            random:
              num_samples: 2
              parameters: {PPO.num_epochs: {choice: [4, 10]}}
            """))

    @parameterized.named_parameters(
        ('unknown_parameter', BASE + 'grid:\n  PPO.learning_rate: [0.1]\n  PPO.learnin_rate: [1]'
         '\n', 5, "doesn't have a parameter named 'learnin_rate'"),
        ('unknown_configurable', BASE + 'bindings:\n  train.num_envs: 4\n  NoSuch.thing: 1\n', 5,
         'NoSuch'),
        ('unknown_random_parameter', BASE + 'random:\n  num_samples: 1\n  parameters:\n'
         '    PPO.nope: {uniform: [0, 1]}\n', 6, "parameter named 'nope'"),
        ('missing_base_gin_file', 'gin_files:\n  - configs/pendulum.gin\n  - configs/nope.gin\n'
         'budget: {env_steps: 5}\n', 3, "gin file 'configs/nope.gin' not found"),
        ('unknown_env_in_grid', BASE + 'grid:\n  train.env_id:\n    - Pendulum-v1\n'
         '    - NoSuchEnv-v0\n', 6, "unknown env id 'NoSuchEnv-v0'"),
    )
    def test_names_the_line(self, text, line, message):
        spec = sweep_spec.parse(text, 'spec.yaml')
        with self.assertRaises(sweep_spec.SpecError) as caught:
            sweep_spec.check_gin(spec)
        self.assertStartsWith(str(caught.exception), f'spec.yaml:{line}: ')
        self.assertIn(message, str(caught.exception))


if __name__ == '__main__':
    absltest.main()
