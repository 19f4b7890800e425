"""The report's content as plain data: configurations, their statistics and ranking, the runs.

Runs whose bindings differ only in the seed form a configuration. Each configuration gets the
statistics of its runs' final evaluation returns (IQM, mean, median with 95% stratified
bootstrap intervals, see `score_statistics`) and its mean learning curve with a 95% band; the
configurations are ranked by IQM. Bootstrap draws come from a generator seeded by the report's
seed and the configuration's id, so a configuration's numbers do not depend on which other
configurations are reported nor on the order a runner processes them in.

A sweep with successive halving (pipelines/sweep/scheduler.py) stops most configurations before the
full budget, and a final return after fewer steps is no score to hold against one after more.
So configurations are compared only with those trained to the same budget (`budget_groups`):
the ranking lists the configurations of the highest budget first, then those of each lower
budget, each group ranked by IQM among itself (summary.csv ranks the same way); the best
configuration is the best of the highest budget; the IQM and sensitivity plots show one budget
at a time. Runs of an ordinary sweep or outside sweeps all count as one budget, as before.
The report also lists each rung: the configurations that entered it, their scores and which
went on (`rung_table`), and where each configuration and run stopped and why.

Everything here is JSON-ready: `report.json` is `build_report`'s result as it is.
"""

import dataclasses
import hashlib
import math
import re

import numpy as np

from agents.runs import gin_text, run_dir
from pipelines import halving
from pipelines.report import run_reader, score_statistics

FORMAT = 'batchppo-report/1'
# pipelines/sweep/scheduler.py's reasons.
COMPLETED, PRUNED, FAILED = 'completed', 'pruned', 'failed'
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
    ignore_bindings: tuple = (run_dir.SEED_BINDING,)
    max_outage_s: float = 0.0  # How long the stages' storage calls ride out an outage.


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
    # A staged sweep trains a configuration's seeds through the rungs together: its run trained
    # furthest tells where the configuration stopped.
    furthest = max((run for run in runs if run.budget is not None), key=lambda run: run.budget,
                   default=None)
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
        # Where a staged sweep stopped it (None outside sweeps that tell): the env steps its
        # runs were trained to, the rung and bracket, why in a word and in a sentence.
        'budget': furthest.budget if furthest else None,
        'rung': furthest.rung if furthest else None,
        'bracket': furthest.bracket if furthest else None,
        'stop_reason': furthest.stop_reason if furthest else None,
        'stop_detail': furthest.stop_detail if furthest else None,
        'sweep_configs': sorted({run.sweep_config for run in runs if run.sweep_config}),
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
    env_id = gin_text.value(bindings.get('train.env_id', ''))
    return env_id if isinstance(env_id, str) and env_id else 'all runs'


def _sort_value(text):
    value = gin_text.value(text)
    numeric = isinstance(value, (int, float)) and not isinstance(value, bool)
    return (0, value, '') if numeric else (1, 0, str(text))


def sensitivity(name, configurations):
    """Points of the sensitivity plot of one swept parameter, in order of its value."""
    points = []
    for config in configurations:
        text = config['bindings'].get(name, '(unset)')
        iqm = config['final']['iqm']
        points.append({'value': gin_text.value(text), 'text': text,
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


def budget_groups(configurations):
    """The configurations by the budget (env steps) their runs were trained to: [(budget,
    [configurations])], the highest budget first.

    Configurations of no known budget (runs outside the sweep) form the last group; when at most
    one budget is known (an ordinary sweep, runs outside sweeps), all form one group.
    """
    if not configurations:
        return []
    known = sorted({config['budget'] for config in configurations
                    if config['budget'] is not None}, reverse=True)
    if len(known) <= 1:
        return [(known[0] if known else None, list(configurations))]
    groups = [(budget, [config for config in configurations if config['budget'] == budget])
              for budget in known]
    unknown = [config for config in configurations if config['budget'] is None]
    return groups + ([(None, unknown)] if unknown else [])


def budget_group(budget, members):
    """A budget group as report.json holds it (its configurations in rank order)."""
    reasons = {config['stop_reason'] for config in members}
    rungs = sorted({config['rung'] for config in members if config['rung'] is not None})
    full = COMPLETED in reasons
    if budget is None:
        title = 'Budget unknown (runs no sweep record tells the budget of)'
    elif full:
        title = f'Trained to the full budget of {budget} env steps'
    else:
        title = f'Stopped at {budget} env steps' + (
            f' (pruned after rung {rungs[0]})' if len(rungs) == 1 and PRUNED in reasons else '')
    return {'budget': budget, 'full': full, 'rungs': rungs, 'title': title,
            'configurations': [config['id'] for config in members]}


def metric_value(run, metric):
    """A run's `metric` at its last evaluation, as the sweep scored it (None if unknown)."""
    value = run.final_metrics.get(metric)
    if value is None and metric == 'mean_return':
        value = run.final_return
    return value


def rung_score(runs, metric):
    """A configuration's score at a rung, as pipelines/halving.py's `score`: the mean over its
    seeds' runs of `metric`, None if a seed failed or has none."""
    return halving.score([metric_value(run, metric) if run.error is None and
                          run.stop_reason != FAILED else None for run in runs])


def _ordered(scores, mode):
    """Config ids with a score best first (ties by id, as halving.promote), then the rest."""
    ranks = halving.ranks(scores, mode)
    return sorted(ranks, key=ranks.get) + sorted(key for key in scores if key not in ranks)


def _rung_entries(scores, mode, status_of, key_of, labels):
    entries = []
    ranked = 0
    for sweep_config in _ordered(scores, mode):
        score = scores[sweep_config]
        ranked += score is not None
        config = key_of.get(sweep_config)
        entries.append({'sweep_config': sweep_config, 'config': config,
                        'label': labels.get(config, sweep_config), 'score': score,
                        'rank': ranked if score is not None else None,
                        'status': status_of(sweep_config)})
    return entries


def rung_table(decisions, runs, labels):
    """The rows of the report's Rungs table, by sweep, bracket and rung.

    A decided rung (a line of rungs.jsonl) lists its configurations by score with 'went on',
    'pruned' or 'no score' (a seed failed). The rung after each bracket's last decision (the
    full budget, unless the sweep stopped early) and the rungs of brackets without decisions
    (HyperBand's last bracket, which prunes nothing) come from the trials that trained in them:
    each configuration 'completed', 'pruned', 'failed' or 'not trained', scored as the sweep
    scores a rung. Without decisions (no halving sweep) there are no rows.

    Args:
      decisions: `run_reader.read_rungs` decisions (`Discovery.rungs`).
      runs: every `run_reader.Run`, readable or not.
      labels: {report configuration id: its label}.
    """
    if not decisions:
        return []
    key_of, runs_of = {}, {}
    for run in runs:
        if run.sweep_config:
            runs_of.setdefault(run.sweep_config, []).append(run)
            if run.error is None:
                key_of.setdefault(run.sweep_config, run.config_key)
    rows, last = [], {}
    for decision in decisions:
        promoted = set(decision['promoted'])
        scores = decision['scores']

        def decided_status(sweep_config, promoted=promoted, scores=scores):
            if sweep_config in promoted:
                return 'went on'
            return PRUNED if scores[sweep_config] is not None else 'no score'

        rows.append({'sweep': decision['sweep'], 'bracket': decision['bracket'],
                     'rung': decision['rung'], 'budget': decision['budget'],
                     'metric': decision['metric'], 'mode': decision['mode'], 'decided': True,
                     'final': False, 'entered': len(scores), 'went_on': len(promoted),
                     'configurations': _rung_entries(scores, decision['mode'], decided_status,
                                                     key_of, labels)})
        last[decision['sweep'], decision['bracket']] = decision
    later = [(sweep, bracket, decision['rung'] + 1, decision['promoted'], decision)
             for (sweep, bracket), decision in last.items() if decision['promoted']]
    decided_brackets = {bracket for _, bracket in last}
    sweeps = sorted({decision['sweep'] for decision in decisions})
    undecided = {}  # (bracket, rung) -> sweep config ids of brackets without decisions.
    for run in runs:
        if (run.sweep_config and run.bracket is not None and run.rung is not None and
                run.bracket not in decided_brackets):
            ids = undecided.setdefault((run.bracket, run.rung), [])
            if run.sweep_config not in ids:
                ids.append(run.sweep_config)
    later += [(sweeps[0] if len(sweeps) == 1 else None, bracket, rung, sorted(ids), decisions[0])
              for (bracket, rung), ids in sorted(undecided.items())]
    for sweep, bracket, rung, entrants, decision in later:
        trained = {sweep_config: [run for run in runs_of.get(sweep_config, [])
                                  if run.rung == rung] for sweep_config in entrants}
        budgets = [run.budget for group in trained.values() for run in group
                   if run.budget is not None]
        scores = {sweep_config: rung_score(group, decision['metric'])
                  for sweep_config, group in trained.items()}

        def trained_status(sweep_config, trained=trained):
            reasons = {FAILED if run.error is not None else run.stop_reason
                       for run in trained[sweep_config]}
            for reason in (FAILED, PRUNED, COMPLETED):
                if reason in reasons:
                    return reason
            return 'not trained'

        entries = _rung_entries(scores, decision['mode'], trained_status, key_of, labels)
        rows.append({'sweep': sweep, 'bracket': bracket, 'rung': rung,
                     'budget': max(budgets, default=None), 'metric': decision['metric'],
                     'mode': decision['mode'], 'decided': False,
                     'final': any(entry['status'] == COMPLETED for entry in entries),
                     'entered': len(entrants), 'went_on': None, 'configurations': entries})
    rows.sort(key=lambda row: (row['sweep'] or '', row['bracket'], row['rung']))
    return rows


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
        # Its place in a staged sweep (None where the sweep does not tell).
        'sweep_config': run.sweep_config,
        'budget': run.budget,
        'rung': run.rung,
        'bracket': run.bracket,
        'stop_reason': run.stop_reason,
        'stop_detail': run.stop_detail,
    }


def _by_iqm(config):
    return (-config['final']['iqm']['value'], -config['final']['mean']['value'], config['id'])


def build_report(runs, configurations, discovery_problems, settings, rungs=()):
    """Everything the report shows.

    Args:
      runs: every `run_reader.Run` found, readable or not (those with `error` are skipped).
      configurations: `summarize_configuration` results (with 'video' or 'video_problem').
      discovery_problems: sentences about sweep files that could not be read.
      settings: the `Settings`.
      rungs: the rung decisions of halving sweeps (`run_reader.Discovery.rungs`).
    """
    swept = swept_parameters(configurations)
    for config in configurations:
        config['label'] = label(config['bindings'], swept)
        config['swept'] = {name: config['bindings'].get(name, '(unset)') for name in swept}
        config.pop('video_candidates', None)
    groups, ranked = _ranked(configurations)
    staged = len(groups) > 1 or bool(rungs)
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
        'settings': _settings_entry(settings),
        'exit_code': exit_code,
        'num_runs': len(readable),
        'num_skipped': len(skipped),
        'swept_parameters': swept,
        # Whether configurations reached different budgets or a halving sweep's rungs are
        # known: then the page shows budgets, rungs and where each configuration stopped.
        'staged': staged,
        'budget_groups': groups,
        'best_configuration': ranked[0]['id'] if ranked else None,
        'configurations': ranked,
        'rungs': rung_table(list(rungs), runs, labels),
        'runs': [run_row(run, by_key, labels) for run in readable],
        'skipped': skipped,
        'problems': problems,
        'plots': {
            'learning_curves': 'plots/learning_curves.svg' if ranked else None,
            # One panel per budget group when there are several.
            'iqm': 'plots/iqm.svg' if ranked else None,
            'sensitivity': sensitivity_entries(swept, groups, by_key, staged),
        },
    }


def _ranked(configurations):
    """(the budget groups, the configurations ranked): ranked within budget groups, the
    highest budget first (see the module docstring)."""
    groups, ranked = [], []
    for budget, members in budget_groups(configurations):
        members = sorted(members, key=_by_iqm)
        for rank, config in enumerate(members, 1):
            config['budget_rank'] = rank
        groups.append(budget_group(budget, members))
        ranked += members
    for rank, config in enumerate(ranked, 1):
        config['rank'] = rank
    return groups, ranked


def _settings_entry(settings):
    """The report's record of the settings it was made with."""
    return {
        'bootstrap_reps': settings.bootstrap_reps,
        'curve_bootstrap_reps': settings.curve_bootstrap_reps,
        'confidence': 0.95,
        'max_curve_points': settings.max_curve_points,
        'ignore_bindings': list(settings.ignore_bindings),
        'video_max_steps': settings.video_max_steps if settings.videos else None,
    }


def sensitivity_entries(swept, groups, by_key, staged):
    """The sensitivity plots: one per swept parameter, and in a staged report per budget group
    in which the parameter takes two values or more (returns of one budget only)."""
    entries = []
    for name in swept:
        for group in groups:
            members = [by_key[key] for key in group['configurations']]
            if staged and len({config['bindings'].get(name) for config in members}) < 2:
                continue
            entries.append({'parameter': name, 'budget': group['budget'] if staged else None,
                            'points': sensitivity(name, members)})
    for index, entry in enumerate(entries):
        entry['plot'] = sensitivity_plot(index)
    return entries
