"""Tests of the report's data: configurations, statistics, ranking, exit codes."""

import json
import os

import numpy as np
from absl.testing import absltest

from pipelines.report import report_data, report_fixtures, run_reader, score_statistics

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


def staged(run, sweep_config, budget, rung, reason, bracket=0, detail=None):
    """`run` as a trial of a staged sweep records it."""
    run.sweep_config, run.budget, run.rung, run.bracket = sweep_config, budget, rung, bracket
    run.stop_reason, run.stop_detail = reason, detail or f'{reason} at rung {rung}'
    return run


def decision(bracket, rung, budget, scores, promoted, sweep=''):
    return {'sweep': sweep, 'bracket': bracket, 'rung': rung, 'budget': budget,
            'metric': 'mean_return', 'mode': 'max', 'scores': scores, 'promoted': promoted}


def rung_rows(report):
    """The Rungs table: (bracket, rung, budget, entered, went on, decided, final,
    [(label, score, rank, status)])."""
    return [(row['bracket'], row['rung'], row['budget'], row['entered'], row['went_on'],
             row['decided'], row['final'],
             [(entry['label'], entry['score'], entry['rank'], entry['status'])
              for entry in row['configurations']]) for row in report['rungs']]


class HalvingReportTest(absltest.TestCase):
    """The report of a successive-halving sweep (`report_fixtures.make_halving_sweep`)."""

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        root = report_fixtures.make_halving_sweep(
            os.path.join(absltest.get_default_test_tmpdir(), 'halving'), events=False)
        cls.report = report_fixtures.build_report(
            root, report_data.Settings(root, '/out', bootstrap_reps=500,
                                       curve_bootstrap_reps=100))
        cls.by_label = {config['label']: config for config in cls.report['configurations']}

    def test_the_rungs_table(self):
        lr = 'PPO.learning_rate='
        self.assertEqual(rung_rows(self.report), [
            (0, 0, 512, 4, 2, True, False, [(lr + '0.001', -150.0, 1, 'went on'),
                                             (lr + '0.003', -165.0, 2, 'went on'),
                                             (lr + '0.01', -180.0, 3, 'pruned'),
                                             (lr + '0.03', -410.0, 4, 'pruned')]),
            (0, 1, 1024, 2, 1, True, False, [(lr + '0.001', -200.0, 1, 'went on'),
                                              (lr + '0.003', -220.0, 2, 'pruned')]),
            (0, 2, 2048, 1, None, False, True, [(lr + '0.001', -250.0, 1, 'completed')]),
        ])
        ids = report_fixtures.HALVING_IDS
        for row in self.report['rungs']:
            self.assertEqual((row['sweep'], row['metric'], row['mode']), ('', 'mean_return',
                                                                          'max'))
            for entry in row['configurations']:
                lr_value = entry['label'].removeprefix(lr)
                self.assertEqual(entry['sweep_config'], ids[lr_value])
                self.assertEqual(entry['config'], self.by_label[entry['label']]['id'])
        self.assertTrue(self.report['staged'])

    def test_configurations_are_ranked_only_against_those_of_their_budget(self):
        configs = self.report['configurations']
        # Ranked by final return alone, the pruned lr 0.01 (IQM -180 after 512 steps) would
        # beat the full-budget winner (IQM -250 after 2048).
        naive = max(configs, key=lambda config: config['final']['iqm']['value'])
        self.assertEqual((naive['label'], naive['budget']), ('PPO.learning_rate=0.01', 512))
        self.assertEqual([(config['rank'], config['label'], config['budget'],
                           config['budget_rank'], config['final']['iqm']['value'])
                          for config in configs], [
            (1, 'PPO.learning_rate=0.001', 2048, 1, -250.0),
            (2, 'PPO.learning_rate=0.003', 1024, 1, -220.0),
            (3, 'PPO.learning_rate=0.01', 512, 1, -180.0),
            (4, 'PPO.learning_rate=0.03', 512, 2, -410.0),
        ])
        self.assertEqual(self.report['best_configuration'],
                         self.by_label['PPO.learning_rate=0.001']['id'])
        # No configuration is ranked above one of a higher budget, and by return only within
        # its budget.
        for above, below in zip(configs, configs[1:], strict=False):
            self.assertGreaterEqual(above['budget'], below['budget'])
            if above['budget'] == below['budget']:
                self.assertGreaterEqual(above['final']['iqm']['value'],
                                        below['final']['iqm']['value'])
        self.assertEqual([(group['budget'], group['full'], group['rungs'], group['title'],
                           [self.label(key) for key in group['configurations']])
                          for group in self.report['budget_groups']], [
            (2048, True, [2], 'Trained to the full budget of 2048 env steps', ['0.001']),
            (1024, False, [1], 'Stopped at 1024 env steps (pruned after rung 1)', ['0.003']),
            (512, False, [0], 'Stopped at 512 env steps (pruned after rung 0)',
             ['0.01', '0.03']),
        ])

    def label(self, key):
        config = next(c for c in self.report['configurations'] if c['id'] == key)
        return config['label'].removeprefix('PPO.learning_rate=')

    def test_where_each_configuration_and_run_stopped(self):
        stops = {config['label']: (config['rung'], config['bracket'], config['stop_reason'],
                                   config['stop_detail'])
                 for config in self.report['configurations']}
        self.assertEqual(stops, {
            'PPO.learning_rate=0.001': (2, 0, 'completed',
                                        'trained to the full budget (2048 env steps)'),
            'PPO.learning_rate=0.003': (1, 0, 'pruned', 'pruned after rung 1 (1024 env '
                                        'steps): ranked 2 of 2 by max mean_return; the top 1 '
                                        'went on'),
            'PPO.learning_rate=0.01': (0, 0, 'pruned', 'pruned after rung 0 (512 env steps): '
                                       'ranked 3 of 4 by max mean_return; the top 2 went on'),
            'PPO.learning_rate=0.03': (0, 0, 'pruned', 'pruned after rung 0 (512 env steps): '
                                       'ranked 4 of 4 by max mean_return; the top 2 went on'),
        })
        runs = {(run['config_label'], run['seed']): run for run in self.report['runs']}
        run = runs['PPO.learning_rate=0.003', 1]
        self.assertEqual((run['budget'], run['rung'], run['bracket'], run['stop_reason'],
                          run['env_steps'], run['final_return']),
                         (1024, 1, 0, 'pruned', 1024, -225.0))
        self.assertEqual(run['sweep_config'], report_fixtures.HALVING_IDS['0.003'])

    def test_summary_plots_compare_one_budget_at_a_time(self):
        (entry,) = self.report['plots']['sensitivity']
        # Only the 512-step group has two learning rates to set side by side.
        self.assertEqual((entry['parameter'], entry['budget'], entry['plot']),
                         ('PPO.learning_rate', 512, 'plots/sensitivity-0.svg'))
        self.assertEqual([point['text'] for point in entry['points']], ['0.01', '0.03'])
        self.assertEqual(self.report['plots']['iqm'], 'plots/iqm.svg')
        json.dumps(self.report, allow_nan=False)


class StagedTest(absltest.TestCase):
    """Budgets and rungs from runs made here: ordinary sweeps, HyperBand, failures."""

    def build(self, runs, rungs=()):
        groups = {}
        for run in runs:
            if run.error is None:
                groups.setdefault(run.config_key, []).append(run)
        configs = [report_data.summarize_configuration(key, group, SETTINGS)
                   for key, group in groups.items()]
        return report_data.build_report(runs, configs, [], SETTINGS, rungs)

    def test_a_sweep_without_a_scheduler_is_reported_as_before(self):
        runs = [staged(make_run(f'{lr}/{seed}', seed, [-500.0, final], lr=lr), f'id{lr}', 200,
                       0, 'completed')
                for lr, final in (('0.001', -150.0), ('0.01', -100.0)) for seed in range(2)]
        runs.append(make_run('outside', 5, [-500.0, -50.0], lr='0.1'))  # No sweep record.
        report = self.build(runs)
        self.assertFalse(report['staged'])
        self.assertEqual(report['rungs'], [])
        self.assertEqual([config['label'] for config in report['configurations']],
                         ['PPO.learning_rate=0.1', 'PPO.learning_rate=0.01',
                          'PPO.learning_rate=0.001'])
        (group,) = report['budget_groups']
        self.assertEqual(group['budget'], 200)
        self.assertLen(group['configurations'], 3)
        self.assertEqual([entry['budget'] for entry in report['plots']['sensitivity']], [None])
        self.assertEqual(report['plots']['sensitivity'][0]['plot'], 'plots/sensitivity-0.svg')

    def test_runs_outside_the_sweep_rank_last_in_a_staged_report(self):
        runs = [staged(make_run('full', 0, [-300.0], lr='0.001'), 'a', 200, 1, 'completed'),
                staged(make_run('pruned', 0, [-100.0], lr='0.01'), 'b', 100, 0, 'pruned'),
                make_run('outside', 0, [-50.0], lr='0.1')]
        report = self.build(runs, [decision(0, 0, 100, {'a': -200.0, 'b': -100.0}, ['a'])])
        self.assertEqual([(config['label'], config['budget'])
                          for config in report['configurations']],
                         [('PPO.learning_rate=0.001', 200), ('PPO.learning_rate=0.01', 100),
                          ('PPO.learning_rate=0.1', None)])
        self.assertEqual(report['budget_groups'][-1]['title'],
                         'Budget unknown (runs no sweep record tells the budget of)')

    def test_hyperband_brackets_and_a_failed_seed(self):
        # Bracket 0 starts 3 configurations at rung 0 (100 steps): c has a failed seed and no
        # score, a goes on to the full 300; bracket 1 starts d at rung 1 (300 steps): no rung
        # of it is decided, it trains to the full budget.
        runs = [
            staged(make_run('a0', 0, [-200.0, -150.0], lr='0.1'), 'a', 300, 1, 'completed'),
            staged(make_run('a1', 1, [-220.0, -170.0], lr='0.1'), 'a', 300, 1, 'completed'),
            staged(make_run('b0', 0, [-300.0], lr='0.2'), 'b', 100, 0, 'pruned'),
            staged(make_run('b1', 1, [-320.0], lr='0.2'), 'b', 100, 0, 'pruned'),
            staged(make_run('c0', 0, [-100.0], lr='0.3'), 'c', 100, 0, 'pruned'),
            staged(make_run('c1', 1, [], lr='0.3', error='the sweep recorded this trial as '
                            'failed'), 'c', None, 0, 'failed'),
            staged(make_run('d0', 0, [-120.0, -140.0], lr='0.4'), 'd', 300, 1, 'completed',
                   bracket=1),
            staged(make_run('d1', 1, [-130.0, -160.0], lr='0.4'), 'd', 300, 1, 'completed',
                   bracket=1),
        ]
        report = self.build(runs, [decision(0, 0, 100, {'a': -210.0, 'b': -310.0, 'c': None},
                                            ['a'])])
        lr = 'PPO.learning_rate='
        self.assertEqual(rung_rows(report), [
            (0, 0, 100, 3, 1, True, False, [(lr + '0.1', -210.0, 1, 'went on'),
                                            (lr + '0.2', -310.0, 2, 'pruned'),
                                            (lr + '0.3', None, None, 'no score')]),
            (0, 1, 300, 1, None, False, True, [(lr + '0.1', -160.0, 1, 'completed')]),
            (1, 1, 300, 1, None, False, True, [(lr + '0.4', -150.0, 1, 'completed')]),
        ])
        # Both brackets' full-budget configurations are ranked together, above the pruned.
        self.assertEqual([(config['label'], config['budget_rank'])
                          for config in report['configurations']],
                         [(lr + '0.4', 1), (lr + '0.1', 2), (lr + '0.3', 1), (lr + '0.2', 2)])
        self.assertEqual(report['best_configuration'], report['configurations'][0]['id'])


class SweepOutputTest(absltest.TestCase):
    """The report reads what pipelines/sweep/sweep.py and scheduler.py write: their course of a
    successive-halving and a HyperBand sweep, with a stand-in trainer that writes each trial's
    result and its run (an evaluation every 100 steps up to its budget)."""

    SPEC = ('gin_files: [configs/pendulum.gin]\nbudget: {env_steps: 900}\nseeds: 2\n'
            'grid:\n  PPO.learning_rate: [1, 2, 3, 4, 5, 6, 7, 8, 9]\n'
            'scheduler: {type: TYPE, min_steps: 100, reduction_factor: 3}\n')

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        # The sweep's modules (Beam, its flags) only for these tests.
        from pipelines.sweep import scheduler, sweep, sweep_spec
        from pipelines.sweep import trial as trial_lib
        cls.modules = scheduler, sweep, sweep_spec, trial_lib

    def make_sweep(self, kind):
        scheduler, sweep, sweep_spec, trial_lib = self.modules
        output_dir = self.create_tempdir().full_path
        spec = sweep_spec.parse(self.SPEC.replace('TYPE', kind), 'spec.yaml')

        def train(work):
            for trial, stop in work:
                budget = stop or spec.env_steps
                rate = trial.bindings['PPO.learning_rate']
                steps = list(range(100, budget + 1, 100))
                # Best near rate 5, growing with the steps; pruned ones end above the winner
                # (no ties: summary.csv and the report break them by different ids).
                returns = [-abs(rate - 5.2) * 10 - 1000 / step + (step == budget) * 50 * (
                    budget < spec.env_steps) + trial.seed for step in steps]
                report_fixtures.make_run(
                    trial_lib.trial_dir(output_dir, trial.id), returns, steps=steps,
                    seed=trial.seed, bindings={'PPO.learning_rate': str(rate)}, events=False)
                record = {'id': trial.id, 'config_id': trial.config_id, 'index': trial.index,
                          'bindings': trial.bindings, 'seed': trial.seed, 'status': 'ok',
                          'final_return': returns[-1], 'best_return': max(returns),
                          'env_steps': budget, 'budget': budget,
                          'final_metrics': {'mean_return': returns[-1]}, 'wall_time_s': 1.0,
                          'error': None, 'logdir': f'trials/{trial.id}'}
                with open(os.path.join(trial_lib.trial_dir(output_dir, trial.id),
                                       'result.json'), 'w', encoding='utf-8') as f:
                    json.dump(record, f)

        course = scheduler.run(spec, output_dir, train)
        records = scheduler.annotate(course, [trial_lib.read_result(output_dir, trial.id)
                                              for trial in course.trials])
        sweep.write_outputs(records, output_dir, spec.metric, spec.mode)
        return output_dir, course

    def check(self, kind):
        output_dir, course = self.make_sweep(kind)
        written = report_fixtures.build_report(output_dir, report_data.Settings(
            output_dir, '/out', bootstrap_reps=100, curve_bootstrap_reps=20))
        self.assertEqual((written['exit_code'], written['skipped']), (3, []))
        self.assertEqual({entry['problem'] for entry in written['problems']},
                         {'no TensorBoard event files: no training curve'})
        self.assertTrue(written['staged'])
        # Every decided rung as rungs.jsonl has it.
        decided = [row for row in written['rungs'] if row['decided']]
        self.assertEqual([(row['bracket'], row['rung'], row['budget']) for row in decided],
                         sorted((key[0], key[1], decision['budget'])
                                for key, decision in course.decisions.items()))
        for row in decided:
            decision = course.decisions[row['bracket'], row['rung']]
            self.assertEqual({entry['sweep_config']: entry['score']
                              for entry in row['configurations']}, decision['scores'])
            self.assertEqual([entry['sweep_config'] for entry in row['configurations']
                              if entry['status'] == 'went on'], decision['promoted'])
        # Every configuration trained to the full budget appears in a completed rung, scored.
        completed = sorted(entry['sweep_config'] for row in written['rungs'] if row['final']
                           for entry in row['configurations'] if entry['status'] == 'completed')
        with open(os.path.join(output_dir, 'trials.jsonl'), encoding='utf-8') as f:
            records = [json.loads(line) for line in f]
        self.assertEqual(completed, sorted({record['config_id'] for record in records
                                            if record['stop_reason'] == 'completed'}))
        # The report ranks the configurations as summary.csv does: by budget, then return.
        with open(os.path.join(output_dir, 'summary.csv'), encoding='utf-8') as f:
            summary = [line.split(',')[1] for line in f.read().splitlines()[1:]]
        self.assertEqual([config['sweep_configs'] for config in written['configurations']],
                         [[config_id] for config_id in summary])
        stops = {record['config_id']: (record['budget'], record['rung'], record['bracket'],
                                       record['stop_reason'], record['stop_detail'])
                 for record in records}
        for config in written['configurations']:
            self.assertEqual((config['budget'], config['rung'], config['bracket'],
                              config['stop_reason'], config['stop_detail']),
                             stops[config['sweep_configs'][0]])
        # A naive ranking by final return would put a pruned configuration first.
        best = max(written['configurations'], key=lambda config: config['final']['iqm']['value'])
        self.assertEqual(best['stop_reason'], 'pruned')
        self.assertEqual(written['configurations'][0]['stop_reason'], 'completed')
        return written

    def test_successive_halving(self):
        written = self.check('successive_halving')
        self.assertEqual([(row['rung'], row['entered'], row['went_on'])
                          for row in written['rungs']], [(0, 9, 3), (1, 3, 1), (2, 1, None)])

    def test_hyperband(self):
        written = self.check('hyperband')
        self.assertEqual(sorted({row['bracket'] for row in written['rungs']}), [0, 1, 2])
        last = [row for row in written['rungs'] if row['bracket'] == 2]
        self.assertEqual([(row['rung'], row['decided'], row['final']) for row in last],
                         [(2, False, True)])


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
