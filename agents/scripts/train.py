r"""Trains a PPO agent: `bazel run //agents:train -- --gin_file=configs/pendulum.gin`.

Flags choose the configuration (gin files and bindings), the log directory and the seed; gin
configures everything else (see configs/). Rerunning with an existing --logdir resumes the run
from its latest checkpoint; a logdir that holds a different configuration is refused.
"""

import datetime
import os
import sys

from absl import app, flags, logging

from agents.algorithms.ppo import trainer
from agents.scripts import run_config

flags.DEFINE_multi_string(
    'gin_file', [], 'Gin config file(s), e.g. configs/pendulum.gin; relative paths are resolved '
    'against the directory you ran the command from, then against the bundled configs.')
flags.DEFINE_multi_string(
    'gin_bindings', [], "Gin bindings overriding the files, e.g. 'train.total_steps = 50000'.")
flags.DEFINE_string(
    'logdir', None, 'Directory for summaries, checkpoints and metrics; default '
    'logs/<config>-<timestamp> under the directory you ran the command from. An existing '
    'logdir of the same configuration is resumed.')
flags.DEFINE_integer('seed', 0, 'Seeds the environments, network initialization and sampling.')

FLAGS = flags.FLAGS


def default_logdir(gin_files):
    name = os.path.splitext(os.path.basename(gin_files[-1]))[0] if gin_files else 'run'
    stamp = datetime.datetime.now().strftime('%Y%m%d-%H%M%S')
    return os.path.join('logs', f'{name}-{stamp}')


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f'Unexpected arguments: {" ".join(argv[1:])}')
    try:
        config = run_config.load(FLAGS.gin_file, FLAGS.gin_bindings, seed=FLAGS.seed)
        trainer.check_config()
        trainer.configure_threads()
        logdir = run_config.prepare_logdir(
            run_config.resolve_path(FLAGS.logdir or default_logdir(FLAGS.gin_file)), config)
    except run_config.ConfigError as error:
        sys.exit(f'train: error: {error}')
    logging.info('Logdir: %s', logdir)
    try:
        trainer.train(logdir=logdir)
    except run_config.ConfigError as error:
        sys.exit(f'train: error: {error}')


if __name__ == '__main__':
    app.run(main)
