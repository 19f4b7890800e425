"""Concurrent runs: one trainer per logdir; the lock of a dead trainer is taken over.

The trainer holds an flock on `<logdir>/.lock` (holder: pid, host, start time, command) for its
lifetime. A second trainer on the same logdir is refused with a message naming the holder; after
the holder dies (the kernel releases the lock) the next trainer takes the logdir over. The
trainers run in forks of this process (harness.start_module_forked), which imported TensorFlow
once: the binary's own code from flag parsing to exit status and output.
"""

import json
import os

from absl.testing import absltest

from agents.runs import run_dir
from reliability import harness

LONG = dict(train__total_steps=10_000_000)
DEAD_PID = 999_999_999


class ConcurrencyTest(absltest.TestCase):

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        harness.preload(pipelines=False)

    def setUp(self):
        super().setUp()
        self.logdir = os.path.join(self.create_tempdir().full_path, 'run')

    def start(self, *flags):
        trainer = harness.start_module_forked(
            'agents.scripts.train', *harness.small_run(self.logdir, **LONG), *flags,
            cwd=harness.ROOT)
        self.addCleanup(trainer.kill)
        return trainer

    def test_one_trainer_per_logdir_and_dead_holders_are_taken_over(self):
        """Each trainer start is expensive, so one story covers the cases: a lock file left by
        a process that no longer runs; two trainers started together, of which one is refused
        while the other holds the lock; then the lock of the holder, killed, taken over by a
        third trainer, which finishes."""
        os.makedirs(self.logdir)
        with open(os.path.join(self.logdir, run_dir.LOCK_FILE), 'w') as f:
            f.write(json.dumps({'pid': DEAD_PID, 'host': 'elsewhere', 'started': 'long ago',
                                'command': 'train'}) + '\n')
        trainers = [self.start() for _ in range(2)]
        harness.wait_for(lambda: any(t.poll() is not None for t in trainers), 300,
                         'one of the trainers to be refused')
        refused = next(t for t in trainers if t.returncode is not None)
        running = next(t for t in trainers if t is not refused)
        output = refused.wait(0).stderr
        self.assertEqual(refused.returncode, 1, output[-3000:])
        self.assertRegex(output, rf'train: error: logdir {self.logdir} is in use by another '
                         rf'trainer: pid {running.pid} on \S+ since [-0-9]+ [:0-9]+ [-+0-9]+ '
                         r'\(.*agents/scripts/train.py .*\)\. Wait for it to finish or stop it, or '
                         r'choose another --logdir\.')
        # The lock file of a dead process was no obstacle: the other took it over and holds it
        # through its run, which saves its first evaluation.
        holder = harness.lock_holder(self.logdir)
        self.assertEqual(holder['pid'], running.pid)
        self.assertIn('agents/scripts/train.py --gin_file=configs/pendulum.gin', holder['command'])
        harness.wait_for(lambda: harness.metrics(self.logdir) or running.poll() is not None, 180,
                         'the first evaluation of the running trainer')
        self.assertIsNone(running.poll(), 'the running trainer was disturbed')
        self.assertEqual(harness.metrics(self.logdir)[0]['step'], 512)
        self.assertEqual(harness.lock_holder(self.logdir)['pid'], running.pid)
        running.kill()  # SIGKILL: no chance to clean up; the lock file stays behind.
        self.assertIn(f'Took over the lock of {self.logdir} from pid {DEAD_PID}, which no longer '
                      'runs.', running.wait(0).stderr)
        self.assertEqual(harness.lock_holder(self.logdir)['pid'], running.pid)

        # The third resumes the killed trainer's run and stops, done, one iteration past the
        # newest checkpoint that trainer began to write (whether or not it completed it).
        names = os.listdir(harness.checkpoint_dir(self.logdir))
        stop_at = max(filter(None, map(run_dir.checkpoint_index_step, names))) + 1
        third = self.start(f'--stop_at_step={stop_at}')
        harness.wait_for(
            lambda: (harness.lock_holder(self.logdir) or {}).get('pid') == third.pid
            or third.poll() is not None, 180, 'the third trainer to lock the logdir')
        self.assertEqual(harness.lock_holder(self.logdir)['pid'], third.pid)
        result = third.wait(300)
        self.assertEqual(result.returncode, 0, result.stderr[-3000:])
        self.assertIn(f'Took over the lock of {self.logdir} from pid {running.pid}, which no '
                      'longer runs.', result.stderr)
        self.assertEqual(harness.metrics(self.logdir)[-1]['step'], stop_at + 511)


if __name__ == '__main__':
    absltest.main()
