"""The launcher's own records in a sweep directory, checked before anything trains.

`trials.jsonl` and `rungs.jsonl` are rewritten whole (atomically), so a torn last line comes
from a writer killed mid-write on a storage that does not write atomically: it is dropped with
a warning (the rerun computes it again), the file kept first as `<name>.torn-<time>`. Anything
else (bytes that are not UTF-8, a line before the last that is not a JSON record, a `search.db`
that SQLite or Optuna cannot read) stops the launcher with one line that names the file, what is
wrong and how to recover: `--repair_state` moves the damaged file aside (kept as
`<name>.damaged-<time>`) and the launcher rebuilds it from the trials' `result.json` files. It
can, because every record is derived from them: rungs are decided again from the trials'
scores, and a study asks the same configurations again (its sampler is seeded per batch) and is
told their results.
"""

import json
import os
import sqlite3
import tempfile
import time

from absl import logging

from agents.runs import run_dir
from agents.storage import file_io, locations


class StateError(Exception):
    """A damaged record of the sweep, told as `<file>: <what is wrong>; <how to recover>`."""


# The tables an Optuna RDB storage holds.
_STUDY_TABLES = {'studies', 'trials'}


def check(output_dir, repair=False):
    """Checks (and with `repair`, moves aside) the launcher's records in `output_dir`; repairs
    a torn last line. Raises StateError."""
    for name in (run_dir.TRIALS_FILE, run_dir.RUNGS_FILE):
        path = locations.join(output_dir, name)
        if file_io.exists(path):
            problem = _check_records(path)
            if problem:
                _damaged(path, problem, repair)
    path = locations.join(output_dir, run_dir.STUDY_FILE)
    if file_io.exists(path):
        problem = _check_study(path)
        if problem:
            _damaged(path, problem, repair)


def _damaged(path, problem, repair):
    if not repair:
        raise StateError(
            f'{path}: {problem}; rerun with --repair_state to keep it as '
            f'{locations.basename(path)}.damaged-<time> and rebuild it from the trials\' '
            'result.json files')
    kept = _set_aside(path, 'damaged')
    logging.warning('%s: %s; kept it as %s, and the sweep rebuilds it from the trials\' '
                    'result.json files.', path, problem, kept)


def _set_aside(path, why):
    """Moves `path` to `<path>.<why>-<time>` (a copy, then a delete, in a bucket); returns it."""
    kept = f'{path}.{why}-{time.strftime("%Y%m%d-%H%M%S")}'
    if locations.is_remote(path):
        file_io.write_bytes(kept, file_io.read_bytes(path))
        file_io.delete([path])
    else:
        os.replace(path, kept)
    return kept


def _check_records(path):
    """What is wrong with a JSON-lines record file, or None; repairs a torn last line."""
    data = file_io.read_bytes(path)
    try:
        text = data.decode('utf-8')
    except UnicodeDecodeError as error:
        return f'bytes that are not UTF-8 text at byte {error.start}'
    lines = text.split('\n')
    complete, last = lines[:-1], lines[-1]  # `last` is '' when the file ends with a newline.
    for number, line in enumerate(complete, 1):
        if line.strip() and not _is_record(line):
            return f'line {number} is not a JSON record ({line[:60]!r})'
    if not last.strip() or _is_record(last):
        return None
    kept = _set_aside(path, 'torn')
    file_io.write_text(path, ''.join(line + '\n' for line in complete))
    logging.warning('%s: dropped its torn last line (%r; the whole file is kept as %s): the '
                    'sweep computes that record again.', path, last[:60], kept)
    return None


def _is_record(line):
    try:
        return isinstance(json.loads(line), dict)
    except ValueError:
        return False


def _check_study(path):
    """What keeps SQLite or Optuna from reading study `path`, or None."""
    local, directory = path, None
    if locations.is_remote(path):
        directory = tempfile.mkdtemp(prefix='sweep-state-')
        local = os.path.join(directory, run_dir.STUDY_FILE)
        file_io.download(path, local)
    try:
        connection = sqlite3.connect(f'file:{local}?mode=ro', uri=True)
        try:
            (verdict,), = connection.execute('PRAGMA quick_check').fetchall()
            if verdict != 'ok':
                return f'a damaged SQLite database ({verdict})'
            tables = {name for (name,) in connection.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table'")}
        finally:
            connection.close()
    except sqlite3.DatabaseError as error:
        return f'not an SQLite database SQLite can read ({error})'
    finally:
        if directory:
            file_io.delete([local])
            os.rmdir(directory)
    if not _STUDY_TABLES <= tables:
        return (f'an SQLite database without an Optuna study (no table '
                f'{", ".join(sorted(_STUDY_TABLES - tables))})')
    return None
