"""Disk full or read-only: a failed write stops the run clearly; the last checkpoint survives.

The test runs reliability/disk_faults.py in a private mount namespace (unshare), where a small
tmpfs holds the logdir, so that it may mount without touching the machine; the trainers run in
forks of that process (harness.start_module_forked), which imported TensorFlow once. There one
run meets both
faults, each after a complete save (its metrics line), as a user would: the trainer is stopped
by ENOSPC (a filler file takes every free byte of the tmpfs); the filler removed, the same
command resumes and is stopped by EROFS (the checkpoint directory bind-mounted read-only: the
whole logdir cannot be remounted read-only while the trainer holds files in it open for writing,
which is what the kernel refuses, not what users see); the mount lifted, the same command
resumes and finishes. Each stop must say which file could not be written and why, and leave the
previous checkpoint valid. Without mount namespaces the test skips with the reason, except under
CI (CI=true), where it fails.
"""

import json
import os
import subprocess
import sys

from absl.testing import absltest

from reliability import harness

# Room for each trainer to get one save past the fault it waits for, however late it strikes.
BUDGET = dict(train__total_steps=3072)
STEPS = list(range(512, 3073, 512))


class DiskFaultTest(absltest.TestCase):

    def assert_stopped_cleanly(self, result, fault, after_fault, reason):
        output = result[f'{fault}_output']
        self.assertEqual(result[f'{fault}_returncode'], 1, output[-5000:])
        # Which write failed depends on what the trainer was writing; each names its file.
        self.assertRegex(output, r'train: error: cannot write (the checkpoint of step \d+ to '
                         r'\S+|the policy of step \d+ to \S+|the summaries in \S+|\S+): .*'
                         rf'{reason}.*\. The run stopped; the last checkpoint \(step '
                         r'\d+\) is intact\. Make room or make the logdir writable, then rerun '
                         r'the same command to resume\.')
        self.assertNotIn('Traceback', output)
        steps, latest = harness.checkpoint_state(after_fault)
        self.assertGreaterEqual(latest, result[f'{fault}_before'])
        for step in steps:
            self.assertIsNone(harness.checkpoint_problem(after_fault, step), step)

    def test_full_disk_then_read_only_checkpoint_directory(self):
        prefix, reason = harness.mount_namespace()
        if prefix is None:
            message = f'no mount namespace for the disk faults: {reason}'
            if os.environ.get('CI') == 'true':
                self.fail(message)
            self.skipTest(message)
        mount = self.create_tempdir('mnt').full_path
        outdir = self.create_tempdir('out').full_path
        flags = [flag for flag in harness.small_run('x', **BUDGET)
                 if not flag.startswith('--logdir=')]
        spec = os.path.join(outdir, 'spec.json')
        with open(spec, 'w') as f:
            json.dump({'mount': mount, 'outdir': outdir, 'size': '64m', 'train_flags': flags}, f)
        process = subprocess.run(
            [*prefix, sys.executable, '-m', 'reliability.disk_faults', spec],
            capture_output=True, text=True, timeout=900, env=harness.environment(),
            check=False)
        self.assertEqual(process.returncode, 0, process.stderr[-5000:])
        with open(os.path.join(outdir, 'result.json')) as f:
            result = json.load(f)

        self.assert_stopped_cleanly(result, 'enospc', os.path.join(outdir, 'after_enospc'),
                                    'No space left on device')
        # The rerun after the full disk resumed; its own fault stopped it.
        self.assertRegex(result['readonly_output'], r'Resumed from \S+/ckpt-\d+ at step \d+')
        self.assert_stopped_cleanly(result, 'readonly', os.path.join(outdir, 'after_readonly'),
                                    'Read-only file system')
        self.assertRegex(result['readonly_output'], r'cannot write the checkpoint of step \d+ '
                         r'to \S+/checkpoints')

        output = result['rerun_output']
        self.assertEqual(result['rerun_returncode'], 0, output[-5000:])
        self.assertRegex(output, r'Resumed from \S+/ckpt-\d+ at step \d+')
        after_rerun = os.path.join(outdir, 'after_rerun')
        self.assertEqual([record['step'] for record in harness.metrics(after_rerun)], STEPS)
        self.assertEqual(harness.leftovers(after_rerun), [])


if __name__ == '__main__':
    absltest.main()
