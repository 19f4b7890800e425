"""Tests of the report's data: configurations, statistics, ranking, exit codes."""

import json

import numpy as np
from absl.testing import absltest

from pipelines import report_data, run_reader, score_statistics

SETTINGS = report_data.Settings(input_dir='/in', output_dir='/out', seed=3,
                                bootstrap_reps=500, curve_bootstrap_reps=200)


def make_run(run_id, seed, returns, steps=None, lr='0.001', policy=True, problems=(),
             error=None):
    bindings = {'PPO.learning_rate': lr, 'train.env_id': "'Pendulum-v1'",
                'train.seed': str(seed)}
    return run_reader.Run(
        run_id=run_id, logdir=f'/in/{run_id}', bindings=bindings,
        config_key=run_reader.config_key(bindings), seed=seed,
        eval_steps=list(steps or range(100, 100 * len(returns) + 1, 100)),
        eval_returns=list(returns), policy_dir=f'/in/{run_id}/policy/1' if policy else None,
        problems=list(problems), error=error)


class SummarizeConfigurationTest(absltest.TestCase):

    def test_statistics_of_final_scores(self):
        runs = [make_run(f'r{seed}', seed, [-900.0, final])
                for seed, final in ((2, -200.0), (0, -150.0), (1, -400.0), (3, -180.0))]
        key = runs[0].config_key
        config = report_data.summarize_configuration(key, runs, SETTINGS)
        self.assertEqual(config['runs'], ['r0', 'r1', 'r2', 'r3'])
        self.assertEqual(config['seeds'], [0, 1, 2, 3])
        self.assertEqual(config['scores'], [-150.0, -400.0, -200.0, -180.0])
        expected = score_statistics.interval_estimates(
            np.array(config['scores'])[:, None], report_data.generator(3, key, 'final'),
            reps=500)
        self.assertEqual(config['final'], expected)
        # 4 runs: the IQM keeps the middle two.
        self.assertEqual(config['final']['iqm']['value'], (-200.0 + -180.0) / 2)
        self.assertEqual(config['best_run'], 'r0')
        self.assertEqual([c[0] for c in config['video_candidates']], ['r0', 'r3', 'r2', 'r1'])
        self.assertNotIn('train.seed', config['bindings'])

    def test_curve_on_a_common_grid(self):
        runs = [make_run('a', 0, [1.0, 2.0, 3.0], steps=[100, 200, 300]),
                make_run('b', 1, [3.0, 5.0], steps=[100, 200])]
        config = report_data.summarize_configuration(runs[0].config_key, runs, SETTINGS)
        curve = config['curve']
        self.assertEqual(curve['steps'], [100, 200, 300])
        self.assertEqual(curve['mean'], [2.0, 3.5, 3.0])
        self.assertEqual(curve['runs'], [2, 2, 1])
        self.assertEqual(curve['lower'][2], 3.0)
        for lower, mean, upper in zip(curve['lower'], curve['mean'], curve['upper'],
                                      strict=True):
            self.assertLessEqual(lower, mean)
            self.assertLessEqual(mean, upper)

    def test_long_curves_are_thinned_and_interpolated(self):
        steps = list(range(0, 30_000, 10))
        runs = [make_run('a', 0, [float(s) for s in steps], steps=steps)]
        config = report_data.summarize_configuration(
            runs[0].config_key, runs, report_data.Settings('/in', '/out', max_curve_points=50,
                                                           bootstrap_reps=10,
                                                           curve_bootstrap_reps=10))
        self.assertLessEqual(len(config['curve']['steps']), 50)
        self.assertEqual(config['curve']['steps'][0], 0)
        self.assertEqual(config['curve']['steps'][-1], 29_990)
        np.testing.assert_allclose(config['curve']['mean'], config['curve']['steps'])

    def test_independent_of_run_order(self):
        runs = [make_run(f'r{seed}', seed, [float(seed), float(seed * seed)]) for seed in range(5)]
        key = runs[0].config_key
        first = report_data.summarize_configuration(key, runs, SETTINGS)
        again = report_data.summarize_configuration(key, runs[::-1], SETTINGS)
        self.assertEqual(first, again)
        other_seed = report_data.summarize_configuration(
            key, runs, report_data.Settings('/in', '/out', seed=4, bootstrap_reps=500,
                                            curve_bootstrap_reps=200))
        self.assertNotEqual(first['final']['iqm']['ci'], other_seed['final']['iqm']['ci'])

    def test_grid_of_steps_up_to_the_int64_maximum(self):
        last = run_reader.MAX_STEP
        self.assertEqual(report_data.curve_grid([[0, 1, last]], 2).tolist(), [0, last])
        grid = report_data.curve_grid([[0, last - 1, last]], 2)
        self.assertEqual(grid.tolist(), [0, last])

    def test_numbers_at_the_ends_of_the_range_give_finite_statistics(self):
        big, last = run_reader.MAX_MAGNITUDE, run_reader.MAX_STEP
        runs = [make_run(f'r{seed}', seed, [-big, big * (-1) ** seed, big],
                         steps=[0, last // 2, last]) for seed in range(8)]
        settings = report_data.Settings('/in', '/out', max_curve_points=2, bootstrap_reps=200,
                                        curve_bootstrap_reps=50)
        config = report_data.summarize_configuration(runs[0].config_key, runs, settings)
        self.assertEqual(config['curve']['steps'], [0, last])
        self.assertEqual(config['curve']['mean'], [-big, big])
        for name in ('iqm', 'mean', 'median'):
            self.assertEqual(config['final'][name], {'value': big, 'ci': [big, big]})
        json.dumps(config, allow_nan=False)  # report.json must be strict JSON.
        mixed = [make_run(f'm{seed}', seed, [big * (-1) ** seed]) for seed in range(8)]
        config = report_data.summarize_configuration(mixed[0].config_key, mixed, settings)
        self.assertEqual(config['final']['mean']['value'], 0.0)
        self.assertEqual(config['final']['iqm']['ci'], [-big, big])
        json.dumps(config, allow_nan=False)


class BuildReportTest(absltest.TestCase):

    def build(self, runs, discovery_problems=(), videos=True):
        groups = {}
        for run in runs:
            if run.error is None:
                groups.setdefault(run.config_key, []).append(run)
        configs = [report_data.summarize_configuration(key, group, SETTINGS)
                   for key, group in groups.items()]
        for config in configs:
            if videos:
                config['video'] = {'path': report_data.video_path(config['id']),
                                   'run': config['best_run']}
        return report_data.build_report(runs, configs, list(discovery_problems), SETTINGS)

    def test_ranks_configurations_by_iqm(self):
        runs = []
        # lr 0.01 has the best mean (an outlier) but lr 0.001 the best IQM.
        for seed, (good, spiky) in enumerate(((-150, -400), (-160, 900), (-170, -410),
                                              (-155, -420))):
            runs.append(make_run(f'good/{seed}', seed, [-500.0, good], lr='0.001'))
            runs.append(make_run(f'spiky/{seed}', seed, [-500.0, spiky], lr='0.01'))
        report = self.build(runs)
        ranked = report['configurations']
        self.assertEqual([config['label'] for config in ranked],
                         ['PPO.learning_rate=0.001', 'PPO.learning_rate=0.01'])
        self.assertEqual([config['rank'] for config in ranked], [1, 2])
        self.assertGreater(ranked[1]['final']['mean']['value'],
                           ranked[0]['final']['mean']['value'])
        self.assertEqual(report['swept_parameters'], ['PPO.learning_rate'])
        self.assertEqual(ranked[0]['swept'], {'PPO.learning_rate': '0.001'})
        self.assertEqual(report['exit_code'], report_data.EXIT_OK)
        self.assertEqual(report['num_runs'], 8)
        sensitivity, = report['plots']['sensitivity']
        self.assertEqual(sensitivity['parameter'], 'PPO.learning_rate')
        self.assertEqual([point['value'] for point in sensitivity['points']], [0.001, 0.01])
        rows = {row['id']: row for row in report['runs']}
        self.assertTrue(rows['good/0']['is_best'])
        self.assertEqual(rows['good/0']['config_label'], 'PPO.learning_rate=0.001')
        self.assertEqual(rows['good/0']['page'], report_data.run_page('good/0'))
        json.dumps(report, allow_nan=False)  # report.json must be strict JSON.

    def test_one_configuration_is_named_by_its_environment(self):
        report = self.build([make_run('a', 0, [1.0]), make_run('b', 1, [2.0])])
        self.assertEqual(report['swept_parameters'], [])
        self.assertEqual(report['configurations'][0]['label'], 'Pendulum-v1')
        self.assertEqual(report['plots']['sensitivity'], [])

    def test_skipped_runs_and_problems_make_exit_code_3(self):
        runs = [make_run('ok', 0, [1.0]),
                make_run('damaged', 1, [2.0], problems=['events.out.x is damaged']),
                make_run('failed', 2, [], error='the sweep recorded this trial as failed')]
        report = self.build(runs, discovery_problems=['trials.jsonl line 3: not JSON'])
        self.assertEqual(report['exit_code'], report_data.EXIT_INCOMPLETE)
        self.assertEqual(report['skipped'], [{'run': 'failed', 'logdir': '/in/failed',
                                              'reason': 'the sweep recorded this trial as '
                                              'failed'}])
        self.assertEqual(report['problems'], [
            {'run': None, 'problem': 'trials.jsonl line 3: not JSON'},
            {'run': 'damaged', 'problem': 'events.out.x is damaged'}])
        self.assertEqual(report['num_runs'], 2)
        self.assertEqual(report['num_skipped'], 1)

    def test_missing_video_is_a_problem(self):
        groups = [make_run('a', 0, [1.0])]
        config = report_data.summarize_configuration(groups[0].config_key, groups, SETTINGS)
        config['video_problem'] = 'no run of this configuration has a usable exported policy'
        report = report_data.build_report(groups, [config], [], SETTINGS)
        self.assertEqual(report['problems'], [{'run': 'a', 'problem': config['video_problem']}])
        self.assertEqual(report['exit_code'], report_data.EXIT_INCOMPLETE)

    def test_no_runs(self):
        report = self.build([])
        self.assertEqual(report['exit_code'], report_data.EXIT_NO_RUNS)
        self.assertEqual(report['configurations'], [])
        self.assertIsNone(report['plots']['learning_curves'])
        only_skipped = self.build([make_run('x', 0, [], error='no evaluation results')])
        self.assertEqual(only_skipped['exit_code'], report_data.EXIT_INCOMPLETE)

    def test_categorical_and_missing_swept_values(self):
        runs = [make_run('a', 0, [1.0]), make_run('b', 0, [2.0])]
        runs[0].bindings['PPO.objective'] = "'clipped'"
        runs[1].bindings['PPO.objective'] = "'kl_penalty'"
        runs[1].bindings['PPO.kl_target'] = '0.01'
        for run in runs:
            run.config_key = run_reader.config_key(run.bindings)
        report = self.build(runs)
        self.assertEqual(report['swept_parameters'], ['PPO.kl_target', 'PPO.objective'])
        labels = sorted(config['label'] for config in report['configurations'])
        self.assertEqual(labels, ["PPO.kl_target=(unset), PPO.objective='clipped'",
                                  "PPO.kl_target=0.01, PPO.objective='kl_penalty'"])
        points = report['plots']['sensitivity'][0]['points']
        self.assertEqual([point['text'] for point in points], ['0.01', '(unset)'])

    def test_swept_values_out_of_range_are_placed_as_texts(self):
        huge = '1' + '0' * 400
        runs = [make_run('a', 0, [1.0], lr='0.01'), make_run('b', 0, [2.0], lr='1e999'),
                make_run('c', 0, [3.0], lr=huge), make_run('d', 0, [4.0], lr='True')]
        report = self.build(runs)
        points = report['plots']['sensitivity'][0]['points']
        self.assertEqual([point['value'] for point in points], [0.01, huge, '1e999', 'True'])
        json.dumps(report, allow_nan=False)  # report.json must be strict JSON.


class NamesTest(absltest.TestCase):

    def test_slugs_are_safe_and_unique(self):
        names = ['<script>alert(1)</script>', 'a/b', 'a_b', '..', '']
        slugs = [report_data.slug(name) for name in names]
        self.assertLen(set(slugs), len(names))
        for slug in slugs:
            self.assertRegex(slug, r'^[A-Za-z0-9._-]+$')
            self.assertFalse(slug.startswith('.'))


if __name__ == '__main__':
    absltest.main()
