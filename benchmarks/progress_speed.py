"""Steady training speed of a run, read from the iteration ends it reports: what the side-by-side
training benchmarks (atari_throughput, envpool_training) share.

A run of the train binary logs a progress line after each compiled call when
`train.log_every_secs` is shorter than a call (`ours_bindings` binds it so, and puts the
evaluations beyond the budget, so that only the final one runs, after the last iteration):

    I1206 23:58:25.827737 1400022 progress.py:43] step 1024/10240 | 192 env steps/s | ...

Each line gives two clocks at that iteration's end: the log's timestamp (the wall clock: the
run's Python between calls, its TensorBoard summaries and progress lines included) and the
training clock, `step / env steps/s` (seconds inside compiled calls since the first, its
compilation included; the line's mean speed comes in whole steps/s, which puts each point within
step / (2 x speed^2) seconds: 0.07 s at step 32,768 and 500 steps/s, but too coarse for runs of a
few seconds). A peer reports its iteration ends as (step, seconds) pairs itself.
`steady_speed` takes the iterations that end at or after a warm-up and gives steps per second
between the first and the last of them: no start-up, no compilation and, for our runs, no
evaluation (the last progress line, which the final evaluation precedes, is left out of the
wall clock's series).
"""

import datetime
import re
import statistics

# A single agent's progress line (a population's says 'K members x S = T env steps/s').
_PROGRESS = re.compile(r'^I(\d\d)(\d\d) (\d\d):(\d\d):(\d\d\.\d+) .*progress\.py:\d+\] '
                       r'step (\d+)/\d+ \| (\d+) env steps/s')
# Flags of train_throughput that the benchmarks adopting its flags do not take.
TRAIN_THROUGHPUT_ONLY = ('tasks', 'systems', 'seeds', 'budget', 'baseline_tree',
                         'sb3_torch_threads', 'sb3_vec_env')
# The evaluations of a run of `ours_bindings` come at no multiple of this before its end.
NO_EVALUATIONS = 10**15


def ours_bindings(total_steps):
    """Gin bindings of a run of the train binary timed by its progress lines: the budget, a
    progress line after every call, and no evaluation before the final one."""
    return [f'train.total_steps = {total_steps}', f'train.eval_every_steps = {NO_EVALUATIONS}',
            'train.log_every_secs = 0.001']


def progress_series(log_text):
    """[(step, wall seconds, training seconds)] of the progress lines in a train binary's log,
    the wall seconds from the log's timestamps (counted from the first line; a log that runs
    past midnight is counted on), the training seconds `step / env steps/s`."""
    points, first, day_offset, last_day = [], None, 0.0, None
    for line in log_text.splitlines():
        match = _PROGRESS.match(line)
        if not match:
            continue
        month, day, hours, minutes, seconds, step, speed = match.groups()
        if last_day is not None and (month, day) != last_day:
            day_offset += 86400.0
        last_day = (month, day)
        stamp = day_offset + int(hours) * 3600 + int(minutes) * 60 + float(seconds)
        first = stamp if first is None else first
        step, speed = int(step), int(speed)
        points.append((step, stamp - first, step / speed if speed else float('inf')))
    return points


def steady_speed(points, warmup_steps):
    """Steps per second between the first and the last of `points` ((step, seconds) of
    iteration ends) whose step is at least `warmup_steps`; None if fewer than two are."""
    window = [point for point in points if point[0] >= warmup_steps]
    if len(window) < 2 or window[-1][1] <= window[0][1]:
        return None
    return (window[-1][0] - window[0][0]) / (window[-1][1] - window[0][1])


def ours_speeds(log_text, warmup_steps):
    """{'wall': steady steps/s by the log's clock, 'train': by the training clock, 'points':
    iteration ends} of a train binary's log (see the module docstring)."""
    points = progress_series(log_text)
    return {
        # The last line follows the final evaluation.
        'wall': steady_speed([(step, wall) for step, wall, _ in points[:-1]], warmup_steps),
        'train': steady_speed([(step, train) for step, _, train in points], warmup_steps),
        'points': len(points),
    }


def check_flags(argv, flag_values, refused):
    """Raises absl's UsageError for arguments besides the flags and for the flags named in
    `refused` that were given (train_throughput's, which a benchmark adopts but does not take)."""
    from absl import app  # noqa: PLC0415 - the binaries' only.

    if len(argv) > 1:
        raise app.UsageError(f'Unexpected arguments: {" ".join(argv[1:])}')
    given = [name for name in refused if flag_values[name].present]
    if given:
        raise app.UsageError(f'--{", --".join(given)}: not taken by this benchmark (see --help)')


def spread(values, digits=2):
    """'median (min to max)' of `values` (Nones left out), or '-'."""
    values = [value for value in values if value is not None]
    if not values:
        return '-'
    return (f'{statistics.median(values):.{digits}f} ({min(values):.{digits}f} to '
            f'{max(values):.{digits}f})')


def now():
    """The local time as the tables note it."""
    return datetime.datetime.now().strftime('%d %b %H:%M')
