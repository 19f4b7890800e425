"""Tests of reading runs back, whole and damaged."""

import errno
import json
import os
import threading
from unittest import mock

import tensorflow as tf
from absl.testing import absltest

from agents.runs import run_dir
from agents.storage import file_io
from pipelines.report import report_fixtures, run_reader


def release_fifos(paths):
    """Gives each FIFO's blocked reader an end of file: a writer that opens and closes it."""
    for path in paths:
        try:
            os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
        except OSError:  # No reader has it open.
            pass


def call_without_blocking(test, function, fifos, timeout=60.0):
    """`function()`, failing `test` if it is still running after `timeout` seconds: then it
    blocks on one of `fifos`, which are released so that nothing is left hanging."""
    result = []
    thread = threading.Thread(target=lambda: result.append(function()), daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        release_fifos(fifos)
        thread.join(timeout)
        test.fail(f'blocked for {timeout} s reading a FIFO of {fifos}')
    test.assertLen(result, 1)  # The function raised if it returned nothing.
    return result[0]


def write_double_events(logdir, tag, values):
    """An event file of float64 scalars {step: value}, which tf.summary (float32) cannot write."""
    with tf.io.TFRecordWriter(os.path.join(logdir, 'events.out.tfevents.2.double')) as writer:
        for step, value in values.items():
            tensor = tf.make_tensor_proto(value, dtype=tf.float64)
            event = tf.compat.v1.Event(step=step, summary=tf.compat.v1.Summary(
                value=[tf.compat.v1.Summary.Value(tag=tag, tensor=tensor)]))
            writer.write(event.SerializeToString())


class ConfigKeyTest(absltest.TestCase):

    def test_config_key_ignores_the_seed_only(self):
        base = {'PPO.learning_rate': '0.001', 'train.seed': '0'}
        key = run_reader.config_key(base)
        self.assertEqual(run_reader.config_key(dict(base, **{'train.seed': '7'})), key)
        self.assertNotEqual(run_reader.config_key(dict(base, **{'PPO.learning_rate': '0.01'})),
                            key)
        self.assertEqual(key, run_reader.config_key(dict(reversed(list(base.items())))))

class ReadRunTest(absltest.TestCase):

    def setUp(self):
        super().setUp()
        self.root = self.create_tempdir().full_path

    def make(self, name, returns=(-900.0, -500.0, -300.0), **kwargs):
        return report_fixtures.make_run(os.path.join(self.root, name), list(returns), **kwargs)

    def test_reads_a_complete_run(self):
        policy = os.path.join(self.create_tempdir().full_path, 'p')
        os.makedirs(policy)
        open(os.path.join(policy, 'saved_model.pb'), 'wb').close()
        logdir = self.make('sweep/a', seed=3, train_returns=[-1000.0, -800.0, -600.0],
                           bindings={'PPO.learning_rate': '0.0003'}, policy=policy)
        run = run_reader.read_run(logdir, self.root)
        self.assertIsNone(run.error)
        self.assertEqual(run.problems, [])
        self.assertEqual(run.run_id, 'sweep/a')
        self.assertEqual(run.seed, 3)
        self.assertEqual(run.bindings['PPO.learning_rate'], '0.0003')
        self.assertEqual(run.eval_steps, [256, 512, 768])
        self.assertEqual(run.eval_returns, [-900.0, -500.0, -300.0])
        self.assertEqual(run.train_steps, [256, 512, 768])
        self.assertEqual(run.train_returns, [-1000.0, -800.0, -600.0])
        self.assertEqual((run.final_return, run.best_return, run.env_steps), (-300.0, -300.0, 768))
        self.assertEqual(run.policy_dir, os.path.join(logdir, 'policy', '768'))
        self.assertEqual(run.config_key, run_reader.config_key(run.bindings))

    def test_corrupt_metrics_lines_are_skipped_and_reported(self):
        logdir = self.make('a')
        with open(os.path.join(logdir, 'metrics.jsonl'), 'a') as f:
            f.write('{"step": 1024, "mean_ret\n')
            f.write(json.dumps({'step': 1280, 'mean_return': float('nan')}) + '\n')
            f.write(json.dumps({'step': 1536, 'mean_return': -100.0}) + '\n')
        run = run_reader.read_run(logdir, self.root)
        self.assertIsNone(run.error)
        self.assertEqual(run.eval_returns, [-900.0, -500.0, -300.0, -100.0])
        self.assertLen(run.problems, 2)
        self.assertIn('metrics.jsonl line 4: not JSON', run.problems[0])
        self.assertIn('metrics.jsonl line 5: no integer "step" and finite', run.problems[1])

    def test_truncated_event_file_is_read_up_to_the_damage(self):
        logdir = self.make('a', train_returns=[1.0, 2.0, 3.0])
        report_fixtures.truncate(report_fixtures.event_files(logdir)[0], 10)
        run = run_reader.read_run(logdir, self.root)
        self.assertIsNone(run.error)
        self.assertLen(run.problems, 1)
        self.assertRegex(run.problems[0], r'^events\.out\.tfevents\.\S+ is damaged \(truncated '
                         r'record at byte \d+\); read the 9 events before it$')
        # The last event (step 768's eval) is lost; metrics.jsonl still has every evaluation.
        self.assertEqual(run.train_returns, [1.0, 2.0, 3.0])
        self.assertEqual(run.eval_returns, [-900.0, -500.0, -300.0])

    def test_corrupt_event_file_without_metrics_falls_back_to_the_events_before(self):
        logdir = self.make('a', metrics=False)
        path = report_fixtures.event_files(logdir)[0]
        report_fixtures.corrupt(path, os.path.getsize(path) - 20)
        run = run_reader.read_run(logdir, self.root)
        self.assertIsNone(run.error)
        self.assertEqual(run.eval_returns, [-900.0, -500.0])
        self.assertRegex(run.problems[0], r'is damaged \(corrupted record at byte \d+\)')

    def test_event_file_of_garbage(self):
        logdir = self.make('a', events=False)
        with open(os.path.join(logdir, 'events.out.tfevents.1.host'), 'wb') as f:
            f.write(b'not a record file' * 10)
        run = run_reader.read_run(logdir, self.root)
        self.assertIsNone(run.error)
        self.assertEqual(run.problems[0], 'events.out.tfevents.1.host is damaged (corrupted '
                         'record at byte 0); read the 0 events before it')

    def test_tf1_simple_values_are_read(self):
        logdir = self.make('a', metrics=False, events=False)
        with tf.io.TFRecordWriter(os.path.join(logdir, 'events.out.tfevents.1.tf1')) as writer:
            for step, value in ((100, -5.0), (200, -2.5)):
                event = tf.compat.v1.Event(step=step, summary=tf.compat.v1.Summary(
                    value=[tf.compat.v1.Summary.Value(tag='eval/mean_return',
                                                      simple_value=value)]))
                writer.write(event.SerializeToString())
        run = run_reader.read_run(logdir, self.root)
        self.assertEqual((run.eval_steps, run.eval_returns), ([100, 200], [-5.0, -2.5]))

    def test_run_without_events_is_used_with_a_problem(self):
        run = run_reader.read_run(self.make('a', events=False), self.root)
        self.assertIsNone(run.error)
        self.assertEqual(run.eval_returns, [-900.0, -500.0, -300.0])
        self.assertEqual(run.problems, ['no TensorBoard event files: no training curve'])

    def test_run_without_any_evaluation_is_skipped(self):
        logdir = self.make('a', metrics=False, events=False)
        run = run_reader.read_run(logdir, self.root)
        self.assertEqual(run.error, 'no evaluation results: metrics.jsonl is missing and the '
                         'event files hold no eval/mean_return')
        with open(os.path.join(logdir, 'metrics.jsonl'), 'w') as f:
            f.write('garbage\n')
        self.assertIn('metrics.jsonl is unusable', run_reader.read_run(logdir, self.root).error)

    def test_run_without_config_or_with_bad_gin(self):
        run = run_reader.read_run(self.make('a', config=False), self.root)
        self.assertIsNone(run.error)
        self.assertIn('no operative_config.gin', run.problems[0])
        self.assertEqual(run.bindings, {})
        logdir = self.make('b')
        with open(os.path.join(logdir, 'operative_config.gin'), 'w') as f:
            f.write('PPO.x = [1,\n')
        run = run_reader.read_run(logdir, self.root)
        # The rest is Python's tokenizer's message, worded per version (3.11: 'line 2: EOF in
        # multi-line statement'; 3.12: 'line 1: unexpected EOF in multi-line statement').
        self.assertRegex(run.problems[0], r'^operative_config\.gin is not valid gin: line [12]: '
                         r'(unexpected )?EOF in multi-line statement$')
        self.assertEqual(run.eval_returns, [-900.0, -500.0, -300.0])

    def test_resumed_run_keeps_the_last_line_of_a_step(self):
        logdir = self.make('a', returns=[-900.0, -500.0])
        with open(os.path.join(logdir, 'metrics.jsonl'), 'a') as f:
            f.write(json.dumps({'step': 512, 'mean_return': -400.0}) + '\n')
            f.write(json.dumps({'step': 768, 'mean_return': -350.0}) + '\n')
        run = run_reader.read_run(logdir, self.root)
        self.assertEqual(run.eval_steps, [256, 512, 768])
        self.assertEqual(run.eval_returns, [-900.0, -400.0, -350.0])

    def test_out_of_range_metrics_lines_are_skipped_and_reported(self):
        logdir = self.make('a', metrics=False)
        lines = [
            {'step': 100, 'mean_return': -1e300},  # The range's ends are taken.
            {'step': 10**19, 'mean_return': -5.0},
            {'step': -1, 'mean_return': -5.0},
            {'step': 2**63, 'mean_return': -5.0},
            {'step': True, 'mean_return': -5.0},
            {'step': 1.5, 'mean_return': -5.0},
            {'step': '300', 'mean_return': -5.0},
            {'step': 300, 'mean_return': 1.7e308},
            {'step': 300, 'mean_return': -1.0000001e300},
            {'step': 300, 'mean_return': 10**400},
            {'step': 300, 'mean_return': float('inf')},
            {'step': 300, 'mean_return': None},
            {'step': 2**63 - 1, 'mean_return': 1e300},
        ]
        with open(os.path.join(logdir, 'metrics.jsonl'), 'w') as f:
            f.write(''.join(json.dumps(line) + '\n' for line in lines))
            f.write('{"step": 400, "mean_return": ' + '1' * 5000 + '}\n')
            f.write('[' * 100_000 + '\n')
        run = run_reader.read_run(logdir, self.root)
        self.assertIsNone(run.error)
        self.assertEqual((run.eval_steps, run.eval_returns), ([100, 2**63 - 1], [-1e300, 1e300]))
        self.assertEqual(run.problems, [
            'metrics.jsonl line 2: "step" 10000000000000000000 is out of range (0 to 2^63 - 1)',
            'metrics.jsonl line 3: "step" -1 is out of range (0 to 2^63 - 1)',
            'metrics.jsonl line 4: "step" 9223372036854775808 is out of range (0 to 2^63 - 1)',
            'metrics.jsonl line 5: "step" true is not an integer',
            'metrics.jsonl line 6: "step" 1.5 is not an integer',
            'metrics.jsonl line 7: "step" "300" is not an integer',
            'metrics.jsonl line 8: "mean_return" 1.7e+308 is out of range (-1e+300 to 1e+300)',
            'metrics.jsonl line 9: "mean_return" -1.0000001e+300 is out of range (-1e+300 to '
            '1e+300)',
            'metrics.jsonl line 10: "mean_return" 1000000000000000000000000000000000000... is '
            'out of range (-1e+300 to 1e+300)',
            'metrics.jsonl line 11: no integer "step" and finite "mean_return"',
            'metrics.jsonl line 12: no integer "step" and finite "mean_return"',
            'metrics.jsonl line 14: not JSON (a number of more than 4300 digits)',
            'metrics.jsonl line 15: not JSON (nested too deeply)',
        ])

    def test_metrics_that_is_no_regular_file_is_a_problem(self):
        logdir = self.make('a')
        metrics = os.path.join(logdir, 'metrics.jsonl')
        kinds = {
            'directory': 'a directory, not a regular file',
            'dangling_symlink': f'a symbolic link to {metrics}.gone, which does not exist',
            'fifo': 'a named pipe (FIFO), not a regular file',
            'device': 'a character device, not a regular file',
            'socket': 'a socket, not a regular file',
        }
        for kind, trouble in kinds.items():
            with self.subTest(kind):
                if os.path.isdir(metrics) and not os.path.islink(metrics):
                    os.rmdir(metrics)
                elif os.path.lexists(metrics):
                    os.remove(metrics)
                report_fixtures.make_special_metrics(metrics, kind)
                run = call_without_blocking(
                    self, lambda: run_reader.read_run(logdir, self.root), [metrics])
                self.assertIsNone(run.error)
                self.assertEqual(run.problems, [f'metrics.jsonl is {trouble}; not read'])
                self.assertEqual(run.eval_returns, [-900.0, -500.0, -300.0])  # From the events.

    def test_unreadable_metrics_is_a_problem(self):
        logdir = self.make('a')
        denied = PermissionError(errno.EACCES, 'Permission denied')
        with mock.patch.object(file_io, 'open_regular', side_effect=denied):
            run = run_reader.read_run(logdir, self.root)
        self.assertIsNone(run.error)
        self.assertEqual(run.problems, ['operative_config.gin is unreadable (Permission '
                                        'denied); not read',
                                        'metrics.jsonl is unreadable (Permission denied); not '
                                        'read'])
        self.assertEqual(run.eval_returns, [-900.0, -500.0, -300.0])

    def test_metrics_swapped_for_a_fifo_after_the_look_is_not_read(self):
        logdir = self.make('a')
        metrics = os.path.join(logdir, 'metrics.jsonl')
        os.remove(metrics)
        os.mkfifo(metrics)
        with mock.patch.object(run_reader, 'file_trouble', return_value=None):
            run = call_without_blocking(
                self, lambda: run_reader.read_run(logdir, self.root), [metrics])
        self.assertIn(f'metrics.jsonl is unreadable ({metrics} is not a regular file); not '
                      'read', run.problems)

    def test_special_files_without_evaluations_elsewhere_skip_the_run(self):
        logdir = self.make('a', metrics=False, events=False)
        report_fixtures.make_special_metrics(os.path.join(logdir, 'metrics.jsonl'), 'fifo')
        run = call_without_blocking(self, lambda: run_reader.read_run(logdir, self.root),
                                    [os.path.join(logdir, 'metrics.jsonl')])
        self.assertEqual(run.error, 'no evaluation results: metrics.jsonl is a named pipe '
                         '(FIFO), not a regular file, and the event files hold no '
                         'eval/mean_return')

    def test_config_and_event_files_that_are_no_regular_files(self):
        logdir = self.make('a', events=False)
        config = os.path.join(logdir, 'operative_config.gin')
        os.remove(config)
        os.mkfifo(config)
        events = os.path.join(logdir, 'events.out.tfevents.1.fifo')
        os.mkfifo(events)
        run = call_without_blocking(self, lambda: run_reader.read_run(logdir, self.root),
                                    [config, events])
        self.assertIsNone(run.error)
        self.assertEqual(run.problems, [
            'operative_config.gin is a named pipe (FIFO), not a regular file; not read',
            'events.out.tfevents.1.fifo is a named pipe (FIFO), not a regular file; not read'])
        self.assertEqual(run.eval_returns, [-900.0, -500.0, -300.0])

    def test_event_values_out_of_range_are_skipped_and_reported(self):
        logdir = self.make('a', metrics=False, events=False)
        write_double_events(logdir, 'eval/mean_return', {
            100: -5.0, 200: 1.7e308, 300: float('nan'), 400: -1e300, 500: -2e300})
        run = run_reader.read_run(logdir, self.root)
        self.assertEqual((run.eval_steps, run.eval_returns), ([100, 400], [-5.0, -1e300]))
        self.assertEqual(run.problems, [
            'events.out.tfevents.2.double: 3 eval/mean_return value(s) not finite or out of '
            'range (-1e+300 to 1e+300), the first at step 200; skipped'])

    def test_run_that_vanished_is_an_error_not_an_exception(self):
        run = run_reader.read_run(os.path.join(self.root, 'gone'), self.root)
        self.assertRegex(run.error, r'^cannot read .*gone: No such file or directory$')


class FindRunsTest(absltest.TestCase):

    def setUp(self):
        super().setUp()
        self.root = self.create_tempdir().full_path

    def make(self, name, **kwargs):
        return report_fixtures.make_run(os.path.join(self.root, name), [-1.0], events=False,
                                      **kwargs)

    def test_finds_runs_in_a_tree(self):
        a = self.make('x/a')
        b = self.make('x/y/b')
        os.makedirs(os.path.join(a, 'nested'))
        self.make('x/a/nested/inner')  # Inside a run: its own files, not another run.
        self.make('.hidden/c')
        report = self.make('report/d')
        os.makedirs(os.path.join(self.root, 'empty'))
        discovery = run_reader.find_runs(self.root, exclude=[os.path.join(self.root, 'report')])
        self.assertEqual(discovery.runs, [(a, None), (b, None)])
        self.assertNotIn(report, [logdir for logdir, _ in discovery.runs])
        self.assertEqual((discovery.missing, discovery.problems), ([], []))

    def test_the_input_itself_may_be_a_run(self):
        logdir = self.make('only')
        discovery = run_reader.find_runs(logdir)
        self.assertEqual(discovery.runs, [(logdir, None)])
        self.assertEqual(run_reader.run_id_of(logdir, logdir), 'only')

    def test_sweep_records_are_attached_to_their_logdirs(self):
        ok = self.make('trials/t1', seed=1)
        failed = self.make('trials/t2')
        records = [
            {'id': 't1', 'status': 'ok', 'seed': 1, 'bindings': {'PPO.learning_rate': 0.001}},
            {'id': 't2', 'status': 'failed', 'error': 'FloatingPointError: NaN loss'},
            {'id': 't3', 'status': 'failed', 'error': 'killed'},
        ]
        with open(os.path.join(self.root, 'trials.jsonl'), 'w') as f:
            f.write(''.join(json.dumps(record) + '\n' for record in records))
            f.write('{"id": \n')
        discovery = run_reader.find_runs(self.root)
        self.assertEqual(discovery.runs, [(ok, records[0]), (failed, records[1])])
        self.assertLen(discovery.missing, 1)
        self.assertEqual(discovery.missing[0].run_id, 'trials/t3')
        self.assertIn("trial 't3' (status 'failed': killed)", discovery.missing[0].error)
        self.assertEqual(discovery.problems,
                         [f'{os.path.join(self.root, "trials.jsonl")} line 4: not JSON '
                          '(Expecting value)'])
        run = run_reader.read_run(failed, self.root, records[1])
        self.assertEqual(run.error, 'the sweep recorded this trial as failed: '
                         'FloatingPointError: NaN loss')

    def test_sweep_bindings_stand_in_for_a_missing_config(self):
        logdir = self.make('trials/t1', config=False)
        record = {'id': 't1', 'status': 'ok', 'seed': 4,
                  'bindings': {'PPO.learning_rate': 0.001, 'train.env_id': 'Pendulum-v1'}}
        run = run_reader.read_run(logdir, self.root, record)
        self.assertEqual(run.bindings, {'PPO.learning_rate': '0.001',
                                        'train.env_id': "'Pendulum-v1'"})
        self.assertEqual(run.seed, 4)
        self.assertIn('taken from the sweep', run.problems[0])

    def test_trials_file_that_is_no_regular_file_is_a_problem(self):
        logdir = self.make('trials/t1')
        trials = os.path.join(self.root, 'trials.jsonl')
        for kind, trouble in (
                ('fifo', 'a named pipe (FIFO), not a regular file'),
                ('dangling_symlink', f'a symbolic link to {trials}.gone, which does not exist')):
            with self.subTest(kind):
                report_fixtures.make_special_metrics(trials, kind)
                discovery = call_without_blocking(
                    self, lambda: run_reader.find_runs(self.root), [trials])
                self.assertEqual(discovery.runs, [(logdir, None)])
                self.assertEqual(discovery.problems, [f'{trials} is {trouble}; not read'])
                os.remove(trials)

    def test_missing_input(self):
        with self.assertRaisesRegex(NotADirectoryError, 'not a directory'):
            run_reader.find_runs(os.path.join(self.root, 'nope'))


class HalvingSweepTest(absltest.TestCase):
    """A successive-halving sweep (`report_fixtures.make_halving_sweep`) read back."""

    def setUp(self):
        super().setUp()
        self.root = self.create_tempdir().full_path
        self.sweep = report_fixtures.make_halving_sweep(os.path.join(self.root, 'sweep'),
                                                        events=False)
        self.ids = report_fixtures.HALVING_IDS

    def test_rung_decisions_are_found_beside_the_trials(self):
        discovery = run_reader.find_runs(self.root)
        self.assertEqual((discovery.missing, discovery.problems), ([], []))
        self.assertLen(discovery.runs, 8)
        ids = self.ids
        self.assertEqual([{key: value for key, value in decision.items() if key != 'decided_at'}
                          for decision in discovery.rungs], [
            {'sweep': 'sweep', 'bracket': 0, 'rung': 0, 'budget': 512, 'metric': 'mean_return',
             'mode': 'max', 'scores': {ids['0.001']: -150.0, ids['0.003']: -165.0,
                                       ids['0.01']: -180.0, ids['0.03']: -410.0},
             'promoted': [ids['0.001'], ids['0.003']]},
            {'sweep': 'sweep', 'bracket': 0, 'rung': 1, 'budget': 1024,
             'metric': 'mean_return', 'mode': 'max',
             'scores': {ids['0.001']: -200.0, ids['0.003']: -220.0},
             'promoted': [ids['0.001']]},
        ])
        # The sweep as the input itself: its decisions belong to the sweep ''.
        self.assertEqual({decision['sweep'] for decision in run_reader.find_runs(
            self.sweep).rungs}, {''})

    def test_a_pruned_and_a_completed_trial(self):
        discovery = run_reader.find_runs(self.sweep)
        trials = dict(discovery.runs)
        pruned_dir = os.path.join(self.sweep, 'trials', f'{self.ids["0.01"]}-seed1')
        pruned = run_reader.read_run(pruned_dir, self.sweep, trials[pruned_dir])
        self.assertEqual(pruned.problems, ['no TensorBoard event files: no training curve'])
        self.assertIsNone(pruned.error)
        self.assertEqual((pruned.eval_steps, pruned.eval_returns), ([256, 512], [-900.0, -185.0]))
        self.assertEqual((pruned.sweep_config, pruned.budget, pruned.rung, pruned.bracket,
                          pruned.stop_reason), (self.ids['0.01'], 512, 0, 0, 'pruned'))
        self.assertEqual(pruned.stop_detail, 'pruned after rung 0 (512 env steps): ranked 3 of '
                         '4 by max mean_return; the top 2 went on')
        self.assertEqual(pruned.final_metrics, {'mean_return': -185.0, 'std_return': 0.0,
                                                'mean_length': 200.0})
        # Its configuration holds the full budget: the trainer was stopped at the rung.
        self.assertEqual(pruned.bindings['train.total_steps'], '2048')
        completed_dir = os.path.join(self.sweep, 'trials', f'{self.ids["0.001"]}-seed0')
        completed = run_reader.read_run(completed_dir, self.sweep, trials[completed_dir])
        self.assertEqual((completed.budget, completed.rung, completed.stop_reason,
                          completed.stop_detail, completed.final_return),
                         (2048, 2, 'completed', 'trained to the full budget (2048 env steps)',
                          -240.0))
        self.assertEqual(completed.config_key, run_reader.read_run(
            os.path.join(self.sweep, 'trials', f'{self.ids["0.001"]}-seed1'), self.sweep,
            trials[os.path.join(self.sweep, 'trials', f'{self.ids["0.001"]}-seed1')]).config_key)

    def test_runs_outside_staged_sweeps_have_no_stop(self):
        logdir = report_fixtures.make_run(os.path.join(self.root, 'alone'), [-1.0],
                                          events=False)
        run = run_reader.read_run(logdir, self.root)
        self.assertEqual((run.sweep_config, run.budget, run.rung, run.bracket, run.stop_reason,
                          run.stop_detail, run.final_metrics), (None,) * 6 + ({},))

    def test_bad_rung_lines_and_trial_fields_are_problems(self):
        path = os.path.join(self.sweep, 'rungs.jsonl')
        with open(path, 'a', encoding='utf-8') as f:
            f.write('{"bracket": 0, "rung\n')
            f.write('[1, 2]\n')
            f.write(json.dumps({'bracket': 0, 'rung': True, 'budget': 1, 'scores': {},
                                'promoted': []}) + '\n')
            f.write(json.dumps({'bracket': 0, 'rung': 5, 'budget': 1,
                                'scores': {'a': 'high'}, 'promoted': []}) + '\n')
            f.write(json.dumps({'bracket': 0, 'rung': 5, 'budget': 1, 'scores': {'a': 1.0},
                                'promoted': 'a'}) + '\n')
            f.write(json.dumps({'bracket': 0, 'rung': 5, 'budget': 1, 'scores': {'a': 1.0},
                                'promoted': ['a'], 'metric': 3}) + '\n')
        discovery = run_reader.find_runs(self.sweep)
        self.assertLen(discovery.rungs, 2)
        self.assertEqual(discovery.problems, [
            f'{path} line 3: not JSON (Unterminated string starting at)',
            f'{path} line 4: not a rung decision (a JSON object); not used',
            f'{path} line 5: "rung" is true, not a step count; not used',
            f'{path} line 6: "scores" is not an object of numbers (within ±1e+300) or nulls; '
            'not used',
            f'{path} line 7: "promoted" is not a list of configuration ids; not used',
            f'{path} line 8: "metric" is not a text; not used',
        ])
        record = {'id': 't', 'status': 'ok', 'config_id': 7, 'budget': 'lots', 'rung': -1,
                  'stop_reason': 'pruned', 'final_metrics': {'mean_return': 'x'}}
        run = run_reader.read_run(os.path.join(self.sweep, 'trials', f'{self.ids["0.01"]}-seed0'),
                                  self.sweep, record)
        self.assertEqual(run.problems, [
            'trials.jsonl gives its "config_id" as 7, not a text; not used',
            'trials.jsonl gives its "budget" as "lots", not a step count; not used',
            'trials.jsonl gives its "rung" as -1, not a rung number; not used',
            'no TensorBoard event files: no training curve',
        ])
        self.assertEqual((run.sweep_config, run.budget, run.rung, run.stop_reason,
                          run.final_metrics), (None, None, None, 'pruned', {}))

    def test_rungs_file_name_matches_the_scheduler(self):
        self.assertEqual(run_dir.RUNGS_FILE, run_dir.RUNGS_FILE)


if __name__ == '__main__':
    absltest.main()
