"""Tests of packing a stage's trials into populations: which trials share one, how many, and
the bindings the trainer gets (parsed by gin and checked by the trainer's own loop)."""

import json
import os
import textwrap

import gin
import numpy as np
from absl.testing import absltest

from agents.algorithms import off_policy_testing, registry  # noqa: F401 (registers them)
from agents.runs import loop, run_config
from pipelines.sweep import packing, sweep_spec, trial

NATIVE = """\
gin_files: [configs/pendulum_native.gin]
budget: {env_steps: 4096}
"""


def parse(text):
    return sweep_spec.parse(NATIVE + textwrap.dedent(text))


def describe(units):
    """[(member trial ids) or trial id, ...] of packed work."""
    return [tuple(t.id for t in unit.trials) if isinstance(unit, trial.Population) else unit.id
            for unit, _ in units]


class PackerTest(absltest.TestCase):

    def setUp(self):
        super().setUp()
        self.output_dir = self.create_tempdir().full_path

    def pack(self, spec, workers=None, work=None):
        work = [(t, None) for t in spec.trials()] if work is None else work
        return packing.Packer(spec, self.output_dir, workers).pack(work)

    def test_trials_differing_in_scalars_and_seeds_share_a_population(self):
        spec = parse("""
            seeds: 2
            grid:
              PPO.learning_rate: [3.0e-4, 1.0e-3]
              PPO.clip_ratio: [0.1, 0.2]
              PPO.num_epochs: [2, 4]
            """)
        trials = spec.trials()
        units = self.pack(spec)
        # num_epochs is not a member's scalar: one population per value, in the spec's order.
        self.assertLen(units, 2)
        for (unit, stop), epochs in zip(units, (2, 4), strict=True):
            self.assertIsNone(stop)
            self.assertIsInstance(unit, trial.Population)
            self.assertLen(unit.trials, 8)
            self.assertEqual({t.bindings['PPO.num_epochs'] for t in unit.trials}, {epochs})
        self.assertCountEqual([t.id for unit, _ in units for t in unit.trials],
                              [t.id for t in trials])

        # The trainer gets the members' seeds and scalars, the rest shared.
        population = units[0][0]
        run_config.load(list(spec.gin_files), list(population.gin_bindings))
        self.addCleanup(gin.clear_config)
        self.assertEqual(gin.query_parameter('train.population'), 8)
        self.assertEqual(gin.query_parameter('PPO.num_epochs'), population.trials[0].bindings[
            'PPO.num_epochs'])
        self.assertEqual(gin.query_parameter('train.population_members'), [
            {'train.seed': t.seed, 'PPO.learning_rate': t.bindings['PPO.learning_rate'],
             'PPO.clip_ratio': t.bindings['PPO.clip_ratio']} for t in population.trials])
        self.assertEqual(gin.query_parameter('train.total_steps'), 4096)
        # ... and builds the population from them.
        with loop.training_run(self.create_tempdir().full_path) as run:
            agent = run.agent
            self.assertEqual(agent.num_members, 8)
            np.testing.assert_allclose(agent.hyperparameters['learning_rate'], [
                t.bindings['PPO.learning_rate'] for t in population.trials], rtol=1e-6)

    def test_the_bundled_native_sweep_packs_into_a_population_per_worker(self):
        spec = sweep_spec.load(sweep_spec.find('configs/sweeps/pendulum_native.yaml'))
        sweep_spec.check_gin(spec)
        units = self.pack(spec, workers=2)
        self.assertEqual([len(unit.trials) for unit, _ in units], [8, 8])

    def test_populations_are_named_by_their_trials(self):
        spec = parse('seeds: 3\ngrid: {PPO.learning_rate: [3.0e-4, 1.0e-3]}\n')
        first, again = self.pack(spec), self.pack(spec)
        self.assertEqual([u.id for u, _ in first], [u.id for u, _ in again])
        (population, _), = first
        self.assertRegex(population.id, r'^pop-[0-9a-f]{10}$')
        fewer = self.pack(spec, work=[(t, None) for t in spec.trials()[:4]])
        self.assertNotEqual(fewer[0][0].id, population.id)

    def test_at_most_max_members_and_every_worker_busy(self):
        spec = parse('seeds: 8\npopulations: {max_members: 3}\n')
        self.assertEqual([len(u.trials) for u, _ in self.pack(spec)], [3, 3, 2])
        spec = parse('seeds: 4\n')
        self.assertEqual([len(u.trials) for u, _ in self.pack(spec, workers=2)], [2, 2])
        # A worker per trial: each trains alone.
        self.assertEqual(describe(self.pack(spec, workers=4)), [t.id for t in spec.trials()])

    def test_trials_the_trainer_cannot_train_as_a_population_train_alone(self):
        for gin_file, bindings in (
                ('configs/pendulum.gin', ''),  # Gymnasium environments.
                # An algorithm without populations.
                ('configs/pendulum_native.gin',
                 "bindings: {train.algorithm: '@OffPolicyTesting'}\n")):
            spec = sweep_spec.parse(
                f'gin_files: [{gin_file}]\nbudget: {{env_steps: 4096}}\nseeds: 3\n{bindings}')
            with self.assertLogs('absl', 'INFO') as logs:
                units = self.pack(spec)
            self.assertEqual(describe(units), [t.id for t in spec.trials()])
            self.assertIn('3 trials', ''.join(logs.output))
        self.assertIn('OffPolicyTesting does not train as a population', logs.output[-1])

    def test_a_varied_binding_a_member_cannot_set_separates_trials(self):
        spec = parse('grid: {PPO.num_epochs: [2, 4]}\n')  # One seed: every trial alone.
        self.assertEqual(describe(self.pack(spec)), [t.id for t in spec.trials()])

    def test_packing_off(self):
        for text in ('seeds: 2\npopulations: {pack: false}\n',
                     'seeds: 2\ngrid: {PPO.learning_rate: [3.0e-4, 1.0e-3]}\n'
                     'scheduler: {type: successive_halving, min_steps: 2048}\n'):
            spec = parse(text)
            work = [(t, 2048) for t in spec.trials()]
            self.assertEqual(self.pack(spec, work=work), work)

    def test_trials_of_a_failed_population_train_alone(self):
        spec = parse('seeds: 3\n')
        trials = spec.trials()
        failed = trial.failed_record(trials[1], 'population pop-x (3 trials): timed out')
        failed['population'] = 'pop-x'
        path = os.path.join(trial.trial_dir(self.output_dir, trials[1].id), 'result.json')
        os.makedirs(os.path.dirname(path))
        with open(path, 'w') as f:
            json.dump(failed, f)
        units = self.pack(spec)
        self.assertEqual(describe(units), [(trials[0].id, trials[2].id), trials[1].id])


if __name__ == '__main__':
    absltest.main()
