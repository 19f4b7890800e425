"""SIGTERM and SIGINT in every phase of the train binary, including those where Python cannot
run its signal handlers.

Before training begins (building environments, tracing), a signal stops the binary at once; it
has saved nothing. During training, the first signal is acknowledged at once, also while the
main thread is inside a compiled TensorFlow call such as the first iteration, which compiles for
seconds; the run stops after that call with a checkpoint. A second signal stops it at once.
Exit status: 128 + the signal's number. (Stops while waiting for a hung environment worker are
in hung_worker_test.py, stops mid-training in preemption_test.py.)
"""

import os
import re
import signal
import time

from absl.testing import absltest

from reliability import harness

STARTUP_TIMEOUT = 300
# How soon a signal must be acknowledged, or end the binary when nothing is to be saved
# (seconds), with room for a machine busy with other tests.
PROMPT = 2.0 + 3.0


class SignalTest(harness.TrainerTestCase):

    def start_compiling(self):
        """A run, signalled while its first iteration compiles; returns it."""
        trainer = self.start(*harness.small_run(
            self.logdir, train__total_steps=100_000, train__log_every_secs=1.0))
        harness.wait_for(
            lambda: 'step 0/100000 | the first iteration (tracing and compiling) for'
            in trainer.output(), STARTUP_TIMEOUT, 'the first compilation', interval=0.01,
            process=trainer)
        trainer.signal(signal.SIGTERM)
        signalled = time.monotonic()
        harness.wait_for(lambda: 'Received SIGTERM' in trainer.output(), PROMPT,
                         'the acknowledgement of SIGTERM', process=trainer)
        self.assertLess(time.monotonic() - signalled, PROMPT)
        return trainer

    def test_signal_before_training_began_stops_at_once(self):
        marker = os.path.join(self.root, 'making')
        trainer = self.start(*harness.small_run(
            self.logdir, harness.FAULTY_ENV_ID, train__env_kwargs={'hang_on_make': marker}))
        with trainer:
            harness.wait_for(lambda: os.path.exists(marker), STARTUP_TIMEOUT,
                             'the environment to hang while it is made', process=trainer)
            trainer.signal(signal.SIGTERM)
            self.assertEqual(trainer.wait(PROMPT), 128 + signal.SIGTERM,
                             trainer.output()[-3000:])
        self.assertIn('train: interrupted by SIGTERM before training began; nothing was saved.',
                      trainer.output())
        self.assertNotIn('Traceback', trainer.output())
        self.assertFalse(os.path.exists(self.logdir))

    def test_sigterm_during_the_first_compilation_stops_after_it_with_a_checkpoint(self):
        with self.start_compiling() as trainer:
            self.assertEqual(trainer.wait(STARTUP_TIMEOUT), 128 + signal.SIGTERM,
                             trainer.output()[-3000:])
        match = re.search(r'train: interrupted by SIGTERM at step (\d+); saved a checkpoint at '
                          r'step \1\.', trainer.output())
        self.assertIsNotNone(match, trainer.output()[-3000:])
        self.assertEqual(harness.checkpoint_state(self.logdir)[1], int(match.group(1)))

    def test_second_signal_stops_at_once(self):
        with self.start_compiling() as trainer:
            trainer.signal(signal.SIGINT)
            signalled = time.monotonic()
            self.assertEqual(trainer.wait(PROMPT), 128 + signal.SIGINT,
                             trainer.output()[-3000:])
            self.assertLess(time.monotonic() - signalled, PROMPT)
        self.assertIn('Received SIGINT again: stopping at once (exit 130)', trainer.output())


if __name__ == '__main__':
    absltest.main()
