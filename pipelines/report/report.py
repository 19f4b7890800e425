r"""Training runs to a report: `bazel run //pipelines:report -- --input=DIR --output_dir=DIR`.

--input is a sweep's output directory (pipelines/sweep/sweep.py) or any directory tree of run
logdirs. An Apache Beam pipeline reads every run in parallel (one element per run: its gin bindings,
`metrics.jsonl`, TensorBoard events, exported policy), groups the runs into configurations
(same bindings but the seed), computes each configuration's statistics and renders the final
policy of its best seed to a video (one element per configuration), then gathers everything
into one element that draws the summary plots and writes `index.html`, a page per run and
`report.json` (see report_data.py for what they hold). Of a sweep with a scheduler (successive
halving, HyperBand), whose `rungs.jsonl` is read too, the report shows the rungs and compares
configurations only with those trained to the same budget.

By default Beam's DirectRunner runs it in worker processes, one per core, as the sweep does
(--direct_running_mode=in_memory keeps it in this process); any other Beam flag (--runner,
...) goes to Beam unchanged. An existing --output_dir must be empty or hold an earlier report.

--input and --output_dir may be object-storage URLs (`gs://bucket/path`, with
`pip install 'apache-beam[gcp]'`). The workers write every plot and video straight to the
report's storage, so any runner works with a URL --output_dir; local paths work only with
runners whose workers run on this machine (the default), and are refused for Dataflow's. No
credentials, an unknown bucket or a denied permission are told before the pipeline starts.

A failed run keeps the previous report. A local report is written to a temporary folder beside
--output_dir and renamed into place when complete. A URL --output_dir gets its files under
`<output_dir>/.staging-<id>/` and, when complete, they are copied (within the store) into
place: index.html of an earlier report is removed first and the new one copied last, so the
folder never has an index.html over the files of two reports (a failure while copying leaves
it without one); then the files of the earlier report the new one lacks, and the staging
files, are removed.

Exit codes:
  0  every run was read completely;
  3  the report was written, but some runs were skipped or read only in part (each is listed
     in the report with the reason: no evaluation results, a corrupt event file or
     metrics.jsonl line, a number out of range, a metrics.jsonl that is no regular file, a
     failed trial, no exported policy for a video...);
  4  the report was written, but --input holds no runs;
  2  bad flags or paths: nothing was written;
  1  the pipeline failed: nothing was written.
"""

import concurrent.futures
import contextlib
import dataclasses
import functools
import json
import logging as std_logging
import mimetypes
import os
import posixpath
import re
import shutil
import sys
import tempfile
import uuid

import apache_beam as beam
from absl import app, flags, logging
from apache_beam.options.pipeline_options import (
    DirectOptions,
    PipelineOptions,
    StandardOptions,
    WorkerOptions,
)

from agents.runs import run_config, run_dir
from agents.scripts import log_noise
from agents.storage import backends, failures, file_io, locations, outages
from pipelines.report import plots, report_data, report_html, run_reader

EXIT_USAGE = 2
EXIT_FAILED = 1
# A report on object storage while the pipeline writes it: <output_dir>/.staging-<id>/.
STAGING_PREFIX = '.staging-'

flags.DEFINE_string('input', None, 'A sweep output directory or any directory tree of runs: a '
                    'local path or a URL (gs://bucket/path).')
flags.DEFINE_string('output_dir', None, 'Directory for the report (index.html, report.json, '
                    'plots, videos); must be empty, new, or hold an earlier report. A URL '
                    '(gs://bucket/path) works with any --runner; a local path only with runners '
                    'whose workers run on this machine (the default).')
flags.DEFINE_integer('seed', 0, 'Seeds the bootstrap and the episodes of the videos.')
flags.DEFINE_float('max_outage_s', 1800.0, 'How long reading the runs and writing the report '
                   'retry a storage that is out of reach before the report stops.',
                   lower_bound=0.0)
flags.DEFINE_integer('bootstrap_reps', 50_000, 'Bootstrap resamples for the intervals of final '
                     'scores (rliable\'s default).')
flags.DEFINE_integer('curve_bootstrap_reps', 2_000, 'Bootstrap resamples per point of the '
                     'learning-curve bands.')
flags.DEFINE_integer('max_curve_points', 200, 'At most this many points per mean curve.')
flags.DEFINE_boolean('videos', True, 'Render a video of the best run of each configuration.')
flags.DEFINE_integer('video_max_steps', 200, 'Length limit of the video episodes.')
flags.DEFINE_integer('video_size', 256, 'Video frames are shrunk to at most this many pixels '
                     'a side.')
flags.DEFINE_multi_string('ignore_bindings', [run_dir.SEED_BINDING], 'Bindings that do not '
                          'tell configurations apart (the seed).')

FLAGS = flags.FLAGS


class UsageError(Exception):
    """Bad flags or paths, told in one sentence."""


@contextlib.contextmanager
def output_file(directory, relative):
    """A local path to write the report's file `relative` (e.g. 'plots/iqm.svg') to.

    Under a local `directory` (whose folders `build_pipeline` made) it is the file itself; under
    a URL it is a temporary file, uploaded to its place when the block ends without an error.
    """
    path = locations.join(directory, relative)
    if not locations.is_remote(path):
        yield path
        return
    with tempfile.TemporaryDirectory(prefix='report-') as local:
        local_path = os.path.join(local, posixpath.basename(relative))
        yield local_path
        with open(local_path, 'rb') as f:
            data = f.read()
        # The type lets browsers show the report from the store.
        file_io.write_bytes(path, data, mime_type=mimetypes.guess_type(relative)[0] or
                            'application/octet-stream')


@contextlib.contextmanager
def local_directory(directory):
    """`directory` itself if it is local, else a temporary copy of the files under the URL."""
    if not locations.is_remote(directory):
        yield directory
        return
    with tempfile.TemporaryDirectory(prefix='policy-') as copy:
        file_io.download_tree(directory, copy)
        yield copy


def _stage(function):
    """A stage of the pipeline, `function(element, ..., settings)`: in whichever worker process
    runs it, storage calls ride out an outage as long as the report's own do."""

    @functools.wraps(function)
    def stage(*args):
        outages.set_limit(args[-1].max_outage_s)
        return function(*args)
    return stage


@_stage
def read_run(item, settings):
    """Stage 1, per run: reads it and draws its curve."""
    logdir, trial = item
    run = run_reader.read_run(logdir, settings.input_dir, trial, settings.ignore_bindings)
    if run.error is None:
        try:
            with output_file(settings.output_dir, report_data.run_plot(run.run_id)) as path:
                plots.run_curve((run.eval_steps, run.eval_returns),
                                (run.train_steps, run.train_returns), path,
                                f'{run.run_id} (seed {run.seed})')
        except failures.OutageError:
            raise
        except Exception as error:  # A plot must not cost the run its place in the report.
            run.problems.append(f'cannot plot its curve: {type(error).__name__}: {error}')
    return run


@_stage
def summarize(item, settings):
    """Stage 2, per configuration: statistics and the curves plot."""
    key, runs = item
    runs = sorted(runs, key=report_data.run_order)
    config = report_data.summarize_configuration(key, runs, settings)
    with output_file(settings.output_dir, config['plot']) as path:
        plots.configuration_curve(
            config['curve'], [(f'seed {run.seed}' if run.seed is not None else run.run_id,
                               run.eval_steps, run.eval_returns) for run in runs],
            path, f'Evaluation return of {len(runs)} run(s)')
    return config


@_stage
def render_video(config, settings):
    """Stage 3, per configuration: the video of the best run that has a usable policy.

    A policy on object storage is copied down (that directory only) to be rendered.
    """
    if not settings.videos:
        return config
    unusable = []
    path = report_data.video_path(config['id'])
    for run_id, seed, policy_dir in config['video_candidates']:
        local_policy = policy_dir
        try:
            with local_directory(policy_dir) as local_policy, \
                    output_file(settings.output_dir, path) as video:
                info = _render_with_retry(local_policy, video, settings)
        except failures.OutageError:
            raise
        except Exception as error:  # One bad policy must not stop the report; it is listed.
            logging.warning('No video of %s: %s', run_id, error)
            # A message naming the policy's local copy names the policy.
            message = failures.first_line(error).replace(local_policy, policy_dir)
            unusable.append(f'{run_id}: {message}')
            continue
        config['video'] = dict(info, path=path, run=run_id, seed=seed)
        if run_id != config['best_run']:
            config['video_problem'] = (
                f'the best run {config["best_run"]} has no usable exported policy '
                f'({"; ".join(unusable) or "none exported"}); the video shows {run_id}')
        return config
    config['video_problem'] = ('no run of this configuration has a usable exported policy'
                               + (f': {"; ".join(unusable)}' if unusable else ''))
    return config


def _render_with_retry(policy_dir, path, settings, attempts=2):
    """`videos.render_policy`, tried again after a failure of the machinery (e.g. ffmpeg dying).

    A policy that cannot be rendered (`VideoError`) is not retried.
    """
    from pipelines.report import videos  # TensorFlow loads only where videos are made.

    for attempt in range(1, attempts + 1):
        try:
            return videos.render_policy(policy_dir, path, seed=settings.seed,
                                        max_steps=settings.video_max_steps,
                                        max_size=settings.video_size)
        except videos.VideoError:
            raise
        except Exception as error:
            if attempt == attempts:
                raise
            logging.warning('Rendering %s failed (%s: %s); trying again.', policy_dir,
                            type(error).__name__, failures.first_line(error))


@_stage
def write_report(unused_element, runs, configurations, discovery, settings):
    """Stage 4, once: the summary plots, the pages and report.json."""
    report = report_data.build_report(list(runs) + discovery.missing, list(configurations),
                                      discovery.problems, settings, discovery.rungs)
    directory = settings.output_dir
    ranked = report['configurations']
    if ranked:
        with output_file(directory, report['plots']['learning_curves']) as path:
            plots.learning_curves([(config['label'], config['curve']) for config in ranked],
                                  path)
        by_id = {config['id']: config for config in ranked}

        def intervals(configs):
            return [(config['label'], config['final']['iqm']['value'],
                     *config['final']['iqm']['ci']) for config in configs]

        groups = report['budget_groups']
        with output_file(directory, report['plots']['iqm']) as path:
            if len(groups) > 1:  # Final returns of different budgets are not compared.
                plots.grouped_interval_estimates(
                    [(group['title'], intervals(by_id[key] for key in group['configurations']))
                     for group in groups], path)
            else:
                plots.interval_estimates(intervals(ranked), path)
    for entry in report['plots']['sensitivity']:
        with output_file(directory, entry['plot']) as path:
            plots.sensitivity(entry['parameter'], [
                (point['value'], point['text'], point['scores'], point['iqm'], point['lower'],
                 point['upper']) for point in entry['points']], path,
                budget=entry['budget'])
    report_html.write_report(report, directory)
    return report['exit_code']


def build_pipeline(pipeline, discovery, settings):
    """The report pipeline's stages on `pipeline` (see the module docstring)."""
    if not locations.is_remote(settings.output_dir):
        for name in ('runs', 'plots', 'videos'):
            os.makedirs(os.path.join(settings.output_dir, name), exist_ok=True)
    runs = (pipeline
            | 'ListRuns' >> beam.Create(discovery.runs)
            | 'SpreadRuns' >> beam.Reshuffle()
            | 'ReadRuns' >> beam.Map(read_run, settings))
    configurations = (runs
                      | 'Readable' >> beam.Filter(lambda run: run.error is None)
                      | 'ByConfiguration' >> beam.Map(lambda run: (run.config_key, run))
                      | 'GroupConfigurations' >> beam.GroupByKey()
                      | 'Summarize' >> beam.Map(summarize, settings)
                      | 'SpreadConfigurations' >> beam.Reshuffle()
                      | 'RenderVideos' >> beam.Map(render_video, settings))
    all_runs = runs | 'AllRuns' >> beam.combiners.ToList()
    all_configurations = configurations | 'AllConfigurations' >> beam.combiners.ToList()
    return (pipeline
            | 'Once' >> beam.Create([None])
            | 'WriteReport' >> beam.Map(write_report, beam.pvalue.AsSingleton(all_runs),
                                        beam.pvalue.AsSingleton(all_configurations),
                                        discovery, settings))


def pipeline_options(beam_args):
    """Beam's options from the flags absl did not know; unknown ones are refused."""
    options = PipelineOptions(beam_args)
    parsers = []  # Beam's own parser of all its options, to find what it does not know.
    options.get_all_options(add_extra_args_fn=parsers.append)
    unknown = parsers[0].parse_known_args(beam_args)[1]
    if unknown:
        raise UsageError(f'unknown flag(s) or argument(s): {" ".join(unknown)} (neither a '
                         'report flag nor a Beam pipeline option)')
    # Options given, even at their default value (which get_all_options(drop_default) drops);
    # Beam's parser takes no abbreviations.
    given = {arg.split('=', 1)[0].removeprefix('--') for arg in beam_args
             if arg.startswith('--')}
    if 'default_sdk_harness_log_level' not in given:
        # Workers log warnings (a run without a video...), not Beam's chatter.
        options.view_as(WorkerOptions).default_sdk_harness_log_level = 'WARNING'
    if options.view_as(StandardOptions).runner in (None, 'DirectRunner'):
        direct = options.view_as(DirectOptions)
        if 'direct_running_mode' not in given:
            direct.direct_running_mode = 'multi_processing'
        if 'direct_num_workers' not in given or direct.direct_num_workers == 0:
            direct.direct_num_workers = os.cpu_count() or 1
        if direct.direct_num_workers < 1:
            raise UsageError(f'--direct_num_workers must be positive, got '
                             f'{direct.direct_num_workers}')
    return options


def default_runner(options):
    """The DirectRunner's engine for --runner=DirectRunner or none, else None (Beam picks).

    Beam's DirectRunner first tries its Prism runner, which downloads a binary from GitHub
    (failing without network, after a delay); its FnApiRunner engine needs nothing and honours
    --direct_num_workers and --direct_running_mode.
    """
    if options.view_as(StandardOptions).runner not in (None, 'DirectRunner'):
        return None
    from apache_beam.runners.portability.fn_api_runner import fn_runner
    return fn_runner.FnApiRunner()


def check_runner(options, settings):
    """Fails if the runner's workers run on other machines (Dataflow's), where local paths are
    not this machine's."""
    runner = options.view_as(StandardOptions).runner
    if runner and 'dataflow' in str(runner).lower():
        local = [f'--{name}' for name, path in (('input', settings.input_dir),
                                                ('output_dir', settings.output_dir))
                 if not locations.is_remote(path)]
        if local:
            raise UsageError(f'--runner={runner} runs the workers on other machines, which '
                             f'cannot reach the local {" and ".join(local)}: give gs:// URLs')


@contextlib.contextmanager
def storage_errors(url):
    """A failure to use URL `url` (library missing, no credentials, unknown bucket, permission
    denied) as a UsageError in one sentence; an outage longer than --max_outage_s passes."""
    try:
        with failures.storage_errors(url, keep=(UsageError,)):
            yield
    except failures.OutageError:
        raise
    except failures.StorageError as error:
        raise UsageError(str(error)) from error


def _contains(directory, path):
    if locations.is_remote(directory) != locations.is_remote(path):
        return False
    if locations.is_remote(directory):
        return path == directory or path.startswith(directory + '/')
    return os.path.commonpath([directory, path]) == directory


def check_output_dir(output_dir, input_dir):
    """Fails unless `output_dir` can take the report without losing anything else."""
    if locations.is_remote(output_dir):
        with storage_errors(output_dir):
            _check_remote_output_dir(output_dir, input_dir)
        return
    if os.path.exists(output_dir) and not os.path.isdir(output_dir):
        raise UsageError(f'output_dir {output_dir} exists and is not a directory')
    if _contains(output_dir, input_dir):
        raise UsageError(f'output_dir {output_dir} contains the input {input_dir}')
    if os.path.isdir(output_dir) and os.listdir(output_dir):
        if not _holds_report(output_dir):
            raise UsageError(f'output_dir {output_dir} is not empty and holds no earlier '
                             'report; choose a new or empty directory')
    unwritable = locations.unwritable_ancestor(os.path.dirname(output_dir))
    if unwritable:
        raise UsageError(f'cannot write output_dir {output_dir}: {unwritable} is not writable')


def _check_remote_output_dir(output_dir, input_dir):
    """`check_output_dir` of a URL; a probe object tells whether it can be written."""
    if _contains(output_dir, input_dir):
        raise UsageError(f'output_dir {output_dir} contains the input {input_dir}')
    file_io.check_writable(output_dir)
    # An object of that name (a bucket itself is none).
    if '/' in output_dir.split('://', 1)[1] and file_io.exists(output_dir):
        raise UsageError(f'output_dir {output_dir} exists and is a file, not a folder')
    if any(not name.startswith(STAGING_PREFIX) for name in file_io.list_files(output_dir)):
        if not _holds_report(output_dir):
            raise UsageError(f'output_dir {output_dir} is not empty and holds no earlier '
                             'report; choose a new or empty folder')


def _holds_report(directory):
    try:
        text = file_io.read_text(locations.join(directory, report_html.REPORT_FILE))
        return json.loads(text).get('format') == report_data.FORMAT
    except (OSError, ValueError, AttributeError):
        return False


def _directory_flag(path):
    """A --input or --output_dir: resolved (URLs unchanged) and without trailing slashes."""
    path = locations.resolve(path)
    return re.sub(r'(?<=[^/])/+$', '', path) if locations.is_remote(path) else path


def settings_from_flags():
    for name in ('input', 'output_dir'):
        if not getattr(FLAGS, name):
            raise UsageError(f'--{name} is required')
    for name in ('bootstrap_reps', 'curve_bootstrap_reps', 'max_curve_points',
                 'video_max_steps', 'video_size'):
        if getattr(FLAGS, name) < 1:
            raise UsageError(f'--{name} must be positive, got {getattr(FLAGS, name)}')
    input_dir = _directory_flag(FLAGS.input)
    if locations.is_remote(input_dir):
        with storage_errors(input_dir):
            if file_io.is_empty_directory(input_dir):
                raise UsageError(f'input {input_dir} does not exist: nothing is stored under it')
    elif not os.path.isdir(input_dir):
        raise UsageError(f'input {input_dir} does not exist or is not a directory')
    output_dir = _directory_flag(FLAGS.output_dir)
    check_output_dir(output_dir, input_dir)
    return report_data.Settings(
        input_dir=input_dir, output_dir=output_dir, seed=FLAGS.seed,
        bootstrap_reps=FLAGS.bootstrap_reps, curve_bootstrap_reps=FLAGS.curve_bootstrap_reps,
        max_curve_points=FLAGS.max_curve_points, videos=FLAGS.videos,
        video_max_steps=FLAGS.video_max_steps, video_size=FLAGS.video_size,
        ignore_bindings=tuple(FLAGS.ignore_bindings), max_outage_s=FLAGS.max_outage_s)


def make_report(settings, options=None):
    """Runs the pipeline into a staging folder, then moves it to `settings.output_dir`.

    The staging folder of a local report is beside it and renamed into place; that of a report
    on object storage is `<output_dir>/.staging-<id>/`, and `publish` moves its files.

    Returns:
      The report (report.json's content).
    """
    output_dir = settings.output_dir
    remote = locations.is_remote(output_dir)
    if remote:
        staging = locations.join(output_dir, STAGING_PREFIX + uuid.uuid4().hex[:12])
    else:
        parent = os.path.dirname(output_dir)
        os.makedirs(parent, exist_ok=True)
        staging = tempfile.mkdtemp(prefix=f'.{os.path.basename(output_dir)}.partial-',
                                   dir=parent)
    try:
        discovery = run_reader.find_runs(settings.input_dir, exclude=[output_dir])
        logging.info('Found %d runs under %s.', len(discovery.runs), settings.input_dir)
        staged = dataclasses.replace(settings, output_dir=staging)
        # Local worker processes import this tree as this process does.
        os.environ['PYTHONPATH'] = run_config.python_path(os.environ.get('PYTHONPATH', ''))
        options = options or PipelineOptions([])
        with beam.Pipeline(runner=default_runner(options), options=options) as pipeline:
            build_pipeline(pipeline, discovery, staged)
        report = json.loads(file_io.read_text(locations.join(staging, report_html.REPORT_FILE)))
        if remote:
            publish(staging, output_dir)
        else:
            run_config.replace_directory(staging, output_dir)
    finally:
        if remote:
            _remove_staging(staging)
        elif os.path.exists(staging):
            shutil.rmtree(staging)
    return report


def publish(staging, output_dir):
    """Moves the report under URL `staging` to URL `output_dir`, replacing an earlier one.

    Object stores rename no folders: each file is copied within the store. The earlier report's
    index.html goes first and the new one comes last, so that neither while the files are
    replaced nor after a failure does the folder have an index.html over the files of two
    reports; then the files of the earlier report that the new one lacks are removed.
    """
    staged = file_io.list_files(staging)
    earlier = [name for name in file_io.list_files(output_dir)
               if not name.startswith(STAGING_PREFIX)]
    index = report_html.INDEX_FILE
    file_io.delete([locations.join(output_dir, index)])
    _in_parallel(lambda name: _copy(locations.join(staging, name),
                                    locations.join(output_dir, name)),
                 [name for name in sorted(staged) if name != index])
    _copy(locations.join(staging, index), locations.join(output_dir, index))
    _in_parallel(lambda name: file_io.delete([locations.join(output_dir, name)]),
                 [name for name in earlier if name not in staged])


def _copy(source, destination):
    """Copies a file within an object store (the data does not pass through here)."""
    backends.filesystems(source).copy([source], [destination])


def _remove_staging(staging):
    try:
        _in_parallel(lambda name: file_io.delete([locations.join(staging, name)]),
                     file_io.list_files(staging))
    except Exception as error:  # Left behind, it is ignored by later reports.
        logging.warning('Could not remove the staging files %s: %s', staging, error)


def _in_parallel(function, items, threads=8):
    """Calls `function` on each item, in threads (object-store requests mostly wait)."""
    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        list(pool.map(function, items))


def parse_flags(argv):
    """absl's flags; the rest (Beam's) stays in argv for `main`."""
    try:
        return FLAGS(argv, known_only=True)
    except flags.Error as error:
        print(f'report: error: {error}', file=sys.stderr)
        sys.exit(EXIT_USAGE)


def main(argv):
    outages.set_limit(FLAGS.max_outage_s)
    try:
        options = pipeline_options(argv[1:])
        settings = settings_from_flags()
        check_runner(options, settings)
    except UsageError as error:
        print(f'report: error: {error}', file=sys.stderr)
        return EXIT_USAGE
    except failures.OutageError as error:
        print(f'report: error: {error}', file=sys.stderr)
        return EXIT_FAILED
    # Beam's own progress lines (also those the workers send here) only at warnings.
    std_logging.getLogger('apache_beam').setLevel(std_logging.WARNING)
    try:
        report = make_report(settings, options)
    except Exception as error:  # pylint: disable=broad-except
        outage = failures.outage_in(error)  # Raised here, or in a worker (Beam's text of it).
        if outage is None:
            raise
        print(f'report: error: {outage}', file=sys.stderr)
        return EXIT_FAILED
    print(f'Report of {report["num_runs"]} runs in {len(report["configurations"])} '
          f'configurations ({report["num_skipped"]} skipped, {len(report["problems"])} '
          f'problems): {locations.join(settings.output_dir, report_html.INDEX_FILE)}')
    for entry in report['skipped']:
        print(f'  skipped {entry["run"]}: {entry["reason"]}')
    for entry in report['problems']:
        print(f'  problem {entry["run"] or ""}: {entry["problem"]}')
    return report['exit_code']


def run():
    """The console script's entry point."""
    # `--helpshort` lists the flags of the program's own file, not this module's, when the
    # program is a console script.
    for flag in FLAGS.get_key_flags_for_module(sys.modules[__name__]):
        FLAGS.register_key_flag_for_module(sys.argv[0], flag)
    # TensorFlow loads in the pipeline's workers (reading event files, rendering videos), which
    # write to this process's stderr and inherit its environment: quiet for the whole run.
    with log_noise.tensorflow_start():
        app.run(main, flags_parser=parse_flags)


if __name__ == '__main__':
    run()
