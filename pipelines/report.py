r"""Training runs to a report: `bazel run //pipelines:report -- --input=DIR --output_dir=DIR`.

--input is a sweep's output directory (pipelines/sweep.py) or any directory tree of run logdirs.
An Apache Beam pipeline reads every run in parallel (one element per run: its gin bindings,
`metrics.jsonl`, TensorBoard events, exported policy), groups the runs into configurations
(same bindings but the seed), computes each configuration's statistics and renders the final
policy of its best seed to a video (one element per configuration), then gathers everything
into one element that draws the summary plots and writes `index.html`, a page per run and
`report.json` (see report_data.py for what they hold).

By default Beam's DirectRunner runs it in worker processes, one per core, as the sweep does
(--direct_running_mode=in_memory keeps it in this process); any other Beam flag (--runner,
...) goes to Beam unchanged. The report is written to a temporary folder beside --output_dir
and moved there when complete, so a failed run keeps the previous report; an existing
--output_dir must be empty or hold an earlier report.

Exit codes:
  0  every run was read completely;
  3  the report was written, but some runs were skipped or read only in part (each is listed
     in the report with the reason: no evaluation results, a corrupt event file or
     metrics.jsonl line, a failed trial, no exported policy for a video...);
  4  the report was written, but --input holds no runs;
  2  bad flags or paths: nothing was written;
  1  the pipeline failed: nothing was written.
"""

import dataclasses
import json
import logging as std_logging
import os
import shutil
import sys
import tempfile

import apache_beam as beam
from absl import app, flags, logging
from apache_beam.options.pipeline_options import (
    DirectOptions,
    PipelineOptions,
    StandardOptions,
    WorkerOptions,
)

from agents.scripts import run_config
from pipelines import plots, report_data, report_html, run_reader

EXIT_USAGE = 2

flags.DEFINE_string('input', None, 'A sweep output directory or any directory tree of runs.')
flags.DEFINE_string('output_dir', None, 'Directory for the report (index.html, report.json, '
                    'plots, videos); must be empty, new, or hold an earlier report.')
flags.DEFINE_integer('seed', 0, 'Seeds the bootstrap and the episodes of the videos.')
flags.DEFINE_integer('bootstrap_reps', 50_000, 'Bootstrap resamples for the intervals of final '
                     'scores (rliable\'s default).')
flags.DEFINE_integer('curve_bootstrap_reps', 2_000, 'Bootstrap resamples per point of the '
                     'learning-curve bands.')
flags.DEFINE_integer('max_curve_points', 200, 'At most this many points per mean curve.')
flags.DEFINE_boolean('videos', True, 'Render a video of the best run of each configuration.')
flags.DEFINE_integer('video_max_steps', 200, 'Length limit of the video episodes.')
flags.DEFINE_integer('video_size', 256, 'Video frames are shrunk to at most this many pixels '
                     'a side.')
flags.DEFINE_multi_string('ignore_bindings', [run_reader.SEED_BINDING], 'Bindings that do not '
                          'tell configurations apart (the seed).')

FLAGS = flags.FLAGS


class UsageError(Exception):
    """Bad flags or paths, told in one sentence."""


def read_run(item, settings):
    """Stage 1, per run: reads it and draws its curve."""
    logdir, trial = item
    run = run_reader.read_run(logdir, settings.input_dir, trial, settings.ignore_bindings)
    if run.error is None:
        try:
            plots.run_curve((run.eval_steps, run.eval_returns),
                            (run.train_steps, run.train_returns),
                            os.path.join(settings.output_dir, report_data.run_plot(run.run_id)),
                            f'{run.run_id} (seed {run.seed})')
        except Exception as error:  # A plot must not cost the run its place in the report.
            run.problems.append(f'cannot plot its curve: {type(error).__name__}: {error}')
    return run


def summarize(item, settings):
    """Stage 2, per configuration: statistics and the curves plot."""
    key, runs = item
    runs = sorted(runs, key=report_data.run_order)
    config = report_data.summarize_configuration(key, runs, settings)
    plots.configuration_curve(
        config['curve'], [(f'seed {run.seed}' if run.seed is not None else run.run_id,
                           run.eval_steps, run.eval_returns) for run in runs],
        os.path.join(settings.output_dir, config['plot']),
        f'Evaluation return of {len(runs)} run(s)')
    return config


def render_video(config, settings):
    """Stage 3, per configuration: the video of the best run that has a usable policy."""
    if not settings.videos:
        return config
    failures = []
    path = report_data.video_path(config['id'])
    for run_id, seed, policy_dir in config['video_candidates']:
        try:
            info = _render_with_retry(policy_dir, os.path.join(settings.output_dir, path),
                                      settings)
        except Exception as error:  # One bad policy must not stop the report; it is listed.
            logging.warning('No video of %s: %s', run_id, error)
            failures.append(f'{run_id}: {_first_line(error)}')
            continue
        config['video'] = dict(info, path=path, run=run_id, seed=seed)
        if run_id != config['best_run']:
            config['video_problem'] = (
                f'the best run {config["best_run"]} has no usable exported policy '
                f'({"; ".join(failures) or "none exported"}); the video shows {run_id}')
        return config
    config['video_problem'] = ('no run of this configuration has a usable exported policy'
                               + (f': {"; ".join(failures)}' if failures else ''))
    return config


def _render_with_retry(policy_dir, path, settings, attempts=2):
    """`videos.render_policy`, tried again after a failure of the machinery (e.g. ffmpeg dying).

    A policy that cannot be rendered (`VideoError`) is not retried.
    """
    from pipelines import videos  # TensorFlow loads only where videos are made.

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
                            type(error).__name__, _first_line(error))


def _first_line(error):
    lines = str(error).strip().splitlines()
    return lines[0] if lines else type(error).__name__


def write_report(unused_element, runs, configurations, discovery, settings):
    """Stage 4, once: the summary plots, the pages and report.json."""
    report = report_data.build_report(list(runs) + discovery.missing, list(configurations),
                                      discovery.problems, settings)
    directory = settings.output_dir
    os.makedirs(os.path.join(directory, 'plots'), exist_ok=True)
    ranked = report['configurations']
    if ranked:
        plots.learning_curves([(config['label'], config['curve']) for config in ranked],
                              os.path.join(directory, report['plots']['learning_curves']))
        plots.interval_estimates(
            [(config['label'], config['final']['iqm']['value'], *config['final']['iqm']['ci'])
             for config in ranked], os.path.join(directory, report['plots']['iqm']))
    for entry in report['plots']['sensitivity']:
        plots.sensitivity(entry['parameter'], [
            (point['value'], point['text'], point['scores'], point['iqm'], point['lower'],
             point['upper']) for point in entry['points']],
            os.path.join(directory, entry['plot']))
    report_html.write_report(report, directory)
    return report['exit_code']


def build_pipeline(pipeline, discovery, settings):
    """The report pipeline's stages on `pipeline` (see the module docstring)."""
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


def check_output_dir(output_dir, input_dir):
    """Fails unless `output_dir` can take the report without losing anything else."""
    if os.path.exists(output_dir) and not os.path.isdir(output_dir):
        raise UsageError(f'output_dir {output_dir} exists and is not a directory')
    if os.path.commonpath([output_dir, input_dir]) == output_dir:
        raise UsageError(f'output_dir {output_dir} contains the input {input_dir}')
    if os.path.isdir(output_dir) and os.listdir(output_dir):
        if not _holds_report(output_dir):
            raise UsageError(f'output_dir {output_dir} is not empty and holds no earlier '
                             'report; choose a new or empty directory')
    parent = os.path.dirname(output_dir)
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent) or not os.access(parent, os.W_OK):
        raise UsageError(f'cannot write output_dir {output_dir}: {parent} is not writable')


def _holds_report(directory):
    try:
        with open(os.path.join(directory, report_html.REPORT_FILE), encoding='utf-8') as f:
            return json.load(f).get('format') == report_data.FORMAT
    except (OSError, ValueError, AttributeError):
        return False


def settings_from_flags():
    for name in ('input', 'output_dir'):
        if not getattr(FLAGS, name):
            raise UsageError(f'--{name} is required')
    for name in ('bootstrap_reps', 'curve_bootstrap_reps', 'max_curve_points',
                 'video_max_steps', 'video_size'):
        if getattr(FLAGS, name) < 1:
            raise UsageError(f'--{name} must be positive, got {getattr(FLAGS, name)}')
    input_dir = run_config.resolve_path(FLAGS.input)
    if not os.path.isdir(input_dir):
        raise UsageError(f'input {input_dir} does not exist or is not a directory')
    output_dir = run_config.resolve_path(FLAGS.output_dir)
    check_output_dir(output_dir, input_dir)
    return report_data.Settings(
        input_dir=input_dir, output_dir=output_dir, seed=FLAGS.seed,
        bootstrap_reps=FLAGS.bootstrap_reps, curve_bootstrap_reps=FLAGS.curve_bootstrap_reps,
        max_curve_points=FLAGS.max_curve_points, videos=FLAGS.videos,
        video_max_steps=FLAGS.video_max_steps, video_size=FLAGS.video_size,
        ignore_bindings=tuple(FLAGS.ignore_bindings))


def make_report(settings, options=None):
    """Runs the pipeline into a staging folder, then moves it to `settings.output_dir`.

    Returns:
      The report (report.json's content).
    """
    output_dir = settings.output_dir
    parent = os.path.dirname(output_dir)
    os.makedirs(parent, exist_ok=True)
    staging = tempfile.mkdtemp(prefix=f'.{os.path.basename(output_dir)}.partial-', dir=parent)
    try:
        discovery = run_reader.find_runs(settings.input_dir, exclude=[output_dir])
        logging.info('Found %d runs under %s.', len(discovery.runs), settings.input_dir)
        staged = dataclasses.replace(settings, output_dir=staging)
        # Local worker processes import this tree as this process does.
        os.environ['PYTHONPATH'] = run_config.python_path(os.environ.get('PYTHONPATH', ''))
        options = options or PipelineOptions([])
        with beam.Pipeline(runner=default_runner(options), options=options) as pipeline:
            build_pipeline(pipeline, discovery, staged)
        with open(os.path.join(staging, report_html.REPORT_FILE), encoding='utf-8') as f:
            report = json.load(f)
        run_config.replace_directory(staging, output_dir)
    finally:
        if os.path.exists(staging):
            shutil.rmtree(staging)
    return report


def parse_flags(argv):
    """absl's flags; the rest (Beam's) stays in argv for `main`."""
    try:
        return FLAGS(argv, known_only=True)
    except flags.Error as error:
        print(f'report: error: {error}', file=sys.stderr)
        sys.exit(EXIT_USAGE)


def main(argv):
    try:
        options = pipeline_options(argv[1:])
        settings = settings_from_flags()
    except UsageError as error:
        print(f'report: error: {error}', file=sys.stderr)
        return EXIT_USAGE
    # Beam's own progress lines (also those the workers send here) only at warnings.
    std_logging.getLogger('apache_beam').setLevel(std_logging.WARNING)
    report = make_report(settings, options)
    print(f'Report of {report["num_runs"]} runs in {len(report["configurations"])} '
          f'configurations ({report["num_skipped"]} skipped, {len(report["problems"])} '
          f'problems): {os.path.join(settings.output_dir, report_html.INDEX_FILE)}')
    for entry in report['skipped']:
        print(f'  skipped {entry["run"]}: {entry["reason"]}')
    for entry in report['problems']:
        print(f'  problem {entry["run"] or ""}: {entry["problem"]}')
    return report['exit_code']


if __name__ == '__main__':
    app.run(main, flags_parser=parse_flags)
