r"""Exports a run's policy as a SavedModel: `bazel run //agents:export -- --logdir=...`.

The trainer already exports the policy of every kept checkpoint to <logdir>/policy/<step>/;
this does the same on demand, for the latest or any checkpoint (--checkpoint), into
<logdir>/policy/<step>/ or --outdir. See agents/runs/policy_export.py for what the
SavedModel holds; it loads with `tf.saved_model.load` alone. --logdir and --outdir may be
bucket URLs (gs://...): the run's checkpoints are read from a local copy, the SavedModel is
written locally and uploaded.
"""

import os
import sys

from absl import app, flags, logging

from agents.scripts import lean_start, log_noise  # import no TensorFlow

# TensorFlow's start-up lines only when asked for; matplotlib, which Keras would load, not at all.
with log_noise.tensorflow_start(), lean_start.without_matplotlib():
    from agents.algorithms import registry  # noqa: F401 (registers the algorithms)
    from agents.runs import policy_export, remote_logdir, restore, run_config, run_dir
    from agents.storage import failures, file_io, locations

flags.DEFINE_string('logdir', None, 'Log directory of a training run.')
flags.DEFINE_string('checkpoint', None, 'Checkpoint to export: a step number of the run or a '
                    'checkpoint path; default the latest that reads back.')
flags.DEFINE_string('outdir', None, 'SavedModel directory to write; default '
                    '<logdir>/policy/<step>. An earlier export there is replaced.')

FLAGS = flags.FLAGS


def check_outdir(outdir):
    """Fails unless `outdir` is free, an empty directory or an earlier export."""
    if locations.is_remote(outdir):
        file_io.check_writable(outdir)
        stored = remote_logdir.stored_files(outdir)
        if stored and 'saved_model.pb' not in stored:
            raise run_config.ConfigError(f'outdir {outdir} holds other files than an exported '
                                         'policy; choose another --outdir')
        return
    if os.path.exists(outdir) and not os.path.isdir(outdir):
        raise run_config.ConfigError(f'outdir {outdir} exists and is not a directory')
    if (os.path.isdir(outdir) and os.listdir(outdir) and
            not os.path.isfile(os.path.join(outdir, 'saved_model.pb'))):
        raise run_config.ConfigError(f'outdir {outdir} holds other files than an exported '
                                     'policy; choose another --outdir')
    # The export is written beside outdir and renamed into place.
    unwritable = locations.unwritable_ancestor(os.path.dirname(outdir))
    if unwritable:
        raise run_config.ConfigError(f'cannot write to outdir {outdir}: {unwritable} is not a '
                                     'writable directory')


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f'Unexpected arguments: {" ".join(argv[1:])}')
    log_noise.quiet()
    with remote_logdir.LocalCopies() as copies:
        export_policy(copies)


def export_policy(copies):
    """Exports the policy; remote inputs and outputs go through `copies`."""
    try:
        if not FLAGS.logdir:
            raise run_config.ConfigError('--logdir is required')
        logdir = locations.resolve(FLAGS.logdir)
        outdir = locations.resolve(FLAGS.outdir) if FLAGS.outdir else None
        if outdir:
            check_outdir(outdir)
        run = restore.restore_agent(copies.input(logdir, remote_logdir.RESTORE_FILES),
                                    FLAGS.checkpoint)
        if run.fallback_warning:
            logging.warning('%s', copies.named(run.fallback_warning))
        if outdir is None:
            outdir = locations.join(logdir, run_dir.POLICY_DIR, str(run.step))
            check_outdir(outdir)
        local_outdir = copies.output(outdir, replace=True)
    except (run_config.ConfigError, failures.StorageError) as error:
        sys.exit(f'export: error: {copies.named(error)}')
    exporter = policy_export.PolicyExporter(run.agent, run.observation_space, run.action_space)
    exporter.export(local_outdir, step=run.step, config=run.config)
    try:
        copies.upload()
    except failures.StorageError as error:
        sys.exit(f'export: error: {error}')
    logging.info('Exported the policy of %s (step %d) to %s.', copies.named(run.checkpoint),
                 run.step, outdir)
    print(outdir)


def run():
    """The console script's entry point."""
    # `--helpshort` lists the flags of the program's own file, not this module's, when the
    # program is a console script.
    for flag in FLAGS.get_key_flags_for_module(sys.modules[__name__]):
        FLAGS.register_key_flag_for_module(sys.argv[0], flag)
    app.run(main)


if __name__ == '__main__':
    run()
