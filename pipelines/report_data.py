"""The report's content as plain data: configurations, their statistics and ranking, the runs.

Runs whose bindings differ only in the seed form a configuration. Each configuration gets the
statistics of its runs' final evaluation returns (IQM, mean, median with 95% stratified
bootstrap intervals, see `score_statistics`) and its mean learning curve with a 95% band; the
configurations are ranked by IQM. Bootstrap draws come from a generator seeded by the report's
seed and the configuration's id, so a configuration's numbers do not depend on which other
configurations are reported nor on the order a runner processes them in.

Everything here is JSON-ready: `report.json` is `build_report`'s result as it is.
"""

import dataclasses
import hashlib
import math
import re

import numpy as np

from pipelines import run_reader, score_statistics

FORMAT = 'batchppo-report/1'
# Exit codes of //pipelines:report, also stored in report.json.
EXIT_OK = 0
EXIT_INCOMPLETE = 3
EXIT_NO_RUNS = 4


@dataclasses.dataclass(frozen=True)
class Settings:
    """What every stage of the report pipeline needs to know."""
    input_dir: str
    output_dir: str  # Where the stages write files (the staging copy of --output_dir).
    seed: int = 0
    bootstrap_reps: int = 50_000
    curve_bootstrap_reps: int = 2_000
    max_curve_points: int = 200
    videos: bool = True
    video_max_steps: int = 200
    video_size: int = 256
    ignore_bindings: tuple = (run_reader.SEED_BINDING,)


def generator(seed, key, purpose):
    """A numpy generator for one purpose of one configuration, fixed by the report's seed."""
    digest = hashlib.sha256(f'{key}/{purpose}'.encode()).digest()
    words = [int.from_bytes(digest[i:i + 4], 'little') for i in range(0, 16, 4)]
    return np.random.default_rng(np.random.SeedSequence([int(seed), *words]))


def slug(run_id):
    """A file name for a run's page and plot: readable, unique, safe on any filesystem."""
    readable = re.sub(r'[^A-Za-z0-9._-]+', '_', run_id).strip('._')[:60] or 'run'
    return f'{readable}-{hashlib.sha256(run_id.encode()).hexdigest()[:8]}'


def run_page(run_id):
    return f'runs/{slug(run_id)}.html'


def run_plot(run_id):
    return f'runs/{slug(run_id)}.svg'


def configuration_plot(key):
    return f'plots/{key}-curve.svg'


def video_path(key):
    return f'videos/{key}.mp4'


def run_order(run):
    """Runs of a configuration by seed (runs without one last), then name."""
    return (run.seed is None, run.seed if run.seed is not None else 0, run.run_id)


def curve_grid(step_lists, max_points):
    """The steps at which the curves of a configuration are compared.

    All evaluation steps of its runs, or `max_points` evenly spaced steps between the first and
    the last when there are more.
    """
    steps = sorted(set().union(*map(set, step_lists)))
    if len(steps) <= max_points:
        return np.array(steps, np.int64)
    # Through Python ints: near 2^63 the float steps round past the last, beyond int64.
    spaced = np.round(np.linspace(steps[0], steps[-1], max_points)).tolist()
    return np.unique(np.array([min(int(step), steps[-1]) for step in spaced], np.int64))


def on_grid(steps, returns, grid):
    """A run's returns interpolated at `grid`; NaN outside the steps it evaluated at."""
    steps = np.asarray(steps, np.float64)
    values = np.interp(grid, steps, returns)
    values[(grid < steps[0]) | (grid > steps[-1])] = np.nan
    return values


def _json_floats(values):
    return [None if not math.isfinite(value) else float(value) for value in values]


def summarize_configuration(key, runs, settings):
    """The statistics of one configuration's readable runs (see the module docstring)."""
    runs = sorted(runs, key=run_order)
    scores = np.array([run.final_return for run in runs], np.float64)
    final = score_statistics.interval_estimates(
        scores[:, None], generator(settings.seed, key, 'final'), reps=settings.bootstrap_reps)
    grid = curve_grid([run.eval_steps for run in runs], settings.max_curve_points)
    values = np.stack([on_grid(run.eval_steps, run.eval_returns, grid) for run in runs])
    mean, lower, upper, count = score_statistics.curve_band(
        values, generator(settings.seed, key, 'curve'), reps=settings.curve_bootstrap_reps)
    # Best first; among equal returns the first by seed.
    by_score = sorted(range(len(runs)), key=lambda i: (-scores[i], i))
    return {
        'id': key,
        'bindings': {name: value for name, value in sorted(runs[0].bindings.items())
                     if name not in settings.ignore_bindings},
        'runs': [run.run_id for run in runs],
        'seeds': [run.seed for run in runs],
        'scores': scores.tolist(),
        'final': final,
        'curve': {'steps': grid.tolist(), 'mean': _json_floats(mean),
                  'lower': _json_floats(lower), 'upper': _json_floats(upper),
                  'runs': count.tolist()},
        'best_run': runs[by_score[0]].run_id,
        # Runs whose policy can show the configuration, best first.
        'video_candidates': [(runs[i].run_id, runs[i].seed, runs[i].policy_dir)
                             for i in by_score if runs[i].policy_dir],
        'plot': configuration_plot(key),
        'video': None,  # Set by the video stage: {'path', 'run', 'seed', 'return', ...}.
        'video_problem': None,
    }


def swept_parameters(configurations):
    """Bindings whose value differs between configurations (a missing binding is a value)."""
    names = sorted(set().union(*(config['bindings'] for config in configurations)))
    return [name for name in names
            if len({config['bindings'].get(name) for config in configurations}) > 1]


def label(bindings, swept):
    """A configuration's name: its swept bindings, or its environment if nothing was swept."""
    if swept:
        return ', '.join(f'{name}={bindings.get(name, "(unset)")}' for name in swept)
    env_id = run_reader.literal(bindings.get('train.env_id', ''))
    return env_id if isinstance(env_id, str) and env_id else 'all runs'


def _sort_value(text):
    value = run_reader.literal(text)
    numeric = isinstance(value, (int, float)) and not isinstance(value, bool)
    return (0, value, '') if numeric else (1, 0, str(text))


def sensitivity(name, configurations):
    """Points of the sensitivity plot of one swept parameter, in order of its value."""
    points = []
    for config in configurations:
        text = config['bindings'].get(name, '(unset)')
        iqm = config['final']['iqm']
        points.append({'value': run_reader.literal(text), 'text': text,
                       'scores': config['scores'], 'iqm': iqm['value'],
                       'lower': iqm['ci'][0], 'upper': iqm['ci'][1], 'config': config['id']})
    points.sort(key=lambda point: (_sort_value(point['text']), point['config']))
    for point in points:
        if not _placeable(point['value']):
            point['value'] = point['text']
    return points


def _placeable(value):
    """Whether the sensitivity plot can place a binding's value: a text, or a number within
    the report's range (infinity or 1e999 would break its axis and report.json)."""
    if isinstance(value, str):
        return True
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return abs(value) <= run_reader.MAX_MAGNITUDE  # False for NaN.


def sensitivity_plot(index):
    return f'plots/sensitivity-{index}.svg'


def run_row(run, configurations_by_key, labels):
    """A run as the report lists it."""
    return {
        'id': run.run_id,
        'logdir': run.logdir,
        'page': run_page(run.run_id),
        'plot': run_plot(run.run_id),
        'config': run.config_key,
        'config_label': labels.get(run.config_key),
        'seed': run.seed,
        'final_return': run.final_return,
        'best_return': run.best_return,
        'env_steps': run.env_steps,
        'evaluations': len(run.eval_steps),
        'policy': run.policy_dir,
        'problems': list(run.problems),
        'bindings': dict(sorted(run.bindings.items())),
        'is_best': configurations_by_key.get(run.config_key, {}).get('best_run') == run.run_id,
    }


def build_report(runs, configurations, discovery_problems, settings):
    """Everything the report shows.

    Args:
      runs: every `run_reader.Run` found, readable or not (those with `error` are skipped).
      configurations: `summarize_configuration` results (with 'video' or 'video_problem').
      discovery_problems: sentences about sweep files that could not be read.
      settings: the `Settings`.
    """
    swept = swept_parameters(configurations)
    for config in configurations:
        config['label'] = label(config['bindings'], swept)
        config['swept'] = {name: config['bindings'].get(name, '(unset)') for name in swept}
        config.pop('video_candidates', None)
    ranked = sorted(configurations, key=lambda config: (
        -config['final']['iqm']['value'], -config['final']['mean']['value'], config['id']))
    for rank, config in enumerate(ranked, 1):
        config['rank'] = rank
    by_key = {config['id']: config for config in ranked}
    labels = {config['id']: config['label'] for config in ranked}
    runs = sorted(runs, key=lambda run: run.run_id)
    readable = [run for run in runs if run.error is None]
    skipped = [{'run': run.run_id, 'logdir': run.logdir, 'reason': run.error}
               for run in runs if run.error is not None]
    problems = [{'run': None, 'problem': problem} for problem in discovery_problems]
    problems += [{'run': run.run_id, 'problem': problem}
                 for run in readable for problem in run.problems]
    problems += [{'run': config['best_run'], 'problem': config['video_problem']}
                 for config in ranked if config.get('video_problem')]
    if not runs:
        exit_code = EXIT_NO_RUNS
    elif skipped or problems:
        exit_code = EXIT_INCOMPLETE
    else:
        exit_code = EXIT_OK
    return {
        'format': FORMAT,
        'input': settings.input_dir,
        'seed': settings.seed,
        'settings': {
            'bootstrap_reps': settings.bootstrap_reps,
            'curve_bootstrap_reps': settings.curve_bootstrap_reps,
            'confidence': 0.95,
            'max_curve_points': settings.max_curve_points,
            'ignore_bindings': list(settings.ignore_bindings),
            'video_max_steps': settings.video_max_steps if settings.videos else None,
        },
        'exit_code': exit_code,
        'num_runs': len(readable),
        'num_skipped': len(skipped),
        'swept_parameters': swept,
        'configurations': ranked,
        'runs': [run_row(run, by_key, labels) for run in readable],
        'skipped': skipped,
        'problems': problems,
        'plots': {
            'learning_curves': 'plots/learning_curves.svg' if ranked else None,
            'iqm': 'plots/iqm.svg' if ranked else None,
            'sensitivity': [{'parameter': name, 'plot': sensitivity_plot(index),
                             'points': sensitivity(name, ranked)}
                            for index, name in enumerate(swept)],
        },
    }
