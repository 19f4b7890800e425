"""Brings a training run's logdir back to a consistent state after the run died.

A trainer can be killed at any instruction (preemption, SIGKILL, a full disk). TensorFlow writes
a checkpoint's files first and then atomically replaces the `checkpoint` state file, and the
trainer appends to `metrics.jsonl` only after the checkpoint of the same step, so the state file
always names complete checkpoints and metrics never lead them. What a kill can leave behind, and
what resuming does about it:

- temporary files and directories of a write in progress (`ckpt-N_temp/`, `checkpoint.tmp*`,
  `policy/.N.partial-*`, `*.tmp-<pid>`): removed (an earlier export moved aside to
  `policy/.N.old-*` goes back in place if nothing replaced it);
- checkpoint data without its index, and an export `policy/N/` without its `saved_model.pb`
  (what a cut upload leaves in a bucket, downloaded when the run resumes): removed;
- a checkpoint that does not read back (a truncated or overwritten file, a disk error): moved to
  `checkpoints/corrupt/` with a warning, and the run resumes from the newest one that reads
  back; if none does, a `RecoveryError` says so and nothing is changed;
- a complete checkpoint the state file does not name yet (killed between the two writes): used;
- a partial last line of `metrics.jsonl` (a cut append): dropped with a warning; evaluations
  past the restored checkpoint (whose checkpoint did not survive) are moved to
  `metrics.orphaned.jsonl`, so that the step in `metrics.jsonl` never goes backwards.

Only a process that holds the logdir (see run_config.LogdirLock) may call the functions that
change it. `newest_readable_checkpoint` only reads: the tools that load a run (evaluate,
visualize, export) pick the checkpoint with it, leaving a broken one where it is.
"""

import dataclasses
import glob
import os
import shutil

import tensorflow as tf
from absl import logging

from agents.runs import metrics, run_dir
from agents.storage import failures


class RecoveryError(Exception):
    """The logdir cannot be resumed as it is, told in one sentence."""


@dataclasses.dataclass
class RecoveredCheckpoints:
    """What `recover_checkpoints` found: usable checkpoints, oldest first, and what it moved."""
    valid: list
    corrupt: list  # (path, problem) of each checkpoint moved aside.

    @property
    def latest(self):
        return self.valid[-1] if self.valid else None


def checkpoint_step(path):
    """The step number of a checkpoint path `.../ckpt-<step>`."""
    return int(path.rsplit('-', 1)[-1])


def checkpoint_path(checkpoint_dir, step):
    """The path (prefix) of the checkpoint of `step` in `checkpoint_dir`: `.../ckpt-<step>`."""
    return os.path.join(checkpoint_dir, f'{run_dir.CHECKPOINT_PREFIX}-{step}')


def clean_partial_writes(logdir, checkpoint_dir, policy_dir):
    """Removes what writes cut short left behind; returns the removed paths."""
    patterns = [
        os.path.join(checkpoint_dir, f'{run_dir.CHECKPOINT_PREFIX}-*_temp'),
        os.path.join(checkpoint_dir, 'checkpoint.tmp*'),
        os.path.join(policy_dir, '.*.partial-*'),
        os.path.join(logdir, '*.tmp-*'),
    ]
    # An export that replaced an earlier one moves the earlier one aside first: put it back if
    # the kill came before the new one took its place.
    for path in glob.glob(os.path.join(policy_dir, '.*.old-*')):
        original = os.path.join(policy_dir, os.path.basename(path)[1:].split('.old-')[0])
        if not os.path.exists(original):
            os.rename(path, original)
            logging.info('Restored the export %s that an interrupted export had moved aside.',
                         original)
    patterns.append(os.path.join(policy_dir, '.*.old-*'))
    removed = [path for pattern in patterns for path in glob.glob(pattern)]
    # An export without its program: a bucket's upload (variables first, saved_model.pb last)
    # was cut short, and resuming downloaded what had arrived. The trainer owns the exports
    # named by step; metrics go up last, so it exports the checkpoint it resumes from again.
    removed += [os.path.join(policy_dir, str(step)) for step in run_dir.exported_steps(policy_dir)
                if not os.path.isfile(os.path.join(policy_dir, str(step), 'saved_model.pb'))]
    # Data files without their index: the index is written last, or deleted first.
    for path in glob.glob(os.path.join(checkpoint_dir, f'{run_dir.CHECKPOINT_PREFIX}-*.data-*')):
        if not os.path.exists(path.split('.data-')[0] + '.index'):
            removed.append(path)
    for path in removed:
        if os.path.isdir(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            try:
                os.remove(path)
            except FileNotFoundError:
                pass
    return removed


def checkpoint_problem(path):
    """Why the checkpoint at `path` (a prefix) does not read back, or None if it does.

    Reads every tensor, so TensorFlow checks each one's checksum, without touching any
    variable of the caller (a failed restore would leave variables half-assigned).
    """
    if not os.path.exists(f'{path}.index'):
        return f'{os.path.basename(path)}.index is missing'
    try:
        reader = tf.train.load_checkpoint(path)
        for name in reader.get_variable_to_shape_map():
            reader.get_tensor(name)
    except Exception as error:  # The reader raises OpError, IndexError, ValueError...
        return failures.one_line(error, limit=500)
    return None


def describe_problems(broken):
    """`ckpt-1: problem; ckpt-2: problem` for (path, problem) pairs, to quote in messages."""
    return '; '.join(f'{os.path.basename(path)}: {problem}' for path, problem in broken)


def _candidates(checkpoint_dir):
    """(candidates oldest first, {path: timestamp} of those the state file names, the state
    file or None if it is missing or unreadable).

    Candidates are the checkpoints the state file names plus complete `ckpt-N.index` files it
    does not name.
    """
    if not os.path.isdir(checkpoint_dir):
        return [], {}, None
    state = _read_state(checkpoint_dir)
    listed = {}
    if state is not None:
        timestamps = list(state.all_model_checkpoint_timestamps)
        for index, path in enumerate(state.all_model_checkpoint_paths):
            path = os.path.join(checkpoint_dir, os.path.basename(path))
            listed[path] = timestamps[index] if index < len(timestamps) else None
    steps = map(run_dir.checkpoint_index_step, os.listdir(checkpoint_dir))
    found = {checkpoint_path(checkpoint_dir, step) for step in steps if step is not None}
    return sorted(set(listed) | found, key=checkpoint_step), listed, state


def newest_readable_checkpoint(checkpoint_dir):
    """The newest checkpoint of `checkpoint_dir` that reads back, changing nothing.

    Returns (path or None, [(path, problem)] of the newer checkpoints that do not read back,
    oldest first). Considers the checkpoints `recover_checkpoints` would, so a reader picks
    the one a resuming trainer would; it only stops at the first (newest) that reads back.
    """
    candidates, _, _ = _candidates(checkpoint_dir)
    broken = []
    for path in reversed(candidates):
        problem = checkpoint_problem(path)
        if problem is None:
            return path, broken[::-1]
        broken.append((path, problem))
    return None, broken[::-1]


def recover_checkpoints(checkpoint_dir):
    """Checks the checkpoints of `checkpoint_dir`; fixes the state file to name usable ones.

    Candidates (see `_candidates`) that do not read back are moved to `corrupt/`. The state
    file is rewritten (atomically, with relative paths) when it was missing, unreadable or
    named anything else than the usable checkpoints. Raises RecoveryError, changing nothing,
    when checkpoints exist but none reads back.
    """
    candidates, listed, state = _candidates(checkpoint_dir)
    problems = {path: checkpoint_problem(path) for path in candidates}
    valid = [path for path in candidates if problems[path] is None]
    broken = [path for path in candidates if problems[path] is not None]
    if broken and not valid:
        details = describe_problems((path, problems[path]) for path in broken)
        raise RecoveryError(
            f'no checkpoint in {checkpoint_dir} reads back ({details}). Nothing was changed; '
            f'move the broken files away to start over from scratch, or restore them from a '
            'backup.')
    corrupt = []
    for path in broken:
        files = glob.glob(f'{glob.escape(path)}.*')
        if files:
            destination = os.path.join(checkpoint_dir, run_dir.CORRUPT_DIR)
            os.makedirs(destination, exist_ok=True)
            for name in files:
                os.replace(name, os.path.join(destination, os.path.basename(name)))
            corrupt.append((path, problems[path]))
        else:  # Deleted by the rotation of a run killed before it rewrote the state file.
            logging.info('Checkpoint %s named in the state file no longer exists; dropped.',
                         path)
    if valid and (state is None or list(listed) != valid or
                  os.path.join(checkpoint_dir, os.path.basename(
                      state.model_checkpoint_path)) != valid[-1]):
        _write_state(checkpoint_dir, valid, listed, state)
    return RecoveredCheckpoints(valid, corrupt)


def _read_state(checkpoint_dir):
    """The parsed state file, or None if it is missing or unreadable."""
    try:
        return tf.train.get_checkpoint_state(checkpoint_dir)
    except (tf.errors.OpError, ValueError):
        return None


def _write_state(checkpoint_dir, valid, listed, state):
    timestamps = [listed.get(path) or os.path.getmtime(f'{path}.index') for path in valid]
    preserved = state.last_preserved_timestamp if state is not None else 0.0
    # The manager rotates only checkpoints younger than the last preserved timestamp.
    preserved = min([preserved] + [timestamp - 1.0 for timestamp in timestamps])
    tf.compat.v1.train.update_checkpoint_state(
        checkpoint_dir, os.path.basename(valid[-1]),
        all_model_checkpoint_paths=[os.path.basename(path) for path in valid],
        all_model_checkpoint_timestamps=timestamps, last_preserved_timestamp=preserved)


def repair_metrics(path, restored_step):
    """Makes `metrics.jsonl` at `path` end at `restored_step`; returns its evaluations.

    A partial last line is dropped and evaluations of later steps are moved to
    `metrics.orphaned.jsonl` beside it, each with a warning. Lines that are not JSON records
    are reported and left in place (readers skip them).
    """
    try:
        lines = list(metrics.read_lines(path, blank=True))
    except FileNotFoundError:
        return []
    changed = False
    kept, orphaned, records = [], [], []
    for line in lines:
        # After the last newline: an append cut short, or one complete but for its newline.
        if not line.complete:
            if line.blank:
                continue
            changed = True
            if line.problem:
                logging.warning('%s ends in a partial line (a write cut short), dropped: %r',
                                path, line.data[:200])
                continue
        record = line.record
        if not isinstance(record, dict) or 'step' not in record:
            if not line.blank:
                logging.warning('%s line %d is not an evaluation record; left as is: %r', path,
                                line.number, line.data[:200])
            kept.append(line.data)
        elif isinstance(record['step'], int) and record['step'] > restored_step:
            orphaned.append(line.data)
        else:
            kept.append(line.data)
            records.append(record)
    if orphaned:
        orphaned_path = os.path.join(os.path.dirname(path), run_dir.ORPHANED_METRICS_FILE)
        logging.warning('%s holds %d evaluation(s) past the restored checkpoint (step %d), whose '
                        'checkpoints did not survive; moved to %s.', path, len(orphaned),
                        restored_step, orphaned_path)
        with open(orphaned_path, 'ab') as f:
            f.write(b''.join(line + b'\n' for line in orphaned))
            f.flush()
            os.fsync(f.fileno())
        changed = True
    if changed:
        temporary = f'{path}.tmp-{os.getpid()}'
        with open(temporary, 'wb') as f:
            f.write(b''.join(line + b'\n' for line in kept))
            f.flush()
            os.fsync(f.fileno())
        os.replace(temporary, path)
    return records
