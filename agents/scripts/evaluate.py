r"""Evaluates a policy without rendering: `bazel run //agents:evaluate -- --policy=... `.

Runs --num_episodes episodes of the deterministic policy of an exported SavedModel (--policy,
e.g. <logdir>/policy/<step>) or of a run's checkpoint (--logdir, optionally --checkpoint) and
prints their statistics as JSON (mean, std, min, max of the returns and lengths), also written
to --output if given. The environment is the one the policy was trained in (with the run's
wrappers), or --env_id with the same wrappers, whose spaces must then fit the policy. Episode
`i` starts from seed `--seed + i`, as in `//agents:visualize`.
"""

import json
import os
import sys

from absl import app, flags, logging

from agents.algorithms.ppo import policy_export, restore
from agents.scripts import log_noise, run_config
from agents.tools import evaluation

flags.DEFINE_string('policy', None, 'Directory of an exported policy (a SavedModel).')
flags.DEFINE_string('logdir', None, 'Log directory of a training run, instead of --policy.')
flags.DEFINE_string('checkpoint', None, 'With --logdir: a step number of the run or a '
                    'checkpoint path; default the latest.')
flags.DEFINE_string('env_id', None, 'Gymnasium environment id; default the one trained on.')
flags.DEFINE_integer('num_episodes', 10, 'Episodes to run.')
flags.DEFINE_integer('seed', 0, 'Episode i resets the environment with seed seed + i.')
flags.DEFINE_string('output', None, 'File to write the metrics JSON to (also printed).')

FLAGS = flags.FLAGS


def check_output(path):
    if os.path.isdir(path):
        raise run_config.ConfigError(f'output {path} is a directory')
    parent = os.path.dirname(path) or '.'
    if not os.path.isdir(parent) or not os.access(parent, os.W_OK):
        raise run_config.ConfigError(f'cannot write output {path}: {parent} is not a writable '
                                     'directory')


def load_policy():
    """The policy, the environment it runs in, and what describes the policy in the metrics."""
    if bool(FLAGS.policy) == bool(FLAGS.logdir):
        raise run_config.ConfigError('give exactly one of --policy and --logdir')
    if FLAGS.policy:
        if FLAGS.checkpoint:
            raise run_config.ConfigError('--checkpoint goes with --logdir, not --policy')
        directory = run_config.resolve_path(FLAGS.policy)
        try:
            policy = policy_export.SavedPolicy(directory)
        except policy_export.PolicyLoadError as error:
            raise run_config.ConfigError(str(error)) from error
        if not policy.config:
            raise run_config.ConfigError(f'policy {directory} does not record the configuration '
                                         'of its run, so its environment is unknown')
        environment = restore.environment_from_config(policy.config)
        spaces = policy.observation_space, policy.action_space
        source = {'policy': directory, 'step': policy.step}
    else:
        run = restore.restore_agent(run_config.resolve_path(FLAGS.logdir), FLAGS.checkpoint)
        policy = restore.AgentPolicy(run.agent)
        environment = run.environment
        spaces = run.observation_space, run.action_space
        source = {'logdir': run_config.resolve_path(FLAGS.logdir),
                  'checkpoint': run.checkpoint, 'step': run.step}
    env = environment.make(FLAGS.env_id)
    try:
        evaluation.check_spaces(env, *spaces)
    except ValueError as error:
        env.close()
        raise run_config.ConfigError(str(error)) from error
    return policy, env, dict(source, env_id=FLAGS.env_id or environment.env_id)


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f'Unexpected arguments: {" ".join(argv[1:])}')
    log_noise.quiet()
    try:
        if FLAGS.num_episodes < 1:
            raise run_config.ConfigError(
                f'--num_episodes must be positive, got {FLAGS.num_episodes}')
        output = run_config.resolve_path(FLAGS.output) if FLAGS.output else None
        if output:
            check_output(output)
        policy, env, source = load_policy()
    except run_config.ConfigError as error:
        sys.exit(f'evaluate: error: {error}')
    try:
        episodes = []
        for episode in evaluation.iterate_episodes(env, policy, FLAGS.num_episodes, FLAGS.seed):
            logging.info('Episode %d/%d: return %.2f, %d steps.', episode.index + 1,
                         FLAGS.num_episodes, episode.episode_return, episode.length)
            episodes.append(episode)
    finally:
        env.close()
    metrics = dict(source, seed=FLAGS.seed, **evaluation.summarize(episodes))
    text = json.dumps(metrics, indent=2) + '\n'
    if output:
        run_config.write_atomic(output, text)
    sys.stdout.write(text)


if __name__ == '__main__':
    app.run(main)
