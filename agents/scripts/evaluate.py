r"""Evaluates a policy without rendering: `bazel run //agents:evaluate -- --policy=... `.

Runs --num_episodes episodes of the deterministic policy of an exported SavedModel (--policy,
e.g. <logdir>/policy/<step>) or of a run's checkpoint (--logdir, optionally --checkpoint) and
prints their statistics as JSON (mean, std, min, max of the returns and lengths), also written
to --output if given. The environment is the one the policy was trained in (with the run's
wrappers), or --env_id with the same wrappers, whose spaces must then fit the policy. Episode
`i` starts from seed `--seed + i`, as in `//agents:visualize`. --policy, --logdir and --output
may be bucket URLs (gs://...): the policy or the run's checkpoints are read from a local copy,
the output is uploaded.
"""

import json
import os
import sys

from absl import app, flags, logging

from agents.scripts import lean_start, log_noise  # import no TensorFlow

# TensorFlow's start-up lines only when asked for; matplotlib, which Keras would load, not at all.
with log_noise.tensorflow_start(), lean_start.without_matplotlib():
    from agents.algorithms import registry  # noqa: F401 (registers the algorithms)
    from agents.runs import policy_export, remote_logdir, restore, run_config
    from agents.storage import failures, file_io, locations
    from agents.tools import evaluation

flags.DEFINE_string('policy', None, 'Directory of an exported policy (a SavedModel).')
flags.DEFINE_string('logdir', None, 'Log directory of a training run, instead of --policy.')
flags.DEFINE_string('checkpoint', None, 'With --logdir: a step number of the run or a '
                    'checkpoint path; default the latest that reads back.')
flags.DEFINE_string('env_id', None, 'Gymnasium environment id (for a run of an Atari game on '
                    "EnvPool, another of EnvPool's games); default the one trained on.")
flags.DEFINE_integer('num_episodes', 10, 'Episodes to run.')
flags.DEFINE_integer('seed', 0, 'Episode i resets the environment with seed seed + i.')
flags.DEFINE_string('output', None, 'File to write the metrics JSON to (also printed).')

FLAGS = flags.FLAGS


def local_output(copies, output):
    """Where to write `output`: itself, or for a URL a local file that `copies` uploads."""
    if not locations.is_remote(output):
        return output
    directory, name = output.rsplit('/', 1)
    file_io.check_writable(directory)
    return os.path.join(copies.output(directory), name)


def check_output(path):
    if os.path.isdir(path):
        raise run_config.ConfigError(f'output {path} is a directory')
    parent = os.path.dirname(path) or '.'
    if not os.path.isdir(parent) or not os.access(parent, os.W_OK):
        raise run_config.ConfigError(f'cannot write output {path}: {parent} is not a writable '
                                     'directory')


def load_policy(copies):
    """The policy, the environment it runs in, and what describes the policy in the metrics."""
    if bool(FLAGS.policy) == bool(FLAGS.logdir):
        raise run_config.ConfigError('give exactly one of --policy and --logdir')
    if FLAGS.policy:
        if FLAGS.checkpoint:
            raise run_config.ConfigError('--checkpoint goes with --logdir, not --policy')
        directory = locations.resolve(FLAGS.policy)
        try:
            policy = policy_export.SavedPolicy(copies.input(directory))
        except policy_export.PolicyLoadError as error:
            raise run_config.ConfigError(str(error)) from error
        if not policy.config:
            raise run_config.ConfigError(f'policy {directory} does not record the configuration '
                                         'of its run, so its environment is unknown')
        environment = restore.environment_from_config(policy.config)
        spaces = policy.observation_space, policy.action_space
        source = {'policy': directory, 'step': policy.step}
    else:
        logdir = locations.resolve(FLAGS.logdir)
        run = restore.restore_agent(copies.input(logdir, remote_logdir.RESTORE_FILES),
                                    FLAGS.checkpoint)
        if run.fallback_warning:
            logging.warning('%s', copies.named(run.fallback_warning))
        policy = restore.AgentPolicy(run.agent)
        environment = run.environment
        spaces = run.observation_space, run.action_space
        source = {'logdir': logdir, 'checkpoint': copies.named(run.checkpoint),
                  'step': run.step}
    env = environment.make(FLAGS.env_id)
    try:
        # By id: EnvPool's Atari games have no Gymnasium spec to tell theirs.
        evaluation.check_spaces(env, *spaces, env_name=FLAGS.env_id or environment.env_id)
    except ValueError as error:
        env.close()
        raise run_config.ConfigError(str(error)) from error
    return policy, env, dict(source, env_id=FLAGS.env_id or environment.env_id)


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f'Unexpected arguments: {" ".join(argv[1:])}')
    log_noise.quiet()
    with remote_logdir.LocalCopies() as copies:
        evaluate_policy(copies)


def evaluate_policy(copies):
    """Runs the episodes and writes their metrics; remote inputs and outputs go through
    `copies`."""
    try:
        if FLAGS.num_episodes < 1:
            raise run_config.ConfigError(
                f'--num_episodes must be positive, got {FLAGS.num_episodes}')
        output = locations.resolve(FLAGS.output) if FLAGS.output else None
        if output:
            output = local_output(copies, output)
            check_output(output)
        policy, env, source = load_policy(copies)
    except (run_config.ConfigError, failures.StorageError) as error:
        sys.exit(f'evaluate: error: {copies.named(error)}')
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
        try:
            copies.upload()
        except failures.StorageError as error:
            sys.exit(f'evaluate: error: {error}')
    sys.stdout.write(text)


def run():
    """The console script's entry point."""
    # `--helpshort` lists the flags of the program's own file, not this module's, when the
    # program is a console script.
    for flag in FLAGS.get_key_flags_for_module(sys.modules[__name__]):
        FLAGS.register_key_flag_for_module(sys.argv[0], flag)
    app.run(main)


if __name__ == '__main__':
    run()
