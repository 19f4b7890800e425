r"""Trains the algorithm a config names (`train.algorithm`).

    bazel run //agents:train -- --gin_file=configs/pendulum.gin

Flags choose the configuration (gin files and bindings), the log directory and the seed; gin
configures everything else (see configs/). Rerunning with an existing --logdir resumes the run
from its latest checkpoint; a logdir that holds a different configuration, or that another
trainer is using, is refused. Only a larger `train.total_steps` is accepted (with a warning: the
schedules then run to the new budget from the current step on). `--stop_at_step=N` stops the run
at step N (whole iterations) with a checkpoint and an evaluation, without changing its
configuration: rerunning without it (or with a later one) continues the same run.

With BATCHPPO_XLA_CACHE_DIR set (e.g. to ~/.cache/batchppo/xla), XLA's compiled programs are kept
in that directory, where a later run of the same program (a rerun, a resumed run, another seed of
the same configuration) loads them instead of compiling them again (agents/runs/xla_cache.py).

Everything the configuration can get wrong is checked before the logdir is touched. Exit status:
0 when the run reached its budget or --stop_at_step; 1 on bad input or when training stopped on a
fault (the message, `train: error: ...`, names it and what was kept); 128 + the signal's number
(143 for SIGTERM, 130 for SIGINT / Ctrl-C) when a signal stopped the run: before training began,
at once; during training, after the current compiled call and a checkpoint (see
docs/run_loop.md); a second signal stops it at once.
"""

import datetime
import gc
import os
import platform
import sys
import time

# Loading TensorFlow and the rest makes hundreds of thousands of objects that live as long as
# the process, which the garbage collector would scan several times while they are made. It
# pauses for the imports, which then leave its sight (`gc.freeze`).
_collecting = gc.isenabled()
gc.disable()

from absl import app, flags, logging  # noqa: E402

from agents.runs import xla_cache  # noqa: E402 (imports no TensorFlow)
from agents.scripts import lean_start, log_noise  # noqa: E402 (import no TensorFlow)
from agents.storage import failures, locations  # noqa: E402 (import no TensorFlow)

# XLA's compilation cache is a setting of the process that TensorFlow reads as it loads.
try:
    xla_cache.enable_from_environment()
    _xla_cache_error = None
except xla_cache.CacheError as error:
    _xla_cache_error = error

# TensorFlow's start-up lines only when asked for; matplotlib, which Keras would load, not at all.
with log_noise.tensorflow_start(), lean_start.without_matplotlib():
    import gin

    from agents.algorithms import registry  # noqa: F401 (registers the algorithms)
    from agents.runs import faults, loop, remote_logdir, run_config, run_dir, run_settings
    from agents.tools import stop_signals

gc.freeze()
if _collecting:
    gc.enable()

flags.DEFINE_multi_string(
    'gin_file', [], 'Gin config file(s), e.g. configs/pendulum.gin; relative paths are resolved '
    'against the directory you ran the command from, then against the bundled configs.')
flags.DEFINE_multi_string(
    'gin_bindings', [], "Gin bindings overriding the files, e.g. 'train.total_steps = 50000'.")
flags.DEFINE_string(
    'logdir', None, 'Directory for summaries, checkpoints and metrics, local or a bucket path '
    '(gs://bucket/run: trained in a local copy uploaded at every evaluation); default '
    'logs/<config>-<timestamp> under the directory you ran the command from. An existing '
    'logdir of the same configuration is resumed.')
flags.DEFINE_integer('seed', None, 'Seeds the environments, network initialization and '
                     'sampling (a non-negative integer); default: the configuration\'s '
                     'train.seed, else 0.', lower_bound=0)

flags.DEFINE_integer(
    'stop_at_step', None, 'Stop at the first iteration end at or past this environment step, '
    'with a checkpoint and an evaluation, short of train.total_steps; not part of the '
    'configuration: rerun without it (or with a later one) to continue the run with the same '
    'schedules.', lower_bound=1)
FLAGS = flags.FLAGS


def default_logdir(gin_files):
    name = os.path.splitext(os.path.basename(gin_files[-1]))[0] if gin_files else 'run'
    stamp = datetime.datetime.now().strftime('%Y%m%d-%H%M%S')
    return os.path.join('logs', f'{name}-{stamp}')


# A stop signal ends the process within this many seconds in every state (a preemption
# notice is 30 s): what is saved by then stays, a bucket's pending saves in the staging
# directory.
STOP_GRACE_S = 25.0
# Of that, what a stop leaves to the pending uploads.
STOP_UPLOAD_S = 15.0


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f'Unexpected arguments: {" ".join(argv[1:])}')
    log_noise.quiet()
    staged = []  # The run's StagedLogdir, once there is one (for the last words of a stop).
    with stop_signals.StopSignals(
            grace_s=STOP_GRACE_S,
            last_words=lambda: staged[0].describe() if staged else None) as signals:
        sys.exit(_main(signals, staged))


def _main(signals, staged_box):
    """Checks, prepares and trains; returns the exit status (or an error message)."""
    staged = None
    try:
        config = run_config.load(FLAGS.gin_file, FLAGS.gin_bindings, seed=FLAGS.seed,
                                 default_seed=run_settings.RunSettings.seed)
        loop.check_config()
        staging = remote_logdir.staging_settings()
        run_settings.configure_threads()
        if _xla_cache_error is not None:
            raise run_config.ConfigError(f'{xla_cache.ENV_VAR}: {_xla_cache_error}')
        logdir = locations.resolve(FLAGS.logdir or default_logdir(FLAGS.gin_file))
        if locations.is_remote(logdir):
            # Access, the lease and the run's files first: the checks below read the copy.
            staged = remote_logdir.StagedLogdir(logdir, settings=staging)
            staged_box.append(staged)
            local = staged.open()
        else:
            local = logdir
        run_config.check_logdir(local, config, _config_file())
    except (run_config.ConfigError, failures.StorageError, stop_signals.StopRequested) as error:
        status = _status(error, staged)  # Before close forgets the copy.
        if staged is not None:
            with signals.deferred():
                staged.close(sync=False)
        return status
    status = 1
    try:
        status = _train(logdir, local, config, staged, signals)
    finally:
        if staged is not None:
            with signals.deferred():  # The last save goes to the bucket whole.
                status = _close(staged, status, signals)
    return status


def _status(error, staged):
    """The exit status of a run that ended before training with `error`."""
    if isinstance(error, stop_signals.StopRequested):
        sys.stderr.write(f'train: {error} before training began; nothing was saved.\n')
        return 128 + error.signum
    return f'train: error: {_in_bucket(error, staged)}'


def _train(logdir, local, config, staged, signals):
    """Trains in `local` (the logdir or its staging copy); returns the exit status."""
    try:
        with loop.training_run(local) as run:
            run.check()
            # Only now, with the configuration known to build, is the logdir touched.
            lock = run_config.lock_logdir(local)
            holder = lock.previous_holder
            if holder.get('pid') not in (None, os.getpid()):
                logging.info('Took over the lock of %s from pid %s, which no longer runs.',
                             local, holder['pid'])
            run_config.prepare_logdir(local, config, _config_file())
            after_save = status = None
            if staged is not None:
                def after_save():
                    staged.sync(should_stop=lambda: signals.signum is not None)
                status = staged.status
                after_save()  # The run's configuration goes to the bucket from the start.
                logging.info('Logdir: %s (staged in %s; Python %s)', logdir, local,
                             platform.python_version())
            else:
                logging.info('Logdir: %s (Python %s)', logdir, platform.python_version())
            run.run(after_save=after_save, signals=signals, stop_at_step=FLAGS.stop_at_step,
                    status=status)
    except (run_config.ConfigError, failures.StorageError, stop_signals.StopRequested) as error:
        return _status(error, staged)
    except faults.Interrupted as error:
        sys.stderr.write(f'train: {error}\n')
        return 128 + error.signum
    except faults.TrainingError as error:
        return f'train: error: {error}'
    return 0


def _config_file():
    """Where the logdir keeps the configuration: a population's is not a run of its own (its
    members' directories are)."""
    try:
        population = gin.query_parameter('train.population')
    except ValueError:
        population = 1
    return (run_dir.POPULATION_CONFIG_FILE if isinstance(population, int) and population > 1
            else run_dir.CONFIG_FILE)


def _in_bucket(error, staged):
    """The error's text, naming the bucket's run rather than its local copy."""
    text = str(error)
    return text if staged is None or staged.local is None else text.replace(
        staged.local, staged.url)


def _close(staged, status, signals):
    """Uploads what the run saved last and releases the bucket's run; returns the exit status
    (a failed upload turns success into an error). After a stop signal the uploads get what is
    left of STOP_UPLOAD_S; what did not reach the bucket stays in the staging directory."""
    timeout = None
    if signals.received_at is not None:
        timeout = max(0.0, STOP_UPLOAD_S - (time.monotonic() - signals.received_at))
    try:
        staged.close(sync=True, timeout_s=timeout,
                     should_stop=lambda: timeout is None and signals.signum is not None)
        if signals.received_at is not None:
            sys.stderr.write(f'train: all saves reached {staged.url}.\n')
    except Exception as error:  # Storage clients raise their own types.
        message = f'train: error: cannot store the run in {staged.url}: {error}'
        if status in (0, None):
            return message
        if str(error) not in str(status):  # Not the error the run stopped with.
            sys.stderr.write(message + '\n')
    return status


def run():
    """The console script's entry point."""
    # `--helpshort` lists the flags of the program's own file, not this module's, when the
    # program is a console script.
    for flag in FLAGS.get_key_flags_for_module(sys.modules[__name__]):
        FLAGS.register_key_flag_for_module(sys.argv[0], flag)
    app.run(main)


if __name__ == '__main__':
    run()
