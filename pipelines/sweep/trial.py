"""One trial of a sweep: the trainer binary in a subprocess, its result read from its logdir.

Each trial runs exactly what `//agents:train` runs (`python -m agents.scripts.train`), in a
process group of its own, so a crash, a NaN or a hang cannot touch other trials; a trial past its
timeout has its whole process group killed. Under pipelines.sweep.supervise the group also dies with
the worker that started it (Linux), so killing a sweep leaves no training behind. A lock on the
logdir keeps two sweeps from training the same trial at once.

The result record comes from the logdir's `metrics.jsonl`; it is written to
`<output_dir>/trials/<id>/result.json` (atomically) as soon as the trial ends, with the
trainer's output in `train.log` beside it, so a sweep killed later loses no finished trial.

A population (`Population`: trials that differ only in their seeds and scalars such as the
learning rate, packed by pipelines/sweep/packing.py) trains in one trainer process in
`<output_dir>/populations/<id>/` (`train.population_members`), each trial in its member's
directory `member-<k>/`; every trial still gets its own `trials/<id>/result.json`, and the
population's `train.log` is beside its members.

In a bucket (`gs://...`), the trainer's logdir is the trial's directory itself: the trainer
uploads its checkpoints, metrics and summaries at every evaluation and holds the directory's
lease (agents/runs/lease.py), and this process uploads the tail of `train.log` every
`LOG_UPLOAD_S` seconds. A trial whose worker died resumes, on whichever worker runs it again,
from its last checkpoint in the bucket. `result.json` is the commit marker: an earlier attempt's
is removed before training and the new one is written last, after every other file.
"""

import contextlib
import dataclasses
import fcntl
import json
import math
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

from agents.runs import metrics, remote_logdir, run_config, run_dir
from agents.storage import file_io, locations, outages

TRAINER_MODULE = 'agents.scripts.train'
LOG_UPLOAD_S = 10.0  # How often a trial in a bucket uploads its train.log.
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
    # How long this worker's writes to output_dir, and its trainers' uploads (unless the spec
    # binds staging.max_outage_s), ride out an outage; 0: the client library's own retries.
    max_outage_s: float = 0.0


@dataclasses.dataclass(frozen=True)
class Population:
    """Trials trained together by one trainer as a population (see pipelines/sweep/packing.py)."""
    id: str
    trials: tuple  # sweep_spec.Trial, one per member, in member order.
    gin_bindings: tuple  # The members' shared bindings and train.population(_members).


def trials_of(unit):
    """The trials a unit of work (a trial, or a Population) trains."""
    return unit.trials if isinstance(unit, Population) else (unit,)


def trial_dir(output_dir, trial_id):
    return locations.join(output_dir, run_dir.TRIALS_DIR, trial_id)


def population_dir(output_dir, population_id):
    return locations.join(output_dir, run_dir.POPULATIONS_DIR, population_id)


def member_logdir(population, index):
    """A member's run directory, relative to the sweep's output_dir."""
    return (f'{run_dir.POPULATIONS_DIR}/{population.id}/'
            f'{run_dir.MEMBER_DIR.format(index)}')


def read_result(output_dir, trial_id):
    """The stored result record of a trial, or None if it has none (or a corrupt one)."""
    path = locations.join(trial_dir(output_dir, trial_id), run_dir.RESULT_FILE)
    try:
        return json.loads(file_io.read_text(path))
    except (OSError, ValueError):
        return None


def run(trial, settings, stop_at_step=None):
    """Trains `trial` (a sweep_spec.Trial); returns its result record, also stored beside it.

    With `stop_at_step`, the trainer stops there (a rung of successive halving) and a later call
    continues the run from that checkpoint; its configuration (and so its schedules) stays that
    of the full budget. Failures of the trial are results (`status: failed` with the error),
    not exceptions.
    """
    logdir = trial_dir(settings.output_dir, trial.id)
    budget = stop_at_step or settings.env_steps
    command = trainer_command(trial, settings, logdir, budget)

    def results(returncode, output, timed_out, wall_time):
        return [_result(trial, logdir, budget, returncode, output, timed_out, wall_time,
                        settings.timeout_s)]

    return _attempt([trial], logdir, run_dir.CONFIG_FILE, command, settings.timeout_s,
                    settings, budget, results)[0]


def run_population(population, settings, stop_at_step=None):
    """Trains the trials of `population` in one trainer; returns their result records, each
    also stored in its trial's directory.

    Its timeout is the trials' timeout times the members: it trains them all. A failure of the
    trainer (a member's non-finite update stops the population) fails every member with it.
    """
    logdir = population_dir(settings.output_dir, population.id)
    budget = stop_at_step or settings.env_steps
    command = population_command(population, settings, logdir, budget)
    members = len(population.trials)
    timeout_s = settings.timeout_s and settings.timeout_s * members

    def results(returncode, output, timed_out, wall_time):
        records = []
        for index, trial in enumerate(population.trials):
            record = _result(trial, locations.join(logdir, run_dir.MEMBER_DIR.format(index)),
                             budget, returncode, output, timed_out, wall_time, timeout_s)
            if record['error']:
                record['error'] = (f'population {population.id} ({members} trials): '
                                   f'{record["error"]}')
            records.append(dict(record, logdir=member_logdir(population, index),
                                population=population.id))
        return records

    return _attempt(population.trials, logdir, run_dir.POPULATION_CONFIG_FILE, command,
                    timeout_s, settings, budget, results)


def _attempt(trials, logdir, config_file, command, timeout_s, settings, budget, results):
    """Runs the trainer `command` in `logdir` once; stores and returns the `trials`' records,
    made by `results(returncode, output, timed_out, wall_time)`."""
    outages.set_limit(settings.max_outage_s)  # This worker's own writes to output_dir.
    result_paths = [locations.join(trial_dir(settings.output_dir, trial.id), run_dir.RESULT_FILE)
                    for trial in trials]
    if locations.is_remote(logdir):
        return _attempt_in_bucket(logdir, command, timeout_s, settings, results, result_paths)
    for path in result_paths:
        os.makedirs(os.path.dirname(path), exist_ok=True)
    os.makedirs(logdir, exist_ok=True)
    lock = _lock(logdir)
    if lock is None:
        return [_record(trial, FAILED, 0.0, budget, error=f'trial {trial.id} is being trained '
                        f'by another process (its logdir {logdir} is locked)')
                for trial in trials]
    try:
        _remove_previous_attempt(logdir, config_file, result_paths)
        began = time.time()
        returncode, output, timed_out = _train(command, settings, timeout_s, lock)
        wall_time = time.time() - began
        records = results(returncode, output, timed_out, wall_time)
        with open(os.path.join(logdir, run_dir.LOG_FILE), 'a', encoding='utf-8') as log:
            log.write(_log_entry(records, wall_time, output))
        for path, record in zip(result_paths, records, strict=True):
            run_config.write_atomic(path, json.dumps(record) + '\n')
        return records
    finally:
        os.close(lock)


def _attempt_in_bucket(logdir, command, timeout_s, settings, results, result_paths):
    """`_attempt` for a logdir in a bucket, which the trainer uses as it is."""
    log_path = locations.join(logdir, run_dir.LOG_FILE)
    try:
        earlier_log = file_io.read_text(log_path)
    except FileNotFoundError:
        earlier_log = ''
    file_io.delete(result_paths)  # An earlier attempt's commit markers.
    began = time.time()
    with _LogUploader(log_path, earlier_log) as log:
        returncode, output, timed_out = _train(command, settings, timeout_s, None, log.follow)
        wall_time = time.time() - began
        records = results(returncode, output, timed_out, wall_time)
        log.finish(_log_entry(records, wall_time, output))
    for path, record in zip(result_paths, records, strict=True):
        file_io.write_text(path, json.dumps(record) + '\n')
    return records


class _LogUploader:
    """Keeps `<trial>/train.log` in the bucket up to date: the earlier attempts' log, then the
    running trainer's output file (`follow`), uploaded every LOG_UPLOAD_S seconds by a thread
    when it changed."""

    def __init__(self, path, earlier):
        self._path = path
        self._earlier = earlier
        self._output_path = None
        self._uploaded = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name='log-upload', daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *unused_exc_info):
        self._stop.set()
        self._thread.join()

    def follow(self, output_path):
        """Uploads the file at `output_path` from now on."""
        self._output_path = output_path

    def _loop(self):
        while not self._stop.wait(LOG_UPLOAD_S):
            if self._output_path is None:
                continue
            text = _read_all(self._output_path)
            if text != self._uploaded:
                with contextlib.suppress(Exception):  # The next upload or `finish` retries.
                    file_io.write_text(self._path, self._earlier + _attempt_header() + text)
                    self._uploaded = text

    def finish(self, entry):
        """Stops the uploads and writes the attempt's whole log entry."""
        self._stop.set()
        self._thread.join()
        file_io.write_text(self._path, self._earlier + entry)


def _attempt_header():
    return f'=== {socket.gethostname()}/{os.getpid()}: attempt running ===\n'


def _log_entry(records, wall_time, output):
    ok = sum(record['status'] == OK for record in records)
    status = (records[0]['status'] if len(records) == 1 else
              f'{ok} of {len(records)} trials {OK}')
    return (f'=== {time.strftime("%Y-%m-%d %H:%M:%S")}: {status} after '
            f'{wall_time:.1f} s ===\n{output}\n')


def trainer_command(trial, settings, logdir, budget=None):
    """The trainer's command line for `trial` to `budget` steps, as a user would type it."""
    return _command(settings, trial.gin_bindings, logdir, budget, [f'--seed={trial.seed}'])


def population_command(population, settings, logdir, budget=None):
    """The trainer's command line for `population`, as a user would type it."""
    return _command(settings, population.gin_bindings, logdir, budget)


def _command(settings, gin_bindings, logdir, budget, flags=()):
    stop = [f'--stop_at_step={budget}'] if budget and budget < settings.env_steps else []
    # A trainer writing to a bucket rides out an outage as long as the sweep does, unless the
    # spec's own binding (later, so it wins) says otherwise.
    outage = ([f'{remote_logdir.MAX_OUTAGE_BINDING} = {settings.max_outage_s:g}']
              if locations.is_remote(logdir) and settings.max_outage_s else [])
    return ([sys.executable, '-m', settings.trainer_module] +
            [f'--gin_file={path}' for path in settings.gin_files] +
            [f'--gin_bindings={binding}' for binding in (*outage, *gin_bindings)] +
            [f'--logdir={logdir}', *flags] + stop)


def trainer_environment(settings):
    """The trainer's environment: this tree importable, the caller's directory, few threads."""
    env = dict(os.environ, PYTHONPATH=run_config.python_path(os.environ.get('PYTHONPATH', '')))
    if settings.caller_directory:
        env['BUILD_WORKING_DIRECTORY'] = settings.caller_directory
    if settings.threads:
        env['TF_NUM_INTRAOP_THREADS'] = str(settings.threads)
    return env


def _train(command, settings, timeout_s, lock, follow_output=None):
    """Runs the trainer `command`; returns (returncode, its output, whether it timed out).

    `follow_output`, if given, is told the path of the file the output goes to.
    """
    # Appended to by the trainer (O_APPEND), read through its own descriptor meanwhile.
    with tempfile.NamedTemporaryFile(mode='ab', prefix='trial-output-') as output:
        process = subprocess.Popen(
            _supervised(command), stdout=output,
            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env=trainer_environment(settings), start_new_session=True,
            pass_fds=(lock,) if lock is not None else ())
        if follow_output:
            follow_output(output.name)
        timed_out = False
        try:
            process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
        finally:
            # Also reaps what the trainer started (environment workers) if it died first.
            _kill_group(process.pid)
            process.wait()
        return process.returncode, _read_all(output.name), timed_out


def _read_all(path):
    with open(path, 'rb') as f:
        return f.read().decode('utf-8', errors='replace')


def _result(trial, logdir, budget, returncode, output, timed_out, wall_time, timeout_s):
    if timed_out:
        return _record(trial, FAILED, wall_time, budget, error=f'timed out after '
                       f'{timeout_s:g} s; its process group was killed\n{_tail(output)}')
    if returncode < 0:
        return _record(trial, FAILED, wall_time, budget, error=f'trainer killed by '
                       f'{signal.Signals(-returncode).name}\n{_tail(output)}')
    if returncode:
        return _record(trial, FAILED, wall_time, budget,
                       error=f'trainer exited with status {returncode}\n{_tail(output)}')
    evaluations = read_metrics(logdir)
    if not evaluations:
        return _record(trial, FAILED, wall_time, budget,
                       error=f'no evaluation in {run_dir.METRICS_FILE}')
    returns = [evaluation.get('mean_return') for evaluation in evaluations]
    final, steps = returns[-1], evaluations[-1].get('step')
    finite = [value for value in returns if _is_finite(value)]
    record = _record(trial, OK, wall_time, budget,
                     final_return=final if _is_finite(final) else None,
                     best_return=max(finite) if finite else None, env_steps=steps,
                     final_metrics={name: value for name, value in evaluations[-1].items()
                                    if name in metrics.EVALUATION_METRICS and _is_finite(value)})
    if len(finite) < len(returns):
        bad = next(e.get('step') for e in evaluations if not _is_finite(e.get('mean_return')))
        record.update(status=FAILED, error=f'non-finite evaluation return at step {bad}')
    elif not isinstance(steps, int) or steps < budget:
        record.update(status=FAILED, error=f'trainer stopped at step {steps}, before the budget '
                      f'of {budget} steps')
    return record


def read_metrics(logdir):
    """The evaluations in a logdir's metrics.jsonl (a line cut by a kill is skipped)."""
    return metrics.evaluations(locations.join(logdir, run_dir.METRICS_FILE))


def _record(trial, status, wall_time, budget, final_return=None, best_return=None,
            env_steps=None, final_metrics=None, error=None):
    return {
        'id': trial.id, 'config_id': trial.config_id, 'index': trial.index,
        'bindings': trial.bindings, 'seed': trial.seed, 'status': status,
        'final_return': final_return, 'best_return': best_return, 'env_steps': env_steps,
        'budget': budget, 'final_metrics': final_metrics or {},
        'wall_time_s': round(wall_time, 3), 'error': error,
        'logdir': f'{run_dir.TRIALS_DIR}/{trial.id}', 'finished_at': time.time(),
        'worker': f'{socket.gethostname()}/{os.getpid()}',  # Which machine and process ran it.
    }


def failed_record(trial, error, budget=None):
    """The record of a trial that has no result of its own (e.g. one that never finished)."""
    return _record(trial, FAILED, 0.0, budget, error=error)


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


def _remove_previous_attempt(logdir, config_file, result_paths):
    """Removes our files of an attempt that never got to train: the trainer refuses a logdir
    that holds files but not its configuration (`config_file`)."""
    if os.path.exists(os.path.join(logdir, config_file)):
        return
    for path in [*result_paths, os.path.join(logdir, run_dir.LOG_FILE)]:
        with contextlib.suppress(FileNotFoundError):
            os.remove(path)


def _kill_group(pgid):
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def _supervised(command):
    """`command` under pipelines.sweep.supervise: its process group dies with this process."""
    return [sys.executable, '-m', 'pipelines.sweep.supervise', str(os.getpid()), *command]
