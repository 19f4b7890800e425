"""A sweep's course: which trials train to which budget, stage after stage, and why they stop.

Without a scheduler a sweep is one stage: every trial to the full budget. With one
(pipelines/halving.py), each stage trains the trials of a rung (every bracket's current rung at
once, for HyperBand) to that rung's budget, continuing each trial from its checkpoint; then each
bracket's configurations are ranked and the top 1/η promoted.

With `search` (pipelines/sweep/search.py), configurations are proposed a batch at a time, and each
batch is halved as a bracket of its own, from the first rung to the full budget, before the
next is asked (as BOHB, Falkner et al. 2018, runs successive halving on what its model
proposes). The sampler is then told every configuration's outcome as Optuna's TPE with a pruner
sees it: its score at each rung, and whether it completed the full budget or was pruned. TPE
ranks completed configurations above pruned ones and pruned ones by how far they got, so it
models what does well at the full budget, not what learns fastest in the first rung. A batch
of η**K configurations (K + 1 rungs) spends what successive halving spends on them in one
bracket, so a search of several batches costs what halving the same number of configurations
at once does.

`train(work)` trains a stage: work is [(trial, budget)], budget None for the full one. Results
are read back from the trials' `result.json`, so the course of a resumed sweep is recomputed
from what is stored: a trial whose result reached a budget is not trained to it again, and a
rung's promotion, once decided, is recorded in `rungs.jsonl` and never recomputed (even if the
sweep is rerun to retry failed trials, which then retrain only in rungs not yet decided).
"""

import dataclasses
import functools
import json
import time

from absl import logging

from agents.runs import run_dir
from agents.storage import file_io, locations
from pipelines import halving
from pipelines.sweep import trial as trial_lib

COMPLETED, PRUNED, FAILED = 'completed', 'pruned', 'failed'


@dataclasses.dataclass
class Course:
    """What the sweep did: its trials, where each stopped and the rungs' decisions."""
    trials: list  # sweep_spec.Trial, in the sweep's order.
    rung_of: dict  # trial id -> index of the last rung it trained in.
    budgets: list  # The budget of each rung (one rung without a scheduler).
    decisions: dict  # (bracket, rung) -> decision record (as in rungs.jsonl).
    bracket_of: dict  # config id -> bracket (with search: the batch that proposed it).


def run(spec, output_dir, train, study=None):
    """Trains the sweep of `spec` stage by stage with `train`; returns its `Course`."""
    scheduler = spec.scheduler
    budgets = (halving.rung_budgets(scheduler.min_steps, scheduler.reduction_factor,
                                    spec.env_steps) if scheduler else [spec.env_steps])
    course = Course(trials=[], rung_of={}, budgets=budgets,
                    decisions=read_decisions(output_dir), bracket_of={})
    trials_of = {}  # config id -> its trials.

    def add(configuration):
        """The config id of `configuration`, whose trials are added unless a proposal was."""
        trials = spec.trials_of(configuration, len(trials_of))
        return trials_of.setdefault(trials[0].config_id, trials)[0].config_id

    halve = functools.partial(_halve, spec, output_dir, course, trials_of, train)
    if study is None:
        config_ids = [add(configuration) for configuration in spec.configurations()]
        brackets = scheduler.brackets if scheduler else 1
        assignment = halving.assign_brackets(config_ids, brackets, len(budgets),
                                             scheduler.reduction_factor if scheduler else 2)
        halve({bracket: (bracket, ids) for bracket, ids in assignment.items()})
    else:
        for index in range(study.num_batches):
            batch = [(number, add(configuration)) for number, configuration in study.batch(index)]
            fresh = [config_id for _, config_id in batch if config_id not in course.bracket_of]
            if not study.told().keys() >= {number for number, _ in batch}:
                logging.info('Search batch %d of %d: %d configurations proposed.', index + 1,
                             study.num_batches, len(batch))
            halve({index: (0, list(dict.fromkeys(fresh)))})
            for number, config_id in batch:
                study.tell(number, *_outcome(spec, output_dir, course, trials_of, config_id))
            study.store()
    course.trials = [trial for trials in trials_of.values() for trial in trials]
    return course


def _halve(spec, output_dir, course, trials_of, train, brackets):
    """Trains the brackets {bracket: (first rung, config ids)} rung by rung to the end.

    The brackets' current rungs train together, one stage per step up; a rung decided before
    (in `course.decisions`) is not decided again, its promotions are taken as recorded.
    """
    budgets = course.budgets
    state = {}  # bracket -> [its current rung, the configurations in it].
    for bracket, (rung, config_ids) in brackets.items():
        course.bracket_of.update(dict.fromkeys(config_ids, bracket))
        survivors = config_ids
        while (bracket, rung) in course.decisions:
            for config_id in course.decisions[bracket, rung]['scores']:
                for trial in trials_of.get(config_id, []):
                    course.rung_of[trial.id] = rung  # Rungs come in order: the last wins.
            survivors = course.decisions[bracket, rung]['promoted']
            rung += 1
        state[bracket] = [rung, survivors]
    while True:
        active = {bracket: (rung, survivors) for bracket, (rung, survivors) in state.items()
                  if rung < len(budgets) and survivors}
        if not active:
            return
        work = []
        for rung, survivors in active.values():
            for config_id in survivors:
                for trial in trials_of[config_id]:
                    course.rung_of[trial.id] = rung
                    work.append((trial, _stop(budgets, rung)))
        pending = [(trial, budget) for trial, budget in work
                   if not reached(trial_lib.read_result(output_dir, trial.id),
                                  budget or spec.env_steps)]
        if pending:
            rungs = sorted({rung for rung, _ in active.values()})
            logging.info('Stage: %d trials to rung%s %s (%s env steps), %d done earlier.',
                         len(pending), 's' if len(rungs) > 1 else '',
                         ', '.join(map(str, rungs)),
                         ', '.join(str(budgets[rung]) for rung in rungs), len(work) - len(pending))
            train(pending)
        for bracket, (rung, survivors) in active.items():
            if rung == len(budgets) - 1:
                state[bracket][0] = rung + 1
                continue
            decision = _decide(spec, output_dir, bracket, rung, budgets[rung], survivors,
                               trials_of)
            course.decisions[bracket, rung] = decision
            write_decisions(output_dir, course.decisions)
            state[bracket] = [rung + 1, decision['promoted']]


def _outcome(spec, output_dir, course, trials_of, config_id):
    """(scores, completed) of a configuration, as the search is told them.

    scores: {budget: score} of each rung the configuration was scored at (a score None if a seed
    failed there); completed: whether it trained to the full budget.
    """
    bracket = course.bracket_of[config_id]
    scores = {}
    for rung, budget in enumerate(course.budgets[:-1]):
        decision = course.decisions.get((bracket, rung))
        if decision is None or config_id not in decision['scores']:
            break
        scores[budget] = decision['scores'][config_id]
    completed = course.rung_of[trials_of[config_id][0].id] == len(course.budgets) - 1
    if completed:
        scores[spec.env_steps] = config_score(spec, output_dir, trials_of[config_id])
    return scores, completed


def _stop(budgets, rung):
    """The --stop_at_step of a rung: None for the last, which trains to the full budget."""
    return None if rung == len(budgets) - 1 else budgets[rung]


def reached(record, budget):
    """Whether a stored result shows its trial trained to `budget` without failing."""
    return bool(record) and record['status'] == trial_lib.OK and record.get(
        'budget', record.get('env_steps') or 0) >= budget


def config_score(spec, output_dir, trials):
    """The score of a configuration from its trials' results (None if a seed failed)."""
    values = []
    for trial in trials:
        record = trial_lib.read_result(output_dir, trial.id)
        values.append(metric_of(record, spec.metric) if record and
                      record['status'] == trial_lib.OK else None)
    return halving.score(values)


def metric_of(record, metric):
    """The metric of a result's last evaluation (results of older sweeps: the final return)."""
    value = (record.get('final_metrics') or {}).get(metric)
    if value is None and metric == 'mean_return':
        value = record.get('final_return')
    return value


def _decide(spec, output_dir, bracket, rung, budget, survivors, trials_of):
    scores = {config_id: config_score(spec, output_dir, trials_of[config_id])
              for config_id in survivors}
    promoted = halving.promote(scores, spec.scheduler.reduction_factor, spec.mode)
    logging.info('Rung %d (%d env steps)%s: %d of %d configurations go on (%s %s): %s.', rung,
                 budget, f' of bracket {bracket}' if spec.scheduler.brackets > 1 else '',
                 len(promoted), len(survivors), spec.mode, spec.metric, ', '.join(
                     f'{config_id} {scores[config_id]:.1f}' for config_id in promoted))
    return {'bracket': bracket, 'rung': rung, 'budget': budget, 'metric': spec.metric,
            'mode': spec.mode, 'scores': scores, 'promoted': promoted,
            'decided_at': time.time()}


def read_decisions(output_dir):
    """{(bracket, rung): decision} from `rungs.jsonl` (none if there is no such file)."""
    path = locations.join(output_dir, run_dir.RUNGS_FILE)
    if not file_io.exists(path):
        return {}
    decisions = {}
    for line in file_io.read_text(path).splitlines():
        if line.strip():
            decision = json.loads(line)
            decisions[decision['bracket'], decision['rung']] = decision
    return decisions


def write_decisions(output_dir, decisions):
    """Rewrites `rungs.jsonl` (atomically) with every decision, in bracket and rung order."""
    file_io.write_text(locations.join(output_dir, run_dir.RUNGS_FILE), ''.join(
        json.dumps(decisions[key], allow_nan=False) + '\n' for key in sorted(decisions)))


def annotate(course, records):
    """Adds to each result record its rung, bracket and why the trial stopped."""
    last_rung = len(course.budgets) - 1
    for record in records:
        rung = course.rung_of.get(record['id'], last_rung)
        bracket = course.bracket_of.get(record['config_id'], 0)
        record['rung'] = rung
        record['bracket'] = bracket
        if record['status'] != trial_lib.OK:
            record['stop_reason'] = FAILED
            record['stop_detail'] = f'failed in rung {rung} ({course.budgets[rung]} env steps)'
        elif rung == last_rung:
            record['stop_reason'] = COMPLETED
            record['stop_detail'] = f'trained to the full budget ({course.budgets[rung]} env steps)'
        else:
            decision = course.decisions.get((bracket, rung))
            record['stop_reason'] = PRUNED
            record['stop_detail'] = _pruned_detail(decision, record['config_id'], rung,
                                                   course.budgets[rung])
    return records


def _pruned_detail(decision, config_id, rung, budget):
    if decision is None:
        return f'stopped after rung {rung} ({budget} env steps)'
    order = halving.ranks(decision['scores'], decision['mode'])
    rank = order.get(config_id)
    where = (f'ranked {rank} of {len(decision["scores"])}' if rank is not None
             else 'no score (a seed failed)')
    return (f'pruned after rung {rung} ({budget} env steps): {where} by {decision["mode"]} '
            f'{decision["metric"]}; the top {len(decision["promoted"])} went on')
