"""Disk full or read-only: a failed write stops the run clearly; the last checkpoint survives.

Each case runs reliability/disk_faults.py in a private mount namespace (unshare), where a
small tmpfs holds the logdir: the trainer is stopped by ENOSPC or EROFS after its first save,
must say which file it could not write and why, and must leave the previous checkpoint valid; a
rerun after the fault is lifted resumes and finishes. Without mount namespaces the tests skip
with the reason, except under CI (CI=true), where they fail.
"""

import json
import os
import subprocess
import sys

from absl.testing import absltest

from reliability import harness


class DiskFaultTest(absltest.TestCase):

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.prefix, cls.reason = harness.mount_namespace()

    def scenario(self, fault, size='64m'):
        if self.prefix is None:
            message = f'no mount namespace for the disk faults: {self.reason}'
            if os.environ.get('CI') == 'true':
                self.fail(message)
            self.skipTest(message)
        mount = self.create_tempdir('mnt').full_path
        outdir = self.create_tempdir('out').full_path
        flags = [flag for flag in harness.small_run('x') if not flag.startswith('--logdir=')]
        spec = os.path.join(outdir, 'spec.json')
        with open(spec, 'w') as f:
            json.dump({'fault': fault, 'mount': mount, 'outdir': outdir, 'size': size,
                       'train_flags': flags}, f)
        process = subprocess.run(
            [*self.prefix, sys.executable, '-m', 'reliability.disk_faults', spec],
            capture_output=True, text=True, timeout=900, env=harness.environment(),
            check=False)
        self.assertEqual(process.returncode, 0, process.stderr[-5000:])
        with open(os.path.join(outdir, 'result.json')) as f:
            result = json.load(f)
        return result, os.path.join(outdir, 'after_fault'), os.path.join(outdir, 'after_rerun')

    def assert_stopped_cleanly(self, result, after_fault, reason):
        output = result['fault_output']
        self.assertEqual(result['fault_returncode'], 1, output[-5000:])
        # Which write failed depends on what the trainer was writing; each names its file.
        self.assertRegex(output, r'train: error: cannot write (the checkpoint of step \d+ to '
                         r'\S+|the policy of step \d+ to \S+|the summaries in \S+|\S+): .*'
                         rf'{reason}.*\. The run stopped; the last checkpoint \(step '
                         r'\d+\) is intact\. Make room or make the logdir writable, then rerun '
                         r'the same command to resume\.')
        self.assertNotIn('Traceback', output)
        before = result['checkpoint_before']
        steps, latest = harness.checkpoint_state(after_fault)
        self.assertGreaterEqual(latest, before)
        for step in steps:
            self.assertIsNone(harness.checkpoint_problem(after_fault, step), step)

    def assert_resumed_and_finished(self, result, after_rerun):
        output = result['rerun_output']
        self.assertEqual(result['rerun_returncode'], 0, output[-5000:])
        self.assertRegex(output, r'Resumed from \S+/ckpt-\d+ at step \d+')
        self.assertEqual([record['step'] for record in harness.metrics(after_rerun)],
                         [512, 1024, 1536, 2048])
        self.assertEqual(harness.leftovers(after_rerun), [])

    def test_full_disk(self):
        result, after_fault, after_rerun = self.scenario('enospc')
        self.assert_stopped_cleanly(result, after_fault, 'No space left on device')
        self.assert_resumed_and_finished(result, after_rerun)

    def test_read_only_checkpoint_directory(self):
        result, after_fault, after_rerun = self.scenario('readonly')
        self.assert_stopped_cleanly(result, after_fault, 'Read-only file system')
        self.assertRegex(result['fault_output'], r'cannot write the checkpoint of step \d+ to '
                         r'\S+/checkpoints')
        self.assert_resumed_and_finished(result, after_rerun)


if __name__ == '__main__':
    absltest.main()
