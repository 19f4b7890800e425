"""Tests of supervise: the exit status passed through, the group killed with the caller."""

import contextlib
import os
import signal
import subprocess
import sys

from absl.testing import absltest

from agents.runs import run_config
from pipelines.process_testing import process_gone, wait_for


def supervise(*command, new_session=True, timeout=60):
    env = dict(os.environ, PYTHONPATH=run_config.PACKAGE_ROOT)
    return subprocess.run(
        [sys.executable, '-m', 'pipelines.sweep.supervise', str(os.getpid()), *command], env=env,
        start_new_session=new_session, capture_output=True, text=True, timeout=timeout,
        check=False)


class SuperviseTest(absltest.TestCase):

    def test_exit_code_and_output(self):
        result = supervise(sys.executable, '-c', 'print("hi"); raise SystemExit(3)')
        self.assertEqual((result.returncode, result.stdout), (3, 'hi\n'))

    def test_death_by_signal(self):
        for name in ('SIGSEGV', 'SIGKILL'):
            result = supervise(sys.executable, '-c',
                               f'import os, signal; os.kill(os.getpid(), signal.{name})')
            self.assertEqual(result.returncode, -getattr(signal, name), name)

    def test_refuses_to_run_outside_its_own_process_group(self):
        result = supervise('true', new_session=False)
        self.assertNotEqual(result.returncode, 0)
        self.assertIn('must lead its process group', result.stderr)

    def test_the_group_dies_with_the_caller(self):
        pid_file = os.path.join(self.create_tempdir().full_path, 'pids')
        # The caller: starts supervise on a command that starts a grandchild, then waits.
        caller = subprocess.Popen([sys.executable, '-c', f'''
import os, subprocess, sys
subprocess.Popen([sys.executable, '-m', 'pipelines.sweep.supervise', str(os.getpid()), 'sh', '-c',
                  'sleep 600 & echo $$ $! > {pid_file}; wait'], start_new_session=True).wait()
'''], env=dict(os.environ, PYTHONPATH=run_config.PACKAGE_ROOT))
        self.addCleanup(caller.wait)

        def started():
            with contextlib.suppress(FileNotFoundError), open(pid_file) as f:
                return f.read().endswith('\n')

        wait_for(started, what='the command to start')
        with open(pid_file) as f:
            pids = [int(pid) for pid in f.read().split()]
        caller.kill()
        wait_for(lambda: all(process_gone(pid) for pid in pids),
                 what=f'{pids} to die with the caller')


if __name__ == '__main__':
    absltest.main()
