"""End-to-end tests of //pipelines:report on a synthetic sweep with damaged runs."""

import html
import json
import os
import subprocess
import sys
import tempfile
from unittest import mock

import imageio.v2 as imageio
from absl.testing import absltest, flagsaver
from apache_beam.options.pipeline_options import DirectOptions, StandardOptions

from agents.scripts import testing_utils as script_testing
from pipelines.report import (
    report,
    report_data,
    report_fixtures,
    report_html,
    score_statistics,
    videos,
)

FAST = {'bootstrap_reps': 2000, 'curve_bootstrap_reps': 200}
IN_PROCESS = '--direct_running_mode=in_memory'


def read_json(path):
    with open(path, encoding='utf-8') as f:
        return json.load(f)


class ReportTest(absltest.TestCase):

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        tmp = tempfile.mkdtemp(dir=absltest.get_default_test_tmpdir())
        cls.policy = report_fixtures.train_tiny_policy(os.path.join(tmp, 'tiny'))
        cls.sweep = report_fixtures.make_sweep(os.path.join(tmp, 'sweep'), cls.policy)
        cls.output = os.path.join(tmp, 'report')
        with flagsaver.flagsaver(input=cls.sweep, output_dir=cls.output, video_max_steps=30,
                                 video_size=128, **FAST):
            cls.exit_code = report.main(['report', IN_PROCESS])
        cls.report = read_json(os.path.join(cls.output, 'report.json'))

    def run_main(self, argv=(IN_PROCESS,), **flag_values):
        with flagsaver.flagsaver(**flag_values):
            return report.main(['report', *argv])

    def test_exit_code_says_runs_were_skipped(self):
        self.assertEqual(self.exit_code, 3)
        self.assertEqual(self.report['exit_code'], 3)

    def test_configurations_ranked_by_iqm_with_rliable_statistics(self):
        configs = self.report['configurations']
        self.assertEqual([config['label'] for config in configs],
                         ['PPO.learning_rate=0.001', 'PPO.learning_rate=0.01'])
        self.assertEqual(self.report['swept_parameters'], ['PPO.learning_rate'])
        best, worst = configs
        # The run outside the sweep has the same bindings but the seed: it joins lr 0.001.
        self.assertEqual(sorted(best['runs']), sorted(
            [f'trials/lr0.001-s{seed}' for seed in range(3)] + [report_fixtures.EVIL_RUN]))
        self.assertEqual(best['seeds'], [0, 1, 2, 5])
        self.assertEqual(best['scores'], [-150.0, -170.0, -160.0, -165.0])
        self.assertEqual(best['final']['iqm']['value'], (-165.0 + -160.0) / 2)
        self.assertEqual(worst['final']['iqm']['value'], -350.0)
        self.assertEqual(worst['final']['mean']['value'], -350.0)
        self.assertEqual(worst['final']['median']['value'], -350.0)
        self.assertEqual(best['best_run'], 'trials/lr0.001-s0')
        for config in configs:
            scores = config['scores']
            for name in ('iqm', 'mean', 'median'):
                low, high = config['final'][name]['ci']
                self.assertTrue(min(scores) <= low <= config['final'][name]['value'] <= high
                                <= max(scores), (name, config['final'][name]))
            self.assertEqual(config['final']['iqm']['value'],
                             score_statistics.aggregate_iqm(scores))

    def test_skipped_runs_and_problems_are_listed_with_reasons(self):
        skipped = {entry['run']: entry['reason'] for entry in self.report['skipped']}
        self.assertEqual(set(skipped), {'trials/lr0.1-s0', 'extra/no-evaluations'})
        self.assertIn("status 'failed': FloatingPointError: non-finite loss",
                      skipped['trials/lr0.1-s0'])
        self.assertIn('no evaluation results', skipped['extra/no-evaluations'])
        problems = {}
        for entry in self.report['problems']:
            problems.setdefault(entry['run'], []).append(entry['problem'])
        self.assertRegex(problems['trials/lr0.01-s1'][0],
                         r'is damaged \(truncated record at byte')
        self.assertIn('metrics.jsonl line 4: not JSON', problems['trials/lr0.001-s2'][0])
        self.assertEqual(problems['trials/lr0.01-s2'],
                         ['no TensorBoard event files: no training curve'])
        self.assertIn('the best run trials/lr0.01-s1 has no usable exported policy',
                      ' '.join(problems['trials/lr0.01-s1']))
        self.assertEqual(self.report['num_runs'], 7)

    def test_one_video_per_configuration_of_its_best_usable_run(self):
        best, worst = self.report['configurations']
        self.assertEqual(best['video']['run'], 'trials/lr0.001-s0')
        self.assertEqual(worst['video']['run'], 'trials/lr0.01-s2')  # s1 exported no policy.
        for config in (best, worst):
            path = os.path.join(self.output, config['video']['path'])
            reader = imageio.get_reader(path, format='FFMPEG')
            try:
                self.assertEqual(reader.get_meta_data()['codec'], 'h264')
                self.assertEqual(reader.count_frames(), 31)  # Reset + 30 steps.
            finally:
                reader.close()
            self.assertLessEqual(config['video']['width'], 128)

    def test_files_of_the_report(self):
        names = set()
        for parent, _, files in os.walk(self.output):
            names.update(os.path.relpath(os.path.join(parent, name), self.output)
                         for name in files)
        expected = {'index.html', 'report.json', 'plots/learning_curves.svg', 'plots/iqm.svg',
                    'plots/sensitivity-0.svg'}
        for config in self.report['configurations']:
            expected |= {config['plot'], config['video']['path']}
        for run in self.report['runs']:
            expected |= {run['page'], run['plot']}
        self.assertEqual(names, expected)
        # Nothing is left beside the report: no staging or replaced copies.
        self.assertEqual(sorted(os.listdir(os.path.dirname(self.output))),
                         sorted(['report', 'sweep', 'tiny']))

    def test_run_named_script_renders_as_text(self):
        with open(os.path.join(self.output, 'index.html'), encoding='utf-8') as f:
            index = f.read()
        self.assertNotIn('<script>', index)
        self.assertIn('extra/&lt;script&gt;alert(1)&lt;/script&gt;', index)
        page = report_data.run_page(report_fixtures.EVIL_RUN)
        self.assertTrue(os.path.isfile(os.path.join(self.output, page)))

    def test_deterministic_for_a_seed_and_independent_of_the_runner(self):
        first = os.path.join(self.create_tempdir().full_path, 'a')
        second = os.path.join(self.create_tempdir().full_path, 'b')
        self.assertEqual(self.run_main(input=self.sweep, output_dir=first, videos=False, **FAST),
                         3)
        # The same in Beam worker processes (the default), through the command line.
        process = subprocess.run(
            [sys.executable, '-m', 'pipelines.report', f'--input={self.sweep}',
             f'--output_dir={second}', '--novideos', '--bootstrap_reps=2000',
             '--curve_bootstrap_reps=200', '--direct_num_workers=2'],
            env=dict(os.environ, PYTHONPATH=script_testing.ROOT), capture_output=True,
            text=True, timeout=300, check=False)
        self.assertEqual(process.returncode, 3, process.stderr[-3000:])
        self.assertIn('Report of 7 runs in 2 configurations (2 skipped', process.stdout)
        with open(os.path.join(first, 'report.json'), 'rb') as a, \
                open(os.path.join(second, 'report.json'), 'rb') as b:
            self.assertEqual(a.read(), b.read())
        with_videos = {config['id']: config['final'] for config in self.report['configurations']}
        without = {config['id']: config['final']
                   for config in read_json(os.path.join(first, 'report.json'))['configurations']}
        self.assertEqual(with_videos, without)
        other = os.path.join(self.create_tempdir().full_path, 'c')
        self.run_main(input=self.sweep, output_dir=other, videos=False, seed=1, **FAST)
        reseeded = read_json(os.path.join(other, 'report.json'))['configurations']
        original = read_json(os.path.join(first, 'report.json'))['configurations']
        # With 3-4 runs the intervals take few values; the curve bands show the new draws.
        self.assertEqual([config['final']['iqm']['value'] for config in reseeded],
                         [config['final']['iqm']['value'] for config in original])
        self.assertNotEqual([config['curve']['lower'] for config in reseeded],
                            [config['curve']['lower'] for config in original])

    def test_empty_input(self):
        empty = self.create_tempdir().full_path
        output = os.path.join(self.create_tempdir().full_path, 'report')
        self.assertEqual(self.run_main(input=empty, output_dir=output), 4)
        written = read_json(os.path.join(output, 'report.json'))
        self.assertEqual((written['configurations'], written['runs']), ([], []))
        with open(os.path.join(output, 'index.html'), encoding='utf-8') as f:
            self.assertIn('No training runs were found', f.read())

    def test_rerun_replaces_an_earlier_report_inside_the_input(self):
        sweep = self.create_tempdir().full_path
        report_fixtures.make_run(os.path.join(sweep, 'a'), [-500.0, -200.0])
        output = os.path.join(sweep, 'report')
        for _ in range(2):
            self.assertEqual(self.run_main(input=sweep, output_dir=output, videos=False,
                                           **FAST), 0)
            written = read_json(os.path.join(output, 'report.json'))
            self.assertEqual([run['id'] for run in written['runs']], ['a'])
        self.assertEqual(sorted(os.listdir(sweep)), ['a', 'report'])

    def test_failed_pipeline_keeps_the_earlier_report(self):
        output = os.path.join(self.create_tempdir().full_path, 'report')
        sweep = self.create_tempdir().full_path
        report_fixtures.make_run(os.path.join(sweep, 'a'), [-500.0, -200.0], events=False)
        self.run_main(input=sweep, output_dir=output, videos=False, **FAST)
        before = script_testing.snapshot(output)
        report_fixtures.make_run(os.path.join(sweep, 'b'), [-100.0], events=False)
        with mock.patch.object(report_html, 'write_report', side_effect=OSError('disk full')):
            with self.assertRaisesRegex(Exception, 'disk full'):
                self.run_main(input=sweep, output_dir=output, videos=False, **FAST)
        self.assertEqual(script_testing.snapshot(output), before)
        self.assertEqual(os.listdir(os.path.dirname(output)), ['report'])

    def test_bad_flags_and_paths_write_nothing(self):
        root = self.create_tempdir().full_path
        foreign = os.path.join(root, 'foreign')
        os.makedirs(foreign)
        with open(os.path.join(foreign, 'notes.txt'), 'w') as f:
            f.write('keep me')
        a_file = os.path.join(root, 'file')
        open(a_file, 'w').close()
        cases = [
            ({'input': None, 'output_dir': os.path.join(root, 'out')}, '--input is required'),
            ({'input': os.path.join(root, 'nope'), 'output_dir': os.path.join(root, 'out')},
             'does not exist'),
            ({'input': self.sweep, 'output_dir': foreign}, 'holds no earlier report'),
            ({'input': self.sweep, 'output_dir': a_file}, 'is not a directory'),
            ({'input': self.sweep, 'output_dir': os.path.dirname(self.sweep)},
             'contains the input'),
            ({'input': self.sweep, 'output_dir': os.path.join(root, 'out'),
              'bootstrap_reps': 0}, '--bootstrap_reps must be positive'),
        ]
        for flag_values, message in cases:
            with self.subTest(message), mock.patch('sys.stderr') as stderr:
                self.assertEqual(self.run_main(**flag_values), 2)
                printed = ''.join(call.args[0] for call in stderr.write.call_args_list)
                self.assertIn(message, printed)
        with mock.patch('sys.stderr') as stderr:
            self.assertEqual(self.run_main(['--runnr=Dataflow'], input=self.sweep,
                                           output_dir=os.path.join(root, 'out')), 2)
            self.assertIn('unknown flag(s) or argument(s): --runnr=Dataflow',
                          ''.join(call.args[0] for call in stderr.write.call_args_list))
        self.assertEqual(sorted(os.listdir(root)), ['file', 'foreign'])
        self.assertEqual(os.listdir(foreign), ['notes.txt'])

    def test_bad_flag_value_on_the_command_line(self):
        process = subprocess.run(
            [sys.executable, '-m', 'pipelines.report', '--input=x', '--output_dir=y',
             '--seed=abc'], env=dict(os.environ, PYTHONPATH=script_testing.ROOT),
            capture_output=True, text=True, timeout=120, check=False)
        self.assertEqual(process.returncode, 2)
        self.assertIn('report: error:', process.stderr)
        self.assertIn('seed', process.stderr)


class ExtremeRunsTest(absltest.TestCase):
    """One report, through the command line, of a normal run beside a run of numbers no
    training gives and runs whose metrics.jsonl is no regular file (a FIFO among them)."""

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        tmp = tempfile.mkdtemp(dir=absltest.get_default_test_tmpdir())
        cls.root = report_fixtures.make_extreme_runs(os.path.join(tmp, 'runs'))
        cls.output = os.path.join(tmp, 'report')
        # Reading the FIFO would block: the timeout fails the test rather than hang it.
        cls.process = subprocess.run(
            [sys.executable, '-m', 'pipelines.report', f'--input={cls.root}',
             f'--output_dir={cls.output}', '--novideos', '--bootstrap_reps=200',
             '--curve_bootstrap_reps=50', IN_PROCESS],
            env=dict(os.environ, PYTHONPATH=script_testing.ROOT), capture_output=True,
            text=True, timeout=300, check=False)
        path = os.path.join(cls.output, 'report.json')
        cls.report = read_json(path) if os.path.exists(path) else None

    def expected_problems(self):
        symlink = os.path.join(self.root, 'special', 'dangling_symlink', 'metrics.jsonl')
        return {
            'extreme': [
                'metrics.jsonl line 2: "step" 10000000000000000000 is out of range (0 to '
                '2^63 - 1)',
                'metrics.jsonl line 3: "mean_return" 1.7e+308 is out of range (-1e+300 to '
                '1e+300)',
                'metrics.jsonl line 4: "step" true is not an integer',
            ],
            'special/directory': [
                'metrics.jsonl is a directory, not a regular file; not read'],
            'special/dangling_symlink': [
                f'metrics.jsonl is a symbolic link to {symlink}.gone, which does not exist; '
                'not read'],
            'special/fifo': [
                'metrics.jsonl is a named pipe (FIFO), not a regular file; not read'],
        }

    def test_report_is_written_and_says_runs_were_read_in_part(self):
        self.assertEqual(self.process.returncode, 3, self.process.stderr[-3000:])
        self.assertNotIn('Traceback', self.process.stderr)
        for name in ('index.html', 'report.json', 'plots/learning_curves.svg',
                     'plots/iqm.svg'):
            self.assertTrue(os.path.isfile(os.path.join(self.output, name)), name)
        self.assertEqual(self.report['exit_code'], 3)
        self.assertEqual(self.report['skipped'], [])
        self.assertEqual(sorted(run['id'] for run in self.report['runs']),
                         ['extreme', 'normal', 'special/dangling_symlink', 'special/directory',
                          'special/fifo'])
        for run in self.report['runs']:
            self.assertTrue(os.path.isfile(os.path.join(self.output, run['page'])), run['id'])
            self.assertTrue(os.path.isfile(os.path.join(self.output, run['plot'])), run['id'])

    def test_each_bad_line_and_file_is_a_problem_of_its_run(self):
        problems = {}
        for entry in self.report['problems']:
            problems.setdefault(entry['run'], []).append(entry['problem'])
        self.assertEqual(problems, self.expected_problems())
        with open(os.path.join(self.output, 'index.html'), encoding='utf-8') as f:
            index = html.unescape(f.read())
        for run, messages in self.expected_problems().items():
            for message in messages:
                self.assertIn(f'  problem {run}: {message}\n', self.process.stdout)
                self.assertIn(message, index)

    def test_the_usable_evaluations_of_those_runs_are_reported(self):
        runs = {run['id']: run for run in self.report['runs']}
        self.assertEqual((runs['extreme']['evaluations'], runs['extreme']['final_return'],
                          runs['extreme']['env_steps']), (2, -200.0, 768))
        for seed, kind in enumerate(report_fixtures.SPECIAL_METRICS, 2):
            run = runs[f'special/{kind}']
            self.assertEqual((run['evaluations'], run['final_return']), (2, -100.0 * seed))
        (config,) = self.report['configurations']
        self.assertEqual(sorted(config['scores']), [-400.0, -300.0, -300.0, -200.0, -200.0])
        self.assertEqual(config['curve']['steps'], [256, 512, 768])  # Not the 1e19 step.


class HalvingSweepTest(absltest.TestCase):
    """The report of a successive-halving sweep (`report_fixtures.make_halving_sweep`) through
    the pipeline: rungs, budgets, and plots of one budget at a time."""

    def test_report_of_a_halving_sweep(self):
        tmp = self.create_tempdir().full_path
        sweep = report_fixtures.make_halving_sweep(os.path.join(tmp, 'sweep'))
        output = os.path.join(tmp, 'report')
        with flagsaver.flagsaver(input=sweep, output_dir=output, videos=False, **FAST):
            self.assertEqual(report.main(['report', IN_PROCESS]), 0)
        written = read_json(os.path.join(output, 'report.json'))
        self.assertEqual([(config['label'], config['budget'])
                          for config in written['configurations']],
                         [('PPO.learning_rate=0.001', 2048), ('PPO.learning_rate=0.003', 1024),
                          ('PPO.learning_rate=0.01', 512), ('PPO.learning_rate=0.03', 512)])
        self.assertEqual([(row['rung'], row['budget'], row['entered'], row['went_on'])
                          for row in written['rungs']],
                         [(0, 512, 4, 2), (1, 1024, 2, 1), (2, 2048, 1, None)])
        names = set()
        for parent, _, files in os.walk(output):
            names.update(os.path.relpath(os.path.join(parent, name), output) for name in files)
        expected = {'index.html', 'report.json', 'plots/learning_curves.svg', 'plots/iqm.svg',
                    'plots/sensitivity-0.svg'}
        expected |= {config['plot'] for config in written['configurations']}
        expected |= {path for run in written['runs'] for path in (run['page'], run['plot'])}
        self.assertEqual(names, expected)
        with open(os.path.join(output, 'plots', 'iqm.svg'), encoding='utf-8') as f:
            iqm = f.read()
        for group in written['budget_groups']:
            self.assertIn(html.escape(group['title']), iqm)
        with open(os.path.join(output, 'plots', 'sensitivity-0.svg'), encoding='utf-8') as f:
            self.assertIn('Sensitivity to PPO.learning_rate at 512 env steps', f.read())


class PopulationReportTest(absltest.TestCase):
    """A population trained by the train binary (`train.population`) reads as runs of one
    configuration, one per member."""

    def test_members_are_runs_of_one_configuration(self):
        tmp = self.create_tempdir().full_path
        logdir = os.path.join(tmp, 'population')
        trained = script_testing.run_script(
            'train', '--gin_file=configs/pendulum_native.gin', f'--logdir={logdir}',
            '--gin_bindings=train.population = 3', '--gin_bindings=train.jit_compile = False',
            '--gin_bindings=train.total_steps = 512', '--gin_bindings=train.num_envs = 4',
            '--gin_bindings=train.rollout_length = 64', '--gin_bindings=train.eval_episodes = 1',
            '--gin_bindings=train.eval_every_steps = 256', '--gin_bindings=PPO.num_minibatches = 4')
        self.assertEqual(trained.returncode, 0, trained.stderr[-3000:])
        output = os.path.join(tmp, 'report')
        with flagsaver.flagsaver(input=logdir, output_dir=output, videos=False, **FAST):
            self.assertEqual(report.main(['report', IN_PROCESS]), 0)
        written = read_json(os.path.join(output, 'report.json'))
        self.assertLen(written['configurations'], 1)
        configuration = written['configurations'][0]
        self.assertEqual(sorted(configuration['runs']), ['member-0', 'member-1', 'member-2'])
        self.assertEqual(sorted(configuration['seeds']), [0, 1, 2])
        finals = {}
        for member in range(3):
            with open(os.path.join(logdir, f'member-{member}', 'metrics.jsonl'),
                      encoding='utf-8') as f:
                finals[member] = [json.loads(line) for line in f][-1]['mean_return']
        self.assertEqual(sorted(configuration['scores']), sorted(finals.values()))


class RenderVideoTest(absltest.TestCase):

    SETTINGS = report_data.Settings('/in', '/out', seed=7, video_max_steps=9, video_size=99)
    INFO = {'return': -1.0, 'length': 9, 'frames': 10, 'width': 98, 'height': 98}

    def config(self):
        return {'id': 'c1', 'best_run': 'a', 'video': None, 'video_problem': None,
                'video_candidates': [('a', 0, '/p/a'), ('b', 1, '/p/b')]}

    def render(self, side_effect):
        with mock.patch.object(videos, 'render_policy', side_effect=side_effect) as render:
            return report.render_video(self.config(), self.SETTINGS), render

    def test_best_run_after_a_transient_failure(self):
        config, render = self.render([BrokenPipeError(32, 'Broken pipe'), self.INFO])
        self.assertEqual(config['video'], dict(self.INFO, path='videos/c1.mp4', run='a',
                                               seed=0))
        self.assertIsNone(config['video_problem'])
        self.assertEqual(render.call_count, 2)
        render.assert_called_with('/p/a', '/out/videos/c1.mp4', seed=7, max_steps=9,
                                  max_size=99)

    def test_unusable_policy_falls_back_to_the_next_run(self):
        config, render = self.render([videos.VideoError('no saved_model.pb'), self.INFO])
        self.assertEqual(config['video']['run'], 'b')
        self.assertEqual(config['video_problem'], 'the best run a has no usable exported policy '
                         '(a: no saved_model.pb); the video shows b')
        self.assertEqual(render.call_count, 2)

    def test_no_usable_policy(self):
        config, _ = self.render([videos.VideoError('x'), OSError('y'), OSError('z')])
        self.assertIsNone(config['video'])
        self.assertEqual(config['video_problem'], 'no run of this configuration has a usable '
                         'exported policy: a: x; b: z')


class PipelineOptionsTest(absltest.TestCase):

    def test_local_defaults_one_worker_process_per_core(self):
        options = report.pipeline_options([]).view_as(DirectOptions)
        self.assertEqual(options.direct_running_mode, 'multi_processing')
        self.assertEqual(options.direct_num_workers, os.cpu_count())
        self.assertIsNotNone(report.default_runner(report.pipeline_options([])))

    def test_given_options_are_kept(self):
        options = report.pipeline_options([IN_PROCESS, '--direct_num_workers=3'])
        self.assertEqual(options.view_as(DirectOptions).direct_running_mode, 'in_memory')
        self.assertEqual(options.view_as(DirectOptions).direct_num_workers, 3)
        dataflow = report.pipeline_options(['--runner', 'DataflowRunner', '--project=p'])
        self.assertEqual(dataflow.view_as(StandardOptions).runner, 'DataflowRunner')
        self.assertIsNone(report.default_runner(dataflow))

    def test_bad_options(self):
        with self.assertRaisesRegex(report.UsageError, 'unknown flag.*--no_such_option=1'):
            report.pipeline_options(['--no_such_option=1'])
        with self.assertRaisesRegex(report.UsageError, r'argument\(s\): extra \('):
            report.pipeline_options(['extra'])
        with self.assertRaisesRegex(report.UsageError, 'must be positive'):
            report.pipeline_options(['--direct_num_workers=-2'])


if __name__ == '__main__':
    absltest.main()
