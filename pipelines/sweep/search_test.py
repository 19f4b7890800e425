"""Tests of a sweep's Optuna study: proposals, their values, resumption, storage in a bucket."""

import os

import optuna
from absl.testing import absltest

from agents.runs import run_dir
from agents.storage import file_io, gcs_testing, locations
from pipelines.sweep import search, sweep_spec

SPEC = """\
gin_files: [configs/pendulum.gin]
budget: {env_steps: 900}
search:
  sampler: SAMPLER
  num_trials: 5
  parallel: 2
  parameters:
    PPO.learning_rate: {log_uniform: [1.0e-5, 1.0e-2]}
    PPO.clip_ratio: {uniform: [0.1, 0.3]}
    PPO.num_epochs: {int_uniform: [1, 20]}
    PPO.num_minibatches: {int_log_uniform: [1, 64]}
    PPO.entropy_coef: {choice: [0.0, 0.01]}
    train.wrappers: {choice: [[ClipAction], [range_normalize, ClipAction]]}
"""


def parse(sampler='tpe'):
    return sweep_spec.parse(SPEC.replace('SAMPLER', sampler), 'spec.yaml')


class StudyTest(absltest.TestCase):

    def test_proposals_follow_the_distributions(self):
        output_dir = self.create_tempdir().full_path
        with search.Study(parse(), output_dir) as study:
            self.assertEqual(study.num_batches, 3)
            batches = [study.batch(index) for index in range(3)]
        self.assertEqual([len(batch) for batch in batches], [2, 2, 1])  # 5 in all.
        for batch in batches:
            for _, configuration in batch:
                self.assertBetween(configuration['PPO.learning_rate'], 1e-5, 1e-2)
                self.assertBetween(configuration['PPO.clip_ratio'], 0.1, 0.3)
                self.assertIn(configuration['PPO.num_epochs'], range(1, 21))
                self.assertIn(configuration['PPO.num_minibatches'], range(1, 65))
                self.assertIn(configuration['PPO.entropy_coef'], (0.0, 0.01))
                # Choices Optuna cannot store (lists) are asked by index, given as values.
                self.assertIn(configuration['train.wrappers'],
                              (['ClipAction'], ['range_normalize', 'ClipAction']))
                # Rounded as the random sampler rounds: readable ids.
                self.assertLessEqual(len(repr(configuration['PPO.clip_ratio'])), 6)

    def test_a_batch_asked_is_read_back_not_asked_again(self):
        output_dir = self.create_tempdir().full_path
        with search.Study(parse(), output_dir) as study:
            first = study.batch(0)
        with search.Study(parse(), output_dir) as study:
            self.assertEqual(study.batch(0), first)
            self.assertEqual(study.proposed(), first)

    def test_outcomes_told_as_optunas_tpe_with_a_pruner_sees_them(self):
        output_dir = self.create_tempdir().full_path
        with search.Study(parse(), output_dir) as study:
            (completed, _), (pruned, _) = study.batch(0)
            (failed, _), (failed_later, _) = study.batch(1)
            study.tell(completed, {100: -900.0, 300: -400.0, 900: -150.0})
            study.tell(pruned, {100: -700.0}, completed=False)
            study.tell(failed, {100: None}, completed=False)
            study.tell(failed_later, {100: -800.0, 300: None}, completed=False)
            study.tell(completed, {900: -1.0})  # Told again (a resumed sweep): nothing changes.
            told = study.told()
        self.assertEqual(told, {completed: -150.0, pruned: -700.0, failed: None,
                                failed_later: None})
        stored = optuna.load_study(study_name=search.STUDY_NAME,
                                   storage=f'sqlite:///{output_dir}/{run_dir.STUDY_FILE}')
        trials = {trial.number: trial for trial in stored.get_trials()}
        state = optuna.trial.TrialState
        self.assertEqual(trials[completed].state, state.COMPLETE)
        self.assertEqual(trials[completed].intermediate_values,
                         {100: -900.0, 300: -400.0, 900: -150.0})
        self.assertEqual(trials[pruned].state, state.PRUNED)
        self.assertEqual(trials[pruned].intermediate_values, {100: -700.0})
        self.assertEqual(trials[failed].state, state.FAIL)
        self.assertEqual(trials[failed_later].state, state.FAIL)
        self.assertEqual(trials[failed_later].intermediate_values, {100: -800.0})

    def test_tpe_models_the_outcomes_once_its_startup_trials_are_told(self):
        self.assertEqual(parse().search.startup_trials, sweep_spec.DEFAULT_STARTUP_TRIALS)
        batches = {}
        for startup_trials in (2, 10):
            spec = sweep_spec.parse(SPEC.replace('SAMPLER', 'tpe').replace(
                'parallel: 2', f'parallel: 2\n  startup_trials: {startup_trials}'), 'spec.yaml')
            self.assertEqual(spec.search.startup_trials, startup_trials)
            with search.Study(spec, self.create_tempdir().full_path) as study:
                first = study.batch(0)
                for number, configuration in first:
                    study.tell(number, {900: -configuration['PPO.num_epochs']})
                batches[startup_trials] = first, study.batch(1)
        # The first batch is random either way; the second is TPE's only after 2 trials.
        self.assertEqual(batches[2][0], batches[10][0])
        self.assertNotEqual(batches[2][1], batches[10][1])

    def test_the_study_in_a_bucket_is_the_launchers_file(self):
        with gcs_testing.GcsEmulator(buckets=('sweeps',)):
            output_dir = 'gs://sweeps/sweep'
            with search.Study(parse(), output_dir) as study:
                first = study.batch(0)
                study.tell(first[0][0], {900: -10.0})
                study.store()
            url = locations.join(output_dir, run_dir.STUDY_FILE)
            self.assertTrue(file_io.exists(url))
            self.assertEqual(file_io.read_bytes(url)[:16], b'SQLite format 3\x00')
            # Another launcher (no local copy) continues the same study.
            with search.Study(parse(), output_dir) as study:
                self.assertEqual(study.batch(0), first)
                self.assertEqual(study.told(), {first[0][0]: -10.0})
            self.assertFalse(os.path.exists(run_dir.STUDY_FILE))


if __name__ == '__main__':
    absltest.main()
