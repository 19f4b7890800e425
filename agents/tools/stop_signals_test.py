"""Tests of StopSignals: raised before `deferred`, watched within, a second signal exits."""

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

from absl.testing import absltest

from agents.tools import stop_signals


def run_script(body, timeout=60):
    """Runs `body` (Python) in a fresh interpreter; returns the CompletedProcess."""
    return subprocess.run(
        [sys.executable, '-c', textwrap.dedent(body)], capture_output=True, text=True,
        timeout=timeout, env={**os.environ, 'PYTHONPATH': os.pathsep.join(sys.path)},
        check=False)


class StopSignalsTest(absltest.TestCase):

    def test_signal_outside_deferred_raises_stop_requested_in_the_main_thread(self):
        with self.assertRaises(stop_signals.StopRequested) as raised:
            with stop_signals.StopSignals() as signals:
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(10)
        self.assertEqual(raised.exception.signum, signal.SIGTERM)
        self.assertEqual(str(raised.exception), 'interrupted by SIGTERM')
        self.assertNotIsInstance(raised.exception, Exception)  # `except Exception` lets it by.
        self.assertEqual(signals.signum, signal.SIGTERM)

    def test_deferred_signal_reaches_callbacks_from_the_watcher_while_the_main_thread_waits(self):
        called = []
        release = threading.Event()

        def callback(signum):
            called.append((signum, threading.current_thread().name))
            release.set()

        with stop_signals.StopSignals() as signals, signals.deferred():
            self.assertTrue(signals.active)
            signals.on_stop(callback)
            os.kill(os.getpid(), signal.SIGINT)
            self.assertTrue(release.wait(10))  # Released by the callback, not by a handler.
            self.assertEqual(signals.signum, signal.SIGINT)
        self.assertEqual(called, [(signal.SIGINT, 'stop-signals')])

    def test_callback_registered_after_the_signal_runs_at_once(self):
        with stop_signals.StopSignals() as signals, signals.deferred():
            os.kill(os.getpid(), signal.SIGTERM)
            self.assertTrue(_wait_until(lambda: signals.signum is not None))
            called = []
            signals.on_stop(called.append)
            self.assertEqual(called, [signal.SIGTERM])

    def test_unregistered_callback_is_not_called(self):
        called = []
        with stop_signals.StopSignals() as signals, signals.deferred():
            unregister = signals.on_stop(called.append)
            unregister()
            os.kill(os.getpid(), signal.SIGTERM)
            self.assertTrue(_wait_until(lambda: signals.signum is not None))
        self.assertEqual(called, [])

    def test_handlers_and_wakeup_fd_are_restored_on_exit(self):
        before = {signum: signal.getsignal(signum) for signum in stop_signals.SIGNALS}
        with stop_signals.StopSignals():
            self.assertNotEqual(signal.getsignal(signal.SIGTERM), before[signal.SIGTERM])
        self.assertEqual({signum: signal.getsignal(signum) for signum in stop_signals.SIGNALS},
                         before)
        self.assertEqual(signal.set_wakeup_fd(-1), -1)

    def test_outside_the_main_thread_nothing_is_watched(self):
        result = []

        def enter():
            with stop_signals.StopSignals() as signals:
                result.append((signals.active, signal.getsignal(signal.SIGTERM)))

        thread = threading.Thread(target=enter)
        thread.start()
        thread.join()
        self.assertEqual(result, [(False, signal.getsignal(signal.SIGTERM))])

    def test_first_signal_is_seen_while_the_main_thread_is_blocked_and_second_exits(self):
        # The main thread blocks in a wait that no Python handler ends (as inside a compiled
        # call); the watcher still sees both signals, and the second ends the process.
        result = run_script('''
            import os, signal, threading, time
            from agents.tools import stop_signals
            with stop_signals.StopSignals() as signals, signals.deferred():
                signals.on_stop(lambda signum: print('stopping', signum, flush=True))
                os.kill(os.getpid(), signal.SIGTERM)
                while signals.signum is None:
                    time.sleep(0.01)
                os.kill(os.getpid(), signal.SIGINT)
                threading.Event().wait(30)
            print('not reached', flush=True)
        ''')
        self.assertEqual(result.returncode, 128 + signal.SIGINT, result.stderr)
        self.assertEqual(result.stdout, f'stopping {int(signal.SIGTERM)}\n')
        self.assertIn('Received SIGTERM: stopping after the current step of work',
                      result.stderr)
        self.assertIn('Received SIGINT again: stopping at once (exit 130)', result.stderr)

    def test_a_process_that_does_not_stop_within_the_grace_ends_with_its_last_words(self):
        # The main thread never returns (a compilation or a native call that does not end).
        result = run_script('''
            import os, signal, threading, time
            from agents.tools import stop_signals
            with stop_signals.StopSignals(grace_s=1.0, last_words=lambda: 'step 512 is kept'
                                          ) as signals, signals.deferred():
                os.kill(os.getpid(), signal.SIGTERM)
                began = time.monotonic()
                threading.Event().wait(30)
            print('not reached', flush=True)
        ''', timeout=20)
        self.assertEqual(result.returncode, 128 + signal.SIGTERM, result.stderr)
        self.assertEqual(result.stdout, '')
        self.assertIn('stopped: still running 1 s after SIGTERM: stopping at once (exit 143); '
                      'the last complete save stays; step 512 is kept', result.stderr)

    def test_a_process_that_stops_within_the_grace_is_not_ended(self):
        result = run_script('''
            import os, signal, time
            from agents.tools import stop_signals
            with stop_signals.StopSignals(grace_s=0.5) as signals, signals.deferred():
                os.kill(os.getpid(), signal.SIGTERM)
                while signals.signum is None:
                    time.sleep(0.01)
            time.sleep(1.0)  # Past the grace, with the signals no longer watched.
            print('exited normally', flush=True)
        ''')
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertEqual(result.stdout, 'exited normally\n')


def _wait_until(condition, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.01)
    return condition()


if __name__ == '__main__':
    absltest.main()
