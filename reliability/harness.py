"""Drives the real binaries for the fault-injection tests: start, watch, kill, inspect.

Every binary runs as `python -m agents.scripts.<name>` in a session of its own (so a kill can
take its environment workers along), with its output in a log file the test can watch while it
runs. Waits poll a condition with a deadline; nothing sleeps for a state.

A test that is not about a binary's start-up may run it in a fork instead (`Forked`,
`run_module_forked`): `preload()` imports, once, the libraries the binaries import, and each
run forks this process and runs the binary's module as `__main__` in the child, which then
starts in milliseconds rather than seconds. TensorFlow must not have run anything in this
process before it forks (its runtime's threads would not follow into the child), nor may other
threads run here: `Forked` checks both.
"""

import atexit
import contextlib
import importlib
import json
import os
import re
import runpy
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback

import psutil
from absl.testing import absltest

from agents.runs import metrics as metrics_lib
from agents.runs import recovery, run_dir
from reliability import faulty_envs

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FAULTY_ENV_ID = faulty_envs.ENV_ID
PROGRESS = re.compile(r'\] step (\d+)/(\d+) \|')


def environment(**extra):
    """The binaries' environment: this tree importable, output unbuffered, quiet TF."""
    env = dict(os.environ, PYTHONPATH=ROOT, PYTHONUNBUFFERED='1', TF_CPP_MIN_LOG_LEVEL='2')
    env.update(extra)
    return env


def command(binary, *args):
    return [sys.executable, '-m', f'agents.scripts.{binary}', *args]


def bindings(**values):
    """`--gin_bindings` flags from `name=value` pairs ('__' stands for '.')."""
    return [f'--gin_bindings={name.replace("__", ".")} = {value!r}'
            for name, value in values.items()]


def run(binary, *args, timeout=300, cwd=None, env=None):
    """Runs a binary to its end; returns the CompletedProcess (text output)."""
    return subprocess.run(command(binary, *args), capture_output=True, text=True,
                          timeout=timeout, cwd=cwd, env=env or environment(),
                          stdin=subprocess.DEVNULL, check=False)


# What the train, evaluate, export and visualize binaries import, then what the sweep and the
# report binaries add, but not the binaries' own modules: those define absl flags, which a
# module run in a fork defines again.
BINARY_LIBRARIES = (
    'gin', 'gymnasium', 'tensorflow', 'agents.algorithms.registry', 'agents.runs.faults',
    'agents.runs.loop', 'agents.runs.policy_export', 'agents.runs.remote_logdir',
    'agents.runs.restore', 'agents.runs.run_config', 'agents.runs.run_settings',
    'agents.tools.evaluation', 'agents.tools.process_env', 'agents.tools.rendering',
    'agents.tools.stop_signals', 'agents.tools.video',
)
SWEEP_LIBRARIES = (
    'apache_beam', 'pipelines.halving', 'pipelines.sweep.scheduler', 'pipelines.sweep.search',
    'pipelines.sweep.sweep_spec', 'pipelines.sweep.sweep_state', 'pipelines.sweep.trial',
)
REPORT_LIBRARIES = (
    'apache_beam', 'pipelines.report.plots', 'pipelines.report.report_data',
    'pipelines.report.report_html', 'pipelines.report.run_reader',
)


def preload(pipelines=True):
    """Imports the binaries' libraries for `run_module_forked`: BINARY_LIBRARIES as the binaries
    do (quiet, without matplotlib), and those of the sweep and the report binaries as well
    (`pipelines` True), of neither (False) or of those named ('sweep', 'report'). Nothing runs
    in TensorFlow."""
    from agents.scripts import lean_start, log_noise
    with log_noise.tensorflow_start(), lean_start.without_matplotlib():
        for name in BINARY_LIBRARIES:
            importlib.import_module(name)
    if pipelines is True:
        pipelines = ('sweep', 'report')
    extra = {'sweep': SWEEP_LIBRARIES, 'report': REPORT_LIBRARIES}
    for name in [name for pipeline in pipelines or () for name in extra[pipeline]]:
        importlib.import_module(name)


def _tensorflow_started():
    """Whether TensorFlow's eager runtime (and with it its thread pools) exists in this process."""
    if 'tensorflow' not in sys.modules:
        return False
    from tensorflow.python.eager import context
    return context.context()._context_handle is not None  # noqa: SLF001 (no public query)


def _exit_status(code):
    """The exit status of a process that raised SystemExit(code), as the interpreter makes it
    (printing a message that is not a number)."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    sys.stderr.write(f'{code}\n')
    return 1


class Forked:
    """`main()` running in a fork of this process as a process of its own would run a program:
    in `cwd` with only `env` (default `environment()`) as its environment, in a session of its
    own, stdin from /dev/null, ending with the exit status of its SystemExit (a traceback and 1
    on another exception). `wait` returns a CompletedProcess with its text output."""

    def __init__(self, main, *, cwd=None, env=None):
        refusal = _fork_refusal()
        if refusal:
            raise RuntimeError(refusal)
        self._main = main
        env = environment() if env is None else env
        self._outputs = [tempfile.TemporaryFile(), tempfile.TemporaryFile()]
        sys.stdout.flush()
        sys.stderr.flush()
        self.pid = os.fork()
        if self.pid == 0:
            self._child(cwd or os.getcwd(), env)
        self.returncode = None

    def _child(self, cwd, env):
        status = 1
        try:
            os.setsid()  # A group of its own, which `kill` ends whole.
            atexit._clear()  # noqa: SLF001 (the parent's exit handlers are not the child's)
            os.chdir(cwd)
            os.environ.clear()
            os.environ.update(env)
            os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
            for fd, file in enumerate(self._outputs, start=1):
                os.dup2(file.fileno(), fd)
            try:
                self._main()
                status = 0
            except SystemExit as exit:
                status = _exit_status(exit.code)
            except BaseException:  # As the interpreter reports an uncaught exception.
                traceback.print_exc()
            atexit._run_exitfuncs()  # noqa: SLF001
        finally:
            with contextlib.suppress(BaseException):
                sys.stdout.flush()
                sys.stderr.flush()
            os._exit(status)

    def poll(self):
        """The exit status once the child has ended (reaping it), else None."""
        if self.returncode is None:
            done, status = os.waitpid(self.pid, os.WNOHANG)
            if done:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait_for_status(self, timeout=None):
        """Waits up to `timeout` s (None: without limit) for the end; returns the exit status
        (subprocess.TimeoutExpired, the child left running, when it has not ended)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(self._main, timeout)
            time.sleep(0.01)
        return self.returncode

    def wait(self, timeout):
        """Waits up to `timeout` s for the end (else kills it: subprocess.TimeoutExpired)."""
        try:
            self.wait_for_status(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise
        outputs = []
        for file in self._outputs:
            file.seek(0)
            outputs.append(file.read().decode('utf-8', errors='replace'))
            file.close()
        return subprocess.CompletedProcess(self._main, self.returncode, *outputs)

    def kill(self):
        """SIGKILL to the child's session; returns once the child is reaped."""
        if self.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pid, signal.SIGKILL)
            self.returncode = os.waitstatus_to_exitcode(os.waitpid(self.pid, 0)[1])


def _fork_refusal():
    """Why a Forked process cannot start here, or None: TensorFlow ran something in this
    process, or other threads run."""
    if _tensorflow_started():
        return 'TensorFlow ran in this process: a fork would lack its threads'
    if threading.active_count() > 1:
        return ('forking beside other threads, whose locks the child could not take: '
                f'{threading.enumerate()}')
    return None


def can_fork():
    """Whether a Forked process can start here (see `_fork_refusal`)."""
    return _fork_refusal() is None


def run_train(*flags, timeout=600):
    """Runs the train binary to its end: in a fork when this process can fork (see `preload`),
    else (once TensorFlow ran here) as a subprocess. Returns the CompletedProcess."""
    if can_fork():
        return run_module_forked('agents.scripts.train', *flags, timeout=timeout, cwd=ROOT)
    return run('train', *flags, timeout=timeout)


def run_forked(main, *, timeout=300, cwd=None, env=None):
    """Runs `main()` in a Forked process to its end; returns the CompletedProcess."""
    return Forked(main, cwd=cwd, env=env).wait(timeout)


def _run_module_as_main(module, args):
    """What `python -m module args...` does once the interpreter has started."""
    sys.path.insert(0, os.getcwd())
    sys.argv = [module, *args]
    runpy.run_module(module, run_name='__main__', alter_sys=True)


def start_module_forked(module, *args, cwd=None, env=None):
    """`python -m module args...` started in a Forked process (after `preload()`): the module
    runs as `__main__` with `args` as its arguments and its working directory first on
    sys.path."""
    return Forked(lambda: _run_module_as_main(module, args), cwd=cwd, env=env)


def run_module_forked(module, *args, timeout=300, cwd=None, env=None):
    """`start_module_forked` to the module's end; returns the CompletedProcess."""
    return start_module_forked(module, *args, cwd=cwd, env=env).wait(timeout)


def wait_for(condition, timeout, what, interval=0.05, process=None):
    """Polls `condition()` until it is truthy (returned) or `timeout` s pass (AssertionError).

    With `process` (a Binary), also fails as soon as the process ends, since the state it was
    to reach will not come.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if process is not None and process.poll() is not None:
            raise AssertionError(f'{what}: the process ended first (exit {process.returncode})'
                                 f'\n{process.output()[-3000:]}')
        if time.monotonic() > deadline:
            raise AssertionError(f'timed out after {timeout} s waiting for {what}')
        time.sleep(interval)


class Binary:
    """A binary running in the background in its own session, its output in `log_path`."""

    def __init__(self, binary, *args, log_path, cwd=None, env=None):
        self.log_path = log_path
        self._log = open(log_path, 'ab')  # Closed when the process is reaped.
        self.process = subprocess.Popen(
            command(binary, *args), stdout=self._log, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, cwd=cwd, env=env or environment(),
            start_new_session=True)
        self.pid = self.process.pid

    @property
    def returncode(self):
        return self.process.returncode

    def poll(self):
        return self.process.poll()

    def output(self):
        with open(self.log_path, encoding='utf-8', errors='replace') as f:
            return f.read()

    def progress(self):
        """The last training step the binary logged, or None."""
        steps = PROGRESS.findall(self.output())
        return int(steps[-1][0]) if steps else None

    def signal(self, signum, group=False):
        """Sends `signum` to the binary (with `group`, to its whole session)."""
        with contextlib.suppress(ProcessLookupError):
            if group:
                os.killpg(self.pid, signum)
            else:
                os.kill(self.pid, signum)

    def kill(self):
        """SIGKILL to the binary and everything it started; returns once it is reaped."""
        self.signal(signal.SIGKILL, group=True)
        return self.wait(60)

    def wait(self, timeout):
        try:
            return self.process.wait(timeout)
        finally:
            if self.process.returncode is not None:
                # Reap what it started (environment workers), as a supervisor would.
                self.signal(signal.SIGKILL, group=True)
                self._log.close()

    def __enter__(self):
        return self

    def __exit__(self, *unused_exc_info):
        if self.process.poll() is None:
            self.kill()
        self.signal(signal.SIGKILL, group=True)
        self._log.close()


class ForkedBinary(Binary):
    """A Binary that runs in a fork of this process (after `preload()`) instead of a new
    interpreter, its output in `log_path` all the same."""

    def __init__(self, binary, *args, log_path, cwd=None, env=None):
        # Not Binary's __init__, which starts a new interpreter.
        self.log_path = log_path
        self._log = open(log_path, 'ab')  # Closed when the process is reaped.
        log = self._log.fileno()
        module = f'agents.scripts.{binary}'

        def main():
            os.dup2(log, 1)
            os.dup2(log, 2)
            _run_module_as_main(module, args)
        self.process = _PopenOfForked(Forked(main, cwd=cwd or ROOT, env=env))
        self.pid = self.process.pid


class _PopenOfForked:
    """Popen's `returncode`, `poll` and `wait` (the exit status) for a Forked."""

    def __init__(self, forked):
        self._forked = forked
        self.pid = forked.pid

    @property
    def returncode(self):
        return self._forked.returncode

    def poll(self):
        return self._forked.poll()

    def wait(self, timeout=None):
        return self._forked.wait_for_status(timeout)


class TrainerTestCase(absltest.TestCase):
    """A test of the train binary: `root` is a fresh directory, `logdir` the run's logdir in it,
    and `start` starts the binary in the background, its output in root/train.log."""

    def setUp(self):
        super().setUp()
        self.root = self.create_tempdir().full_path
        self.logdir = os.path.join(self.root, 'run')

    def start(self, *flags):
        return Binary('train', *flags, log_path=os.path.join(self.root, 'train.log'))


def processes():
    """{pid: parent pid} of the live processes of the machine (a zombie has ended; it waits to
    be reaped)."""
    return {process.pid: process.info['ppid']
            for process in psutil.process_iter(['ppid', 'status'])
            if process.info['status'] != psutil.STATUS_ZOMBIE}


def session_pids(session):
    """Pids of the live processes of `session` (a Binary's pid is its session's id)."""
    members = []
    for pid in processes():
        with contextlib.suppress(ProcessLookupError):  # It ended meanwhile.
            if os.getsid(pid) == session:
                members.append(pid)
    return sorted(members)


def env_worker_pids(binary):
    """Pids of the environment workers of a training binary: the children of its forkserver,
    the one child of the binary that has children of its own."""
    parents = processes()
    return sorted(pid for pid, parent in parents.items() if parents.get(parent) == binary.pid)


def checkpoint_dir(logdir):
    return os.path.join(logdir, run_dir.CHECKPOINT_DIR)


def checkpoint_state(logdir):
    """(steps the state file names, oldest first; the latest step), or ([], None)."""
    import tensorflow as tf  # Only the tests that look into checkpoints pay for the import.
    state = tf.train.get_checkpoint_state(checkpoint_dir(logdir))
    if state is None:
        return [], None
    steps = [recovery.checkpoint_step(path) for path in state.all_model_checkpoint_paths]
    return steps, recovery.checkpoint_step(state.model_checkpoint_path)


def checkpoint_problem(logdir, step):
    return recovery.checkpoint_problem(recovery.checkpoint_path(checkpoint_dir(logdir), step))


def metrics(logdir, complete_only=True):
    """The evaluation records of metrics.jsonl (skipping a cut last line if `complete_only`);
    a line that is not JSON fails the test."""
    path = os.path.join(logdir, run_dir.METRICS_FILE)
    try:
        lines = [line for line in metrics_lib.read_lines(path)
                 if line.complete or not complete_only]
    except FileNotFoundError:
        return []
    for line in lines:
        if line.problem:
            raise AssertionError(f'{path} line {line.number} is {line.problem}')
    return [line.record for line in lines]


def leftovers(logdir):
    """Temporary files of interrupted writes under `logdir`."""
    found = []
    for parent, directories, files in os.walk(logdir):
        for name in directories + files:
            if re.search(r'_temp$|\.partial-|\.old-|\.tmp', name):
                found.append(os.path.relpath(os.path.join(parent, name), logdir))
    return found


def lock_holder(logdir):
    """The holder record of the logdir's lock file, or None."""
    try:
        with open(os.path.join(logdir, run_dir.LOCK_FILE), encoding='utf-8') as f:
            return json.loads(f.read() or 'null')
    except (FileNotFoundError, ValueError):
        return None


def small_run(logdir, env_id=None, **overrides):
    """Flags of a short Pendulum run into `logdir`: 4 environments x 128 steps per iteration,
    an evaluation and checkpoint every iteration (512 steps), 2048 steps in all.

    `overrides` are more bindings ('__' for '.'); `env_id` replaces Pendulum-v1 (e.g. by
    FAULTY_ENV_ID, then with `train__env_kwargs`).
    """
    values = dict(train__env_mode='in_process', train__num_envs=4, train__rollout_length=128,
                  train__total_steps=2048, train__eval_every_steps=512, train__eval_episodes=2,
                  train__log_every_secs=0.001, PPO__num_minibatches=4, PPO__num_epochs=2)
    if env_id:
        values['train__env_id'] = env_id
    values.update(overrides)
    return ['--gin_file=configs/pendulum.gin', f'--logdir={logdir}', *bindings(**values)]


def faulty_workers_run(logdir, fault, **overrides):
    """Flags of `small_run` on FAULTY_ENV_ID with `fault` (its env_kwargs), stepped by two
    worker processes, where the faults strike."""
    return small_run(logdir, FAULTY_ENV_ID, train__env_mode='external', train__num_workers=2,
                     train__env_kwargs=fault, **overrides)


def mount_namespace():
    """The command prefix that runs a command in a private mount namespace where it may mount
    (as root of a user namespace, or as root), and why not when there is none: (prefix, reason).
    """
    import tempfile
    problems = []
    with tempfile.TemporaryDirectory() as directory:
        for prefix in (['unshare', '--user', '--map-root-user', '--mount'],
                       ['unshare', '--mount']):
            try:
                result = subprocess.run(
                    [*prefix, 'mount', '-t', 'tmpfs', '-o', 'size=1m', 'tmpfs', directory],
                    capture_output=True, text=True, timeout=60, check=False)
            except OSError as error:
                problems.append(f'{" ".join(prefix)}: {error}')
                continue
            if result.returncode == 0:
                return prefix, None
            problems.append(f'{" ".join(prefix)}: {result.stderr.strip()}')
    return None, '; '.join(problems)
