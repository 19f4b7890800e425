"""A run's files: its run directories, their checkpoints, metrics lines, policies and summaries.

A lone run has one run directory, its logdir; a population of K members has K, `member-<k>/`,
each an ordinary run. A save writes, in this order and from one thread, the checkpoint, the
policy export and the metrics line, so that a reader never finds a metrics line before its
checkpoint, nor a policy whose checkpoint is pruned. The state is copied first
(`CheckpointSnapshot`), so a save after the first runs in the background while training goes on;
the store waits for it before the next one and before the run ends. A failed write becomes a
`WriteError` that names the file and what was kept.
"""

import concurrent.futures
import contextlib
import functools
import json
import os

import gin
import tensorflow as tf
from absl import logging

from agents.runs import (
    checkpoint_snapshot,
    faults,
    gin_text,
    policy_export,
    progress,
    recovery,
    run_config,
    run_dir,
)
from agents.storage import failures


class RunDirectory:
    """What the loop writes of one run: a lone run's logdir, or a population member's.

    `bindings` (a member's): the gin bindings that make its configuration from the
    population's, so that its directory describes it as a lone run of its seed.
    """

    def __init__(self, logdir, agent, seed, checkpoint, name='', bindings=None):
        self.logdir = logdir
        self.agent = agent  # What its checkpoint and policy export hold.
        self.seed = seed
        self.checkpoint = checkpoint
        self.name = name
        self.bindings = bindings
        self.checkpoint_dir = os.path.join(logdir, run_dir.CHECKPOINT_DIR)
        self.policy_dir = os.path.join(logdir, run_dir.POLICY_DIR)
        self.metrics_path = os.path.join(logdir, run_dir.METRICS_FILE)
        self.manager = None  # Made by `RunStore.restore`, once the checkpoints are recovered.
        self.corrupt = False  # Whether recovery moved a broken checkpoint aside.
        self.writer = None  # Made by `RunStore.open`: nothing is written before.
        self.exporter = None
        self.write_scalars = None  # A ScalarWriter, once the names of the scalars are known.
        self.skipped_batches = 0

    def configured(self, config):
        """`config` (the population's, as gin writes it) as this run's own."""
        if self.bindings is None:
            return config
        return gin_text.with_bindings(config, self.bindings, remove=run_dir.POPULATION_BINDINGS)

    def write_member_config(self):
        """Writes a population member's `config.gin`: the population's configuration as a
        lone run of the member's seed and hyperparameters (rewritten when the population's
        budget was raised)."""
        path = os.path.join(self.logdir, run_dir.CONFIG_FILE)
        text = self.configured(gin.config_str())
        if not os.path.isfile(path) or run_config.read_text(path) != text:
            os.makedirs(self.logdir, exist_ok=True)
            run_config.write_atomic(path, text)


class RunStore:
    """The run directories of a run and the saves in flight."""

    def __init__(self, logdir, runs, checkpoints_to_keep, observation_space, action_space):
        self.logdir = logdir
        self.runs = runs
        self._checkpoints_to_keep = checkpoints_to_keep
        self._spaces = (observation_space, action_space)
        self._snapshot = checkpoint_snapshot.CheckpointSnapshot([run.checkpoint for run in runs])
        self.saved_step = None  # Of the newest complete checkpoint, once known.
        self._pending = None  # The save in flight: (the step saved before it, its work).
        self._background = None  # The thread of background saves, while `open`.
        self.after_save = None  # Called whenever the run directories hold a complete save.

    @contextlib.contextmanager
    def open(self):
        """Prepares every run directory for writing (partial writes of a killed run removed)
        and runs the background thread of saves; waits for the save in flight on the way out,
        logging its failure when another error leaves."""
        with concurrent.futures.ThreadPoolExecutor(
                max_workers=1, thread_name_prefix='background') as self._background:
            try:
                for run in self.runs:
                    with self.writing(f'the logdir {run.logdir}'):
                        if run.bindings is not None:
                            run.write_member_config()
                        removed = recovery.clean_partial_writes(
                            run.logdir, run.checkpoint_dir, run.policy_dir)
                    if removed:
                        logging.info('Removed what interrupted writes left: %s',
                                     ', '.join(removed))
                yield self
            except BaseException:
                # The first fault is the one to report; a write of the save in flight that
                # failed too is logged (what it left is cleaned up on resume).
                failure = self.wait()
                if failure is not None:
                    logging.warning('Could not write %s (%s).', failure.what, _reason(
                        failure.error))
                raise

    def publish(self):
        """Hands the complete save to `after_save` (e.g. an upload to the run's bucket), once
        the save in flight is written."""
        if self.after_save is None:
            return
        self.finish()
        try:
            self.after_save()
        except Exception as error:  # Storage clients raise their own types.
            raise faults.WriteError(
                f'cannot store the run: {type(error).__name__}: {error}. The run stopped; '
                f'{faults.kept(self.saved_step)}. Rerun the same command to resume.') from error

    def submit(self, work):
        """Runs `work` on the background thread (while `open`); returns its future."""
        return self._background.submit(work)

    def recover(self):
        """Recovers each run directory's checkpoints (broken ones moved aside with a warning);
        returns the checkpoint each restores, or Nones (see `common_checkpoints`)."""
        for run in self.runs:
            try:
                recovered = recovery.recover_checkpoints(run.checkpoint_dir)
            except recovery.RecoveryError as error:
                raise faults.TrainingError(str(error)) from error
            except OSError as error:
                raise faults.WriteError(f'cannot recover the checkpoints in {run.checkpoint_dir}: '
                                        f'{error.filename}: {error.strerror}') from error
            for path, problem in recovered.corrupt:
                logging.warning('Checkpoint %s does not read back (%s); moved to %s/.', path,
                                problem, os.path.join(run.checkpoint_dir, run_dir.CORRUPT_DIR))
            run.corrupt = bool(recovered.corrupt)
            run.manager = tf.train.CheckpointManager(
                run.checkpoint, run.checkpoint_dir, max_to_keep=self._checkpoints_to_keep)
        return self.common_checkpoints()

    def common_checkpoints(self):
        """The checkpoint each run directory restores: its latest, or for a population the
        newest step every member kept (members save one after the other, so a killed run may
        have saved some members' last step only)."""
        if len(self.runs) == 1:
            return [self.runs[0].manager.latest_checkpoint]
        by_step = [{recovery.checkpoint_step(path): path for path in run.manager.checkpoints}
                   for run in self.runs]
        common = set.intersection(*(set(steps) for steps in by_step))
        if not common:
            if any(by_step):
                kept = ', '.join(f'{run.name}: {sorted(steps)}' for run, steps in zip(
                    self.runs, by_step, strict=True))
                raise faults.TrainingError(
                    f'the members of the population in {self.logdir} have no checkpoint of '
                    f'the same step ({kept}); the population cannot resume')
            return [None] * len(self.runs)
        step = max(common)
        for run, steps in zip(self.runs, by_step, strict=True):
            if max(steps) > step:
                logging.warning('%s has checkpoints past step %d, the newest every member has '
                                '(a save was interrupted); the population resumes from %d.',
                                run.logdir, step, step)
        return [steps[step] for steps in by_step]

    def restore(self, run, path, key):
        """Restores `run` from its checkpoint `path`; returns whether that holds entries under
        `key` (a checkpoint from before them, or of another backend, does not)."""
        try:
            run.checkpoint.restore(path)
            held = any(name.startswith(key + '/') for name in
                       tf.train.load_checkpoint(path).get_variable_to_shape_map())
        except (tf.errors.OpError, ValueError, AssertionError) as error:
            raise faults.TrainingError(f'cannot restore checkpoint {path}: '
                                       f'{failures.first_line(error)}') from error
        steps = int(run.checkpoint.env_steps)
        if run.corrupt:
            logging.warning('Resumed from %s at step %d: the newest checkpoint that reads '
                            'back.', path, steps)
        else:
            logging.info('Resumed from %s at step %d.', path, steps)
        return held

    def write_scalars(self, steps, names, values):
        """Each run's TensorBoard scalars `values` [len(steps), runs, len(names)] at `steps`,
        written by one compiled call per run (progress.ScalarWriter)."""
        steps = tf.constant(steps, tf.int64)
        for member, run in enumerate(self.runs):
            with self.writing(f'the summaries in {run.logdir}'):
                if run.write_scalars is None or run.write_scalars.names != names:
                    run.write_scalars = progress.ScalarWriter(run.writer, names)
                run.write_scalars(steps, tf.constant(values[:, member]))

    def open_logs(self, start_steps):
        """Opens each run's summaries and repairs its metrics lines past `start_steps`;
        returns each run's evaluation records."""
        records = []
        for run in self.runs:
            with self.writing(f'the summaries in {run.logdir}'):
                run.writer = tf.summary.create_file_writer(run.logdir)
            with self.writing(run.metrics_path):
                records.append(recovery.repair_metrics(run.metrics_path, start_steps))
        return records

    def write_operative_configs(self):
        for run in self.runs:
            path = os.path.join(run.logdir, run_dir.OPERATIVE_CONFIG_FILE)
            with self.writing(path):
                run_config.write_atomic(path, run.configured(gin.operative_config_str()))

    @contextlib.contextmanager
    def writing(self, what):
        """Turns a failed write into a WriteError that names `what` and what was kept."""
        try:
            yield
        except (OSError, tf.errors.OpError) as caught:
            # Free what the failed write took (e.g. on a full disk); a write of the save in
            # flight that failed is the fault to report (it came first).
            earlier = self.wait()
            what, error = (earlier.what, earlier.error) if earlier else (what, caught)
            for run in self.runs:
                with contextlib.suppress(OSError):
                    recovery.clean_partial_writes(run.logdir, run.checkpoint_dir, run.policy_dir)
            raise faults.WriteError(
                f'cannot write {what}: {_reason(error)}. The run stopped; '
                f'{faults.kept(self.saved_step)}. Make room or make the logdir writable, then '
                'rerun the same command to resume.') from error

    def flush_summaries(self):
        for run in self.runs:
            with self.writing(f'the summaries in {run.logdir}'):
                run.writer.flush()

    def summary(self, run, steps, scalars):
        """Writes `scalars` ({name: value}; None skipped) to `run`'s summaries at `steps`."""
        with self.writing(f'the summaries in {run.logdir}'), run.writer.as_default(step=steps):
            for name, value in scalars.items():
                if value is not None:
                    tf.summary.scalar(name, value)

    def checkpoint_write(self, steps, agent):
        """(what, write) of the checkpoint of `steps`, whose state is copied now (a
        population's members first), so that a thread can write it."""
        agent.to_members()
        self._snapshot.take()

        def write():
            for run in self.runs:
                run.manager.save(checkpoint_number=steps)

        if len(self.runs) == 1:
            return f'the checkpoint of step {steps} to {self.runs[0].checkpoint_dir}', write
        return (f'the checkpoints of step {steps} to {self.logdir}/'
                f'{run_dir.MEMBER_DIR.format("*")}/{run_dir.CHECKPOINT_DIR}', write)

    def export_writes(self, steps, runs):
        """The policy of the checkpoint of `steps`, as a SavedModel in <logdir>/policy/<step>/,
        copied now; policies of checkpoints no longer kept are deleted. Returns [(what, write)]
        and whether a thread may write it.

        The first export may not: `tf.saved_model.save` sets the process-wide log level to
        FATAL while it scans the policy's attributes (TensorFlow's AutoTrackable), which in a
        thread silences what the run logs meanwhile. A population's members already hold its
        state: copied by the checkpoint of `steps`, or restored from it.
        """
        exports = []
        for run in runs:
            if run.exporter is None:
                run.exporter = policy_export.PolicyExporter(run.agent, *self._spaces)
            run.exporter.capture(step=steps, config=run.configured(gin.operative_config_str()))
            exports.append((run, os.path.join(run.policy_dir, str(steps))))

        def write():
            for run, directory in exports:
                run.exporter.write(directory)
                policy_export.prune_exports(run.policy_dir, [
                    recovery.checkpoint_step(path) for path in run.manager.checkpoints])

        what = (f'the policy of step {steps} to {exports[0][1]}' if len(exports) == 1 else
                f'the policies of step {steps} to {self.logdir}/{run_dir.MEMBER_DIR.format("*")}')
        return [(what, write)], all(run.exporter.program_saved for run, _ in exports)

    def metrics_writes(self, runs, records):
        """(what, write) of each of `runs`' metrics line `records[run]`."""
        return [(run.metrics_path, functools.partial(_append_line, run.metrics_path, records[run]))
                for run in runs]

    def start(self, writes, steps=None, background=False):
        """Runs `writes` ((what, write) pairs; with `steps`, the first is the checkpoint of
        `steps`) in order, stopping at the first that fails: here, or with `background` in the
        background thread while training goes on. `finish` waits for them and raises the
        failure as WriteError."""

        def write_all():
            for index, (what, write) in enumerate(writes):
                try:
                    write()
                except (OSError, tf.errors.OpError) as error:
                    raise faults.WriteFailed(
                        what, error, checkpointed=steps is None or index > 0) from error

        # Named as kept from now on: every way out of the run waits for the save; a failed
        # checkpoint puts back the step before it.
        previous = self.saved_step
        if steps is not None:
            self.saved_step = steps
        self._pending = (previous, self._background.submit(write_all) if background
                         else write_all)
        if not background:
            self.finish()

    def finish(self):
        """Waits for the save in flight, if any; a failed write raises WriteError."""
        failure = self.wait()
        if failure is not None:
            with self.writing(failure.what):
                raise failure.error

    def wait(self):
        """Waits for the save in flight, if any; returns its WriteFailed, if a write failed."""
        if self._pending is None:
            return None
        (previous, work), self._pending = self._pending, None
        try:
            work.result() if isinstance(work, concurrent.futures.Future) else work()
        except faults.WriteFailed as failure:
            if not failure.checkpointed:
                self.saved_step = previous
            return failure
        return None


def _reason(error):
    if isinstance(error, tf.errors.OpError):
        return faults.tf_reason(error)
    reason = error.strerror or str(error)
    return f'{error.filename}: {reason}' if error.filename else reason


def _append_line(path, record):
    with open(path, 'a', encoding='utf-8') as f:
        f.write(json.dumps(record) + '\n')
