"""Corruption: damaged checkpoints and metrics make resume fall back, never fail silently.

A finished run (checkpoints of steps 512, 1024 and 1536) is copied for each test and damaged
the way disks and kills damage files; rerunning the same command must resume from the newest
checkpoint that reads back (with a warning), keep the metrics consistent with it, and finish.
When no checkpoint reads back, the run stops and changes nothing.
"""

import json
import os
import shutil
import subprocess
import sys

from absl.testing import absltest

from agents.scripts import testing_utils
from reliability import harness

BUDGET = dict(train__total_steps=1536)


class CorruptionTest(absltest.TestCase):

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.baseline = os.path.join(absltest.get_default_test_tmpdir(), 'baseline')
        shutil.rmtree(cls.baseline, ignore_errors=True)
        result = harness.run('train', *harness.small_run(cls.baseline, **BUDGET), timeout=600)
        assert result.returncode == 0, result.stderr[-5000:]

    def setUp(self):
        super().setUp()
        self.logdir = os.path.join(self.create_tempdir().full_path, 'run')
        shutil.copytree(self.baseline, self.logdir)
        self.assertEqual(harness.checkpoint_state(self.logdir), ([512, 1024, 1536], 1536))

    def checkpoint_file(self, step, suffix):
        return os.path.join(self.logdir, 'checkpoints', f'ckpt-{step}{suffix}')

    def rerun(self):
        return harness.run('train', *harness.small_run(self.logdir, **BUDGET), timeout=600)

    def assert_fell_back_and_finished(self, result):
        self.assertEqual(result.returncode, 0, result.stderr[-5000:])
        self.assertRegex(result.stderr, r'Checkpoint \S+/ckpt-1536 does not read back \(.+\); '
                         r'moved to \S+/checkpoints/corrupt/\.')
        self.assertRegex(result.stderr, r'Resumed from \S+/ckpt-1024 at step 1024: the newest '
                         r'checkpoint that reads back\.')
        self.assertRegex(result.stderr, r'metrics.jsonl holds 1 evaluation\(s\) past the restored '
                         r'checkpoint \(step 1024\), whose checkpoints did not survive; moved to '
                         r'\S+metrics.orphaned.jsonl\.')
        self.assertIn('Done: 1536 steps', result.stderr)
        # The run trained 1024 -> 1536 again; every checkpoint it names reads back.
        self.assertEqual(harness.checkpoint_state(self.logdir), ([512, 1024, 1536], 1536))
        for step in (512, 1024, 1536):
            self.assertIsNone(harness.checkpoint_problem(self.logdir, step))
        self.assertEqual([record['step'] for record in harness.metrics(self.logdir)],
                         [512, 1024, 1536])
        with open(os.path.join(self.logdir, 'metrics.orphaned.jsonl')) as f:
            self.assertIn('"step": 1536', f.read())
        self.assertNotEmpty(os.listdir(os.path.join(self.logdir, 'checkpoints', 'corrupt')))

    def test_truncated_latest_checkpoint_falls_back_to_the_previous_one(self):
        path = self.checkpoint_file(1536, '.data-00000-of-00001')
        with open(path, 'r+b') as f:
            f.truncate(os.path.getsize(path) // 2)
        self.assert_fell_back_and_finished(self.rerun())

    def test_garbage_latest_checkpoint_falls_back_to_the_previous_one(self):
        # The same size, other bytes: only the checksums can tell.
        path = self.checkpoint_file(1536, '.data-00000-of-00001')
        with open(path, 'r+b') as f:
            f.write(os.urandom(os.path.getsize(path)))
        self.assert_fell_back_and_finished(self.rerun())

    def test_garbage_index_falls_back_to_the_previous_one(self):
        with open(self.checkpoint_file(1536, '.index'), 'wb') as f:
            f.write(b'not a checkpoint index' * 10)
        self.assert_fell_back_and_finished(self.rerun())

    def test_no_readable_checkpoint_stops_and_changes_nothing(self):
        for step in (512, 1024, 1536):
            with open(self.checkpoint_file(step, '.index'), 'wb') as f:
                f.write(b'garbage')
        before = testing_utils.snapshot(self.logdir)
        result = self.rerun()
        self.assertEqual(result.returncode, 1, result.stderr[-5000:])
        self.assertRegex(result.stderr, r'train: error: no checkpoint in \S+/checkpoints reads '
                         r'back \(ckpt-512: .+; ckpt-1024: .+; ckpt-1536: .+\)\. Nothing was '
                         r'changed; move the broken files away to start over from scratch, or '
                         r'restore them from a backup\.')
        after = testing_utils.snapshot(self.logdir)
        self.assertEqual(sorted(after), sorted(before))
        for name, content in before.items():
            if name != '.lock':  # Names the last holder: this rerun.
                self.assertEqual(after[name], content, name)

    def test_unreadable_state_file_is_rebuilt_from_the_checkpoints(self):
        with open(os.path.join(self.logdir, 'checkpoints', 'checkpoint'), 'w') as f:
            f.write('garbage {{{')
        result = self.rerun()
        self.assertEqual(result.returncode, 0, result.stderr[-5000:])
        self.assertRegex(result.stderr, r'Resumed from \S+/ckpt-1536 at step 1536\.')
        self.assertIn('Nothing to do: the run already reached 1536 steps.', result.stderr)
        self.assertEqual(harness.checkpoint_state(self.logdir), ([512, 1024, 1536], 1536))

    def test_cut_metrics_line_is_dropped_and_the_evaluation_redone(self):
        # As a kill during the last append leaves it.
        path = os.path.join(self.logdir, 'metrics.jsonl')
        with open(path) as f:
            lines = f.readlines()
        with open(path, 'w') as f:
            f.write(''.join(lines[:-1]) + lines[-1][:25])
        result = self.rerun()
        self.assertEqual(result.returncode, 0, result.stderr[-5000:])
        self.assertRegex(result.stderr, r'metrics.jsonl ends in a partial line \(a write cut '
                         r'short\), dropped: ')
        self.assertIn('Completing the evaluation of step 1536: the previous run saved its '
                      'checkpoint but stopped before logging it.', result.stderr)
        self.assertEqual([record['step'] for record in harness.metrics(self.logdir)],
                         [512, 1024, 1536])

    def test_export_cut_before_its_program_is_written_again(self):
        # As a kill during the upload to a bucket leaves a run (variables first, saved_model.pb
        # and fingerprint.pb next, metrics.jsonl last), downloaded by the resuming trainer.
        export = os.path.join(self.logdir, 'policy', '1536')
        for name in ('saved_model.pb', 'fingerprint.pb'):
            os.remove(os.path.join(export, name))
        path = os.path.join(self.logdir, 'metrics.jsonl')
        with open(path) as f:
            lines = f.readlines()
        with open(path, 'w') as f:
            f.write(''.join(lines[:-1]))
        result = self.rerun()
        self.assertEqual(result.returncode, 0, result.stderr[-5000:])
        self.assertRegex(result.stderr, r'Removed what interrupted writes left: \S+/policy/1536')
        self.assertIn('Completing the evaluation of step 1536', result.stderr)
        self.assertTrue(os.path.isfile(os.path.join(export, 'saved_model.pb')))
        self.assertEqual(sorted(os.listdir(os.path.join(self.logdir, 'policy'))),
                         ['1024', '1536', '512'])
        self.assertEqual([record['step'] for record in harness.metrics(self.logdir)],
                         [512, 1024, 1536])

    def test_corrupt_metrics_line_is_reported_not_fatal(self):
        path = os.path.join(self.logdir, 'metrics.jsonl')
        with open(path) as f:
            lines = f.readlines()
        lines.insert(1, '{"step": 7, "mean_ret\x00\n')
        with open(path, 'w') as f:
            f.write(''.join(lines))
        result = self.rerun()
        self.assertEqual(result.returncode, 0, result.stderr[-5000:])
        self.assertRegex(result.stderr, r'metrics.jsonl line 2 is not an evaluation record; left '
                         r'as is: ')
        with open(path) as f:
            self.assertEqual(f.readlines(), lines)
        # The report pipeline reads the run, lists the line as a problem and writes the report.
        output_dir = os.path.join(self.create_tempdir().full_path, 'report')
        report = subprocess.run(
            [sys.executable, '-m', 'pipelines.report', f'--input={os.path.dirname(self.logdir)}',
             f'--output_dir={output_dir}', '--videos=false', '--bootstrap_reps=200',
             '--curve_bootstrap_reps=50', '--direct_running_mode=in_memory'],
            capture_output=True, text=True, timeout=600, env=harness.environment(),
            stdin=subprocess.DEVNULL, check=False)
        self.assertEqual(report.returncode, 3, report.stderr[-5000:])  # Written, read in part.
        with open(os.path.join(output_dir, 'report.json')) as f:
            problems = [entry['problem'] for entry in json.load(f)['problems']]
        self.assertTrue(any('metrics.jsonl line 2' in problem for problem in problems), problems)


if __name__ == '__main__':
    absltest.main()
