"""Tests of sweep_efficiency's derived specs and arithmetic (the sweeps themselves are not run)."""

import json
import os

from absl.testing import absltest

from benchmarks import sweep_efficiency
from pipelines.sweep import sweep_spec


def base_document():
    path = sweep_spec.find('configs/sweeps/pendulum_halving.yaml')
    with open(path) as f:
        return sweep_spec.document(f.read(), path)


def parse(document):
    return sweep_spec.parse(json.dumps(document), 'derived.yaml')


class DerivedSpecsTest(absltest.TestCase):

    def test_the_three_searches_share_the_space(self):
        document = base_document()
        full = parse(sweep_efficiency.method_spec(document, 'full', 3))
        halving = parse(sweep_efficiency.method_spec(document, 'halving', 3))
        tpe = parse(sweep_efficiency.method_spec(document, 'tpe_halving', 9))
        self.assertIsNone(full.scheduler)
        self.assertEqual(full.trials(), halving.trials())  # The same configurations and ids.
        self.assertGreaterEqual(len(full.configurations()), 27)
        self.assertEqual(tpe.scheduler, halving.scheduler)
        self.assertEqual(tpe.search.distributions, halving.distributions)
        self.assertEqual(tpe.search.num_trials, len(halving.configurations()))
        self.assertEqual((tpe.search.sampler, tpe.search.parallel), ('tpe', 9))
        self.assertEqual(tpe.search.startup_trials, 9)  # TPE models from the second batch on.
        self.assertEqual(document, base_document(), 'the base document was changed')
        with self.assertRaisesRegex(ValueError, 'unknown method'):
            sweep_efficiency.method_spec(document, 'grid', 3)

    def test_retraining_fixes_the_pick_and_takes_fresh_seeds(self):
        document = base_document()
        pick = {'PPO.learning_rate': 0.001, 'PPO.num_epochs': 7}
        spec = parse(sweep_efficiency.retrain_spec(document, pick, ['1000', '1001']))
        self.assertEqual([trial.seed for trial in spec.trials()], [1000, 1001])
        self.assertEqual(spec.bindings['PPO.learning_rate'], 0.001)
        self.assertEqual(spec.env_steps, document['budget']['env_steps'])
        self.assertIsNone(spec.scheduler)


class ArithmeticTest(absltest.TestCase):

    def test_env_steps_count_each_trial_once(self):
        records = [{'env_steps': 16384}, {'env_steps': 150016}, {'env_steps': None}]
        self.assertEqual(sweep_efficiency.env_steps_spent(records), 166400)

    def test_t_interval(self):
        mean, low, high = sweep_efficiency.t_interval([-150.0, -170.0, -160.0])
        self.assertAlmostEqual(mean, -160.0)
        # sd 10, n 3: half width 4.303 * 10 / sqrt(3).
        self.assertAlmostEqual(high - mean, 4.303 * 10 / 3 ** 0.5, places=6)
        self.assertAlmostEqual(mean - low, high - mean)

    def test_pick_is_the_first_row_of_the_summary(self):
        output_dir = self.create_tempdir().full_path
        with open(os.path.join(output_dir, 'summary.csv'), 'w') as f:
            f.write('rank,config_id,mean_final_return\n1,bbb,-150\n2,aaa,-140\n')
        with open(os.path.join(output_dir, 'trials.jsonl'), 'w') as f:
            for config_id, rate in (('aaa', 0.1), ('bbb', 0.2)):
                f.write(json.dumps({'config_id': config_id,
                                    'bindings': {'PPO.learning_rate': rate}}) + '\n')
        self.assertEqual(sweep_efficiency.pick(output_dir), ('bbb', {'PPO.learning_rate': 0.2}))

    def test_table_says_where_each_pick_lies(self):
        rows = [
            {'method': 'full', 'env_steps': 1200, 'wall_time_s': 600.0, 'config_id': 'aaa',
             'retrained': (-150.0, -170.0, -130.0)},
            {'method': 'halving', 'env_steps': 300, 'wall_time_s': 150.0, 'config_id': 'bbb',
             'retrained': (-165.0, -180.0, -150.0)},
            {'method': 'tpe_halving', 'env_steps': 290, 'wall_time_s': 160.0,
             'config_id': 'ccc', 'retrained': (-120.0, -125.0, -115.0)},
        ]
        text = sweep_efficiency.table(rows, rows[0]['retrained'])
        self.assertIn('halving: mean -165.0 is within the full search\'s interval '
                      '[-170.0, -130.0]; 0.25 of its env steps', text)
        self.assertIn('tpe_halving: mean -120.0 is above', text)


if __name__ == '__main__':
    absltest.main()
