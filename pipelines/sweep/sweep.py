r"""Runs a hyperparameter sweep as an Apache Beam pipeline.

    bazel run //pipelines:sweep -- --spec=configs/sweeps/pendulum.yaml --output_dir=/tmp/sweep

The spec (see sweep_spec.py) expands into trials; a Reshuffle spreads them over the runner's
workers, each trains one trial at a time with the trainer binary (trial.py), and the results are
gathered into `trials.jsonl` and a ranked `summary.csv`. With a scheduler or a search, the sweep
runs in stages, a pipeline each (scheduler.py): the rungs of successive halving, the batches of
Optuna's proposals. Flags this binary does not define go to
Beam: by default the DirectRunner's FnApiRunner in multi-processing mode with one worker per
core; any runner works, e.g. `--runner=DataflowRunner --project=... --region=...
--temp_location=gs://...` with `--output_dir=gs://...`, where each trial trains in and resumes
from its directory in the bucket.

Rerunning the same command resumes: trials whose result is `ok` are kept, failed and missing ones
run again (in a rung not yet decided), and a rung's decision is never recomputed. An output
directory that holds a different spec is refused, as is one another launcher holds (a lock file
locally, a lease in a bucket). Damaged records of the launcher are checked before anything
trains (sweep_state.py): a torn last line is repaired, other damage refused until
`--repair_state` rebuilds the record from the trials' results.
"""

import contextlib
import csv
import difflib
import io
import json
import logging as std_logging
import os
import sys
import time

import apache_beam as beam
import numpy as np
from absl import app, flags, logging
from apache_beam.options.pipeline_options import (
    DirectOptions,
    PipelineOptions,
    SetupOptions,
    StandardOptions,
    WorkerOptions,
)

from agents.runs import lease as lease_lib
from agents.runs import run_config, run_dir
from agents.scripts import log_noise
from agents.storage import failures, file_io, locations, outages
from pipelines import halving
from pipelines.sweep import scheduler, search, sweep_spec, sweep_state
from pipelines.sweep import trial as trial_lib

flags.DEFINE_string('spec', None, 'The sweep spec (YAML), e.g. configs/sweeps/pendulum.yaml; '
                    'relative paths are taken from the directory you ran the command from.')
flags.DEFINE_string('output_dir', None, 'Where trials train (trials/<id>/) and the results go: '
                    'a local directory or, on a cluster, a bucket path such as gs://b/sweep.')
flags.DEFINE_integer('threads_per_trial', 0, 'TensorFlow intra-op threads per trial; 0: the '
                     'cores divided among the local workers (TensorFlow decides on other runners).')

flags.DEFINE_integer('pipeline_attempts', 3, 'Runs of the pipeline while it fails (e.g. a lost '
                     'worker on a runner that does not retry bundles, as the local ones): each '
                     'reruns only the unfinished trials, from their last checkpoints.',
                     lower_bound=1)

flags.DEFINE_float('max_outage_s', 1800.0, 'How long the launcher, its workers and the '
                   'trainers retry the storage of output_dir while it is out of reach before '
                   'the sweep stops (a spec binding staging.max_outage_s sets the trainers\' '
                   'own).',
                   lower_bound=0.0)
flags.DEFINE_bool('repair_state', False, 'Move a damaged trials.jsonl, rungs.jsonl or search.db '
                  'of the output_dir aside (kept as <name>.damaged-<time>) and rebuild it from '
                  'the trials\' result.json files.')
FLAGS = flags.FLAGS



class SweepError(Exception):
    """A problem with the output directory or the runner's options, told in one sentence."""


class StageError(Exception):
    """A stage's pipeline failed every attempt; the message says how and what is left."""


# What a launcher's hold on its output_dir leaves there (hold_output_dir): no sweep's content.
HOLD_FILES = (run_dir.LOCK_FILE, run_dir.LEASE_FILE)
# Who holds an output_dir, and the flag that chooses another, as refusals name them.
LAUNCHER = 'sweep launcher'
OUTPUT_DIR_FLAG = '--output_dir'


def check_output_dir(output_dir, spec, spec_text):
    """Whether `output_dir` can hold this sweep, writing nothing: True if the spec's copy must
    be written (a new sweep, or the same sweep's spec with other formatting, comments or
    timeout), False if it is there as it is.

    Anything that changes what the trials are is refused, as is a directory that holds no
    sweep and more than a launcher's lock or lease (HOLD_FILES).
    """
    copy = locations.join(output_dir, run_dir.SPEC_COPY)
    if file_io.exists(copy):
        stored_text = file_io.read_text(copy)
        try:
            stored = sweep_spec.parse(stored_text, copy)
        except sweep_spec.SpecError as error:
            raise SweepError(f'{output_dir} holds an unreadable sweep spec: {error}') from None
        if _trials_content(stored) != _trials_content(spec):
            _check_same_course(stored, spec, output_dir)
            diff = ''.join(difflib.unified_diff(
                stored_text.splitlines(True), spec_text.splitlines(True), 'output_dir spec',
                'this spec'))
            raise SweepError(f'output_dir {output_dir} holds a sweep of a different spec; use '
                             f'another --output_dir or the same spec. Difference:\n{diff}')
        return stored_text != spec_text
    if not file_io.is_empty_directory(output_dir, ignore=HOLD_FILES):
        raise SweepError(f'output_dir {output_dir} is not empty and holds no '
                         f'{run_dir.SPEC_COPY}: not a sweep; choose another --output_dir')
    return True


def prepare_output_dir(output_dir, spec, spec_text):
    """Stores the spec in `output_dir` (see `check_output_dir`), which this launcher holds."""
    if check_output_dir(output_dir, spec, spec_text):
        file_io.write_text(locations.join(output_dir, run_dir.SPEC_COPY), spec_text)


def _trials_content(spec):
    """The spec's content that decides its trials: not how long they may take, nor whether
    they are packed into populations (a resumed sweep packs what it has left to train)."""
    content = spec.canonical()
    for name in ('timeout_s', 'pack_populations', 'max_population'):
        del content[name]
    return content


COURSE_FIELDS = ('scheduler', 'search', 'metric', 'mode')


def _check_same_course(stored, spec, output_dir):
    """Refuses, at the spec's line, a resumed sweep whose scheduler or search changed while the
    trials stayed the same: its rungs and proposals were decided by the stored ones."""
    before, after = _trials_content(stored), _trials_content(spec)
    changed = [name for name in before if before[name] != after[name]]
    if not changed or not set(changed) <= set(COURSE_FIELDS):
        return
    field = 'scheduler' if {'scheduler', 'metric', 'mode'} & set(changed) else 'search'
    location = (field,) if (field,) in spec.lines else ()
    was = json.dumps(before[field], sort_keys=True) if before[field] else 'none'
    raise spec.error(location, f'the {field} differs from the one output_dir {output_dir} was '
                     f'started with ({was}): a resumed sweep keeps its {field}, whose decisions '
                     'are stored there; use another --output_dir or the stored spec')


class RunTrial(beam.DoFn):
    """Trains one trial, or one population of trials, per element and logs the sweep's
    progress as trials finish.

    A worker whose storage stayed out of reach past --max_outage_s (or became unusable) says so
    in one line and takes no more trials, each of which would wait as long again. The launcher,
    reading the results, then stops with the storage's error; or, with the storage back by
    then, counts the trials left unfinished as failed, which a rerun retries.
    """

    def __init__(self, settings, trial_ids, started_at):
        self._settings = settings
        self._trial_ids = list(trial_ids)
        self._started_at = started_at
        self._storage_failure = None

    def setup(self):
        # Workers started without Beam's logging set-up (as by a worker pool) would drop the
        # progress lines: show them on the worker's stderr.
        absl_logger = std_logging.getLogger('absl')
        if absl_logger.getEffectiveLevel() > std_logging.INFO:
            absl_logger.setLevel(std_logging.INFO)
        if not std_logging.getLogger().handlers and not absl_logger.handlers:
            handler = std_logging.StreamHandler()
            handler.setFormatter(std_logging.Formatter('%(asctime)s %(levelname)s %(message)s'))
            absl_logger.addHandler(handler)

    def process(self, work):
        unit, stop_at_step = work
        if self._storage_failure is not None:
            return
        to_step = f' (to step {stop_at_step})' if stop_at_step else ''
        try:
            if isinstance(unit, trial_lib.Population):
                logging.info('Population %s of %d trials starting%s: %s', unit.id,
                             len(unit.trials), to_step, ', '.join(
                                 f'{trial.id} {json.dumps(trial.bindings)}'
                                 for trial in unit.trials))
                records = trial_lib.run_population(unit, self._settings, stop_at_step)
            else:
                logging.info('Trial %s starting%s: seed %d, %s', unit.id, to_step, unit.seed,
                             json.dumps(unit.bindings))
                records = [trial_lib.run(unit, self._settings, stop_at_step)]
        except failures.StorageError as error:
            self._storage_failure = error
            logging.error('%s left unfinished: %s; this worker takes no more trials.', unit.id,
                          error)
            return
        for record in records:
            logging.info('Trial %s %s%s', record['id'], record['status'], _outcome(record))
        logging.info('Sweep progress: %s', progress(
            self._settings.output_dir, self._trial_ids, self._started_at))
        yield from records


def _outcome(record):
    if record['status'] == trial_lib.OK:
        return (f' in {record["wall_time_s"]:.0f} s: final return {record["final_return"]:.1f}, '
                f'best {record["best_return"]:.1f}')
    return f' after {record["wall_time_s"]:.0f} s: {record["error"]}'


def progress(output_dir, trial_ids, started_at, now=None):
    """'done/total, failures, ETA' from the stored results, whichever worker wrote them.

    `trial_ids`: the stage's [(trial id, budget)]; a trial is done when its result reached the
    budget, or failed in this run.
    """
    now = time.time() if now is None else now
    done = failed = finished_now = 0
    for trial_id, budget in trial_ids:
        record = trial_lib.read_result(output_dir, trial_id)
        if record is None:
            continue
        this_run = record.get('finished_at', 0) >= started_at
        finished_now += this_run
        if scheduler.reached(record, budget) or this_run:
            done += 1
            failed += record['status'] != trial_lib.OK
    remaining = len(trial_ids) - done
    if remaining == 0:
        eta = '0:00:00'
    elif finished_now:
        eta = _format_seconds(remaining * (now - started_at) / finished_now)
    else:
        eta = '?'
    return f'{done}/{len(trial_ids)} trials done, {failed} failed, ETA {eta}'


def _format_seconds(seconds):
    minutes, seconds = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f'{hours}:{minutes:02d}:{seconds:02d}'


def write_outputs(records, output_dir, metric='mean_return', mode='max'):
    """Writes trials.jsonl (in spec order) and summary.csv (ranked), each atomically."""
    records = sorted(records, key=lambda record: record['index'])
    file_io.write_text(locations.join(output_dir, run_dir.TRIALS_FILE), ''.join(
        json.dumps(record, allow_nan=False) + '\n' for record in records))
    file_io.write_text(locations.join(output_dir, run_dir.SUMMARY_FILE),
                       summary_csv(summarize(records, metric, mode), metric))
    return len(records)


def summarize(records, metric='mean_return', mode='max'):
    """Per configuration: the budget its seeds reached, and its final return (mean, std, count
    over its ok seeds) and `metric` there; best first among those of the same budget.

    Configurations are compared only at equal budgets: those that went further (successive
    halving promoted them) rank above those stopped earlier, whatever their returns. The std is
    the sample standard deviation (0 for one seed); configurations without an ok trial come
    last, without statistics.
    """
    configurations = {}
    for record in records:
        configurations.setdefault(record['config_id'], []).append(record)
    rows = []
    for config_id, group in configurations.items():
        ok = [r for r in group if r['status'] == trial_lib.OK]
        finals = [r['final_return'] for r in ok]
        bests = [r['best_return'] for r in ok]
        values = [scheduler.metric_of(r, metric) for r in ok]
        values = [value for value in values if value is not None]
        rows.append({
            'config_id': config_id,
            'bindings': group[0]['bindings'],
            'budget': max((r.get('budget') or r.get('env_steps') or 0 for r in ok), default=None),
            'rung': max((r['rung'] for r in group if 'rung' in r), default=None),
            'mean_final_return': float(np.mean(finals)) if finals else None,
            'std_final_return': float(np.std(finals, ddof=1)) if len(finals) > 1 else (
                0.0 if finals else None),
            'count': len(finals),
            'failed': len(group) - len(finals),
            'mean_best_return': float(np.mean(bests)) if bests else None,
            'metric': float(np.mean(values)) if values else None,
            'seeds': sorted(r['seed'] for r in group),
        })
    sign = -1.0 if mode == 'max' else 1.0
    rows.sort(key=lambda row: (row['metric'] is None, -(row['budget'] or 0),
                               sign * (row['metric'] or 0.0), row['config_id']))
    for rank, row in enumerate(rows, 1):
        row['rank'] = rank
    return rows


def summary_csv(rows, metric='mean_return'):
    parameters = sorted({name for row in rows for name in row['bindings']})
    staged = any(row['rung'] is not None for row in rows)
    columns = (['rank', 'config_id'] + parameters + (['rung', 'budget'] if staged else []) +
               ['mean_final_return', 'std_final_return', 'count', 'failed', 'mean_best_return'] +
               ([f'mean_{metric}'] if metric != 'mean_return' else []))
    text = io.StringIO()
    writer = csv.writer(text, lineterminator='\n')
    writer.writerow(columns)
    for row in rows:
        values = {**row, **{name: row['bindings'].get(name) for name in parameters},
                  f'mean_{metric}': row['metric']}
        writer.writerow(['' if values[column] is None else _csv_value(values[column])
                         for column in columns])
    return text.getvalue()


def _csv_value(value):
    if isinstance(value, float):
        return f'{value:.8g}'
    return json.dumps(value) if isinstance(value, list | dict) else value


def build(pipeline, work, settings, trial_ids, started_at):
    """A stage's pipeline: its work, [(trial or population, stop_at_step)], spread and
    trained."""
    # The results are gathered into one element: a runner then waits on every worker's output
    # and fails the pipeline as soon as one is lost.
    return (pipeline
            | 'Trials' >> beam.Create(work)
            | 'Spread' >> beam.Reshuffle()
            | 'Train' >> beam.ParDo(RunTrial(settings, trial_ids, started_at))
            | 'Gather' >> beam.combiners.ToList())


def pipeline_options(beam_args):
    """Beam's options from the flags this binary does not define, with local defaults.

    Without a runner, the DirectRunner runs trials in worker processes, one per core.
    """
    unknown = _unknown_beam_args(beam_args)
    if unknown:
        raise SweepError(f'unknown flags: {" ".join(unknown)} (neither a sweep flag nor a Beam '
                         'pipeline option)')
    options = PipelineOptions(beam_args)
    given = {arg[2:].split('=', 1)[0] for arg in beam_args if arg.startswith('--')}
    # Workers log the sweep's progress (absl) and Beam's warnings, not Beam's chatter.
    worker = options.view_as(WorkerOptions)
    if 'default_sdk_harness_log_level' not in given:
        worker.default_sdk_harness_log_level = 'WARNING'
    if 'sdk_harness_log_level_overrides' not in given:
        worker.sdk_harness_log_level_overrides = {'absl': 'INFO'}
    # Packages for remote workers, like every path here, are relative to the caller's directory.
    setup = options.view_as(SetupOptions)
    for name in ('setup_file', 'requirements_file'):
        if getattr(setup, name):
            setattr(setup, name, locations.resolve(getattr(setup, name)))
    if setup.extra_packages:
        setup.extra_packages = [locations.resolve(path) for path in setup.extra_packages]
    if options.view_as(StandardOptions).runner in (None, 'DirectRunner'):
        direct = options.view_as(DirectOptions)
        if 'direct_running_mode' not in given:
            direct.direct_running_mode = 'multi_processing'
        if direct.direct_running_mode == 'in_memory':
            direct.direct_num_workers = 1
        elif 'direct_num_workers' not in given or direct.direct_num_workers == 0:
            direct.direct_num_workers = os.cpu_count() or 1
        if direct.direct_num_workers < 1:
            raise SweepError(f'--direct_num_workers must be >= 1, got {direct.direct_num_workers}')
    return options


def default_runner(options):
    """The DirectRunner's FnApiRunner for --runner=DirectRunner or none, else None (Beam picks).

    Beam's DirectRunner would first try its Prism runner, which downloads a binary (failing
    offline, after a delay): a different engine from the one the tests run.
    """
    if options.view_as(StandardOptions).runner not in (None, 'DirectRunner'):
        return None
    from apache_beam.runners.portability.fn_api_runner import fn_runner
    return fn_runner.FnApiRunner()


def check_runner(options, output_dir):
    """Refuses a local output_dir on a runner whose workers may be other machines."""
    if local_workers(options) is None and not locations.is_remote(output_dir):
        runner = options.view_as(StandardOptions).runner
        if runner in ('DataflowRunner', 'dataflow'):
            raise SweepError(f'--runner={runner} needs an --output_dir its workers can reach, '
                             f'such as gs://BUCKET/sweep; got the local path {output_dir}')


def local_workers(options):
    """Trials trained at once on this machine, or None when the runner is not local."""
    if options.view_as(StandardOptions).runner not in (None, 'DirectRunner'):
        return None
    return options.view_as(DirectOptions).direct_num_workers  # 1 in memory (pipeline_options).


def _unknown_beam_args(args):
    parsers = []
    PipelineOptions(args).get_all_options(add_extra_args_fn=parsers.append)
    return parsers[0].parse_known_args(args)[1]


def main(argv):
    outages.set_limit(FLAGS.max_outage_s)
    try:
        spec_path = sweep_spec.find(FLAGS.spec)
        spec = sweep_spec.load(spec_path, name=FLAGS.spec)
        with open(spec_path, encoding='utf-8') as f:
            spec_text = f.read()
        output_dir = locations.resolve(FLAGS.output_dir)
        options = pipeline_options(argv[1:])
        check_runner(options, output_dir)
        try:
            file_io.check_writable(output_dir)
            check_not_held(output_dir)
            # Checked before the hold, which leaves a lock file, and written only under it: a
            # launcher refused beside a running one changes nothing of its sweep.
            check_output_dir(output_dir, spec, spec_text)
            with log_noise.tensorflow_start():  # check_gin loads TensorFlow, quietly.
                sweep_spec.check_gin(spec)
            release = hold_output_dir(output_dir)
            try:
                prepare_output_dir(output_dir, spec, spec_text)
            except BaseException:
                release()
                raise
        except OSError as error:
            raise SweepError(f'cannot write to output_dir {output_dir}: '
                             f'{error.strerror or error}') from None
        except lease_lib.LeaseHeld as error:
            raise SweepError(str(error)) from None
        except failures.StorageError as error:
            raise SweepError(f'output_dir: {error}') from None
        except run_config.ConfigError as error:
            raise SweepError(str(error)) from None
    except (sweep_spec.SpecError, SweepError) as error:
        sys.exit(f'sweep: error: {error}')
    try:
        try:
            sweep_state.check(output_dir, repair=FLAGS.repair_state)
        except sweep_state.StateError as error:
            return f'sweep: error: {error}'
        except failures.StorageError as error:
            return f'sweep: error: output_dir: {error}'
        return _launch(spec, output_dir, options)
    finally:
        release()


def check_not_held(output_dir):
    """Refuses `output_dir` if a live launcher on this machine holds it, reading only, so that a
    second launcher stops before the gin check loads TensorFlow; `hold_output_dir` decides for
    holders elsewhere. Raises ConfigError or LeaseHeld naming the holder."""
    if locations.scheme(output_dir) == 'gs':
        lease_lib.Lease(output_dir, user=LAUNCHER, flag=OUTPUT_DIR_FLAG).check_free()
    elif not locations.is_remote(output_dir) and os.path.isdir(output_dir):
        run_config.check_unlocked(output_dir, user=LAUNCHER, flag=OUTPUT_DIR_FLAG)


def hold_output_dir(output_dir):
    """Makes this launcher the only one of `output_dir` (a second would train the same trials
    and fail them): a lock file locally, a lease with a heartbeat in a bucket, each taken over
    only from a holder that is gone. Returns the function that lets go; raises ConfigError or
    LeaseHeld naming the holder."""
    if locations.scheme(output_dir) == 'gs':
        lease = lease_lib.Lease(output_dir, user=LAUNCHER, flag=OUTPUT_DIR_FLAG)
        lease.acquire()
        return lease.release
    if locations.is_remote(output_dir):
        logging.warning('%s:// has no lease: nothing keeps a second launcher from using %s at '
                        'the same time.', locations.scheme(output_dir), output_dir)
        return lambda: None
    return run_config.LogdirLock(output_dir, user=LAUNCHER, flag=OUTPUT_DIR_FLAG).release


def _launch(spec, output_dir, options):
    """Trains the sweep in `output_dir`, which this launcher holds; returns the exit status."""
    workers = local_workers(options)
    threads = FLAGS.threads_per_trial or (
        max(1, (os.cpu_count() or 1) // workers) if workers else None)
    settings = trial_lib.Settings(
        output_dir=output_dir, gin_files=spec.gin_files, env_steps=spec.env_steps,
        timeout_s=spec.timeout_s, caller_directory=locations.caller_directory(),
        threads=threads, max_outage_s=FLAGS.max_outage_s)
    runner = options.view_as(StandardOptions).runner or 'DirectRunner'
    logging.info('%s into %s on %s%s.', describe(spec, output_dir), output_dir, runner,
                 f' with {workers} workers' if workers else '')
    # Local worker processes import this tree as the trainer does.
    os.environ['PYTHONPATH'] = run_config.python_path(os.environ.get('PYTHONPATH', ''))
    # The workers' lines reach this process twice: on their stderr and through Beam's log
    # service; keep the first, with Beam's own chatter, at warnings.
    std_logging.getLogger('apache_beam').setLevel(std_logging.WARNING)
    started_at = time.time()
    # Imported here: packing loads TensorFlow, which the Beam workers that import this module
    # to run trials do not need.
    from pipelines.sweep import packing
    packer = packing.Packer(spec, output_dir, workers)

    def train(work):
        train_stage(work, settings, options, FLAGS.pipeline_attempts, packer.pack)

    try:
        with contextlib.ExitStack() as stack:
            study = (stack.enter_context(search.Study(spec, output_dir)) if spec.search
                     else None)
            course = scheduler.run(spec, output_dir, train, study)
        records = [trial_lib.read_result(output_dir, trial.id) or _missing(trial)
                   for trial in course.trials]
        if spec.scheduler:
            records = scheduler.annotate(course, records)
        write_outputs(records, output_dir, spec.metric, spec.mode)
    except StageError as error:
        return f'sweep: error: {error}'
    except failures.StorageError as error:  # An outage longer than --max_outage_s.
        return (f'sweep: error: {error}; what the trials finished is stored with them: rerun '
                'the same command to go on')
    return report(output_dir, time.time() - started_at, spec.metric, spec.mode)


def describe(spec, output_dir):
    """The sweep's opening line: its trials, how it runs them and what is done already."""
    seeds = len(spec.seeds)
    if spec.search:
        what = (f'Sweep of {spec.search.num_trials} configurations proposed by '
                f'{spec.search.sampler} ({spec.search.parallel} at a time'
                f'{", each batch halved before the next" if spec.scheduler else ""}) x '
                f'{seeds} seeds')
    else:
        trials = spec.trials()
        done = sum(scheduler.reached(trial_lib.read_result(output_dir, trial.id),
                                     spec.env_steps) for trial in trials)
        what = (f'Sweep of {len(trials)} trials ({len(trials) // seeds} configurations x '
                f'{seeds} seeds)')
        if not spec.scheduler:
            return f'{what}: {done} done earlier, {len(trials) - done} to train'
    scheduler_spec = spec.scheduler
    if scheduler_spec:
        budgets = halving.rung_budgets(scheduler_spec.min_steps,
                                       scheduler_spec.reduction_factor, spec.env_steps)
        what += (f', {scheduler_spec.type.replace("_", " ")} by {spec.mode} {spec.metric} over '
                 f'rungs of {", ".join(map(str, budgets))} env steps (the top '
                 f'1/{scheduler_spec.reduction_factor} go on'
                 + (f', {scheduler_spec.brackets} brackets)' if scheduler_spec.brackets > 1
                    else ')'))
    return what


def _missing(trial):
    """The record of a trial of the course that has no result (none can be read)."""
    return trial_lib.failed_record(trial, 'no result.json: the trial never finished')


def train_stage(work, settings, options, attempts, pack=list):
    """Trains [(trial, stop_at_step)] with Beam, rerunning the pipeline (only the trials it left
    unfinished) while it fails; raises StageError after `attempts` failed runs.

    `pack` turns the work into the pipeline's elements, trials and populations of them
    (packing.Packer.pack); a rerun keeps the populations of the trials it left unfinished.
    """
    started_at = time.time()
    trial_ids = [(trial.id, stop or settings.env_steps) for trial, stop in work]
    units = pack(work)
    populations = sum(isinstance(unit, trial_lib.Population) for unit, _ in units)
    if populations:
        packed = sum(len(unit.trials) for unit, _ in units
                     if isinstance(unit, trial_lib.Population))
        logging.info('%d of %d trials packed into %d populations (each one trainer, one '
                     'compiled program); %d alone.', packed, len(work), populations,
                     len(work) - packed)
    pending = units
    for attempt in range(1, attempts + 1):
        try:
            with beam.Pipeline(runner=default_runner(options), options=options) as pipeline:
                build(pipeline, pending, settings, trial_ids, started_at)
            return
        except Exception as error:  # Runners raise their own types; Beam's message says why.
            unfinished = {trial.id for trial, _ in split_work(settings, work, started_at)[1]}
            pending = [(unit, stop) for unit, stop in units
                       if any(trial.id in unfinished for trial in trial_lib.trials_of(unit))]
            reason = _first_line(error)
            if attempt == attempts:
                raise StageError(f'the pipeline failed ({reason}) {attempt} times; '
                                 f'{len(unfinished)} trials unfinished. Rerun the same command to '
                                 'resume them.') from None
            logging.warning('The pipeline failed (%s); %d trials unfinished: running them '
                            'again, each from its last checkpoint (attempt %d of %d).', reason,
                            len(unfinished), attempt + 1, attempts)


def split_work(settings, work, started_at=None):
    """(the result records of trials done, the [(trial, stop_at_step)] to train) of a stage.

    Done: trials whose result reached their budget and, with `started_at`, trials that failed
    since then (the pipeline of this stage already tried them).
    """
    completed, pending = [], []
    for trial, stop in work:
        record = trial_lib.read_result(settings.output_dir, trial.id)
        if scheduler.reached(record, stop or settings.env_steps) or (
                record and started_at is not None and
                record.get('finished_at', 0) >= started_at):
            completed.append(record)
        else:
            pending.append((trial, stop))
    return completed, pending


def _first_line(error):
    """'<the error's type>: <the first line of its message>', at most 300 characters."""
    message = failures.first_line(error) if str(error).strip() else ''
    return f'{type(error).__name__}: {message}'[:300]


def report(output_dir, wall_time, metric='mean_return', mode='max'):
    """Logs the sweep's outcome; the exit status is 1 if a trial failed."""
    records = [json.loads(line) for line in file_io.read_text(
        locations.join(output_dir, run_dir.TRIALS_FILE)).splitlines() if line]
    failed = [record for record in records if record['status'] != trial_lib.OK]
    rows = summarize(records, metric, mode)
    logging.info('Sweep done in %s: %d trials, %d ok, %d failed. Results: %s, %s.',
                 _format_seconds(wall_time), len(records), len(records) - len(failed),
                 len(failed), locations.join(output_dir, run_dir.TRIALS_FILE),
                 locations.join(output_dir, run_dir.SUMMARY_FILE))
    for row in rows[:3]:
        if row['mean_final_return'] is not None:
            budget = f' at {row["budget"]} env steps' if row['rung'] is not None else ''
            logging.info('#%d %s %s: final return %.1f +- %.1f over %d seeds%s', row['rank'],
                         row['config_id'], json.dumps(row['bindings']),
                         row['mean_final_return'], row['std_final_return'], row['count'],
                         budget)
    for record in failed:
        logging.error('Trial %s failed: %s', record['id'], record['error'])
    if failed:
        return f'sweep: {len(failed)} of {len(records)} trials failed (see above); rerun the ' \
               'same command to retry them'
    return 0


def _parse_flags(argv):
    """Our flags for absl; everything else is left for Beam."""
    try:
        return FLAGS(argv, known_only=True)
    except flags.Error as error:
        sys.exit(f'sweep: error: {error}\nPass --helpshort to see the flags.')


def run():
    """The console script's entry point."""
    # `--helpshort` lists the flags of the program's own file, not this module's, when the
    # program is a console script.
    for flag in FLAGS.get_key_flags_for_module(sys.modules[__name__]):
        FLAGS.register_key_flag_for_module(sys.argv[0], flag)
    flags.mark_flags_as_required(['spec', 'output_dir'])
    app.run(main, flags_parser=_parse_flags)


if __name__ == '__main__':
    run()
