"""Training runs read back from their logdirs, tolerating whatever a crash or a disk left behind.

A run logdir (see the README's table) is a directory holding `operative_config.gin` (or the
`config.gin` written before training starts), `metrics.jsonl` or TensorBoard event files. From
it this module reads

- the gin bindings, parsed with gin's own parser, as `{'PPO.learning_rate': '0.001', ...}` (the
  value as written); runs whose bindings differ only in the seed form one configuration;
- the evaluation curve: `metrics.jsonl` lines as agents/runs/metrics.py reads them (a line
  that is not JSON, lacks a finite `mean_return` or holds a number out of range, see `MAX_STEP`
  and `MAX_MAGNITUDE`, is skipped and reported), or the `eval/mean_return` summaries when that
  file gives nothing;
- the training-episode returns from the event files (TF2 writes scalars as tensors); a
  truncated or corrupt file is read up to the damage, which is reported, and values out of
  range are skipped and reported;
- the latest exported policy, for the evaluation video.

Nothing here raises for a damaged run: what could not be read becomes `Run.problems` (the run
is still used) or `Run.error` (the run is skipped), each a sentence naming the file. A file
that is no regular file (a directory, a dangling symbolic link, a FIFO, a socket or device) is
such a problem and is never opened: opening a FIFO would block until some writer came.

A sweep's `trials.jsonl` (pipelines/sweep/sweep.py) adds each trial's status, seed and
bindings; a trial the sweep recorded as failed is skipped with its error. A sweep with a
scheduler (successive halving, pipelines/sweep/scheduler.py) also tells each trial's budget (the
env steps it was trained to), rung, bracket and why it stopped, and its `rungs.jsonl` each
rung's decision: the configurations' scores and which went on. Outside such sweeps these are None.

The input may be an object-storage URL (`gs://...`, see agents/storage/): runs are then
found in one listing of everything under it, and each run's small files (gin, metrics.jsonl,
event files) are copied to a temporary directory and read there as local ones. A run's policy
directory stays a URL; whoever renders it copies it down.
"""

import dataclasses
import fnmatch
import json
import math
import os
import re
import stat
import tempfile
from typing import Any

import numpy as np
from tensorboard.compat.proto import event_pb2, types_pb2

from agents.runs import gin_text, metrics, run_dir
from agents.storage import failures, file_io, locations

CONFIG_FILES = (run_dir.OPERATIVE_CONFIG_FILE, run_dir.CONFIG_FILE)
EVENTS_PATTERN = run_dir.EVENTS_PREFIX + '*'
EVAL_TAG = 'eval/mean_return'
TRAIN_RETURN_TAG = 'train/episode_return'
# The range of the steps and returns the report takes (see agents/runs/metrics.py).
MAX_STEP = metrics.MAX_STEP
MAX_MAGNITUDE = metrics.MAX_MAGNITUDE
_FILE_KINDS = {stat.S_IFDIR: 'a directory', stat.S_IFIFO: 'a named pipe (FIFO)',
               stat.S_IFSOCK: 'a socket', stat.S_IFCHR: 'a character device',
               stat.S_IFBLK: 'a block device'}


@dataclasses.dataclass
class Run:
    """What was read of one run; `error` set means it cannot be used."""
    run_id: str
    logdir: str
    bindings: dict = dataclasses.field(default_factory=dict)
    config_key: str = ''
    seed: Any = None
    eval_steps: list = dataclasses.field(default_factory=list)
    eval_returns: list = dataclasses.field(default_factory=list)
    train_steps: list = dataclasses.field(default_factory=list)
    train_returns: list = dataclasses.field(default_factory=list)
    policy_dir: Any = None
    problems: list = dataclasses.field(default_factory=list)
    error: Any = None
    # From the sweep's record of the trial (None where it does not tell): the sweep's id of the
    # configuration, the env steps it was trained to, the rung and HyperBand bracket it last
    # trained in, why it stopped ('completed', 'pruned', 'failed') in a word and a sentence,
    # and the numbers of its last evaluation.
    sweep_config: Any = None
    budget: Any = None
    rung: Any = None
    bracket: Any = None
    stop_reason: Any = None
    stop_detail: Any = None
    final_metrics: dict = dataclasses.field(default_factory=dict)

    @property
    def final_return(self):
        return self.eval_returns[-1] if self.eval_returns else None

    @property
    def best_return(self):
        return max(self.eval_returns) if self.eval_returns else None

    @property
    def env_steps(self):
        return max(self.eval_steps[-1:] + self.train_steps[-1:], default=None)


@dataclasses.dataclass
class Discovery:
    """The runs under an input directory, with their sweep records (None outside sweeps)."""
    runs: list  # [(logdir, trial record or None)], sorted by logdir.
    missing: list  # [Run] of sweep trials without a logdir, each with its `error`.
    problems: list  # Sentences about unreadable sweep files.
    # The rung decisions of halving sweeps (`read_rungs`), by sweep, bracket and rung.
    rungs: list = dataclasses.field(default_factory=list)


def is_run_file(name):
    """Whether a file of this name makes its directory a run logdir."""
    return (name in CONFIG_FILES or name == run_dir.METRICS_FILE or
            fnmatch.fnmatch(name, EVENTS_PATTERN))


def is_run_dir(path, names=None):
    names = os.listdir(path) if names is None else names
    return any(is_run_file(name) for name in names)


def _normalize(path):
    """A directory as this module names it: absolute, or a URL without a trailing '/'."""
    return path.rstrip('/') if locations.is_remote(path) else os.path.abspath(path)


def run_id_of(logdir, root):
    """The run's name in the report: its path under the input directory."""
    if locations.is_remote(root):
        root, logdir = _normalize(root), _normalize(logdir)
        return locations.basename(root) if logdir == root else logdir[len(root) + 1:]
    relative = os.path.relpath(logdir, root)
    return os.path.basename(os.path.abspath(root)) if relative == '.' else relative.replace(
        os.sep, '/')


def _remote_tree(root):
    """{directory URL: (subdirectory names, file names)} of everything under URL `root`, from
    one listing (object stores have no directories: a directory is a prefix of some object)."""
    tree = {root: (set(), [])}
    for relative in file_io.list_files(root):
        *folders, name = relative.split('/')
        parent = root
        for folder in folders:
            tree[parent][0].add(folder)
            parent = locations.join(parent, folder)
            tree.setdefault(parent, (set(), []))
        tree[parent][1].append(name)
    return tree


def _walk(root, tree):
    """`os.walk(root)` (top-down: callers prune `directories` in place), or the same over a
    `_remote_tree` when `tree` is given."""
    if tree is None:
        yield from os.walk(root)
        return
    directories, names = tree[root]
    directories = sorted(directories)
    yield root, directories, sorted(names)
    for name in directories:
        yield from _walk(locations.join(root, name), tree)


def find_runs(root, exclude=()):
    """Every run logdir under `root` (not looking inside runs, nor in hidden or `exclude` dirs).

    `root` may be a URL: then logdirs are URLs, found in one listing of everything under it.

    Raises:
      NotADirectoryError: `root` is not a directory (or, for a URL, holds no files).
    """
    root = _normalize(root)
    if locations.is_remote(root):
        tree = _remote_tree(root)
        exists = tree != {root: (set(), [])}
    else:
        tree, exists = None, os.path.isdir(root)
    if not exists:
        raise NotADirectoryError(f'input {root} is not a directory')
    exclude = {_normalize(path) for path in exclude}
    join = locations.join if tree is not None else os.path.join
    logdirs, trial_files, rung_files = [], [], []
    for parent, directories, names in _walk(root, tree):
        if run_dir.TRIALS_FILE in names:
            trial_files.append(join(parent, run_dir.TRIALS_FILE))
        if run_dir.RUNGS_FILE in names:
            rung_files.append((parent, join(parent, run_dir.RUNGS_FILE)))
        if any(is_run_file(name) for name in names):
            logdirs.append(parent)
            directories[:] = []
            continue
        directories[:] = sorted(
            name for name in directories if not name.startswith('.') and
            join(parent, name) not in exclude)
    is_directory = os.path.isdir if tree is None else tree.__contains__
    trials, problems = {}, []
    for path in trial_files:
        found, file_problems = _read_trials(path, is_directory)
        trials.update(found)
        problems += file_problems
    runs = [(logdir, trials.pop(logdir, None)) for logdir in sorted(logdirs)]
    missing = []
    for logdir, record in sorted(trials.items()):
        run = Run(run_id_of(logdir, root), logdir, error=(
            f'the sweep lists trial {record.get("id")!r} (status {record.get("status")!r}'
            f'{_trial_error_suffix(record)}) but its logdir {logdir} holds no run'))
        _read_sweep_fields(run, record)
        missing.append(run)
    rungs = []
    for parent, path in rung_files:
        found, file_problems = read_rungs(path, run_id_of(parent, root) if parent != root else '')
        rungs += found
        problems += file_problems
    return Discovery(runs, missing, problems, rungs)


def _trial_error_suffix(record):
    return f': {record["error"]}' if record.get('error') else ''


def _json_lines(path):
    """([(line number, JSON value)] of a sweep's JSON-lines file, [problems of the file and of
    the lines that could not be read])."""
    trouble = None if locations.is_remote(path) else file_trouble(path)
    if trouble:
        return [], [not_read(path, trouble)]
    try:
        lines = list(metrics.read_lines(path))
    except OSError as error:
        return [], [not_read(path, unreadable(error))]
    records, problems = [], []
    for line in lines:
        if line.problem:
            problems.append(f'{path} line {line.number}: {line.problem}')
        else:
            records.append((line.number, line.record))
    return records, problems


def _read_trials(path, is_directory=os.path.isdir):
    """{logdir: last record} of a sweep's trials.jsonl, and the lines that could not be read."""
    join = locations.join if locations.is_remote(path) else os.path.join
    base = path.rsplit('/', 1)[0] if locations.is_remote(path) else os.path.dirname(path)
    trials = {}
    lines, problems = _json_lines(path)
    for number, record in lines:
        if not isinstance(record, dict) or not isinstance(record.get('id'), str):
            problems.append(f'{path} line {number}: not a trial record with an "id"')
            continue
        candidates = [join(base, run_dir.TRIALS_DIR, record['id']), join(base, record['id'])]
        if isinstance(record.get('logdir'), str):
            candidates.insert(0, join(base, record['logdir']))
        logdir = next((c for c in candidates if is_directory(c)), candidates[0])
        trials[_normalize(logdir)] = record
    return trials, problems


def read_rungs(path, sweep=''):
    """The rung decisions in a halving sweep's rungs.jsonl (pipelines/sweep/scheduler.py), and the
    lines that could not be read.

    Each decision is as stored, {'bracket', 'rung', 'budget', 'metric', 'mode', 'scores':
    {sweep config id: score or None}, 'promoted': [config ids, best first], ...}, plus 'sweep':
    `sweep`, the sweep's directory under the report's input ('' for the input itself). Sorted
    by bracket and rung; of two lines of one rung the later counts.
    """
    lines, problems = _json_lines(path)
    decisions = {}
    for number, record in lines:
        trouble = _decision_trouble(record)
        if trouble:
            problems.append(f'{path} line {number}: {trouble}; not used')
            continue
        record = dict(record, sweep=sweep, metric=record.get('metric', 'mean_return'),
                      mode=record.get('mode', 'max'))
        decisions[record['bracket'], record['rung']] = record
    return [decisions[key] for key in sorted(decisions)], problems


def _is_count(value):
    """Whether `value` is an integer (not a boolean) a step count can be: 0 to MAX_STEP."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_STEP


def _is_score(value):
    return value is None or (isinstance(value, (int, float)) and not isinstance(value, bool)
                             and math.isfinite(value) and abs(value) <= MAX_MAGNITUDE)


def _decision_trouble(record):
    """Why a rungs.jsonl line is no rung decision, or None."""
    if not isinstance(record, dict):
        return 'not a rung decision (a JSON object)'
    for name in ('bracket', 'rung', 'budget'):
        if not _is_count(record.get(name)):
            return f'"{name}" is {json.dumps(record.get(name))[:40]}, not a step count'
    scores = record.get('scores')
    if not isinstance(scores, dict) or not all(map(_is_score, scores.values())):
        return '"scores" is not an object of numbers (within ±1e+300) or nulls'
    promoted = record.get('promoted')
    if not isinstance(promoted, list) or not all(isinstance(key, str) for key in promoted):
        return '"promoted" is not a list of configuration ids'
    for name in ('metric', 'mode'):
        if not isinstance(record.get(name, ''), str):
            return f'"{name}" is not a text'
    return None


def file_trouble(path):
    """What keeps local `path` from being read as a file ('a directory, not a regular file',
    ...), or None for a regular file or nothing at all.

    Only looks (stat, readlink): opening a FIFO would block until some writer came.
    """
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        try:
            return f'a symbolic link to {os.readlink(path)}, which does not exist'
        except OSError:  # Nothing there (or it went since).
            return None
    except OSError as error:  # A loop of links, a folder on the way that denies access...
        return unreadable(error)
    if stat.S_ISREG(mode):
        return None
    return f'{_FILE_KINDS.get(stat.S_IFMT(mode), "a special file")}, not a regular file'


def unreadable(error):
    """The `file_trouble` of a file that opening or reading failed with OSError `error`."""
    return f'unreadable ({error.strerror or error})'


def not_read(name, trouble):
    """The problem of a file that was not read for its `file_trouble`."""
    return f'{name} is {trouble}; not read'


def config_key(bindings, ignore=(run_dir.SEED_BINDING,)):
    """A stable id of a configuration: its bindings but `ignore`d ones (the seed)."""
    kept = sorted((name, value) for name, value in bindings.items() if name not in ignore)
    return 'c' + gin_text.config_hash(kept, 10)


def read_events(paths, tags=(EVAL_TAG, TRAIN_RETURN_TAG)):
    """({tag: (steps, values)}, problems) of TensorBoard event files, up to any damage.

    TF2's `tf.summary.scalar` stores each value as a tensor, TF1 as a `simple_value`; both are
    read. A truncated or corrupt file keeps the events before the damage.
    """
    scalars = {tag: {} for tag in tags}
    problems = []
    for path in paths:
        records, damage = _records(path)
        out_of_range = {}  # {tag: [steps of values not finite or beyond MAX_MAGNITUDE]}
        try:
            for record in records:
                event = event_pb2.Event.FromString(record)
                for value in event.summary.value:
                    if value.tag in scalars:
                        number = _scalar(value)
                        if number is None:
                            continue
                        if math.isfinite(number) and abs(number) <= MAX_MAGNITUDE:
                            scalars[value.tag][event.step] = number
                        else:
                            out_of_range.setdefault(value.tag, []).append(event.step)
        except Exception as error:  # A record that is not an Event, a tensor of no number...
            damage = f'{type(error).__name__}: {error}'
        name = os.path.basename(path)
        if damage:
            problems.append(f'{name} is damaged ({damage}); read the {len(records)} events '
                            'before it')
        problems += [f'{name}: {len(steps)} {tag} value(s) not finite or out of range '
                     f'({metrics.VALUE_RANGE}), the first at step {steps[0]}; skipped'
                     for tag, steps in out_of_range.items()]
    result = {}
    for tag, values in scalars.items():
        steps = sorted(values)
        result[tag] = (steps, [values[step] for step in steps])
    return result, problems


def _records(path, batch=4096):
    """(the records of a TFRecord file up to any damage, the damage or None)."""
    import tensorflow as tf

    dataset = tf.data.TFRecordDataset(path)
    records = []
    try:
        # Batches: TensorFlow's per-element overhead would dominate reading small records.
        for chunk in dataset.batch(batch):
            records.extend(chunk.numpy().tolist())
        return records, None
    except tf.errors.OpError:
        pass
    # The damage is in the batch after `records`: read on one record at a time to reach it.
    try:
        for record in dataset.skip(len(records)):
            records.append(record.numpy())
    except tf.errors.OpError as error:
        return records, _damage(error.message)
    return records, None


_NUMPY_TYPES = {types_pb2.DT_FLOAT: np.float32, types_pb2.DT_DOUBLE: np.float64,
                types_pb2.DT_INT32: np.int32, types_pb2.DT_INT64: np.int64,
                types_pb2.DT_HALF: np.float16}


def _scalar(value):
    """The number in a summary value (a TF2 scalar tensor or a TF1 simple value), or None."""
    if value.HasField('tensor'):
        tensor = value.tensor
        for field in (tensor.float_val, tensor.double_val, tensor.int_val, tensor.int64_val):
            if len(field) == 1:
                return float(field[0])
        dtype = _NUMPY_TYPES.get(tensor.dtype)
        if dtype is not None and len(tensor.tensor_content) == np.dtype(dtype).itemsize:
            return float(np.frombuffer(tensor.tensor_content, dtype)[0])
        import tensorflow as tf  # Any other encoding.
        array = tf.make_ndarray(tensor)
        return float(array.reshape(-1)[0]) if array.size == 1 else None
    if value.HasField('simple_value'):
        return float(value.simple_value)
    return None


def _damage(message):
    """TensorFlow's message about a bad record file, without its op and graph details."""
    match = re.search(r'(truncated|corrupted) record at (\d+)', message)
    if match:
        return f'{match.group(1)} record at byte {match.group(2)}'
    message = re.sub(r'\{\{.*?\}\}|\[Op:.*?\]', '', message)
    return ' '.join(message.split())


def latest_policy(logdir, files=None):
    """The latest exported policy's directory, or None.

    For a URL `logdir` the policy is found in `files` (`file_io.list_files(logdir)`, listed if
    not given) and returned as a URL.
    """
    if locations.is_remote(logdir):
        files = file_io.list_files(logdir) if files is None else files
        steps = sorted(int(parts[1]) for parts in (name.split('/') for name in files)
                       if len(parts) == 3 and parts[0] == run_dir.POLICY_DIR and parts[1].isdigit()
                       and parts[2] == 'saved_model.pb')
        return locations.join(logdir, run_dir.POLICY_DIR, str(steps[-1])) if steps else None
    directory = os.path.join(logdir, run_dir.POLICY_DIR)
    if not os.path.isdir(directory):
        return None
    steps = sorted(int(name) for name in os.listdir(directory) if name.isdigit() and
                    os.path.isfile(os.path.join(directory, name, 'saved_model.pb')))
    return os.path.join(directory, str(steps[-1])) if steps else None


def read_run(logdir, root, trial=None, ignore_bindings=(run_dir.SEED_BINDING,)):
    """Reads the run in `logdir` (`trial`: its sweep record); never raises for bad files.

    A URL `logdir`'s files are read from a local copy of those this module reads.
    """
    if locations.is_remote(logdir):
        run = Run(run_id_of(logdir, root), _normalize(logdir))
        try:
            files = file_io.list_files(run.logdir)
            with tempfile.TemporaryDirectory(prefix='run-') as copy:
                for name in files:
                    if '/' not in name and is_run_file(name):
                        file_io.download(locations.join(run.logdir, name),
                                         os.path.join(copy, name))
                _read_into(run, copy, trial, ignore_bindings)
            run.policy_dir = latest_policy(run.logdir, files)
        except failures.OutageError:
            raise  # Storage out of reach past --max_outage_s: the report stops.
        except Exception as error:  # Each storage library raises its own types.
            run.error = failures.describe_error(run.logdir, error)
        return run
    run = Run(run_id_of(logdir, root), os.path.abspath(logdir))
    try:
        _read_into(run, run.logdir, trial, ignore_bindings)
        run.policy_dir = latest_policy(run.logdir)
    except OSError as error:
        run.error = f'cannot read {error.filename or logdir}: {error.strerror or error}'
    return run


def _read_into(run, logdir, trial, ignore_bindings):
    """Reads the files of `run` in local directory `logdir` (its logdir or a copy)."""
    if trial is not None and trial.get('status') == 'failed':
        run.error = f'the sweep recorded this trial as failed{_trial_error_suffix(trial)}'
    if trial is not None:
        _read_sweep_fields(run, trial)
    _read_config(run, logdir, trial)
    if not run.bindings and trial is not None:
        run.bindings = _trial_bindings(trial)
    seed_text = run.bindings.get(run_dir.SEED_BINDING)
    seed = gin_text.value(seed_text) if run_dir.SEED_BINDING in run.bindings else None
    if trial is not None and isinstance(trial.get('seed'), int):
        seed = trial['seed']
    run.seed = seed if isinstance(seed, int) and not isinstance(seed, bool) else None
    run.config_key = config_key(run.bindings, ignore_bindings)

    metrics_state = _read_metrics_into(run, os.path.join(logdir, run_dir.METRICS_FILE))
    event_names = sorted(name for name in os.listdir(logdir)
                         if fnmatch.fnmatch(name, EVENTS_PATTERN))
    events = []
    for name in event_names:
        trouble = file_trouble(os.path.join(logdir, name))
        if trouble:
            run.problems.append(not_read(name, trouble))
        else:
            events.append(os.path.join(logdir, name))
    if events:
        scalars, problems = read_events(events)
        run.problems += problems
        run.train_steps, run.train_returns = scalars[TRAIN_RETURN_TAG]
        if not run.eval_returns:
            run.eval_steps, run.eval_returns = scalars[EVAL_TAG]
    elif not event_names:
        run.problems.append('no TensorBoard event files: no training curve')
    if not run.eval_returns and run.error is None:
        # A state with commas ('a directory, not a regular file') ends with one.
        comma = ',' if ',' in metrics_state else ''
        run.error = (f'no evaluation results: {run_dir.METRICS_FILE} is {metrics_state}{comma} '
                     f'and the event files hold no {EVAL_TAG}')
    _sort_curve(run)


def _read_config(run, logdir, trial):
    """Reads the bindings of the run's gin file into `run`; a missing or unreadable one is a
    problem."""
    for name in CONFIG_FILES:
        path = os.path.join(logdir, name)
        if not os.path.lexists(path):
            continue
        trouble = file_trouble(path)
        if trouble:
            run.problems.append(not_read(name, trouble))
            continue
        try:
            with file_io.open_regular(path, text=True) as f:
                text = f.read()
        except OSError as error:
            run.problems.append(not_read(name, unreadable(error)))
            continue
        try:
            run.bindings = gin_text.parse_bindings(text)
        except ValueError as error:
            run.problems.append(f'{name} is not valid gin: {error}')
        return
    if not any(os.path.lexists(os.path.join(logdir, name)) for name in CONFIG_FILES):
        run.problems.append(f'no {run_dir.OPERATIVE_CONFIG_FILE}: the configuration is '
                            'unknown' + (', taken from the sweep' if trial else ''))


def _read_metrics_into(run, path):
    """Reads the evaluations of metrics.jsonl at `path` into `run`; returns what the file is
    for a run without evaluations ('missing', 'unusable' or its `file_trouble`)."""
    if not os.path.lexists(path):
        return 'missing'
    trouble = file_trouble(path)
    if trouble is None:
        try:
            run.eval_steps, run.eval_returns, problems = metrics.curve(path)
            run.problems += problems
            return 'unusable'
        except OSError as error:
            trouble = unreadable(error)
    run.problems.append(not_read(run_dir.METRICS_FILE, trouble))
    return trouble


def _sort_curve(run):
    """Orders evaluations by step; a resumed run may log a step twice: the later line wins."""
    by_step = dict(zip(run.eval_steps, run.eval_returns, strict=True))
    run.eval_steps = sorted(by_step)
    run.eval_returns = [by_step[step] for step in run.eval_steps]


# The fields of a staged sweep's trial record (pipelines/sweep/scheduler.py `annotate`) a Run takes,
# with what each must be.
_SWEEP_FIELDS = (('config_id', 'sweep_config', str, 'a text'),
                 ('budget', 'budget', _is_count, 'a step count'),
                 ('rung', 'rung', _is_count, 'a rung number'),
                 ('bracket', 'bracket', _is_count, 'a bracket number'),
                 ('stop_reason', 'stop_reason', str, 'a text'),
                 ('stop_detail', 'stop_detail', str, 'a text'))


def _read_sweep_fields(run, trial):
    """Takes the trial's place in its sweep from its record; a value of the wrong kind is a
    problem and not taken."""
    for key, attribute, kind, what in _SWEEP_FIELDS:
        value = trial.get(key)
        if value is None:
            continue
        if isinstance(value, kind) if isinstance(kind, type) else kind(value):
            setattr(run, attribute, value)
        else:
            run.problems.append(f'{run_dir.TRIALS_FILE} gives its "{key}" as '
                                f'{json.dumps(value)[:40]}, not {what}; not used')
    final_metrics = trial.get('final_metrics')
    if isinstance(final_metrics, dict):
        run.final_metrics = {name: value for name, value in final_metrics.items()
                             if value is not None and _is_score(value)}


def _trial_bindings(trial):
    """A sweep record's bindings as {name: value text}: a dict, or a list of 'name = value'."""
    bindings = trial.get('bindings')
    if isinstance(bindings, dict):
        return {str(name): value if isinstance(value, str) and value.startswith('@')
                else repr(value) for name, value in bindings.items()}
    if isinstance(bindings, list):
        try:
            return gin_text.parse_bindings('\n'.join(str(binding) for binding in bindings))
        except ValueError:
            return {}
    return {}
