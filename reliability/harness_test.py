"""Tests the fork runner of the fault-injection tests: a Forked `main` ends as a program would
(exit status, output, environment, working directory, its own session), a timeout kills it,
and it refuses to fork beside another thread or once TensorFlow ran."""

import os
import subprocess
import sys
import threading

from absl.testing import absltest

from reliability import harness


def _report_and_exit():
    print(f'cwd={os.getcwd()} only={os.environ.get("ONLY")} pid={os.getpid()} '
          f'session={os.getsid(0)}')
    print('to stderr', file=sys.stderr)
    sys.exit(3)


class ForkedTest(absltest.TestCase):

    def test_ends_as_a_program_would(self):
        cwd, here = self.create_tempdir().full_path, os.getcwd()
        result = harness.run_forked(_report_and_exit, cwd=cwd, env={'ONLY': 'this'})
        self.assertEqual(result.returncode, 3)
        fields = dict(item.split('=') for item in result.stdout.split())
        self.assertEqual((fields['cwd'], fields['only']), (os.path.realpath(cwd), 'this'))
        self.assertEqual(fields['session'], fields['pid'])  # A session of its own.
        self.assertEqual(result.stderr, 'to stderr\n')
        self.assertEqual(os.getcwd(), here)  # The parent stays where it was.

    def test_exit_statuses_as_the_interpreter_makes_them(self):
        for main, status, stderr in ((lambda: None, 0, ''),
                                     (lambda: sys.exit('a message'), 1, 'a message\n'),
                                     (lambda: sys.exit(256 + 7), 7, '')):
            with self.subTest(status=status):
                result = harness.run_forked(main)
                self.assertEqual((result.returncode, result.stderr), (status, stderr))
        result = harness.run_forked(lambda: 1 / 0)
        self.assertEqual(result.returncode, 1)
        self.assertIn('ZeroDivisionError', result.stderr)

    def test_a_timeout_kills_it(self):
        forked = harness.Forked(lambda: threading.Event().wait())
        with self.assertRaises(subprocess.TimeoutExpired):
            forked.wait(0.5)
        self.assertEqual(forked.returncode, -9)

    def test_refuses_beside_another_thread(self):
        stop = threading.Event()
        thread = threading.Thread(target=stop.wait)
        thread.start()
        try:
            self.assertFalse(harness.can_fork())
            with self.assertRaisesRegex(RuntimeError, 'forking beside other threads'):
                harness.Forked(lambda: None)
        finally:
            stop.set()
            thread.join()
        self.assertTrue(harness.can_fork())

    def test_refuses_once_tensorflow_ran(self):
        # Last: nothing forks in this process after it (test methods run in name order).
        import tensorflow as tf  # noqa: PLC0415
        self.assertTrue(harness.can_fork())  # Imported, nothing run.
        tf.constant(1.0) + 1.0  # noqa: B018
        self.assertFalse(harness.can_fork())
        with self.assertRaisesRegex(RuntimeError, 'TensorFlow ran in this process'):
            harness.Forked(lambda: None)


if __name__ == '__main__':
    absltest.main()
