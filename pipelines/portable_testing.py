"""Beam's portable runner on this machine, as a cluster runs it, for tests: a job service and a
pool of external worker processes (`--environment_type=EXTERNAL`)."""

import os
import re
import signal
import subprocess
import sys

import psutil

from pipelines.process_testing import wait_for

# The pool logs its port at INFO, but configures no handler: give it one.
_POOL_MAIN = ('import logging, sys; logging.basicConfig(level=logging.INFO); '
              'from apache_beam.runners.worker import worker_pool_main; '
              'sys.argv[0] = "worker_pool_main"; worker_pool_main.main()')


class PortableCluster:
    """Starts the job service (this interpreter) and the worker pool (`worker_python`, with
    `worker_env` and working directory `worker_cwd`); stops both and all they started on exit.

    The pool starts each worker as `python` from its PATH: the PATH given to it starts with the
    directory of `worker_python`.
    """

    def __init__(self, directory, env=None, worker_python=sys.executable, worker_env=None,
                 worker_cwd=None, startup_timeout=120):
        self.directory = directory
        self._env = dict(os.environ if env is None else env)
        worker_env = dict(self._env if worker_env is None else worker_env)
        worker_env['PATH'] = os.pathsep.join(
            [os.path.dirname(worker_python), worker_env.get('PATH', '')])
        self._worker_env = worker_env
        self._worker_python = worker_python
        self._worker_cwd = worker_cwd or directory
        self._timeout = startup_timeout
        self._processes = []
        self.job_log = os.path.join(directory, 'job_service.log')
        self.pool_log = os.path.join(directory, 'worker_pool.log')

    def _start(self, command, log_path, env, cwd):
        with open(log_path, 'w') as log:
            process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env,
                                       cwd=cwd, stdin=subprocess.DEVNULL, start_new_session=True)
        self._processes.append(process)
        return process

    def __enter__(self):
        port_file = os.path.join(self.directory, 'job.port')
        self.job_service = self._start(
            [sys.executable, '-m', 'apache_beam.runners.portability.local_job_service_main',
             '--port=0', f'--port_file={port_file}'], self.job_log, self._env, self.directory)
        self.pool = self._start(
            [self._worker_python, '-c', _POOL_MAIN, '--service_port=0'], self.pool_log,
            self._worker_env, self._worker_cwd)
        try:
            wait_for(lambda: os.path.exists(port_file) or self.job_service.poll() is not None,
                     self._timeout, 'the job service')
            wait_for(lambda: self._pool_port() or self.pool.poll() is not None, self._timeout,
                     'the worker pool')
            if self.job_service.poll() is not None or self.pool.poll() is not None:
                raise AssertionError(f'the job service or the worker pool exited:\n'
                                     f'{self.logs()}')
        except BaseException:
            self.__exit__()
            raise
        with open(port_file) as f:
            self.job_port = f.read().strip()
        return self

    def __exit__(self, *unused_exc_info):
        for process in self._processes:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        # Workers the pool started live in its process group; kill what survived it.
        for pid in self.worker_pids():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def _pool_port(self):
        with open(self.pool_log) as f:
            match = re.search(r'worker pool servicer at port: \S*:(\d+)', f.read())
        return match and match.group(1)

    def pipeline_args(self):
        """The flags that send a pipeline to this cluster."""
        return ['--runner=PortableRunner', f'--job_endpoint=localhost:{self.job_port}',
                '--environment_type=EXTERNAL',
                f'--environment_config=localhost:{self._pool_port()}']

    def worker_pids(self):
        """The pids of the SDK worker processes the pool started (alive or zombie)."""
        pool = getattr(self, 'pool', None)
        try:
            return [child.pid for child in psutil.Process(pool.pid).children()] if pool else []
        except psutil.NoSuchProcess:  # The pool has been reaped.
            return []

    def logs(self):
        text = []
        for path in (self.job_log, self.pool_log):
            with open(path, errors='replace') as f:
                text.append(f'--- {os.path.basename(path)} ---\n{f.read()[-4000:]}')
        return '\n'.join(text)
