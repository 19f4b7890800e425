"""Concurrent runs: one trainer per logdir; the lock of a dead trainer is taken over.

The trainer holds an flock on `<logdir>/.lock` (holder: pid, host, start time, command) for its
lifetime. A second trainer on the same logdir is refused with a message naming the holder; after
the holder dies (the kernel releases the lock) the next trainer takes the logdir over.
"""

import os
import signal

from absl.testing import absltest

from agents.runs import run_dir
from reliability import harness

LONG = dict(train__total_steps=10_000_000)


class ConcurrencyTest(absltest.TestCase):

    def setUp(self):
        super().setUp()
        self.logdir = os.path.join(self.create_tempdir().full_path, 'run')
        self.logs = self.create_tempdir().full_path

    def test_second_trainer_is_refused_then_takes_over_the_stale_lock(self):
        first = harness.Binary('train', *harness.small_run(self.logdir, **LONG),
                               log_path=os.path.join(self.logs, 'first.log'))
        with first:
            # It holds the lock from then on, through its whole run.
            holder = harness.wait_for(lambda: harness.lock_holder(self.logdir), 180,
                                      'the first trainer to lock the logdir', process=first)
            self.assertEqual(holder['pid'], first.pid)
            self.assertIn('agents/scripts/train.py --gin_file=configs/pendulum.gin',
                          holder['command'])
            second = harness.run('train', *harness.small_run(self.logdir, **LONG), timeout=300)
            self.assertEqual(second.returncode, 1, second.stderr[-3000:])
            self.assertRegex(second.stderr, rf'train: error: logdir {self.logdir} is in use by '
                             rf'another trainer: pid {first.pid} on \S+ since [-0-9]+ '
                             r'[:0-9]+ [-+0-9]+ \(.*agents/scripts/train.py .*\)\. Wait for it to '
                             r'finish or stop it, or choose another --logdir\.')
            self.assertEqual(harness.lock_holder(self.logdir)['pid'], first.pid)
            self.assertIsNone(first.poll(), 'the first trainer was disturbed')
            first.kill()  # SIGKILL: no chance to clean up; the lock file stays behind.
        self.assertEqual(harness.lock_holder(self.logdir)['pid'], first.pid)

        third = harness.Binary('train', *harness.small_run(self.logdir, **LONG),
                               log_path=os.path.join(self.logs, 'third.log'))
        with third:
            harness.wait_for(lambda: (third.progress() or 0) > 0, 180, 'the third trainer to '
                             'train', process=third)
            self.assertIn(f'Took over the lock of {self.logdir} from pid {first.pid}, which no '
                          'longer runs.', third.output())
            self.assertEqual(harness.lock_holder(self.logdir)['pid'], third.pid)
            third.signal(signal.SIGTERM)
            self.assertEqual(third.wait(120), 128 + signal.SIGTERM, third.output()[-3000:])

    def test_lock_file_of_a_dead_process_is_no_obstacle(self):
        os.makedirs(self.logdir)
        with open(os.path.join(self.logdir, run_dir.LOCK_FILE), 'w') as f:
            f.write('{"pid": 999999999, "host": "elsewhere", "started": "long ago", '
                    '"command": "train"}\n')
        result = harness.run('train', *harness.small_run(
            self.logdir, train__total_steps=512, train__eval_every_steps=512), timeout=600)
        self.assertEqual(result.returncode, 0, result.stderr[-3000:])
        self.assertIn('from pid 999999999, which no longer runs', result.stderr)
        self.assertEqual([record['step'] for record in harness.metrics(self.logdir)], [512])

    def test_two_trainers_started_together_one_trains(self):
        trainers = [harness.Binary('train', *harness.small_run(self.logdir, **LONG),
                                   log_path=os.path.join(self.logs, f'{index}.log'))
                    for index in range(2)]
        with trainers[0], trainers[1]:
            harness.wait_for(lambda: any(t.poll() is not None for t in trainers), 300,
                             'one of the trainers to be refused')
            refused = next(t for t in trainers if t.poll() is not None)
            running = next(t for t in trainers if t is not refused)
            self.assertEqual(refused.returncode, 1, refused.output()[-3000:])
            self.assertIn(f'is in use by another trainer: pid {running.pid}', refused.output())
            harness.wait_for(lambda: (running.progress() or 0) > 0, 180, 'the other to train',
                             process=running)
            self.assertEqual(harness.lock_holder(self.logdir)['pid'], running.pid)


if __name__ == '__main__':
    absltest.main()
