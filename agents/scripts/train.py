r"""Trains a PPO agent: `bazel run //agents:train -- --gin_file=configs/pendulum.gin`.

Flags choose the configuration (gin files and bindings), the log directory and the seed; gin
configures everything else (see configs/). Rerunning with an existing --logdir resumes the run
from its latest checkpoint; a logdir that holds a different configuration, or that another
trainer is using, is refused.

Everything the configuration can get wrong is checked before the logdir is touched. Exit status:
0 when the run reached its budget; 1 on bad input or when training stopped on a fault (the
message, `train: error: ...`, names it and what was kept); 128 + the signal's number (143 for
SIGTERM, 130 for SIGINT / Ctrl-C) when a signal stopped the run after saving a checkpoint.
"""

import datetime
import gc
import os
import sys

# Loading TensorFlow and the rest makes ~400k objects that live as long as the process, and the
# garbage collector scanned them all several times while they were being made: 0.5 to 0.8 s of
# every start (measured). It pauses for the imports, which then leave its sight (`gc.freeze`).
_collecting = gc.isenabled()
gc.disable()

from absl import app, flags, logging  # noqa: E402

from agents.algorithms.ppo import trainer  # noqa: E402
from agents.scripts import log_noise, run_config  # noqa: E402

gc.freeze()
if _collecting:
    gc.enable()

flags.DEFINE_multi_string(
    'gin_file', [], 'Gin config file(s), e.g. configs/pendulum.gin; relative paths are resolved '
    'against the directory you ran the command from, then against the bundled configs.')
flags.DEFINE_multi_string(
    'gin_bindings', [], "Gin bindings overriding the files, e.g. 'train.total_steps = 50000'.")
flags.DEFINE_string(
    'logdir', None, 'Directory for summaries, checkpoints and metrics; default '
    'logs/<config>-<timestamp> under the directory you ran the command from. An existing '
    'logdir of the same configuration is resumed.')
flags.DEFINE_integer('seed', 0, 'Seeds the environments, network initialization and sampling '
                     '(a non-negative integer).', lower_bound=0)

FLAGS = flags.FLAGS


def default_logdir(gin_files):
    name = os.path.splitext(os.path.basename(gin_files[-1]))[0] if gin_files else 'run'
    stamp = datetime.datetime.now().strftime('%Y%m%d-%H%M%S')
    return os.path.join('logs', f'{name}-{stamp}')


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f'Unexpected arguments: {" ".join(argv[1:])}')
    log_noise.quiet()
    try:
        config = run_config.load(FLAGS.gin_file, FLAGS.gin_bindings, seed=FLAGS.seed)
        trainer.check_config()
        trainer.configure_threads()
        logdir = run_config.resolve_path(FLAGS.logdir or default_logdir(FLAGS.gin_file))
        run_config.check_logdir(logdir, config)
    except run_config.ConfigError as error:
        sys.exit(f'train: error: {error}')
    try:
        with trainer.training_run(logdir) as run:
            run.check()
            # Only now, with the configuration known to build, is the logdir touched.
            lock = run_config.lock_logdir(logdir)
            holder = lock.previous_holder
            if holder.get('pid') not in (None, os.getpid()):
                logging.info('Took over the lock of %s from pid %s, which no longer runs.',
                             logdir, holder['pid'])
            run_config.prepare_logdir(logdir, config)
            logging.info('Logdir: %s', logdir)
            run.run()
    except run_config.ConfigError as error:
        sys.exit(f'train: error: {error}')
    except trainer.Interrupted as error:
        sys.stderr.write(f'train: {error}\n')
        sys.exit(128 + error.signum)
    except trainer.TrainingError as error:
        sys.exit(f'train: error: {error}')


if __name__ == '__main__':
    app.run(main)
