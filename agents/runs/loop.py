"""The run loop of every algorithm: build, resume, then train, evaluate and save until done.

The loop knows no algorithm: `train.algorithm` names one (e.g. `train.algorithm = @PPO`), which
gives the loop what agents/algorithms/algorithm.py lists, and whose cadence says how long an
iteration is. docs/run_loop.md tells what a run does and writes, and how it ends; the parts live
in their own modules: run_settings (the `train.*` settings), training_step (the compiled
iterations), evaluator, run_store (checkpoints, metrics, policies), faults and progress.
"""

import contextlib
import os
import signal
import time

import numpy as np
import tensorflow as tf
from absl import logging

from agents.runs import (
    agent_factory,
    environments,
    evaluator,
    faults,
    progress,
    run_config,
    run_dir,
    run_settings,
    run_store,
    training_step,
    xla_cache,
)
from agents.storage import failures
from agents.tools import batch_env, stop_signals

# The checkpoint's entry for the training episodes in flight (native backend only); a checkpoint
# without it (Gymnasium backend, or from before it existed) resumes with new episodes.
ROLLOUT_CHECKPOINT_KEY = 'rollout'
# A compiled call of several iterations ends after about this many seconds (see
# `train.iterations_per_call`), so that a stop signal or a progress line waits no longer.
CALL_SECONDS = 1.0


def train(logdir, stop_at_step=None, **overrides):
    """Trains as configured by gin (`train.*`, the algorithm's...); returns the last evaluation.

    `overrides` replace gin's values of the run's settings (run_settings.RunSettings);
    `stop_at_step`: see `TrainingRun.run`.
    """
    with training_run(logdir, **overrides) as run:
        return run.run(stop_at_step=stop_at_step)


@contextlib.contextmanager
def training_run(logdir, **overrides):
    """Builds the environments, the algorithm and the `TrainingRun` of the gin-configured
    settings (with `overrides`) in `logdir`.

    Nothing is written to `logdir` before `TrainingRun.run`, so a mistake in the configuration
    found here leaves no trace. The environments are closed when the context exits.
    """
    settings = run_settings.from_gin(**overrides)
    run_settings.apply_process_settings(settings)
    members, member_bindings = (
        settings.member_overrides() if settings.population > 1 else (None, None))
    seeds = [member['seed'] for member in members] if members else settings.seed
    with environments.Environments(
            settings.env_id, settings.env_backend, settings.num_envs, settings.eval_episodes,
            seeds, env_kwargs=settings.env_kwargs, wrappers=settings.wrappers,
            mode=settings.env_mode, num_workers=settings.num_workers,
            native_dtype=settings.native_dtype,
            check_inputs=not settings.compiles_with_xla()) as envs:
        agent = agent_factory.build_agent(settings, envs.training, members)
        yield TrainingRun(logdir, settings, agent, envs, member_bindings)


def check_config():
    """Checks the run's settings of the parsed gin config before a logdir is created."""
    run_settings.from_gin()


class TrainingRun:
    """One training run in its logdir: its parts, and the loop that drives them."""

    def __init__(self, logdir, settings, agent, envs, member_bindings=None):
        """`member_bindings` (a population's): each member's gin bindings ({'train.seed': ...})
        that make its configuration from the population's."""
        self.settings = settings
        self.agent = agent
        self._train_env = envs.training
        self._training_episodes = envs.training_episodes
        self._training_games = envs.training_games  # An Atari run's whole games, or None.
        length = settings.iteration_length(agent.cadence)
        # A member's steps: each member counts its own, as a lone run of its seed would.
        self._steps_per_iteration = settings.num_envs * length
        jit_compile = settings.compiles_with_xla()
        self.env_steps = tf.Variable(0, dtype=tf.int64, trainable=False, name='env_steps')
        self.wall_time = tf.Variable(0.0, dtype=tf.float64, trainable=False, name='wall_time')
        self.steps_per_sec = tf.Variable(
            0.0, dtype=tf.float64, trainable=False, name='steps_per_sec')
        calls = settings.calls_of(agent.cadence)
        self.training_step = training_step.TrainingStep(
            agent, envs.training, length, self.env_steps, calls, jit_compile)
        self._schedule = _Schedule(settings, self._steps_per_iteration, calls)
        self.evaluator = evaluator.Evaluator(agent, envs.evaluation, jit_compile)
        self._restarts = faults.EnvironmentRestarts(
            envs.training, envs.make_training, settings.on_env_failure,
            settings.max_env_restarts, settings.seed)
        self._nonfinite = faults.NonFiniteBatches(settings.on_nonfinite)
        self.store = run_store.RunStore(
            logdir, self._run_directories(logdir, member_bindings), settings.checkpoints_to_keep,
            envs.evaluation.observation_space, envs.evaluation.action_space)
        # Whether the restored checkpoint held the episodes in flight (see `restore`).
        self.episodes_restored = False
        self._restored = False
        self._eval_warmup = None  # The future of the evaluation compiled ahead.
        self._signals = None  # The StopSignals watched while `run` runs.
        self._heartbeat = None  # The progress.Heartbeat of `run`.
        self._status = lambda: None  # The phrase `run`'s progress lines add.
        self._step = 0  # int(env_steps) as of the last iteration, for other threads.

    def _run_directories(self, logdir, member_bindings):
        """A run directory per member of the agent: a lone run's logdir, or each population
        member's `member-<k>/` (an ordinary run of its seed: its checkpoint holds the member as
        a lone agent, without episodes in flight)."""
        saved = dict(env_steps=self.env_steps, wall_time=self.wall_time,
                     steps_per_sec=self.steps_per_sec)
        self._saves_episodes = member_bindings is None and self._train_env.state_in_variables
        if self._saves_episodes:
            saved[ROLLOUT_CHECKPOINT_KEY] = self.training_step.episodes_in_flight()
        places = [(logdir, '', None)] if member_bindings is None else [
            (os.path.join(logdir, run_dir.MEMBER_DIR.format(index)),
             run_dir.MEMBER_DIR.format(index), bindings)
            for index, bindings in enumerate(member_bindings)]
        return [run_store.RunDirectory(
            path, member, (bindings or {}).get(run_dir.SEED_BINDING, self.settings.seed),
            tf.train.Checkpoint(agent=member.checkpointed(), **saved), name, bindings)
            for (path, name, bindings), member in zip(places, self.agent.members, strict=True)]

    @property
    def checkpoint(self):
        """The checkpoint of a lone run (a population's members have one each)."""
        return self.store.runs[0].checkpoint

    @property
    def skipped_batches(self):
        return self._nonfinite.skipped

    def check(self):
        """Traces the compiled iteration and evaluation, so that mistakes which only show in the
        graph (shapes, dtypes, minibatch sizes) surface as a ConfigError before anything is
        written. Executes nothing."""
        try:
            self.training_step.trace()
            self.evaluator.trace()
        except (ValueError, TypeError) as error:
            raise run_config.ConfigError(
                f'the configuration does not build a training graph: {failures.first_line(error)}'
            ) from error

    def restore(self):
        """Restores the latest checkpoint that reads back, if any; returns its path or None.

        `episodes_restored` tells whether it held the training episodes in flight (native
        backend), which the next iteration then continues; otherwise it resets every training
        environment. A population restores each member's checkpoint of the newest step that
        every member has (the path returned is the first member's). Broken checkpoints are moved
        aside with a warning (see recovery.py); if checkpoints exist but none reads back, raises
        TrainingError and changes nothing.
        """
        if self._restored:
            return self.store.runs[0].manager.latest_checkpoint
        paths = self.store.recover()
        for run, path in zip(self.store.runs, paths, strict=True):
            if path:
                held = self.store.restore(run, path, ROLLOUT_CHECKPOINT_KEY)
                self.episodes_restored = self._saves_episodes and held
        if paths[0]:
            self.agent.from_members()
        self._restored = True
        return paths[0]

    def run(self, after_save=None, signals=None, stop_at_step=None, status=None):
        """Trains from the latest checkpoint to the budget; returns the last evaluation.

        `after_save`, if given, is called whenever the logdir holds a complete save (after each
        evaluation's checkpoint, policy and metrics line, and after the checkpoint of a signal),
        e.g. to upload it to the run's bucket. `signals`: the entered StopSignals of the
        caller, if it watches them already. `stop_at_step` (a positive int, or None): stop at
        the first iteration end at or past it, short of the budget, with an evaluation and a save
        as at the budget; a run already there does nothing. The schedules stay those of the
        budget, so a rerun goes on as if the run had not stopped. `status`, if given, returns a
        phrase the progress lines add, or None (e.g. that the run's bucket is out of reach).
        Raises TrainingError (a subclass naming the fault) when training cannot go on.
        """
        if stop_at_step is not None and (not _is_int(stop_at_step) or stop_at_step < 1):
            raise ValueError(f'stop_at_step must be a positive integer, got {stop_at_step!r}')
        self.store.after_save = after_save
        self._status = status or (lambda: None)
        with contextlib.ExitStack() as stack:
            if signals is None:
                signals = stack.enter_context(stop_signals.StopSignals())
            self._signals = signals
            stack.enter_context(signals.deferred())
            stack.callback(self._signals.on_stop(self._cancel_env_waits))
            self._heartbeat = stack.enter_context(progress.Heartbeat(
                max(self.settings.log_every_secs, 1.0),
                lambda phase, seconds: progress.heartbeat_line(
                    self._step, self.settings.total_steps, phase, seconds,
                    self._train_env.vector_env, self._status())))
            stack.enter_context(self.store.open())
            return self._train(stop_at_step)

    def _train(self, stop_at_step):
        """Resumes, then trains, evaluates and saves up to the budget or `stop_at_step`."""
        start_steps, latest = self._resume(stop_at_step)
        target = min(self.settings.total_steps, stop_at_step or self.settings.total_steps)
        if self.evaluator.whole_episodes and latest is None and start_steps < target:
            self._compile_evaluation_ahead()
        clock = _Clock(start_steps, float(self.wall_time))
        episodes = [0, 0.0]  # Training episodes ended since the last progress line, their return.
        # Whole games ended since the last progress line, their score (where episodes are not).
        games = None if self._training_games is None else [0, 0.0]
        while int(self.env_steps) < target:
            previous_steps = int(self.env_steps)
            iterations = self._timed_call(previous_steps, target, clock)
            steps = self._step = int(self.env_steps)
            self._log_iterations(iterations, steps, clock, episodes, games)
            last = steps >= target  # The budget's, or a stop's.
            if self._schedule.eval_due(previous_steps, steps) or last:
                latest = self._evaluate_and_save(steps)
            if last or clock.progress_due(self.settings.log_every_secs):
                progress.log_progress(steps, self.settings.total_steps, clock.steps_per_sec,
                                      episodes, latest, self.agent.num_members, self._status(),
                                      train_return=self._training_episodes[0], games=games)
                self._heartbeat.beat()
                episodes[:] = [0, 0.0]
                if games is not None:
                    games[:] = [0, 0.0]
            self._heartbeat.phase('training')
        self.store.finish()
        progress.log_end(int(self.env_steps), self.settings.total_steps, start_steps,
                         stop_at_step, latest)
        self.store.flush_summaries()
        return latest

    def _resume(self, stop_at_step):
        """Restores the newest checkpoint and completes its save; (its step, the evaluation
        record that completing it wrote, if any)."""
        path = self.restore()
        start_steps = self._step = int(self.env_steps)
        self.store.saved_step = start_steps if path else None
        records = self.store.open_logs(start_steps)
        return start_steps, self._complete_last_save(start_steps, records, stop_at_step)

    def _compile_evaluation_ahead(self):
        """Compiles the evaluation (on the second core) while the first iteration compiles: its
        first run, on the current weights, touches only the evaluation environments and draws
        no random numbers; every evaluation reseeds and resets them. Both are traced first,
        here: tracing in two threads at once would number the graphs' functions in a varying
        order, and XLA's persistent cache would miss."""
        self.check()
        self._eval_warmup = self.store.submit(
            lambda: self.evaluator.rollout(tf.constant(True)))

    def _timed_call(self, steps, target, clock):
        """One compiled call of iterations from `steps`, timed by `clock`."""
        self._check_signals()
        progress.clear_scalar_cache()
        began = time.time()
        count = self._schedule.call_size(steps, target, clock.seconds_per_iteration)
        self._heartbeat.phase(
            'the first iteration (tracing and compiling)' if clock.first
            else 'an iteration' if count == 1 else f'a call of {count} iterations')
        # New episodes everywhere, unless the checkpoint held those in flight.
        iterations = self._iterations(clock.first and not self.episodes_restored, count)
        clock.ran(time.time() - began, len(iterations), int(self.env_steps))
        return iterations

    def _log_iterations(self, iterations, steps, clock, episodes, games):
        """Summaries of a call's iterations; the operative configs after the first call.
        Adds the call's training episodes, and its whole games (`games`, if not None), to the
        counts and sums of the next progress line."""
        ended_games = None if self._training_games is None else self._training_games.take()
        self._write_iteration_summaries(iterations, steps, clock.steps_per_sec, ended_games)
        for iteration in iterations:
            episodes[0] += int(iteration.episodes.sum())
            episodes[1] += float(iteration.return_sum.sum())
        if ended_games is not None:
            games[0] += len(ended_games[0])
            games[1] += float(ended_games[0].sum())
        if clock.calls == 1:
            self.store.write_operative_configs()
        self.wall_time.assign(clock.wall_time())
        self.steps_per_sec.assign(clock.steps_per_sec)

    def _cancel_env_waits(self, signum):
        """Ends a wait for the training environments' workers, e.g. for one that hangs."""
        if self._train_env.vector_env is not None:
            self._train_env.vector_env.cancel_wait(f'stopping on {signal.Signals(signum).name}')

    def _check_signals(self):
        """Stops the run (Interrupted) if a stop signal came."""
        if self._signals.signum is not None:
            self._stop_on_signal(self._signals.signum)

    def _write_iteration_summaries(self, iterations, steps, steps_per_sec, games=None):
        """Each run's TensorBoard scalars of the iterations of a call (the last ending at
        `steps`), and of the whole games that ended in it (`games`, see
        progress.iteration_scalars), written by one compiled call per run."""
        names, values = progress.iteration_scalars(
            iterations, self.agent.num_members, steps_per_sec, self._training_episodes, games)
        ends = steps - self._steps_per_iteration * np.arange(len(iterations))[::-1]
        self.store.write_scalars(ends, names, values)

    def _iterations(self, reset, count):
        """One compiled call of up to `count` iterations, redone on fresh environments if they
        fail (see `on_env_failure`); returns the iterations run (training_step.TrainingStep).
        After a failed call, whose iterations before the failure stand (their statistics
        lost), the retry runs the rest."""
        start = int(self.env_steps)
        vector_env = self._train_env.vector_env
        while True:
            self._check_signals()  # Also before a retry on rebuilt environments.
            if vector_env is not None:
                vector_env.failure = None
            try:
                iterations, report = self.training_step(reset, count)
                break
            except tf.errors.OpError as error:
                self._on_failed_call(error)
            reset = True
            count -= (int(self.env_steps) - start) // self._steps_per_iteration
            start = int(self.env_steps)
            vector_env = self._train_env.vector_env
        nonfinite = report['nonfinite']
        if len(iterations) > 1 or not nonfinite.any():
            self._nonfinite.passed()
        if nonfinite.any():
            # The metrics of an undone update are not written.
            iterations[-1].dropped = nonfinite > 0
            self._on_nonfinite_batch(nonfinite, report)
        return iterations

    def _on_failed_call(self, error):
        """Restarts failed environments, or raises what the failed call means."""
        vector_env = self._train_env.vector_env
        failure = vector_env.failure if vector_env is not None else None
        if isinstance(failure, batch_env.WaitCancelled):
            # A stop signal ended the wait for the workers, which may hang: they are not
            # waited for again.
            with contextlib.suppress(Exception):
                vector_env.close(terminate=True)
            self._check_signals()
            raise error
        if failure is not None:
            self._restarts.restart(failure, int(self.env_steps), self.store.saved_step)
        elif evaluator.NONFINITE_ACTION in error.message:
            # The iteration's rollout ended early, before its update. The retry resets every
            # environment: new episodes.
            self._on_nonfinite_batch(None, None)
        elif xla_cache.damaged(error):
            raise faults.damaged_cache(error, self.store.saved_step) from None
        else:
            raise error

    def _on_nonfinite_batch(self, codes, report):
        """Stops the run, or logs the skipped batch (the update was undone in the graph).

        `codes`: what went non-finite, per member ([K]; code k names the k-th of the training
        step's `nonfinite_quantities`), with the call's `report`; None for a rollout that a
        non-finite action stopped as a whole.
        """
        steps = int(self.env_steps)
        if codes is None:
            problem = (f'non-finite {training_step.ACTION} in the iteration after step {steps}; '
                       'the rollout stopped before the update')
            members = range(len(self.store.runs))
        else:
            members = np.flatnonzero(codes).tolist()
            problem = '; '.join(self.training_step.describe_nonfinite(
                member, int(codes[member]), report, steps, self.store.runs[member].name)
                for member in members)
        self._nonfinite.dropped(problem, self.store.saved_step)
        for member in members:
            run = self.store.runs[member]
            run.skipped_batches += 1
            self.store.summary(run, steps, {'train/skipped_batches': run.skipped_batches})

    def _stop_on_signal(self, signum):
        """Saves a checkpoint (unless this step has one) and raises Interrupted."""
        steps = int(self.env_steps)
        self.store.finish()
        if not steps:
            saved = 'nothing to save yet'
        elif self.store.saved_step != steps:
            self.store.start([self.store.checkpoint_write(steps, self.agent)], steps)
            self._restarts.checkpointed()
            saved = f'saved a checkpoint at step {steps}'
        else:
            saved = f'the checkpoint of step {steps} is saved'
        self.store.flush_summaries()
        self.store.publish()
        raise faults.Interrupted(signum, steps, f'interrupted by {signal.Signals(signum).name} '
                                 f'at step {steps}; {saved}. Rerun the same command to resume.')

    def _evaluate_and_save(self, steps, save_checkpoint=True, runs=None):
        """Evaluates; writes the checkpoint, the policy, the metrics line and summaries (of
        `runs`, default all: a population's members, whose evaluation records are returned
        too); returns the (first) evaluation record."""
        self._heartbeat.phase(f'the evaluation of step {steps}')
        records = self._evaluate(steps)
        self._heartbeat.phase(f'saving step {steps}')
        runs = self.store.runs if runs is None else runs
        # The snapshot and the policies' copies below reuse the variables the save in flight
        # writes from.
        self.store.finish()
        writes = [self.store.checkpoint_write(steps, self.agent)] if save_checkpoint else []
        exports, background = self.store.export_writes(steps, runs)
        writes.extend(exports)
        writes.extend(self.store.metrics_writes(runs, records))
        self.store.start(writes, steps if save_checkpoint else None, background)
        if save_checkpoint:
            self._restarts.checkpointed()
        for run in runs:
            self.store.summary(run, steps, {f'eval/{name}': records[run][name] for name in (
                'mean_return', 'std_return', 'mean_length')})
            with self.store.writing(f'the summaries in {run.logdir}'):
                run.writer.flush()
        self.store.publish()
        return records[self.store.runs[0]]

    def _evaluate(self, steps):
        """Each run directory's evaluation record of `steps`."""
        warmup, self._eval_warmup = self._eval_warmup, None
        if warmup is not None:
            # Its errors (e.g. a non-finite action) are the evaluation's to raise.
            warmup.exception()
        runs = self.store.runs
        seeds = [evaluator.evaluation_seed(run.seed, steps) for run in runs]
        try:
            returns, lengths = self.evaluator.evaluate(
                seeds if len(runs) > 1 else seeds[0], self._check_signals)
        except tf.errors.OpError as error:
            if xla_cache.damaged(error):
                raise faults.damaged_cache(error, self.store.saved_step) from None
            if evaluator.NONFINITE_ACTION not in error.message:
                raise
            raise faults.NonFiniteError(
                f'non-finite {training_step.ACTION} in the evaluation at step {steps}; the run '
                f'stopped before saving step {steps}; {faults.kept(self.store.saved_step)}.'
            ) from None
        records = {}
        for run, member_returns, member_lengths in zip(
                runs, returns.reshape(len(runs), -1), lengths.reshape(len(runs), -1),
                strict=True):
            records[run] = _evaluation_record(
                steps, run.name, member_returns, member_lengths, float(self.steps_per_sec),
                float(self.wall_time))
        return records

    def _complete_last_save(self, steps, records, stop_at_step=None):
        """Finishes the save of the restored checkpoint if the previous run was stopped in it.

        A checkpoint of an evaluation step (or of the stop at `stop_at_step`, which a rerun with
        the same stop would otherwise find done without its evaluation) is followed by its
        policy export and metrics line (`records` holds the lines there are); if the run died in
        between, the evaluation is redone for the restored weights. Returns the evaluation
        record this call wrote, if any.
        """
        previous = steps - self._steps_per_iteration
        at_stop = stop_at_step is not None and previous < stop_at_step <= steps
        if not steps or not (self._schedule.eval_due(previous, steps) or at_stop):
            return None
        logged = [any(record.get('step') == steps for record in run_records)
                  for run_records in records]
        runs = self.store.runs
        if all(logged):
            unexported = [run for run in runs
                          if not os.path.isdir(os.path.join(run.policy_dir, str(steps)))]
            if unexported:
                logging.info('Exporting the policy of step %d, which the previous run did not '
                             'finish.', steps)
                self.store.finish()
                self.store.start(self.store.export_writes(steps, unexported)[0])
            return None
        logging.warning('Completing the evaluation of step %d: the previous run saved its '
                        'checkpoint but stopped before logging it.', steps)
        return self._evaluate_and_save(
            steps, save_checkpoint=False,
            runs=[run for run, done in zip(runs, logged, strict=True) if not done])


class _Schedule:
    """When a run evaluates, and how many iterations its next compiled call runs."""

    def __init__(self, settings, steps_per_iteration, iterations_per_call):
        self._every = settings.eval_every_steps
        self._total = settings.total_steps
        self._steps_per_iteration = steps_per_iteration
        self._iterations_per_call = iterations_per_call

    def eval_due(self, previous_steps, steps):
        """Whether the iteration from `previous_steps` to `steps` ends with an evaluation: a
        function of the steps alone, so a resumed run evaluates where an uninterrupted one
        would have."""
        return steps >= self._total or steps // self._every > previous_steps // self._every

    def call_size(self, steps, target, seconds_per_iteration):
        """How many iterations the next compiled call runs from `steps`: up to the next
        evaluation or `target`, at most `iterations_per_call`, and about CALL_SECONDS' worth once
        an iteration's time is known (the first call, which compiles, runs one)."""
        most = 1
        if seconds_per_iteration is not None:
            most = min(self._iterations_per_call,
                       max(1, int(CALL_SECONDS / max(seconds_per_iteration, 1e-9))))
        count = 1
        end = steps + self._steps_per_iteration
        while count < most and end < target and not self.eval_due(steps, end):
            count += 1
            steps, end = end, end + self._steps_per_iteration
        return count


class _Clock:
    """A run's training time: seconds spent in compiled calls, steps per second, and when the
    last progress line was logged."""

    def __init__(self, start_steps, start_wall):
        self._start_steps = start_steps
        self._start_wall = start_wall
        self._start_time = time.time()
        self._train_seconds = 0.0
        self._last_log = time.time()
        self.calls = 0
        self.seconds_per_iteration = None  # Of the last call, once one ran without compiling.
        self.steps_per_sec = 0.0

    @property
    def first(self):
        return self.calls == 0

    def ran(self, seconds, iterations, steps):
        """Notes a call of `iterations` that took `seconds` and ended at `steps`."""
        if self.calls:
            self.seconds_per_iteration = seconds / iterations
        self.calls += 1
        self._train_seconds += seconds
        self.steps_per_sec = (steps - self._start_steps) / max(self._train_seconds, 1e-9)

    def wall_time(self):
        return self._start_wall + time.time() - self._start_time

    def progress_due(self, every):
        """Whether a progress line is due (and, if so, notes it as logged)."""
        if time.time() - self._last_log < every:
            return False
        self._last_log = time.time()
        return True


def _evaluation_record(steps, name, returns, lengths, steps_per_sec, wall_time):
    finite = np.isfinite(returns).all()
    if not finite:
        bad = np.flatnonzero(~np.isfinite(returns)).tolist()
        logging.warning('Evaluation at step %d%s: environments %s ended with a non-finite '
                        'return; its mean_return and std_return are null.', steps,
                        f' of {name}' if name else '', bad)
    return {
        'step': steps,
        'mean_return': float(np.mean(returns)) if finite else None,
        'std_return': float(np.std(returns)) if finite else None,
        'episodes': len(returns),
        'mean_length': float(np.mean(lengths)),
        'env_steps_per_sec': steps_per_sec,
        'wall_time_s': wall_time,
    }


def _is_int(value):
    return isinstance(value, int) and not isinstance(value, bool)
