"""The one reader of a run's `metrics.jsonl`: a JSON object per evaluation, a line each.

The trainer (loop.py) appends `{"step": ..., "mean_return": ..., ...}` and a newline after the
checkpoint of the same step. A kill can cut the last append short: that line has no newline
(`Line.complete` is False) and may not be JSON. Everything that reads the file goes through
`read_lines`:

- `evaluations`: the records, for whoever wants what the trainer wrote (a sweep's trial result);
- `curve`: the points of the evaluation curve a report can draw, with a sentence for each line
  that is none (not JSON, no integer step or finite return, a number out of range);
- recovery.repair_metrics: the lines as stored, to rewrite the file up to a restored step.

`read_lines` reads any JSON-lines file (also a sweep's `trials.jsonl`), local or behind a URL.
"""

import dataclasses
import io
import json
import math
import sys
from typing import Any

from agents.runs import run_dir
from agents.storage import file_io, locations

# The numbers of an evaluation record besides its step (loop.py writes them): what a sweep may
# rank configurations by.
EVALUATION_METRICS = ('mean_return', 'std_return', 'mean_length', 'env_steps_per_sec',
                      'wall_time_s')
# Steps are int64 in the report's arrays, as in the trainer's step counter.
MAX_STEP = 2**63 - 1
# The largest magnitude of a return the report takes. Larger ones come from bugs or damage,
# not training, and break its arithmetic: matplotlib's axis ticks overflow for ranges above
# about 1e307, and the statistics sum the returns of a configuration's runs. 1e300 leaves a
# factor of 10^8 below the float maximum (1.8e308).
MAX_MAGNITUDE = 1e300
STEP_RANGE = '0 to 2^63 - 1'
VALUE_RANGE = f'{-MAX_MAGNITUDE:g} to {MAX_MAGNITUDE:g}'


@dataclasses.dataclass(frozen=True)
class Line:
    """A line of a JSON-lines file."""
    number: int  # From 1, blank lines included.
    data: bytes  # As stored, without its newline.
    record: Any  # The parsed JSON value; None for a blank line or one that is not JSON.
    problem: str | None  # Why a line that is not blank is not JSON ('not JSON (...)'), or None.
    complete: bool  # Whether it ends in a newline: only the last line of a file may not.

    @property
    def blank(self):
        return not self.data.strip()


def read_lines(path, blank=False):
    """Yields the `Line`s of the JSON-lines file at `path` (a local path or a URL); blank lines
    only with `blank`.

    A local file is read only if it is a regular file (file_io.open_regular: a FIFO does not
    block). Lines are UTF-8; bytes that are not become U+FFFD.

    Raises:
      FileNotFoundError: there is no such file.
      OSError: the file cannot be read, or is no regular file.
    """
    if locations.is_remote(path):
        file = io.BytesIO(file_io.read_bytes(path))
    else:
        file = file_io.open_regular(path)
    with file:
        for number, data in enumerate(file, 1):
            complete = data.endswith(b'\n')
            if complete:
                data = data[:-1]
            if not data.strip():
                if blank:
                    yield Line(number, data, None, None, complete)
                continue
            record, problem = _parse(data)
            yield Line(number, data, record, problem, complete)


def _parse(data):
    """(JSON value, None) of a line's bytes, or (None, why they are not JSON)."""
    try:
        return json.loads(data.decode('utf-8', errors='replace')), None
    except json.JSONDecodeError as error:
        return None, f'not JSON ({error.msg})'
    except ValueError:  # Python refuses to convert integers of too many digits.
        return None, f'not JSON (a number of more than {sys.get_int_max_str_digits()} digits)'
    except RecursionError:
        return None, 'not JSON (nested too deeply)'


def evaluations(path):
    """The records (JSON objects) of metrics.jsonl at `path` (a local path or a URL), in file
    order; [] if there is no file. Other lines are skipped: a line cut by a kill, damage."""
    try:
        return [line.record for line in read_lines(path) if isinstance(line.record, dict)]
    except FileNotFoundError:
        return []


def curve(path):
    """(steps, returns, problems) of metrics.jsonl at `path`: the points of the evaluation
    curve in file order, and a sentence for each line that is none.

    Raises:
      FileNotFoundError, OSError: as `read_lines`.
    """
    steps, returns, problems = [], [], []
    for line in read_lines(path):
        problem = line.problem or record_problem(line.record)
        if problem:
            problems.append(f'{run_dir.METRICS_FILE} line {line.number}: {problem}')
            continue
        steps.append(line.record['step'])
        returns.append(float(line.record['mean_return']))
    return steps, returns, problems


def record_problem(record):
    """Why a metrics.jsonl record is no point of the curve, or None."""
    if not isinstance(record, dict):
        return 'no integer "step" and finite "mean_return"'
    step, value = record.get('step'), record.get('mean_return')
    if 'step' in record and (isinstance(step, bool) or not isinstance(step, int)):
        return f'"step" {_quoted(step)} is not an integer'
    if (step is None or isinstance(value, bool) or not isinstance(value, (int, float)) or
            not _is_finite(value)):
        return 'no integer "step" and finite "mean_return"'
    if not 0 <= step <= MAX_STEP:
        return f'"step" {_quoted(step)} is out of range ({STEP_RANGE})'
    if abs(value) > MAX_MAGNITUDE:
        return f'"mean_return" {_quoted(value)} is out of range ({VALUE_RANGE})'
    return None


def _is_finite(value):
    """`math.isfinite`, also for integers too large for a float (which are finite)."""
    return isinstance(value, int) or math.isfinite(value)


def _quoted(value, limit=40):
    """A JSON value as a message quotes it; a long one is cut."""
    text = json.dumps(value)
    return text if len(text) <= limit else text[:limit - 3] + '...'
