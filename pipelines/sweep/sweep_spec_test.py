"""Tests of sweep specs: expansion into trials, stable ids, and every kind of bad spec."""

import textwrap

from absl.testing import absltest, parameterized

from pipelines import halving
from pipelines.sweep import sweep_spec

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


class SchedulerAndSearchTest(absltest.TestCase):

    def test_successive_halving_defaults(self):
        spec = parse('grid: {PPO.learning_rate: [0.001]}\n'
                     'scheduler: {type: successive_halving, min_steps: 100}\n')
        self.assertEqual(spec.scheduler, sweep_spec.Scheduler(
            type='successive_halving', min_steps=100, reduction_factor=3, brackets=1))
        self.assertEqual((spec.metric, spec.mode), ('mean_return', 'max'))
        # The trials and their ids are those of the same spec without a scheduler.
        plain = parse('grid: {PPO.learning_rate: [0.001]}\n')
        self.assertEqual(spec.trials(), plain.trials())

    def test_hyperband_takes_every_bracket_by_default(self):
        spec = parse('scheduler: {type: hyperband, min_steps: 100, metric: mean_length, '
                     'mode: min}\n')
        # Rungs of 100, 300, 900 and 2048 steps: four brackets.
        self.assertEqual(spec.scheduler.brackets, 4)
        self.assertEqual(halving.rung_budgets(100, 3, 2048), [100, 300, 900, 2048])
        self.assertEqual((spec.metric, spec.mode), ('mean_length', 'min'))

    def test_populations_packed_by_default_without_a_scheduler(self):
        plain = parse('seeds: 2\n')
        self.assertEqual((plain.pack_populations, plain.max_population, plain.packs_populations),
                         (None, 8, True))
        halved = parse('scheduler: {type: successive_halving, min_steps: 100}\n')
        self.assertFalse(halved.packs_populations)
        off = parse('populations: {pack: false}\n')
        self.assertFalse(off.packs_populations)
        sized = parse('populations: {pack: true, max_members: 3}\n')
        self.assertEqual((sized.packs_populations, sized.max_population), (True, 3))
        # Packing does not change the trials.
        self.assertEqual(sized.trials(), plain.trials()[:1])

    def test_search(self):
        spec = parse("""
            search:
              sampler: tpe
              num_trials: 9
              parallel: 3
              parameters:
                PPO.learning_rate: {log_uniform: [1e-4, 1e-2]}
                PPO.num_epochs: {int_uniform: [3, 12]}
            """)
        self.assertEqual(spec.search, sweep_spec.Search(
            sampler='tpe', num_trials=9, parallel=3, seed=0, distributions={
                'PPO.learning_rate': ('log_uniform', [1e-4, 1e-2]),
                'PPO.num_epochs': ('int_uniform', [3, 12])}))
        with self.assertRaisesRegex(ValueError, 'proposed by its sampler'):
            spec.configurations()
        trials = spec.trials_of({'PPO.learning_rate': 0.001, 'PPO.num_epochs': 4}, 2)
        self.assertEqual([trial.index for trial in trials], [2])

    def test_integer_distributions_in_random(self):
        spec = parse("""
            random:
              num_samples: 300
              parameters:
                PPO.num_epochs: {int_uniform: [3, 6]}
                PPO.num_minibatches: {int_log_uniform: [1, 64]}
            """)
        configurations = spec.configurations()
        self.assertEqual({c['PPO.num_epochs'] for c in configurations}, {3, 4, 5, 6})
        batches = [c['PPO.num_minibatches'] for c in configurations]
        self.assertTrue(all(isinstance(b, int) and 1 <= b <= 64 for b in batches))
        # Quantiles: uniform over the integers; log-uniform over [low - 0.5, high + 0.5).
        grid = [(k + 0.5) / 1000 for k in range(1000)]
        counts = [sum(sweep_spec.quantile('int_uniform', [3, 6], u) == v for u in grid)
                  for v in (3, 4, 5, 6)]
        self.assertEqual(counts, [250, 250, 250, 250])
        logs = [sweep_spec.quantile('int_log_uniform', [1, 64], u) for u in grid]
        self.assertEqual((min(logs), max(logs)), (1, 64))
        self.assertBetween(sum(value <= 8 for value in logs), 450, 600)  # About half.


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
        ('unknown_scheduler', BASE + 'scheduler:\n  type: asha\n  min_steps: 100\n', 4,
         "unknown scheduler type 'asha'; expected one of successive_halving, hyperband"),
        ('scheduler_without_type', BASE + 'scheduler: {min_steps: 100}\n', 3,
         'unknown scheduler type None'),
        ('unknown_scheduler_field', BASE + 'scheduler:\n  type: hyperband\n  min_step: 1\n', 5,
         "unknown scheduler field 'min_step'"),
        ('min_steps_above_budget', BASE + 'scheduler:\n  type: successive_halving\n'
         '  min_steps: 4096\n', 5, 'scheduler.min_steps (4096) must be below budget.env_steps '
         '(2048)'),
        ('min_steps_at_budget', BASE + 'scheduler: {type: successive_halving, min_steps: 2048}\n',
         3, 'must be below budget.env_steps'),
        ('reduction_factor_one', BASE + 'scheduler:\n  type: successive_halving\n'
         '  min_steps: 100\n  reduction_factor: 1\n', 6,
         'scheduler.reduction_factor must be an integer >= 2'),
        ('fractional_reduction_factor', BASE + 'scheduler: {type: successive_halving, '
         'min_steps: 100, reduction_factor: 2.5}\n', 3, 'must be an integer >= 2'),
        ('unknown_metric', BASE + 'scheduler:\n  type: successive_halving\n  min_steps: 100\n'
         '  metric: reward\n', 6, "scheduler.metric: 'reward' is not a metric the trainer "
         'writes (in metrics.jsonl); expected one of mean_return'),
        ('step_is_no_metric', BASE + 'scheduler: {type: successive_halving, min_steps: 100, '
         'metric: step}\n', 3, "'step' is not a metric the trainer writes"),
        ('unknown_mode', BASE + 'scheduler:\n  type: successive_halving\n  min_steps: 100\n'
         '  mode: maximize\n', 6, "scheduler.mode: 'maximize' is not a mode; expected one of "
         'max, min'),
        ('brackets_of_halving', BASE + 'scheduler:\n  type: successive_halving\n'
         '  min_steps: 100\n  brackets: 2\n', 6, 'brackets is an option of type: hyperband'),
        ('too_many_brackets', BASE + 'scheduler:\n  type: hyperband\n  min_steps: 1000\n'
         '  brackets: 3\n', 6, 'scheduler.brackets must be an integer from 1 to 2'),
        ('unknown_sampler', BASE + 'search:\n  sampler: cmaes\n  num_trials: 4\n'
         '  parallel: 2\n  parameters: {PPO.clip_ratio: {uniform: [0.1, 0.3]}}\n', 4,
         "unknown sampler 'cmaes'; expected one of tpe, random"),
        ('fewer_trials_than_parallel', BASE + 'search:\n  sampler: tpe\n  num_trials: 2\n'
         '  parallel: 4\n  parameters: {PPO.clip_ratio: {uniform: [0.1, 0.3]}}\n', 5,
         'search.num_trials (2) must be at least search.parallel (4)'),
        ('zero_parallel', BASE + 'search:\n  sampler: tpe\n  num_trials: 2\n  parallel: 0\n'
         '  parameters: {PPO.clip_ratio: {uniform: [0.1, 0.3]}}\n', 6,
         'search.parallel must be a positive integer, got 0'),
        ('search_without_parameters', BASE + 'search: {sampler: tpe, num_trials: 2, '
         'parallel: 1}\n', 3, 'search.parameters must map gin parameters to distributions'),
        ('search_and_grid', BASE + 'grid:\n  PPO.clip_ratio: [0.1]\nsearch:\n  sampler: tpe\n'
         '  num_trials: 2\n  parallel: 1\n  parameters: {PPO.num_epochs: {choice: [1]}}\n',
         3, 'grid and search exclude each other'),
        ('search_and_halving_metrics_differ', BASE + 'scheduler:\n  type: successive_halving\n'
         '  min_steps: 100\nsearch:\n  sampler: tpe\n  num_trials: 2\n  parallel: 1\n'
         '  metric: mean_length\n  parameters: {PPO.num_epochs: {choice: [1]}}\n', 10,
         'search.metric (mean_length) differs from scheduler.metric (mean_return)'),
        ('hyperband_with_search', BASE + 'scheduler:\n  type: hyperband\n  min_steps: 100\n'
         'search:\n  sampler: tpe\n  num_trials: 2\n  parallel: 1\n'
         '  parameters: {PPO.num_epochs: {choice: [1]}}\n', 4, 'hyperband with search is not '
         'supported'),
        ('startup_trials_of_random', BASE + 'search:\n  sampler: random\n  num_trials: 2\n'
         '  parallel: 1\n  startup_trials: 1\n  parameters: {PPO.num_epochs: {choice: [1]}}\n',
         7, 'startup_trials is an option of sampler: tpe'),
        ('negative_startup_trials', BASE + 'search:\n  sampler: tpe\n  num_trials: 2\n'
         '  parallel: 1\n  startup_trials: -1\n  parameters: {PPO.num_epochs: {choice: [1]}}\n',
         7, 'search.startup_trials must be an integer >= 0, got -1'),
        ('int_uniform_of_floats', BASE + 'random:\n  num_samples: 2\n  parameters:\n'
         '    PPO.num_epochs: {int_uniform: [1.5, 4]}\n', 6, 'int_uniform needs integer bounds'),
        ('int_log_uniform_of_zero', BASE + 'random:\n  num_samples: 2\n  parameters:\n'
         '    PPO.num_epochs: {int_log_uniform: [0, 4]}\n', 6, 'int_log_uniform needs 0 < low'),
        ('populations_not_a_mapping', BASE + 'populations: true\n', 3,
         'populations must be a mapping such as {pack: true, max_members: 8}'),
        ('populations_unknown_field', BASE + 'populations:\n  size: 4\n', 4,
         "unknown populations field 'size'; expected one of pack, max_members"),
        ('pack_not_a_bool', BASE + 'populations:\n  pack: yes please\n', 4,
         "populations.pack must be true or false, got 'yes please'"),
        ('one_member', BASE + 'populations:\n  max_members: 1\n', 4,
         'populations.max_members must be an integer >= 2 (to train every trial alone: '
         'pack: false), got 1'),
        ('pack_with_a_scheduler', BASE + 'scheduler: {type: successive_halving, '
         'min_steps: 100}\npopulations:\n  pack: true\n', 5,
         'populations.pack: true does not go with a scheduler'),
        ('population_bound', BASE + 'bindings:\n  train.population: 4\n', 4,
         'train.population is set by the sweep when it packs trials into populations'),
        ('population_members_varied', BASE + 'grid:\n  train.population_members: '
         '[[{train.seed: 1}]]\n', 4, 'train.population_members is set by the sweep'),
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
