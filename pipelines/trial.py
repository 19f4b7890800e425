"""One trial of a sweep: the trainer binary in a subprocess, its result read from its logdir.

Each trial runs exactly what `//agents:train` runs (`python -m agents.scripts.train`), in a
process group of its own, so a crash, a NaN or a hang cannot touch other trials; a trial past its
timeout has its whole process group killed. Under pipelines.supervise the group also dies with
the worker that started it (Linux), so killing a sweep leaves no training behind. A lock on the
logdir keeps two sweeps from training the same trial at once.

The result record comes from the logdir's `metrics.jsonl`; it is written to
`<output_dir>/trials/<id>/result.json` (atomically) as soon as the trial ends, with the
trainer's output in `train.log` beside it, so a sweep killed later loses no finished trial.
Remote output directories (gs://...) get the logdir uploaded after the trial, which trains in a
local temporary directory.
"""

import contextlib
import dataclasses
import fcntl
import json
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

from agents.scripts import run_config
from pipelines import storage

TRAINER_MODULE = 'agents.scripts.train'
TRIALS_DIR = 'trials'
RESULT_FILE = 'result.json'
LOG_FILE = 'train.log'
METRICS_FILE = 'metrics.jsonl'
ERROR_TAIL_LINES = 15
ERROR_TAIL_CHARS = 3000
OK, FAILED = 'ok', 'failed'


@dataclasses.dataclass(frozen=True)
class Settings:
    """What every trial of a sweep shares."""
    output_dir: str
    gin_files: tuple
    env_steps: int
    timeout_s: float | None = None
    caller_directory: str | None = None  # Relative gin files are resolved against it.
    threads: int | None = None  # TensorFlow intra-op threads per trial; None lets TF choose.
    trainer_module: str = TRAINER_MODULE


def trial_dir(output_dir, trial_id):
    return storage.join(output_dir, TRIALS_DIR, trial_id)


def read_result(output_dir, trial_id):
    """The stored result record of a trial, or None if it has none (or a corrupt one)."""
    path = storage.join(trial_dir(output_dir, trial_id), RESULT_FILE)
    try:
        return json.loads(storage.read_text(path))
    except (OSError, ValueError):
        return None


def run(trial, settings):
    """Trains `trial` (a sweep_spec.Trial); returns its result record, also stored beside it.

    Failures of the trial are results (`status: failed` with the error), not exceptions.
    """
    destination = trial_dir(settings.output_dir, trial.id)
    local = storage.is_local(settings.output_dir)
    logdir = destination if local else tempfile.mkdtemp(prefix=f'sweep-{trial.id}-')
    with contextlib.ExitStack() as stack:
        if local:
            os.makedirs(logdir, exist_ok=True)
            lock = _lock(logdir)
            if lock is None:
                return _record(trial, FAILED, 0.0, error=f'trial {trial.id} is being trained by '
                               f'another process (its logdir {logdir} is locked)')
            stack.callback(os.close, lock)
            _remove_previous_attempt(logdir)
        else:
            stack.callback(shutil.rmtree, logdir, ignore_errors=True)
            lock = None
        began = time.time()
        returncode, output, timed_out = _train(trial, settings, logdir, lock)
        wall_time = time.time() - began
        record = _result(trial, settings, logdir, returncode, output, timed_out, wall_time)
        with open(os.path.join(logdir, LOG_FILE), 'a', encoding='utf-8') as log:
            log.write(f'=== {time.strftime("%Y-%m-%d %H:%M:%S")}: {record["status"]} after '
                      f'{wall_time:.1f} s ===\n{output}\n')
        run_config.write_atomic(os.path.join(logdir, RESULT_FILE), json.dumps(record) + '\n')
        if not local:
            storage.upload_tree(logdir, destination)
        return record


def trainer_command(trial, settings, logdir):
    """The trainer's command line for `trial`, as a user would type it."""
    return ([sys.executable, '-m', settings.trainer_module] +
            [f'--gin_file={path}' for path in settings.gin_files] +
            [f'--gin_bindings={binding}' for binding in trial.gin_bindings] +
            [f'--logdir={logdir}', f'--seed={trial.seed}'])


def trainer_environment(settings):
    """The trainer's environment: this tree importable, the caller's directory, few threads."""
    env = dict(os.environ, PYTHONPATH=run_config.python_path(os.environ.get('PYTHONPATH', '')))
    if settings.caller_directory:
        env['BUILD_WORKING_DIRECTORY'] = settings.caller_directory
    if settings.threads:
        env['TF_NUM_INTRAOP_THREADS'] = str(settings.threads)
    return env


def _train(trial, settings, logdir, lock):
    """Runs the trainer; returns (returncode, its output, whether it timed out)."""
    with tempfile.TemporaryFile() as output:
        process = subprocess.Popen(
            _supervised(trainer_command(trial, settings, logdir)), stdout=output,
            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env=trainer_environment(settings), start_new_session=True,
            pass_fds=(lock,) if lock is not None else ())
        timed_out = False
        try:
            process.wait(timeout=settings.timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
        finally:
            # Also reaps what the trainer started (environment workers) if it died first.
            _kill_group(process.pid)
            process.wait()
        output.seek(0)
        return process.returncode, output.read().decode('utf-8', errors='replace'), timed_out


def _result(trial, settings, logdir, returncode, output, timed_out, wall_time):
    if timed_out:
        return _record(trial, FAILED, wall_time, error=f'timed out after {settings.timeout_s:g} '
                       f's; its process group was killed\n{_tail(output)}')
    if returncode < 0:
        return _record(trial, FAILED, wall_time, error=f'trainer killed by '
                       f'{signal.Signals(-returncode).name}\n{_tail(output)}')
    if returncode:
        return _record(trial, FAILED, wall_time,
                       error=f'trainer exited with status {returncode}\n{_tail(output)}')
    evaluations = read_metrics(logdir)
    if not evaluations:
        return _record(trial, FAILED, wall_time, error=f'no evaluation in {METRICS_FILE}')
    returns = [evaluation.get('mean_return') for evaluation in evaluations]
    final, steps = returns[-1], evaluations[-1].get('step')
    finite = [value for value in returns if _is_finite(value)]
    record = _record(trial, OK, wall_time, final_return=final if _is_finite(final) else None,
                     best_return=max(finite) if finite else None, env_steps=steps)
    if len(finite) < len(returns):
        bad = next(e.get('step') for e in evaluations if not _is_finite(e.get('mean_return')))
        record.update(status=FAILED, error=f'non-finite evaluation return at step {bad}')
    elif not isinstance(steps, int) or steps < settings.env_steps:
        record.update(status=FAILED, error=f'trainer stopped at step {steps}, before the budget '
                      f'of {settings.env_steps} steps')
    return record


def read_metrics(logdir):
    """The evaluations in a logdir's metrics.jsonl (a line cut by a kill is skipped)."""
    evaluations = []
    try:
        with open(os.path.join(logdir, METRICS_FILE), encoding='utf-8') as f:
            for line in f:
                try:
                    evaluations.append(json.loads(line))
                except ValueError:
                    continue
    except FileNotFoundError:
        pass
    return evaluations


def _record(trial, status, wall_time, final_return=None, best_return=None, env_steps=None,
            error=None):
    return {
        'id': trial.id, 'config_id': trial.config_id, 'index': trial.index,
        'bindings': trial.bindings, 'seed': trial.seed, 'status': status,
        'final_return': final_return, 'best_return': best_return, 'env_steps': env_steps,
        'wall_time_s': round(wall_time, 3), 'error': error,
        'logdir': f'{TRIALS_DIR}/{trial.id}', 'finished_at': time.time(),
        'worker': f'{socket.gethostname()}/{os.getpid()}',  # Which machine and process ran it.
    }


def _is_finite(value):
    return isinstance(value, int | float) and math.isfinite(value)


def _tail(output):
    lines = output.rstrip().splitlines()[-ERROR_TAIL_LINES:]
    return '\n'.join(lines)[-ERROR_TAIL_CHARS:]


def _lock(logdir):
    """An exclusive lock on the logdir (a file descriptor), or None if another process holds it.

    The trainer inherits the descriptor, so the lock lasts as long as any training in it.
    """
    descriptor = os.open(logdir, os.O_RDONLY)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(descriptor)
        return None
    return descriptor


def _remove_previous_attempt(logdir):
    """Removes our files of an attempt that never got to train: the trainer refuses a logdir
    that holds files but no config.gin of its own."""
    if os.path.exists(os.path.join(logdir, run_config.CONFIG_FILE)):
        return
    for name in (RESULT_FILE, LOG_FILE):
        with contextlib.suppress(FileNotFoundError):
            os.remove(os.path.join(logdir, name))


def _kill_group(pgid):
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def _supervised(command):
    """`command` under pipelines.supervise: its process group dies with this process."""
    return [sys.executable, '-m', 'pipelines.supervise', str(os.getpid()), *command]
