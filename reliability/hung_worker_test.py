"""Hung environment workers: restarted after `BatchEnv.timeout`, no obstacle to a signal, and
never left behind.

A worker that stops answering (SIGSTOP, or an environment whose step never returns) is deemed
hung after `BatchEnv.timeout` seconds: the trainer names the environments it hosted, kills it and
restarts the training environments under `train.on_env_failure`, as for a dead worker. While
it waits, progress lines name the worker it waits for; SIGTERM ends the wait and the run (exit
143) at once; and a SIGKILL of the trainer leaves no process of the run behind. The trainers
run in forks of this process (harness.Forked), which imported TensorFlow once: the binary's own
code from flag parsing to exit status and output.
"""

import os
import re
import signal
import time

from absl.testing import absltest

from reliability import harness

STARTUP_TIMEOUT = 300
# The bound the README gives for a stop while the trainer waits for a hung worker (seconds),
# and room for a machine busy with other tests.
STOP_BOUND = 2.0
MARGIN = 3.0


class HungWorkerTest(harness.TrainerTestCase):

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        harness.preload(pipelines=False)

    def start(self, *flags):
        return harness.ForkedBinary('train', *flags,
                                    log_path=os.path.join(self.root, 'train.log'))

    def start_stuck(self, **bindings):
        """A run whose worker hangs in a step of the second iteration (after the checkpoint of
        step 512); returns (trainer, its workers' pids) once the worker hangs."""
        marker = os.path.join(self.root, 'hung')
        trainer = self.start(*harness.faulty_workers_run(
            self.logdir, {'fault': 'hang', 'at_step': 200, 'workers_only': True,
                          'once_marker': marker}, train__total_steps=100_000, **bindings))
        harness.wait_for(lambda: os.path.exists(marker), STARTUP_TIMEOUT, 'the hang',
                         process=trainer)
        workers = harness.env_worker_pids(trainer)
        self.assertLen(workers, 2)
        return trainer, workers

    def test_stopped_worker_is_named_killed_and_restarted_and_the_run_finishes(self):
        timeout = 3.0
        # One evaluation, at the end: the iterations before it are what the stop must hit.
        trainer = self.start(*harness.faulty_workers_run(
            self.logdir, {}, train__total_steps=8192, train__eval_every_steps=8192,
            BatchEnv__timeout=timeout))
        with trainer:
            harness.wait_for(lambda: (trainer.progress() or 0) >= 1024, STARTUP_TIMEOUT,
                             'two iterations', process=trainer)
            workers = harness.env_worker_pids(trainer)
            self.assertLen(workers, 2)
            os.kill(workers[1], signal.SIGSTOP)
            stopped = time.monotonic()
            failure = re.compile(
                rf'Training environment failure: BatchEnv worker process 1 \(pid {workers[1]}\) '
                rf'hosting envs \[2, 3\] \(it was stopped\) did not answer step within '
                rf'{timeout} s and was killed \(in the iteration after step \d+\)\. Restarting '
                r'all 4 training environments')
            harness.wait_for(lambda: failure.search(trainer.output()), timeout + 5,
                             'the restart naming the stopped worker', process=trainer)
            self.assertLess(time.monotonic() - stopped, timeout + 5)
            self.assertEqual(trainer.wait(STARTUP_TIMEOUT), 0, trainer.output()[-3000:])
        self.assertIn('Done: 8192 steps', trainer.output())
        self.assertNotIn(workers[1], harness.processes())
        self.assertEqual(harness.metrics(self.logdir)[-1]['step'], 8192)

    def test_sigterm_stops_a_trainer_stuck_on_a_hung_worker(self):
        trainer, workers = self.start_stuck(train__log_every_secs=1.0)
        with trainer:
            # Meanwhile, progress lines name the worker that is waited for.
            harness.wait_for(
                lambda: re.search(r'step 512/100000 \| an iteration for \d+ s \| waiting \d+ s '
                                  rf'for worker process \d \(pid ({"|".join(map(str, workers))})'
                                  r'\) hosting envs \[\d, \d\]', trainer.output()),
                30, 'a progress line naming the hung worker', process=trainer)
            trainer.signal(signal.SIGTERM)
            signalled = time.monotonic()
            self.assertEqual(trainer.wait(60), 128 + signal.SIGTERM, trainer.output()[-3000:])
            elapsed = time.monotonic() - signalled
        self.assertLess(elapsed, STOP_BOUND + MARGIN)
        self.assertIn('train: interrupted by SIGTERM at step 512; the checkpoint of step 512 is '
                      'saved.', trainer.output())
        self.assertEqual(harness.checkpoint_state(self.logdir)[1], 512)

    def test_no_process_of_the_run_survives_a_sigkill_of_the_trainer(self):
        trainer, workers = self.start_stuck()
        with trainer:
            os.kill(workers[0], signal.SIGSTOP)  # One hangs in its step, the other is stopped.
            members = harness.session_pids(trainer.pid)
            self.assertGreaterEqual(len(members), 5)  # Trainer, tracker, forkserver, workers.
            trainer.signal(signal.SIGKILL)  # The trainer alone, as the OOM killer would.
            trainer.process.wait(30)
            harness.wait_for(lambda: not harness.session_pids(trainer.pid), 5,
                             'the end of every process of the run')


if __name__ == '__main__':
    absltest.main()
