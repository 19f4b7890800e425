"""Tests of a sweep's Optuna study: proposals, their values, resumption, storage in a bucket."""

import os

from absl.testing import absltest

from agents.runs import gcs_testing, run_dir
from pipelines import search, sweep_spec

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

    def test_values_told_and_failures(self):
        output_dir = self.create_tempdir().full_path
        with search.Study(parse('random'), output_dir) as study:
            (one, _), (two, _) = study.batch(0)
            study.tell(one, -150.0)
            study.tell(two, None)
            study.tell(one, -150.0)  # Told again (a resumed sweep): no error.
            self.assertEqual(study.told(), {one: -150.0, two: None})

    def test_the_study_in_a_bucket_is_the_launchers_file(self):
        with gcs_testing.GcsEmulator(buckets=('sweeps',)):
            output_dir = 'gs://sweeps/sweep'
            with search.Study(parse(), output_dir) as study:
                first = study.batch(0)
                study.tell(first[0][0], -10.0)
                study.store()
            url = run_dir.join(output_dir, search.STUDY_FILE)
            self.assertTrue(run_dir.exists(url))
            self.assertEqual(run_dir.read_bytes(url)[:16], b'SQLite format 3\x00')
            # Another launcher (no local copy) continues the same study.
            with search.Study(parse(), output_dir) as study:
                self.assertEqual(study.batch(0), first)
                self.assertEqual(study.told(), {first[0][0]: -10.0})
            self.assertFalse(os.path.exists(search.STUDY_FILE))


if __name__ == '__main__':
    absltest.main()
