"""Corruption: damaged checkpoints and metrics make resume fall back, never fail silently.

A finished run (checkpoints of steps 512, 1024, 1536 and 2048) is copied for each test and
damaged the way disks and kills damage files; rerunning the same command must resume from the
newest checkpoint that reads back (with a warning), keep the metrics consistent with it, and
finish. When no checkpoint reads back, the run stops and changes nothing. Each rerun costs a
trainer's start-up, so each test stacks damages that the trainer repairs independently of one
another. The trainer runs in a fork of this process (harness.run_module_forked), which imported
TensorFlow once: the binary's own code from flag parsing to exit status and output.
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile

from absl.testing import absltest

from agents.scripts import testing_utils
from reliability import harness

# Four checkpoints kept, so that three of them can be damaged in three ways at once and the
# run still has one to fall back to.
BUDGET = dict(train__total_steps=2048, train__checkpoints_to_keep=4)
STEPS = [512, 1024, 1536, 2048]


def train(logdir):
    return harness.run_module_forked('agents.scripts.train', *harness.small_run(logdir, **BUDGET),
                                     timeout=600, cwd=harness.ROOT)


class CorruptionTest(absltest.TestCase):

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        harness.preload(pipelines=False)
        cls.baseline = os.path.join(
            tempfile.mkdtemp(dir=absltest.get_default_test_tmpdir()), 'baseline')
        result = train(cls.baseline)
        assert result.returncode == 0, result.stderr[-5000:]

    def setUp(self):
        super().setUp()
        self.logdir = os.path.join(self.create_tempdir().full_path, 'run')
        shutil.copytree(self.baseline, self.logdir)
        self.assertEqual(harness.checkpoint_state(self.logdir), (STEPS, 2048))

    def checkpoint_file(self, step, suffix):
        return os.path.join(self.logdir, 'checkpoints', f'ckpt-{step}{suffix}')

    def metrics_lines(self):
        with open(os.path.join(self.logdir, 'metrics.jsonl')) as f:
            return f.readlines()

    def write_metrics(self, text):
        with open(os.path.join(self.logdir, 'metrics.jsonl'), 'w') as f:
            f.write(text)

    def test_damaged_checkpoints_are_moved_aside_and_the_run_falls_back(self):
        # The three newest, each damaged another way: truncated data; data of the same size
        # but other bytes (only the checksums can tell); an index that is garbage.
        path = self.checkpoint_file(2048, '.data-00000-of-00001')
        with open(path, 'r+b') as f:
            f.truncate(os.path.getsize(path) // 2)
        path = self.checkpoint_file(1536, '.data-00000-of-00001')
        with open(path, 'r+b') as f:
            f.write(os.urandom(os.path.getsize(path)))
        with open(self.checkpoint_file(1024, '.index'), 'wb') as f:
            f.write(b'not a checkpoint index' * 10)
        result = train(self.logdir)
        self.assertEqual(result.returncode, 0, result.stderr[-5000:])
        for step in (1024, 1536, 2048):
            self.assertRegex(result.stderr, rf'Checkpoint \S+/ckpt-{step} does not read back '
                             r'\(.+\); moved to \S+/checkpoints/corrupt/\.')
        self.assertRegex(result.stderr, r'Resumed from \S+/ckpt-512 at step 512: the newest '
                         r'checkpoint that reads back\.')
        self.assertRegex(result.stderr, r'metrics.jsonl holds 3 evaluation\(s\) past the restored '
                         r'checkpoint \(step 512\), whose checkpoints did not survive; moved to '
                         r'\S+metrics.orphaned.jsonl\.')
        self.assertIn('Done: 2048 steps', result.stderr)
        # The run trained 512 -> 2048 again; every checkpoint it names reads back.
        self.assertEqual(harness.checkpoint_state(self.logdir), (STEPS, 2048))
        for step in STEPS:
            self.assertIsNone(harness.checkpoint_problem(self.logdir, step))
        self.assertEqual([record['step'] for record in harness.metrics(self.logdir)], STEPS)
        with open(os.path.join(self.logdir, 'metrics.orphaned.jsonl')) as f:
            self.assertEqual([json.loads(line)['step'] for line in f], [1024, 1536, 2048])
        self.assertContainsSubset(
            ['ckpt-1024.index', 'ckpt-1536.data-00000-of-00001', 'ckpt-2048.data-00000-of-00001'],
            os.listdir(os.path.join(self.logdir, 'checkpoints', 'corrupt')))

    def test_no_readable_checkpoint_stops_and_changes_nothing(self):
        for step in STEPS:
            with open(self.checkpoint_file(step, '.index'), 'wb') as f:
                f.write(b'garbage')
        before = testing_utils.snapshot(self.logdir)
        result = train(self.logdir)
        self.assertEqual(result.returncode, 1, result.stderr[-5000:])
        self.assertRegex(result.stderr, r'train: error: no checkpoint in \S+/checkpoints reads '
                         r'back \(ckpt-512: .+; ckpt-1024: .+; ckpt-1536: .+; ckpt-2048: .+\)\. '
                         r'Nothing was changed; move the broken files away to start over from '
                         r'scratch, or restore them from a backup\.')
        after = testing_utils.snapshot(self.logdir)
        self.assertEqual(sorted(after), sorted(before))
        for name, content in before.items():
            if name != '.lock':  # Names the last holder: this rerun.
                self.assertEqual(after[name], content, name)

    def test_unreadable_state_file_and_corrupt_metrics_line_are_no_obstacle(self):
        """The state file is rebuilt from the checkpoints; a metrics line that is not a record
        is reported and left in place, by the trainer and by the report pipeline."""
        with open(os.path.join(self.logdir, 'checkpoints', 'checkpoint'), 'w') as f:
            f.write('garbage {{{')
        lines = self.metrics_lines()
        lines.insert(1, '{"step": 7, "mean_ret\x00\n')
        self.write_metrics(''.join(lines))
        result = train(self.logdir)
        self.assertEqual(result.returncode, 0, result.stderr[-5000:])
        self.assertRegex(result.stderr, r'Resumed from \S+/ckpt-2048 at step 2048\.')
        self.assertIn('Nothing to do: the run already reached 2048 steps.', result.stderr)
        self.assertEqual(harness.checkpoint_state(self.logdir), (STEPS, 2048))
        self.assertRegex(result.stderr, r'metrics.jsonl line 2 is not an evaluation record; left '
                         r'as is: ')
        self.assertEqual(self.metrics_lines(), lines)
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

    def test_cut_metrics_line_and_cut_export_are_written_again(self):
        """As kills leave a run: during the last append to metrics.jsonl (a cut line), and
        during the upload to a bucket (variables first, saved_model.pb and fingerprint.pb next,
        metrics.jsonl last), downloaded by the resuming trainer."""
        export = os.path.join(self.logdir, 'policy', '2048')
        for name in ('saved_model.pb', 'fingerprint.pb'):
            os.remove(os.path.join(export, name))
        lines = self.metrics_lines()
        self.write_metrics(''.join(lines[:-1]) + lines[-1][:25])
        result = train(self.logdir)
        self.assertEqual(result.returncode, 0, result.stderr[-5000:])
        self.assertRegex(result.stderr, r'metrics.jsonl ends in a partial line \(a write cut '
                         r'short\), dropped: ')
        self.assertRegex(result.stderr, r'Removed what interrupted writes left: \S+/policy/2048')
        self.assertIn('Completing the evaluation of step 2048: the previous run saved its '
                      'checkpoint but stopped before logging it.', result.stderr)
        self.assertTrue(os.path.isfile(os.path.join(export, 'saved_model.pb')))
        self.assertEqual(sorted(map(int, os.listdir(os.path.join(self.logdir, 'policy')))), STEPS)
        self.assertEqual([record['step'] for record in harness.metrics(self.logdir)], STEPS)


if __name__ == '__main__':
    absltest.main()
