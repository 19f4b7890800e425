"""Tests of a sweep's course: stages, promotions, resumption and search, with a stand-in trainer.

The stand-in writes each trial's result.json as the trainer-running trial.py would, with a
return that is a known function of the configuration and the budget, so every promotion can be
checked against the one it must be.
"""

import collections
import json
import os
import time

import optuna
from absl.testing import absltest

from agents.runs import run_dir
from pipelines import halving
from pipelines.sweep import scheduler, search, sweep_spec
from pipelines.sweep import trial as trial_lib

BASE = """\
gin_files: [configs/pendulum.gin]
budget: {env_steps: 900}
seeds: 2
"""
HALVING = BASE + """\
grid:
  PPO.learning_rate: [1, 2, 3, 4, 5, 6, 7, 8, 9]
scheduler: {type: successive_halving, min_steps: 100, reduction_factor: 3}
"""


def score_of(bindings, budget, seed):
    """The stand-in's return: best near learning rate 5 (or 0.5), growing with the budget."""
    rate = bindings.get('PPO.learning_rate', 5)
    return -abs(rate - 5) * 10 - abs(rate - 0.5) - 1000 / budget + seed * 0.01


class StandInTrainer:
    """`train` for scheduler.run: writes results; can fail chosen trials or stop mid-way."""

    def __init__(self, output_dir, env_steps, fail=(), stop_after=None, fail_at_full_budget=()):
        self.output_dir = output_dir
        self.env_steps = env_steps
        self.fail = set(fail)
        self.fail_at_full_budget = set(fail_at_full_budget)
        self.stop_after = stop_after  # Trials to train before raising (a killed sweep).
        self.stages = []

    def __call__(self, work):
        self.stages.append([(trial.id, stop) for trial, stop in work])
        for trial, stop in work:
            if self.stop_after is not None:
                if self.stop_after == 0:
                    raise KeyboardInterrupt('the sweep was killed')
                self.stop_after -= 1
            budget = stop or self.env_steps
            failed = trial.id in self.fail or (
                stop is None and trial.id in self.fail_at_full_budget)
            value = None if failed else score_of(trial.bindings, budget, trial.seed)
            record = {
                'id': trial.id, 'config_id': trial.config_id, 'index': trial.index,
                'bindings': trial.bindings, 'seed': trial.seed,
                'status': trial_lib.FAILED if failed else trial_lib.OK,
                'final_return': value, 'best_return': value,
                'env_steps': None if failed else budget, 'budget': budget,
                'final_metrics': {} if failed else {'mean_return': value},
                'wall_time_s': 1.0, 'error': 'boom' if failed else None,
                'logdir': f'trials/{trial.id}', 'finished_at': time.time()}
            path = os.path.join(self.output_dir, 'trials', trial.id, 'result.json')
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, 'w') as f:
                json.dump(record, f)

    def trained(self):
        return [item for stage in self.stages for item in stage]


def parse(text):
    return sweep_spec.parse(text, 'spec.yaml')


def spec_config_id(text, configuration):
    return parse(text).trials_of(configuration, 0)[0].config_id


def config_ids_by_rate(spec):
    return {trial.bindings['PPO.learning_rate']: trial.config_id
            for trial in spec.trials()}


class HalvingTest(absltest.TestCase):

    def setUp(self):
        super().setUp()
        self.output_dir = self.create_tempdir().full_path

    def test_rungs_train_the_top_third_longer_and_continue_them(self):
        spec = parse(HALVING)
        ids = config_ids_by_rate(spec)
        trainer = StandInTrainer(self.output_dir, 900)
        course = scheduler.run(spec, self.output_dir, trainer)
        self.assertEqual(course.budgets, [100, 300, 900])
        # Rung 0: all 9 configurations x 2 seeds to 100 steps; rung 1: the best 3 (rates 4, 5,
        # 6) to 300; rung 2: the best of those to the full budget (no --stop_at_step).
        self.assertEqual([len(stage) for stage in trainer.stages], [18, 6, 2])
        self.assertEqual({stop for _, stop in trainer.stages[0]}, {100})
        self.assertEqual({stop for _, stop in trainer.stages[1]}, {300})
        self.assertEqual({stop for _, stop in trainer.stages[2]}, {None})
        self.assertCountEqual({trial_id.split('-')[0] for trial_id, _ in trainer.stages[1]},
                              [ids[4], ids[5], ids[6]])
        self.assertEqual({trial_id.split('-')[0] for trial_id, _ in trainer.stages[2]},
                         {ids[5]})
        decisions = scheduler.read_decisions(self.output_dir)
        self.assertEqual(sorted(decisions), [(0, 0), (0, 1)])
        self.assertEqual(decisions[0, 0]['promoted'], [ids[5], ids[4], ids[6]])
        self.assertEqual(decisions[0, 1]['promoted'], [ids[5]])
        # The score is the mean over seeds of the evaluation at the rung's budget.
        self.assertAlmostEqual(decisions[0, 0]['scores'][ids[5]],
                               (score_of({'PPO.learning_rate': 5}, 100, 0) +
                                score_of({'PPO.learning_rate': 5}, 100, 1)) / 2)

        records = scheduler.annotate(course, [
            trial_lib.read_result(self.output_dir, trial.id) for trial in course.trials])
        by_rate = {}
        for record in records:
            by_rate.setdefault(record['bindings']['PPO.learning_rate'], []).append(record)
        self.assertEqual({(r['rung'], r['stop_reason']) for r in by_rate[5]}, {(2, 'completed')})
        self.assertEqual({(r['rung'], r['stop_reason']) for r in by_rate[4]}, {(1, 'pruned')})
        self.assertEqual({(r['rung'], r['stop_reason']) for r in by_rate[9]}, {(0, 'pruned')})
        self.assertIn('pruned after rung 0 (100 env steps): ranked 9 of 9 by max mean_return; '
                      'the top 3 went on', by_rate[9][0]['stop_detail'])
        self.assertEqual({r['budget'] for r in by_rate[4]}, {300})

    def test_env_steps_spent_against_the_full_search(self):
        spec = parse(HALVING)
        trainer = StandInTrainer(self.output_dir, 900)
        scheduler.run(spec, self.output_dir, trainer)
        # A continued trial only adds the steps beyond the rung it comes from.
        reached, spent = {}, 0
        for trial_id, stop in trainer.trained():
            budget = stop or 900
            spent += budget - reached.get(trial_id, 0)
            reached[trial_id] = budget
        self.assertEqual(spent, 18 * 100 + 6 * (300 - 100) + 2 * (900 - 300))
        self.assertLess(spent, 18 * 900 / 3)

    def test_a_killed_sweep_resumes_without_retraining_finished_work(self):
        spec = parse(HALVING)
        killed = StandInTrainer(self.output_dir, 900, stop_after=18 + 4)
        with self.assertRaises(KeyboardInterrupt):
            scheduler.run(spec, self.output_dir, killed)
        decided = scheduler.read_decisions(self.output_dir)
        self.assertEqual(sorted(decided), [(0, 0)])
        resumed = StandInTrainer(self.output_dir, 900)
        scheduler.run(spec, self.output_dir, resumed)
        # Rung 0 is decided and done; of rung 1, the 2 trials not finished; then rung 2.
        self.assertEqual([len(stage) for stage in resumed.stages], [2, 2])
        self.assertEqual(scheduler.read_decisions(self.output_dir)[0, 0], decided[0, 0])
        # A third run has nothing left to do.
        again = StandInTrainer(self.output_dir, 900)
        scheduler.run(spec, self.output_dir, again)
        self.assertEqual(again.stages, [])

    def test_a_failed_seed_keeps_its_configuration_from_going_on(self):
        spec = parse(HALVING)
        ids = config_ids_by_rate(spec)
        trainer = StandInTrainer(self.output_dir, 900, fail=[f'{ids[5]}-seed1'])
        course = scheduler.run(spec, self.output_dir, trainer)
        decision = course.decisions[0, 0]
        self.assertIsNone(decision['scores'][ids[5]])
        self.assertNotIn(ids[5], decision['promoted'])
        self.assertEqual(decision['promoted'], [ids[4], ids[6], ids[3]])
        records = scheduler.annotate(course, [
            trial_lib.read_result(self.output_dir, trial.id) for trial in course.trials])
        failed = [r for r in records if r['id'] == f'{ids[5]}-seed1'][0]
        self.assertEqual((failed['stop_reason'], failed['rung']), ('failed', 0))
        # The trial failed once in this run: not retried by it.
        self.assertEqual(trainer.trained().count((f'{ids[5]}-seed1', 100)), 1)
        # A rerun retries nothing of the decided rung 0.
        rerun = StandInTrainer(self.output_dir, 900)
        scheduler.run(spec, self.output_dir, rerun)
        self.assertEqual(rerun.stages, [])

    def test_a_failure_in_the_last_rung_is_retried_by_a_rerun(self):
        spec = parse(HALVING)
        ids = config_ids_by_rate(spec)
        winner = f'{ids[5]}-seed1'
        course = scheduler.run(spec, self.output_dir, StandInTrainer(
            self.output_dir, 900, fail_at_full_budget=[winner]))
        self.assertEqual(course.rung_of[winner], 2)
        self.assertEqual(trial_lib.read_result(self.output_dir, winner)['status'], 'failed')
        rerun = StandInTrainer(self.output_dir, 900)
        scheduler.run(spec, self.output_dir, rerun)
        self.assertEqual(rerun.stages, [[(winner, None)]])


class HyperBandTest(absltest.TestCase):

    def test_brackets_start_at_successive_rungs(self):
        output_dir = self.create_tempdir().full_path
        spec = parse(HALVING.replace('successive_halving', 'hyperband'))
        self.assertEqual(spec.scheduler.brackets, 3)
        trainer = StandInTrainer(output_dir, 900)
        course = scheduler.run(spec, output_dir, trainer)
        sizes = halving.bracket_sizes(9, 3, 3, 3)
        self.assertEqual(sum(sizes), 9)
        self.assertGreater(sizes[0], sizes[1])
        by_bracket = {}
        for config_id, bracket in course.bracket_of.items():
            by_bracket.setdefault(bracket, []).append(config_id)
        self.assertEqual([len(by_bracket.get(b, [])) for b in range(3)], sizes)
        # The first stage trains bracket 0 at rung 0, bracket 1 at rung 1, bracket 2 to the end.
        first = dict(trainer.stages[0])
        for bracket, budget in ((0, 100), (1, 300), (2, None)):
            for config_id in by_bracket[bracket]:
                self.assertEqual(first[f'{config_id}-seed0'], budget)
        self.assertIn((0, 0), course.decisions)
        self.assertIn((1, 1), course.decisions)
        self.assertNotIn((2, 2), course.decisions)


SEARCH = BASE + """\
search:
  sampler: tpe
  num_trials: 6
  parallel: 2
  seed: 3
  parameters:
    PPO.learning_rate: {uniform: [0.0, 10.0]}
    PPO.num_epochs: {int_uniform: [1, 20]}
    PPO.policy_network: {choice: ['@FeedForwardGaussianPolicy', '@RecurrentGaussianPolicy']}
"""


class SearchTest(absltest.TestCase):

    def run_search(self, text, output_dir, trainer=None):
        spec = parse(text)
        trainer = trainer or StandInTrainer(output_dir, 900)
        with search.Study(spec, output_dir) as study:
            course = scheduler.run(spec, output_dir, trainer, study)
            told = study.told()
            proposed = study.proposed()
        return course, trainer, told, proposed

    def test_batches_are_trained_and_told_before_the_next_is_asked(self):
        output_dir = self.create_tempdir().full_path
        course, trainer, told, proposed = self.run_search(SEARCH, output_dir)
        self.assertEqual([len(stage) for stage in trainer.stages], [4, 4, 4])
        self.assertLen(proposed, 6)
        self.assertLen(told, 6)
        for number, configuration in proposed:
            self.assertBetween(configuration['PPO.learning_rate'], 0.0, 10.0)
            self.assertIsInstance(configuration['PPO.num_epochs'], int)
            self.assertAlmostEqual(told[number], score_of(configuration, 900, 0.5), places=6)
        self.assertLen(course.trials, 12)
        self.assertTrue(os.path.isfile(os.path.join(output_dir, run_dir.STUDY_FILE)))

    def test_the_same_seed_proposes_the_same_configurations_and_a_rerun_none(self):
        first_dir = self.create_tempdir().full_path
        second_dir = self.create_tempdir().full_path
        _, _, _, first = self.run_search(SEARCH, first_dir)
        _, _, _, second = self.run_search(SEARCH, second_dir)
        self.assertEqual(first, second)
        _, _, _, other = self.run_search(SEARCH.replace('seed: 3', 'seed: 4'),
                                         self.create_tempdir().full_path)
        self.assertNotEqual(first, other)
        _, rerun, _, again = self.run_search(SEARCH, first_dir)
        self.assertEqual(rerun.stages, [])
        self.assertEqual(again, first)

    def test_a_killed_search_resumes_with_the_batch_it_had_asked(self):
        output_dir = self.create_tempdir().full_path
        _, _, _, uninterrupted = self.run_search(SEARCH, self.create_tempdir().full_path)
        killed = StandInTrainer(output_dir, 900, stop_after=4 + 1)  # Mid-way through batch 2.
        with self.assertRaises(KeyboardInterrupt):
            self.run_search(SEARCH, output_dir, killed)
        _, resumed, told, proposed = self.run_search(SEARCH, output_dir)
        self.assertEqual(proposed, uninterrupted)
        self.assertEqual([len(stage) for stage in resumed.stages], [3, 4])
        self.assertLen(told, 6)

    def test_each_batch_is_halved_before_the_next_is_asked_and_told_how_far_it_got(self):
        output_dir = self.create_tempdir().full_path
        text = SEARCH.replace('parallel: 2', 'parallel: 3') + (
            'scheduler: {type: successive_halving, min_steps: 100}\n')
        course, trainer, told, proposed = self.run_search(text, output_dir)
        # Batch by batch: 3 configurations to rung 0 (100 steps), the best to 300, then to 900.
        self.assertEqual([len(stage) for stage in trainer.stages], [6, 2, 2] * 2)
        self.assertEqual([{stop for _, stop in stage} for stage in trainer.stages],
                         [{100}, {300}, {None}] * 2)
        self.assertEqual(sorted(course.decisions), [(0, 0), (0, 1), (1, 0), (1, 1)])
        stored = optuna.load_study(study_name=search.STUDY_NAME,
                                   storage=f'sqlite:///{output_dir}/{run_dir.STUDY_FILE}')
        trials = {trial.number: trial for trial in stored.get_trials()}
        for number, configuration in proposed:
            config_id = spec_config_id(text, configuration)
            batch = course.bracket_of[config_id]
            self.assertEqual(batch, number // 3)
            rung_0 = score_of(configuration, 100, 0.5)
            self.assertAlmostEqual(course.decisions[batch, 0]['scores'][config_id], rung_0)
            if config_id in course.decisions[batch, 1]['promoted']:  # Trained to the end.
                self.assertEqual(trials[number].state, optuna.trial.TrialState.COMPLETE)
                self.assertAlmostEqual(told[number], score_of(configuration, 900, 0.5))
                self.assertEqual(sorted(trials[number].intermediate_values), [100, 300, 900])
            else:  # Pruned: its last rung's score, which TPE ranks below every completed one.
                self.assertEqual(trials[number].state, optuna.trial.TrialState.PRUNED)
                last = max(trials[number].intermediate_values)
                self.assertIn(last, (100, 300))
                self.assertAlmostEqual(told[number], score_of(configuration, last, 0.5))
        # A rerun trains nothing and tells nothing new.
        _, rerun, told_again, _ = self.run_search(text, output_dir)
        self.assertEqual(rerun.stages, [])
        self.assertEqual(told_again, told)

    def test_batches_of_eta_to_the_k_configurations_cost_what_halving_them_at_once_does(self):
        halving_scheduler = 'scheduler: {type: successive_halving, min_steps: 100}\n'
        searched = SEARCH.replace('num_trials: 6', 'num_trials: 18').replace(
            'parallel: 2', 'parallel: 9') + halving_scheduler
        at_once = searched.replace('search:', 'random:').replace(
            '  sampler: tpe\n  num_trials: 18\n  parallel: 9\n', '  num_samples: 18\n')
        spent = {}
        for name, text in (('search', searched), ('at once', at_once)):
            output_dir = self.create_tempdir().full_path
            if name == 'search':
                _, trainer, _, _ = self.run_search(text, output_dir)
            else:
                trainer = StandInTrainer(output_dir, 900)
                scheduler.run(parse(text), output_dir, trainer)
            last = {}
            for trial_id, stop in trainer.trained():
                last[trial_id] = stop or 900
            spent[name] = sorted(collections.Counter(last.values()).items())
        # 2 x (9 to 100 steps, 3 on to 300, 1 to 900) = 18, 6 and 2 (x 2 seeds).
        self.assertEqual(spent['search'], [(100, 24), (300, 8), (900, 4)])
        self.assertEqual(spent['at once'], spent['search'])


if __name__ == '__main__':
    absltest.main()
