"""The run loop of every algorithm: alternating training and evaluation phases, everything logged.

The loop knows no algorithm: `train.algorithm` names one (e.g. `train.algorithm = @PPO`), which
gives the loop what agents/algorithms/algorithm.py lists. A training iteration is the
simulator's T-step rollout of the batch of environments followed by the algorithm's update,
compiled. With the Gymnasium backend each iteration is one call; with the native backend
(`env_backend='native'`, TF environments from agents/envs) one call runs the iterations up to
the next evaluation (`iterations_per_call`) with no Python at all (`jit_compile` hands it to
XLA), and an evaluation is one call too: Python touches the loop only between them. Every
`eval_every_steps` environment steps the deterministic policy runs `eval_episodes` episodes on
separate environment instances; the run then writes a checkpoint, exports the policy as a
SavedModel to `policy/<step>/`, and writes a line of `metrics.jsonl` and TensorBoard summaries,
in this order, so that nothing the run logs leads its checkpoints. Exports after the first
(which runs `tf.saved_model.save`, see `_export`) are written by a background thread while
training goes on; the run waits for one before the next export and before it ends. A rerun in
the same logdir restores the latest checkpoint that reads back (step count, weights, optimizer
and normalizer statistics) and goes on (see recovery.py for what a killed run leaves behind and
how resuming deals with it). With the native backend the checkpoint also holds the training
episodes in flight, which a resumed run continues; Gymnasium's environments live in worker
processes, so their episodes restart. Each evaluation reseeds its environments from the run's
seed and its step, so it is a function of the weights and the step alone.

A population (`population=K`, native backend) trains K members in the same compiled calls, one
block of environments each; each member's run is an ordinary run directory, `<logdir>/member-<k>/`,
written as above (its configuration: the population's with the member's seed), and the steps it
counts are its own. A resumed population restores every member from the newest step all of them
saved, and starts new training episodes.

`run(stop_at_step=N)` (the trainer's `--stop_at_step`, not part of the configuration) stops at
the first iteration end at or past N with an evaluation and a save as at the end of a run; a
rerun without it (or with a later one) goes on with the same schedules, which `total_steps`
defines. On the native backend (deterministic on CPU) the stopped and continued run ends
bit-for-bit where an uninterrupted one ends; on the Gymnasium backend the training episodes
restart at the stop, so the continuation takes another random path (loop_test.py).

Faults end in a `TrainingError` that names the problem, never with a checkpoint of a broken
state:
- SIGTERM or SIGINT: the run saves a checkpoint after the current compiled call (an iteration,
  or a rollout of the evaluation) and raises `Interrupted`; a wait for environment workers
  ends at once, and a second signal stops the process at once (see tools/stop_signals.py);
- a training environment fails (raises, or its worker process dies or does not answer within
  `BatchEnv.timeout`, a minute by default): all training environments are rebuilt
  and the iteration is redone (`on_env_failure='restart'`, at most `max_env_restarts` times
  between checkpoints), or the run stops (`'stop'`);
- a non-finite observation or reward of the rollout, a non-finite parameter after the update, or
  what the algorithm reports non-finite (e.g. a loss or a gradient): the update is undone; the
  run stops (`on_nonfinite='stop'`) or goes on with the next batch (`'skip'`);
- a failed write (a full disk, a read-only logdir): the run stops naming the file; the previous
  checkpoint stays valid.
"""

import concurrent.futures
import contextlib
import functools
import json
import os
import re
import signal
import threading
import time
import types

import gin
import gymnasium as gym
import numpy as np
import tensorflow as tf
from absl import logging
from tensorboard.plugins.scalar import metadata as scalar_metadata
from tensorflow.python import pywrap_tfe

from agents.algorithms import algorithm as algorithm_lib
from agents.algorithms import registry
from agents.runs import (
    checkpoint_snapshot,
    environments,
    policy_export,
    recovery,
    run_config,
    run_dir,
    simulated_agent,
    xla_cache,
)
from agents.tools import batch_env, simulate, stop_signals

METRICS_FILE = run_dir.METRICS_FILE
CHECKPOINT_DIR = run_dir.CHECKPOINT_DIR
ENV_FAILURE_POLICIES = ('restart', 'stop')
NONFINITE_POLICIES = ('stop', 'skip')
# What the loop itself checks for non-finite values, by the names its errors use.
OBSERVATION = 'observation from the environments'
REWARD = 'reward from the environments'
PARAMETER = 'parameter'
ACTION = 'action (the policy acted on a non-finite observation, or its parameters are not finite)'
# In 'skip' mode, this many dropped batches in a row stop the run: the fault is not passing.
MAX_DROPPED_IN_A_ROW = 10
# InGraphBatchEnv's refusal of a NaN action, which ends the rollout before its checks.
_NONFINITE_ACTION = 'action contains NaN or infinity'
# Seeds of rebuilt training environments: far from the seeds of the first ones.
_RESTART_SEED_STRIDE = 7919
# The checkpoint's entry for the training episodes in flight (native backend only); a checkpoint
# without it (Gymnasium backend, or from before it existed) resumes with new episodes.
ROLLOUT_CHECKPOINT_KEY = 'rollout'
# A compiled call of several iterations ends after about this many seconds (see
# `train.iterations_per_call`), so that a stop signal or a progress line waits no longer.
CALL_SECONDS = 1.0
# A lone run of at most this many environments compiles without XLA by default (measured at
# 16: XLA's compilation delays the first returns more than it speeds the iterations).
SMALL_RUN_ENVS = 64
# The bindings that make a population, which its members' configurations do not have.
POPULATION_BINDINGS = ('train.population', 'train.population_members')
# Steps of the evaluation environments per compiled call (Gymnasium backend).
_EVAL_CHUNK = 100


class TrainingError(Exception):
    """Training cannot go on; the message names the problem and what was kept."""


class EnvironmentFailure(TrainingError):
    """The training environments failed and were not (or no more) restarted."""


class NonFiniteError(TrainingError):
    """A rollout or an update produced a NaN or an infinity."""


class WriteError(TrainingError):
    """A file of the run could not be written (e.g. the disk is full or read-only)."""


class Interrupted(TrainingError):
    """SIGTERM or SIGINT stopped the run (after saving a checkpoint).

    Attributes:
      signum: the signal's number; a binary exits with 128 + signum, as shells do.
      step: the environment step of the checkpoint.
    """

    def __init__(self, signum, step, message):
        super().__init__(message)
        self.signum = signum
        self.step = step


def train(logdir, stop_at_step=None, **overrides):
    """Trains as configured by gin (`train.*`, the algorithm's...); returns the last evaluation.

    `overrides` replace gin's values for the arguments of `training_run`; `stop_at_step`: see
    `TrainingRun.run`.
    """
    with training_run(logdir, **overrides) as run:
        return run.run(stop_at_step=stop_at_step)


@contextlib.contextmanager
@gin.configurable('train', denylist=['logdir'])
def training_run(logdir,
          algorithm=gin.REQUIRED,
          env_id=gin.REQUIRED,
          total_steps=gin.REQUIRED,
          num_envs=16,
          rollout_length=128,
          env_mode='external',
          env_backend='gymnasium',
          native_dtype='float64',
          jit_compile=None,
          optimize_graphs=None,
          num_workers=None,
          env_kwargs=None,
          wrappers=environments.DEFAULT_WRAPPERS,
          anneal_learning_rate=True,
          eval_every_steps=20_000,
          eval_episodes=10,
          checkpoints_to_keep=3,
          log_every_secs=10.0,
          on_env_failure='restart',
          max_env_restarts=3,
          on_nonfinite='stop',
          iterations_per_call=None,
          population=1,
          population_members=None,
          seed=0):
    """Builds the environments, the algorithm and the `TrainingRun` of `algorithm` on `env_id`.

    Nothing is written to `logdir` before `TrainingRun.run`, so a mistake in the configuration
    found here leaves no trace. The environments are closed when the context exits.

    Args:
      logdir: where summaries, checkpoints, `metrics.jsonl` and `operative_config.gin` go.
      algorithm: the algorithm to train, a subclass of `Algorithm` (agents/algorithms/
        algorithm.py), e.g. `@PPO` or `@A2C`.
      env_id: a Gymnasium environment id.
      total_steps: training budget in environment steps (rounded up to whole iterations).
      num_envs: environments stepped together for training.
      rollout_length: steps per environment between updates (T).
      env_mode: 'external' (worker processes, shared memory), 'in_process' or 'hybrid'
        (see `batch_env.BatchEnv`); the Gymnasium backend only.
      env_backend: 'gymnasium' (Gymnasium environments through the in-graph batch env) or
        'native' (the TF twin of `env_id` from agents/envs: rollout and update are one TF
        program, no Python per step; Pendulum-v1, CartPole-v1, MountainCarContinuous-v0,
        Acrobot-v1).
      native_dtype: 'float64' or 'float32', the physics dtype of the native training
        environments (float32 is faster; evaluation always runs float64, Gymnasium-exact).
      jit_compile: compile iterations and evaluations with XLA; None: for the native backend
        (the Gymnasium backend calls Python in the graph, which XLA cannot compile), but not for
        a lone run of at most `SMALL_RUN_ENVS` environments, whose first returns come sooner
        without XLA's compilation (measured: benchmarks/README.md).
      optimize_graphs: run TensorFlow's graph optimizer (Grappler) on the compiled functions;
        None: for the Gymnasium backend only, where it measured faster (on the native one it
        only lengthened the first iteration; benchmarks/README.md, "Tracing and graph
        optimization"). A setting of the whole process (`tf.config.optimizer`).
      num_workers: worker processes in external mode (default: the number of cores).
      env_kwargs: keyword arguments of `gymnasium.make`.
      wrappers: wrapper specs applied to each environment (see `wrappers.apply_wrappers`);
        by default bounded observations and actions are rescaled to [-1, 1] and the policy's
        actions clipped to the action space.
      anneal_learning_rate: anneal the algorithm's schedules (e.g. decay its learning rate
        linearly to zero) over the budget.
      eval_every_steps: evaluations (and checkpoints) come at the first iteration past each
        multiple of this many environment steps, and at the end.
      eval_episodes: episodes of the deterministic policy per evaluation.
      checkpoints_to_keep: how many checkpoints to keep.
      log_every_secs: seconds between progress lines.
      on_env_failure: when a training environment fails (raises, or its worker process dies):
        'restart' rebuilds all training environments (the episodes in flight are dropped) and
        redoes the iteration; 'stop' ends the run with an error naming the environment.
      max_env_restarts: restarts allowed between two checkpoints; one more failure ends the
        run.
      on_nonfinite: when the rollout holds a non-finite observation or reward, or the update a
        non-finite loss, gradient or parameter, the update is undone and 'stop' ends the run
        (the last checkpoint stays the last one) or 'skip' goes on with the next batch.
      iterations_per_call: the most training iterations one compiled call runs (native backend;
        the Gymnasium backend runs one). A call never runs past an evaluation, nor (once the
        first calls are timed) much longer than `CALL_SECONDS`, so that signals and progress
        lines are not held up. None: as many as fit. The iterations and their results are the
        same whatever the value; fewer, longer calls leave Python less to do.
      population: K > 1 trains K independent agents of seeds `seed`, ..., `seed` + K - 1 in
        one program (native backend, an algorithm of `registry.POPULATIONS`), each on its own
        `num_envs` environments and with its own `eval_episodes`; each member's run is an
        ordinary run in `<logdir>/member-<k>/` (its configuration: this one with its seed), and
        `total_steps` is each member's budget.
      population_members: the K members' own bindings, a list of dicts, e.g. `[{'train.seed':
        3, 'PPO.learning_rate': 1e-3}, ...]`: `train.seed` (default `seed` + k) and the
        hyperparameters in which members may differ (the population class's SCALARS, e.g.
        PPO's learning_rate, clip_ratio, entropy_coef, discount and gae_lambda). None: seeds
        alone.
      seed: seeds environments, network initialization and sampling.
    """
    _check_algorithm(algorithm)
    environments.check_env_id(env_id)
    for name, value in (('total_steps', total_steps), ('num_envs', num_envs),
                        ('population', population),
                        ('rollout_length', rollout_length), ('eval_every_steps', eval_every_steps),
                        ('eval_episodes', eval_episodes),
                        ('checkpoints_to_keep', checkpoints_to_keep)):
        if not _is_int(value) or value < 1:
            raise run_config.ConfigError(f'train.{name} must be a positive integer, got {value!r}')
    for name, value in (('seed', seed), ('max_env_restarts', max_env_restarts)):
        if not _is_int(value) or value < 0:
            raise run_config.ConfigError(
                f'train.{name} must be a non-negative integer, got {value!r}')
    for name, value, choices in (('env_mode', env_mode, environments.MODES),
                                 ('env_backend', env_backend, environments.BACKENDS),
                                 ('native_dtype', native_dtype, ('float64', 'float32')),
                                 ('jit_compile', jit_compile, (None, True, False)),
                                 ('optimize_graphs', optimize_graphs, (None, True, False)),
                                 ('on_env_failure', on_env_failure, ENV_FAILURE_POLICIES),
                                 ('on_nonfinite', on_nonfinite, NONFINITE_POLICIES)):
        if value not in choices:
            raise run_config.ConfigError(
                f'train.{name} must be one of {", ".join(map(repr, choices))}; got {value!r}')
    if not isinstance(log_every_secs, int | float) or not log_every_secs > 0:
        raise run_config.ConfigError(
            f'train.log_every_secs must be a positive number, got {log_every_secs!r}')
    steps_per_iteration = num_envs * rollout_length
    num_iterations = -(-total_steps // steps_per_iteration)
    native = env_backend == 'native'
    if population > 1 and not native:
        raise run_config.ConfigError(
            'train.population > 1 needs train.env_backend = \'native\': a population is one '
            'compiled program, environments included')
    if population > 1:
        try:
            population_class = registry.population_class(algorithm)
        except ValueError as error:
            raise run_config.ConfigError(f'train.population = {population}: {error}') from None
    if jit_compile is None:
        jit_compile = native and (population > 1 or num_envs > SMALL_RUN_ENVS)
    if jit_compile and not native:
        raise run_config.ConfigError(
            'train.jit_compile = True needs train.env_backend = \'native\': Gymnasium '
            'environments are stepped by Python, which XLA cannot compile')
    if iterations_per_call is not None and (
            not _is_int(iterations_per_call) or iterations_per_call < 1):
        raise run_config.ConfigError('train.iterations_per_call must be a positive integer or '
                                     f'None, got {iterations_per_call!r}')
    if not native and iterations_per_call not in (None, 1):
        raise run_config.ConfigError(
            'train.iterations_per_call > 1 needs train.env_backend = \'native\': a failed '
            'Gymnasium environment is restarted and its iteration redone one at a time')
    if iterations_per_call is None:
        # Enough for the iterations between two evaluations.
        iterations_per_call = -(-eval_every_steps // steps_per_iteration) if native else 1
    if optimize_graphs is None:
        optimize_graphs = not native
    tf.config.optimizer.set_experimental_options({'disable_meta_optimizer': not optimize_graphs})
    members = None
    if population > 1:
        members, member_bindings = _population_members(
            population, population_members, seed, algorithm, population_class)
    elif population_members is not None:
        raise run_config.ConfigError('train.population_members needs train.population > 1')
    seeds = [member['seed'] for member in members] if members else seed
    with environments.Environments(
            env_id, env_backend, num_envs, eval_episodes, seeds, env_kwargs=env_kwargs,
            wrappers=wrappers, mode=env_mode, num_workers=num_workers, native_dtype=native_dtype,
            check_inputs=not jit_compile) as envs:
        make_agent = functools.partial(
            build_algorithm, algorithm, envs.training.observation_space,
            envs.training.action_space, num_envs,
            lr_anneal_updates=num_iterations if anneal_learning_rate else None)
        if members:
            try:
                agent = population_class(make_member=make_agent, members=members)
            except ValueError as error:
                raise run_config.ConfigError(
                    f'train.population = {population}: {error}') from error
        else:
            agent, member_bindings = make_agent(seed=seed), None
        yield TrainingRun(logdir, agent, envs.training, envs.evaluation, rollout_length,
                          total_steps, eval_every_steps, checkpoints_to_keep, log_every_secs,
                          make_train_env=envs.make_training, on_env_failure=on_env_failure,
                          max_env_restarts=max_env_restarts, on_nonfinite=on_nonfinite,
                          seed=seeds, jit_compile=jit_compile,
                          iterations_per_call=iterations_per_call,
                          member_bindings=member_bindings)


def _population_members(population, population_members, seed, algorithm, population_class):
    """The members' arguments of `population_class` and their gin bindings (see
    `train.population_members`); raises a ConfigError naming what is wrong."""
    if population_members is None:
        population_members = [{} for _ in range(population)]
    if not isinstance(population_members, list | tuple) or len(population_members) != population:
        raise run_config.ConfigError(
            f'train.population_members must be a list of {population} dicts (one per member of '
            f'train.population = {population}), got {population_members!r}')
    name = getattr(algorithm, '__name__', str(algorithm))
    allowed = {'train.seed'} | {f'{name}.{scalar}' for scalar in population_class.SCALARS}
    members, bindings = [], []
    for index, overrides in enumerate(population_members):
        unknown = sorted(set(overrides) - allowed) if isinstance(overrides, dict) else None
        if unknown is None or unknown:
            raise run_config.ConfigError(
                f'train.population_members[{index}] is {overrides!r}: a member may bind only '
                f'{", ".join(sorted(allowed))}')
        member_seed = overrides.get('train.seed', seed + index)
        if not _is_int(member_seed) or member_seed < 0:
            raise run_config.ConfigError(
                f'train.population_members[{index}]: train.seed must be a non-negative integer, '
                f'got {member_seed!r}')
        members.append({'seed': member_seed, **{
            key.split('.', 1)[1]: value for key, value in overrides.items()
            if key != 'train.seed'}})
        bindings.append({'train.seed': member_seed, **{
            key: value for key, value in overrides.items() if key != 'train.seed'}})
    return members, bindings


def _is_int(value):
    return isinstance(value, int) and not isinstance(value, bool)


@gin.configurable
def configure_threads(inter_op_threads=1, intra_op_threads=0):
    """Sets TensorFlow's thread pools; must run before TensorFlow executes anything.

    One inter-op thread measured fastest for the rollout (each step is a chain of small ops
    around the environment call, where more threads only add hand-offs); 0 lets TF choose.
    """
    tf.config.threading.set_inter_op_parallelism_threads(inter_op_threads)
    tf.config.threading.set_intra_op_parallelism_threads(intra_op_threads)


def check_config():
    """Checks what can be checked of the parsed gin config before a logdir is created."""
    try:
        algorithm = gin.query_parameter('train.algorithm')
    except ValueError:
        raise run_config.ConfigError(
            'no algorithm: bind train.algorithm in the config, e.g. train.algorithm = @PPO'
        ) from None
    if isinstance(algorithm, gin.config.ConfigurableReference):
        _check_algorithm(algorithm.scoped_configurable_fn)
    try:
        env_id = gin.query_parameter('train.env_id')
    except ValueError:
        raise run_config.ConfigError('no environment: bind train.env_id in the config') from None
    environments.check_env_id(env_id)


def _check_algorithm(algorithm):
    # Gin passes a configurable class as a function that builds it.
    cls = getattr(algorithm, '__wrapped__', algorithm)
    if not (isinstance(cls, type) and issubclass(cls, algorithm_lib.Algorithm)):
        raise run_config.ConfigError(
            f'train.algorithm must name an algorithm (a subclass of agents.algorithms.algorithm.'
            f'Algorithm, e.g. @PPO or @A2C), got {getattr(cls, "__name__", repr(cls))}')


def build_algorithm(algorithm, observation_space, action_space, num_envs, seed,
                    lr_anneal_updates=None, **hyperparameters):
    """The algorithm (configured by its own gin bindings, but for `hyperparameters`, e.g. a
    population member's) for these spaces."""
    try:
        agent = algorithm(
            observ_shape=observation_space.shape,
            action_size=environments.action_size(action_space), num_envs=num_envs, seed=seed,
            lr_anneal_updates=lr_anneal_updates, **hyperparameters)
    except (ValueError, TypeError) as error:
        name = getattr(algorithm, '__name__', 'the algorithm')
        raise run_config.ConfigError(f'cannot build the {name} agent: {error}') from error
    discrete = isinstance(action_space, gym.spaces.Discrete)
    if agent.action_dtype.is_integer != discrete:
        kind = 'discrete' if discrete else 'continuous'
        wanted = 'a categorical' if discrete else 'a Gaussian'
        name = type(agent).__name__
        policy = type(agent.exported_policy()[0]).__name__
        raise run_config.ConfigError(
            f'the policy network {policy} acts with {agent.action_dtype.name} actions but the '
            f'environment\'s action space {action_space} is {kind}; set {name}.policy_network '
            f'to {wanted} policy')
    return agent


class TrainingRun:
    """One training run in its logdir: state, checkpoints, logs."""

    def __init__(self, logdir, agent, train_env, eval_env, rollout_length, total_steps,
                 eval_every_steps, checkpoints_to_keep, log_every_secs, make_train_env=None,
                 on_env_failure='restart', max_env_restarts=3, on_nonfinite='stop', seed=0,
                 jit_compile=False, iterations_per_call=1, member_bindings=None):
        """`agent` may be a population (an algorithm with `members`, e.g. PPOPopulation): then
        `train_env` and `eval_env` hold a block of environments per member, `seed` is the list of
        the members' seeds, and `member_bindings` the gin bindings ({'train.seed': ...}) that
        make a member's configuration from the population's."""
        self._logdir = logdir
        self._agent = agent
        self._population = agent.num_members > 1
        self._train_env = train_env
        self._eval_env = eval_env
        self._rollout_length = rollout_length
        self._num_members = agent.num_members
        # A member's steps: each member counts its own, as a lone run of its seed would.
        self._steps_per_iteration = len(train_env) // self._num_members * rollout_length
        self._total_steps = total_steps
        self._eval_every_steps = eval_every_steps
        self._checkpoints_to_keep = checkpoints_to_keep
        self._log_every_secs = log_every_secs
        self._make_train_env = make_train_env
        self._on_env_failure = on_env_failure
        self._max_env_restarts = max_env_restarts
        self._on_nonfinite = on_nonfinite
        self._seed = seed
        self._iterations_per_call = iterations_per_call
        self._env_restarts = 0  # Since the last checkpoint.
        self._total_env_restarts = 0
        self.skipped_batches = 0
        self._dropped_in_a_row = 0
        # An agent whose update runs programs side by side (PPO's concurrent_networks) calls
        # them itself: one XLA program around the iteration would fuse them into one again,
        # so XLA then compiles the rollout alone.
        concurrent_update = agent.concurrent_update
        # Autograph off: the code has no tensor-dependent Python control flow, and converting
        # it lengthened the first iteration's tracing by seconds.
        self._compiled_iterations = tf.function(
            self._iterations_graph, autograph=False,
            jit_compile=jit_compile and not concurrent_update)
        # Native evaluation environments run whole episodes in one call; Gymnasium's in calls
        # of `_EVAL_CHUNK` steps, between which the run checks for stop signals.
        self._native_eval = getattr(eval_env, 'vector_env', None) is None
        self._eval_rollout = tf.function(
            self._evaluation_graph if self._native_eval else self._eval_rollout_graph,
            autograph=False, jit_compile=jit_compile)
        train_agent = simulated_agent.SimulatedAgent(agent, len(train_env))
        self._train_sim = simulate.Simulator(train_env, train_agent)
        self._rollout = functools.partial(self._train_sim.rollout, rollout_length)
        if jit_compile and concurrent_update:
            self._rollout = tf.function(self._rollout, autograph=False, jit_compile=True)
        if concurrent_update and tf.config.threading.get_inter_op_parallelism_threads() == 1:
            logging.warning('The agent trains its networks side by side, but TensorFlow has one '
                            'inter-op thread, which runs them one after the other; set '
                            'configure_threads.inter_op_threads = 2.')
        self._eval_sim = simulate.Simulator(
            eval_env, simulated_agent.SimulatedAgent(agent, len(eval_env), greedy=True))
        self.env_steps = tf.Variable(0, dtype=tf.int64, trainable=False, name='env_steps')
        self.wall_time = tf.Variable(0.0, dtype=tf.float64, trainable=False, name='wall_time')
        self.steps_per_sec = tf.Variable(
            0.0, dtype=tf.float64, trainable=False, name='steps_per_sec')
        saved = dict(agent=agent.checkpointed(), env_steps=self.env_steps, wall_time=self.wall_time,
                     steps_per_sec=self.steps_per_sec)
        if self._population:
            # Each member's directory is an ordinary run: its checkpoint holds the member as
            # a lone agent (`to_members` copies the population's state there before a save).
            # The training episodes in flight are not saved: a resumed population starts new
            # ones.
            self._runs = [
                _RunDirectory(os.path.join(logdir, run_dir.MEMBER_DIR.format(index)), member,
                              seed[index], tf.train.Checkpoint(**dict(saved, agent=member.checkpointed())),
                              run_dir.MEMBER_DIR.format(index), member_bindings[index])
                for index, member in enumerate(agent.members)]
        elif getattr(train_env, 'state_in_variables', False):
            # The training episodes in flight (native environments), which a resumed run
            # continues: the environments, the episode statistics, the policy state.
            saved[ROLLOUT_CHECKPOINT_KEY] = tf.train.Checkpoint(
                env=train_env, episode_score=self._train_sim.score,
                episode_length=self._train_sim.length,
                agent=tf.train.Checkpoint(**train_agent.state_variables()))
        if not self._population:
            self._runs = [_RunDirectory(logdir, agent, seed, tf.train.Checkpoint(**saved))]
        # Whether the restored checkpoint held the episodes in flight (see `restore`).
        self.episodes_restored = False
        self._restored = False
        # An executor while `run` runs: the evaluation's compilation ahead, then checkpoints and
        # policy exports, written in the order they were taken.
        self._background_thread = None
        self._eval_warmup = None  # The future of the evaluation compiled ahead (see `_run`).
        # The save in flight: (the step saved before it, its future, or its writes to run).
        self._pending_save = None
        self._snapshot = checkpoint_snapshot.CheckpointSnapshot(
            [run.checkpoint for run in self._runs])
        self._after_save = None  # Called with the saved state complete (see `run`).
        self._signals = None  # The StopSignals watched while `run` runs.
        self._heartbeat = None  # The _Heartbeat of `run`.
        self._step = 0  # int(env_steps) as of the last iteration, for other threads.
        self._saved_step = None
        # The update's whole state, copied before each update to undo a non-finite one.
        seen, self._variables = set(), []
        for variable in agent.undo_variables():
            if variable.ref() not in seen:
                seen.add(variable.ref())
                self._variables.append(variable)
        # What a compiled iteration's `nonfinite` code k > 0 names: the (k-1)-th (see
        # `_iteration_graph`, which fills in the algorithm's quantities when it is traced).
        self._nonfinite_quantities = None
        self._backups = [tf.Variable(variable.read_value(), trainable=False)
                         for variable in self._variables]
        self._float_variables = [variable for variable in self._variables
                                 if variable.dtype.is_floating]

    @property
    def checkpoint(self):
        """The checkpoint of a lone run (a population's members have one each)."""
        return self._runs[0].checkpoint

    def check(self):
        """Traces the compiled iteration and evaluation, so that mistakes which only show in the
        graph (shapes, dtypes, minibatch sizes) surface as a ConfigError before anything is
        written. Executes nothing."""
        try:
            self._compiled_iterations.get_concrete_function(
                tf.TensorSpec([], tf.bool), tf.TensorSpec([], tf.int32))
            self._eval_rollout.get_concrete_function(tf.TensorSpec([], tf.bool))
        except (ValueError, TypeError) as error:
            raise run_config.ConfigError(
                f'the configuration does not build a training graph: {run_config.first_line(error)}'
            ) from error

    def restore(self):
        """Restores the latest checkpoint that reads back, if any; returns its path or None.

        `episodes_restored` tells whether it held the training episodes in flight (native
        backend), which the next iteration then continues; otherwise it resets every training
        environment. A population restores each member's checkpoint of the newest step that
        every member has (the path returned is the first member's).

        Broken checkpoints are moved aside with a warning (see recovery.py); if checkpoints
        exist but none reads back, raises TrainingError and changes nothing.
        """
        if self._restored:
            return self._runs[0].manager.latest_checkpoint
        for run in self._runs:
            try:
                recovered = recovery.recover_checkpoints(run.checkpoint_dir)
            except recovery.RecoveryError as error:
                raise TrainingError(str(error)) from error
            except OSError as error:
                raise WriteError(f'cannot recover the checkpoints in {run.checkpoint_dir}: '
                                 f'{error.filename}: {error.strerror}') from error
            for path, problem in recovered.corrupt:
                logging.warning('Checkpoint %s does not read back (%s); moved to %s/.', path,
                                problem, os.path.join(run.checkpoint_dir, recovery.CORRUPT_DIR))
            run.corrupt = bool(recovered.corrupt)
            run.manager = tf.train.CheckpointManager(
                run.checkpoint, run.checkpoint_dir, max_to_keep=self._checkpoints_to_keep)
        paths = self._common_checkpoints()
        for run, path in zip(self._runs, paths, strict=True):
            if not path:
                continue
            try:
                run.checkpoint.restore(path)
                self.episodes_restored = (
                    hasattr(run.checkpoint, ROLLOUT_CHECKPOINT_KEY) and any(
                        name.startswith(ROLLOUT_CHECKPOINT_KEY + '/') for name in
                        tf.train.load_checkpoint(path).get_variable_to_shape_map()))
            except (tf.errors.OpError, ValueError, AssertionError) as error:
                raise TrainingError(f'cannot restore checkpoint {path}: '
                                    f'{run_config.first_line(error)}') from error
            if run.corrupt:
                logging.warning('Resumed from %s at step %d: the newest checkpoint that reads '
                                'back.', path, int(self.env_steps))
            else:
                logging.info('Resumed from %s at step %d.', path, int(self.env_steps))
        if self._population and paths[0]:
            self._agent.from_members()
        self._restored = True
        return paths[0]

    def _common_checkpoints(self):
        """The checkpoint each run directory restores: its latest, or for a population the
        newest step every member kept (members save one after the other, so a killed run may
        have saved some members' last step only)."""
        if not self._population:
            return [self._runs[0].manager.latest_checkpoint]
        by_step = [{recovery.checkpoint_step(path): path for path in run.manager.checkpoints}
                   for run in self._runs]
        common = set.intersection(*(set(steps) for steps in by_step))
        if not common:
            if any(by_step):
                kept = ', '.join(f'{run.name}: {sorted(steps)}' for run, steps in zip(
                    self._runs, by_step, strict=True))
                raise TrainingError(
                    f'the members of the population in {self._logdir} have no checkpoint of '
                    f'the same step ({kept}); the population cannot resume')
            return [None] * len(self._runs)
        step = max(common)
        for run, steps in zip(self._runs, by_step, strict=True):
            if max(steps) > step:
                logging.warning('%s has checkpoints past step %d, the newest every member has '
                                '(a save was interrupted); the population resumes from %d.',
                                run.logdir, step, step)
        return [steps[step] for steps in by_step]

    def run(self, after_save=None, signals=None, stop_at_step=None):
        """Trains from the latest checkpoint to the budget; returns the last evaluation.

        `after_save`, if given, is called whenever the logdir holds a complete save (after each
        evaluation's checkpoint, policy and metrics line, and after the checkpoint of a signal),
        e.g. to upload it to the run's bucket. `signals`: the entered StopSignals of the
        caller, if it watches them already. `stop_at_step` (a positive int, or None): stop at
        the first iteration end at or past it, short of the budget, with an evaluation and a save
        as at the budget; a run already there does nothing. The schedules stay those of the
        budget, so a rerun goes on as if the run had not stopped. Raises TrainingError (a
        subclass naming the fault) when training cannot go on.
        """
        if stop_at_step is not None and (not _is_int(stop_at_step) or stop_at_step < 1):
            raise ValueError(f'stop_at_step must be a positive integer, got {stop_at_step!r}')
        self._after_save = after_save
        with contextlib.ExitStack() as stack:
            if signals is None:
                signals = stack.enter_context(stop_signals.StopSignals())
            self._signals = signals
            stack.enter_context(signals.deferred())
            stack.callback(self._signals.on_stop(self._cancel_env_waits))
            self._heartbeat = stack.enter_context(_Heartbeat(
                max(self._log_every_secs, 1.0), self._heartbeat_line))
            self._background_thread = stack.enter_context(concurrent.futures.ThreadPoolExecutor(
                max_workers=1, thread_name_prefix='background'))
            try:
                return self._run(stop_at_step)
            except BaseException:
                # The first fault is the one to report; a write of the save in flight that
                # failed too is logged (what it left is cleaned up on resume).
                failure = self._wait_for_save()
                if failure is not None:
                    logging.warning('Could not write %s (%s).', failure.what,
                                    _tf_reason(failure.error) if isinstance(
                                        failure.error, tf.errors.OpError) else failure.error)
                raise

    def _cancel_env_waits(self, signum):
        """Ends a wait for the training environments' workers, e.g. for one that hangs."""
        vector_env = getattr(self._train_env, 'vector_env', None)
        if vector_env is not None:
            vector_env.cancel_wait(f'stopping on {signal.Signals(signum).name}')

    def _check_signals(self):
        """Stops the run (Interrupted) if a stop signal came."""
        if self._signals.signum is not None:
            self._stop_on_signal(self._signals.signum)

    def _heartbeat_line(self, phase, seconds):
        """The progress line of a phase that has lasted `seconds` without one."""
        line = f'step {self._step}/{self._total_steps} | {phase} for {seconds:.0f} s'
        vector_env = getattr(self._train_env, 'vector_env', None)
        waiting = vector_env.waiting() if vector_env is not None else None
        if waiting:
            waited, workers = waiting
            line += (f' | waiting {waited:.0f} s for {", ".join(workers)} (deemed hung after '
                     'BatchEnv.timeout)')
        return line

    def _run(self, stop_at_step):
        for run in self._runs:
            with self._writing(f'the logdir {run.logdir}'):
                if run.bindings is not None:
                    self._write_member_config(run)
                removed = recovery.clean_partial_writes(
                    run.logdir, run.checkpoint_dir, run.policy_dir)
            if removed:
                logging.info('Removed what interrupted writes left: %s', ', '.join(removed))
        path = self.restore()
        start_steps = self._step = int(self.env_steps)
        self._saved_step = start_steps if path else None
        records = []
        for run in self._runs:
            with self._writing(f'the summaries in {run.logdir}'):
                run.writer = tf.summary.create_file_writer(run.logdir)
            with self._writing(os.path.join(run.logdir, METRICS_FILE)):
                records.append(recovery.repair_metrics(
                    os.path.join(run.logdir, METRICS_FILE), start_steps))
        latest = self._complete_last_save(start_steps, records, stop_at_step)
        # The budget, or the stop short of it (whole iterations, as the budget).
        target = min(self._total_steps, stop_at_step or self._total_steps)
        if self._native_eval and latest is None and start_steps < target:
            # The evaluation program compiles (on the second core) while the first iteration
            # does: its first run, on the current weights, touches only the evaluation
            # environments and draws no random numbers; every evaluation reseeds and resets them.
            # Both are traced first, here: tracing in two threads at once would number the
            # graphs' functions in a varying order, and XLA's persistent cache would miss.
            self.check()
            self._eval_warmup = self._background_thread.submit(
                self._eval_rollout, tf.constant(True))
        start_time = time.time()
        start_wall = float(self.wall_time)
        train_seconds = 0.0
        last_log = time.time()
        first_iteration = True
        seconds_per_iteration = None  # Of the last call, once one ran without compiling.
        episodes = [0, 0.0]  # Training episodes ended since the last progress line, their return.
        while int(self.env_steps) < target:
            self._check_signals()
            _clear_scalar_cache()
            began = time.time()
            previous_steps = int(self.env_steps)
            count = self._call_size(previous_steps, target, seconds_per_iteration)
            self._heartbeat.phase(
                'the first iteration (tracing and compiling)' if first_iteration
                else 'an iteration' if count == 1 else f'a call of {count} iterations')
            # New episodes everywhere, unless the checkpoint held those in flight.
            iterations = self._iterations(first_iteration and not self.episodes_restored, count)
            seconds = time.time() - began
            train_seconds += seconds
            if not first_iteration:
                seconds_per_iteration = seconds / len(iterations)
            steps = self._step = int(self.env_steps)
            steps_per_sec = (steps - start_steps) / max(train_seconds, 1e-9)
            self._write_iteration_summaries(iterations, steps, steps_per_sec)
            for iteration in iterations:
                episodes[0] += int(iteration.episodes.sum())
                episodes[1] += float(iteration.return_sum.sum())
            if first_iteration:
                for run in self._runs:
                    path = os.path.join(run.logdir, run_config.OPERATIVE_CONFIG_FILE)
                    with self._writing(path):
                        run_config.write_atomic(path, run.configured(gin.operative_config_str()))
                first_iteration = False
            self.wall_time.assign(start_wall + time.time() - start_time)
            self.steps_per_sec.assign(steps_per_sec)
            # The last iteration of this call: the budget's, or a stop's.
            last = steps >= target
            # A stop short of the budget saves as the budget does: it has an evaluation. Its
            # environments are seeded by the step (`_evaluate`), so that it changes nothing later.
            if self._eval_due(previous_steps, steps) or last:
                latest = self._evaluate_and_save(steps)
            if last or time.time() - last_log >= self._log_every_secs:
                last_log = time.time()
                self._log_progress(steps, steps_per_sec, episodes, latest)
                episodes = [0, 0.0]
            self._heartbeat.phase('training')
        self._finish_save()
        steps = int(self.env_steps)
        if steps < self._total_steps:  # At or past stop_at_step.
            if steps == start_steps:
                logging.info('Nothing to do: the run is at step %d, at or past --stop_at_step=%d; '
                             'rerun without --stop_at_step, or with a later one, to continue.',
                             steps, stop_at_step)
            else:
                logging.info('Stopped at step %d of %d (--stop_at_step=%d); rerun without '
                             '--stop_at_step, or with a later one, to continue.', steps,
                             self._total_steps, stop_at_step)
        elif latest is None:
            logging.info('Nothing to do: the run already reached %d steps.', self._total_steps)
        else:
            logging.info('Done: %d steps in %.1f s, %.0f env steps/s, eval return %s.',
                         latest['step'], latest['wall_time_s'], latest['env_steps_per_sec'],
                         _format_return(latest['mean_return']))
        self._flush_summaries()
        return latest

    def _write_iteration_summaries(self, iterations, steps, steps_per_sec):
        """Each run's TensorBoard scalars of the iterations of a call (the last ending at
        `steps`), written by one compiled call per run: written one by one from Python, a
        population's scalars took longer than its iterations."""
        names = [f'train/{name}' for name in iterations[0].metrics] + [
            'train/episode_return', 'train/episode_length', 'train/env_steps_per_sec']
        # [iterations, members, names]; NaN: not written (an undone update's metrics, the
        # returns of an iteration where no episode ended).
        values = np.full([len(iterations), self._num_members, len(names)], np.nan, np.float32)
        for index, iteration in enumerate(iterations):
            kept = ~iteration.dropped
            for column, value in enumerate(iteration.metrics.values()):
                values[index, kept, column] = value[kept]
            ended = iteration.episodes > 0
            count = np.maximum(iteration.episodes, 1)
            values[index, ended, -3] = (iteration.return_sum / count)[ended]
            values[index, ended, -2] = (iteration.length_sum / count)[ended]
            values[index, :, -1] = steps_per_sec
        ends = steps - self._steps_per_iteration * np.arange(len(iterations))[::-1]
        for member, run in enumerate(self._runs):
            with self._writing(f'the summaries in {run.logdir}'):
                if run.write_scalars is None or run.write_scalars.names != names:
                    run.write_scalars = _ScalarWriter(run.writer, names)
                run.write_scalars(tf.constant(ends, tf.int64), tf.constant(values[:, member]))

    def _eval_due(self, previous_steps, steps):
        """Whether the iteration from `previous_steps` to `steps` ends with an evaluation.

        A function of the steps alone, so a resumed run evaluates where an uninterrupted one
        would have.
        """
        every = self._eval_every_steps
        return steps >= self._total_steps or steps // every > previous_steps // every

    def _call_size(self, steps, target, seconds_per_iteration):
        """How many iterations the next compiled call runs from `steps`: up to the next
        evaluation or `target`, at most `iterations_per_call`, and about CALL_SECONDS' worth once
        an iteration's time is known (the first call, which compiles, runs one)."""
        most = self._iterations_per_call
        if seconds_per_iteration is None:
            most = 1
        else:
            most = min(most, max(1, int(CALL_SECONDS / max(seconds_per_iteration, 1e-9))))
        count = 1
        end = steps + self._steps_per_iteration
        while count < most and end < target and not self._eval_due(steps, end):
            count += 1
            steps, end = end, end + self._steps_per_iteration
        return count

    def _iterations_graph(self, reset, count):
        """Up to `count` iterations (at most `iterations_per_call`) in one compiled call.

        The first iteration resets every environment if `reset`; the call stops early after an
        iteration whose batch was non-finite (its update undone). Returns the number of
        iterations run, each one's statistics stacked to [iterations_per_call] (the update's
        metrics; the training episodes that ended with a finite return, their summed return and
        length) and the non-finite report of the last one.
        """
        members = self._num_members

        def iteration(reset):
            summary, metrics = self._iteration_graph(reset)
            ended = ((summary['terminated'] | summary['truncated'])
                     & tf.math.is_finite(summary['episode_return']))

            def member_sum(values):  # [T, K * N] -> [K]
                return tf.reduce_sum(tf.reshape(values, [tf.shape(values)[0], members, -1]),
                                     axis=[0, 2])

            def ended_sum(values):
                return member_sum(tf.where(ended, tf.cast(values, tf.float64), 0.0))

            # Every statistic per member: [K] (a lone run's metrics are scalars).
            stats = dict({name: tf.reshape(value, [members]) for name, value in metrics.items()},
                         episodes=member_sum(tf.cast(ended, tf.int32)),
                         return_sum=ended_sum(summary['episode_return']),
                         length_sum=ended_sum(summary['episode_length']))
            report = {name: summary[name] for name in (
                'nonfinite', 'nonfinite_envs', 'finite_variables')}
            return stats, report

        size = self._iterations_per_call
        if size == 1:
            stats, report = iteration(reset)
            return dict(report, ran=tf.constant(1),
                        stats={name: value[None] for name, value in stats.items()})
        # The loop's variables need the outputs' structure, which a trace of the body tells;
        # the loop then calls that trace rather than tracing the body a second time (running
        # the first iteration outside the loop instead made XLA compile it twice).
        traced = tf.function(iteration, autograph=False).get_concrete_function(
            tf.TensorSpec([], tf.bool))
        stats, report = traced.structured_outputs
        stacked = {name: tf.zeros([size] + value.shape, value.dtype)
                   for name, value in stats.items()}
        report = {name: tf.zeros(value.shape, value.dtype) for name, value in report.items()}

        def body(index, reset, stacked, unused_report):
            stats, report = traced(reset)
            stacked = {name: tf.tensor_scatter_nd_update(values, [[index]], [stats[name]])
                       for name, values in stacked.items()}
            return index + 1, tf.constant(False), stacked, report

        ran, _, stacked, report = tf.while_loop(
            lambda index, unused_reset, unused_stacked, report: (index < count) & (
                tf.reduce_all(report['nonfinite'] == 0)),
            body, (tf.constant(0), reset, stacked, report), parallel_iterations=1,
            maximum_iterations=size)
        return dict(report, ran=ran, stats=stacked)

    def _iteration_graph(self, reset):
        """One iteration: the rollout and the update, with the update undone if non-finite."""
        transitions = self._rollout(reset=reset)
        batch = {
            'observ': transitions.observ,
            'action': transitions.action,
            'reward': transitions.reward,
            'terminated': transitions.terminated,
            'truncated': transitions.truncated,
            'next_observ': transitions.next_observ,
            'extras': transitions.extras,
        }
        bad_observ = tf.zeros([len(self._train_env)], tf.bool)
        if transitions.observ.dtype.is_floating:
            for observ in (transitions.observ, transitions.next_observ):
                flat = tf.reshape(observ, tf.concat([tf.shape(observ)[:2], [-1]], 0))
                bad_observ |= tf.reduce_any(~tf.math.is_finite(flat), axis=[0, 2])
        bad_reward = tf.reduce_any(~tf.math.is_finite(transitions.reward), axis=0)
        save = [backup.assign(variable) for backup, variable in zip(
            self._backups, self._variables, strict=True)]
        with tf.control_dependencies(save):
            batch = tf.nest.map_structure(tf.identity, batch)
        # What went non-finite per member ([K]; a lone run is one member), variables [V, K].
        members = self._num_members

        def per_member(values):
            return tf.reduce_any(tf.reshape(values, [members, -1]), axis=1)

        metrics, learned = self._agent.learn(batch, ~per_member(bad_observ | bad_reward))
        finite_variables = tf.stack([
            ~per_member(~tf.math.is_finite(variable)) for variable in self._float_variables])
        checks = [(OBSERVATION, per_member(bad_observ)), (REWARD, per_member(bad_reward)),
                  *((name, tf.reshape(value, [members])) for name, value in learned.items()),
                  (PARAMETER, ~tf.reduce_all(finite_variables, axis=0))]
        self._nonfinite_quantities = [name for name, _ in checks] + [ACTION]
        nonfinite = tf.zeros([members], tf.int32)
        for code, (_, bad) in reversed(list(enumerate(checks, 1))):  # The first one wins.
            nonfinite = tf.where(bad, code, nonfinite)

        with tf.control_dependencies(tf.nest.flatten(metrics) + [finite_variables]):
            undone = self._agent.undo(
                nonfinite > 0, list(zip(self._variables, self._backups, strict=True)))
        with tf.control_dependencies(undone):
            self.env_steps.assign_add(
                tf.cast(tf.size(transitions.reward) // members, tf.int64))
        summary = {
            'terminated': transitions.terminated, 'truncated': transitions.truncated,
            'episode_return': transitions.episode_return,
            'episode_length': transitions.episode_length,
            'nonfinite': nonfinite, 'nonfinite_envs': bad_observ | bad_reward,
            'finite_variables': finite_variables}
        return summary, metrics

    def _iterations(self, reset, count):
        """One compiled call of up to `count` iterations, redone on fresh environments if they
        fail (see `on_env_failure`; Gymnasium runs one iteration per call); returns each
        iteration run as a namespace of its metrics (none for a dropped batch) and its training
        episodes' count, summed return and summed length. After a failed call, whose iterations
        before the failure stand (their statistics lost), the retry runs the rest."""
        start = int(self.env_steps)
        while True:
            self._check_signals()  # Also before a retry on rebuilt environments.
            # Native environments have no vector env: they run no code that could crash.
            vector_env = getattr(self._train_env, 'vector_env', None)
            if vector_env is not None:
                vector_env.failure = None
            try:
                outputs = self._compiled_iterations(tf.constant(reset), tf.constant(count))
                break
            except tf.errors.OpError as error:
                failure = vector_env.failure if vector_env is not None else None
                if isinstance(failure, batch_env.WaitCancelled):
                    # A stop signal ended the wait for the workers, which may hang: they are
                    # not waited for again.
                    with contextlib.suppress(Exception):
                        vector_env.close(terminate=True)
                    self._check_signals()
                    raise
                if failure is not None:
                    self._restart_envs(failure)
                elif _NONFINITE_ACTION in error.message:
                    # The rollout ended early; nothing was updated. The retry below resets
                    # every environment (reset=True): new episodes.
                    self._on_nonfinite_batch(ACTION, None)
                elif xla_cache.damaged(error):
                    self._on_damaged_cache(error)
                else:
                    raise
            reset = True
            count -= (int(self.env_steps) - start) // self._steps_per_iteration
            start = int(self.env_steps)
        stats = {name: values.numpy() for name, values in outputs.pop('stats').items()}
        iterations = []
        for index in range(int(outputs['ran'])):
            metrics = {name: values[index] for name, values in stats.items()}
            iterations.append(types.SimpleNamespace(
                episodes=metrics.pop('episodes'), return_sum=metrics.pop('return_sum'),
                length_sum=metrics.pop('length_sum'), metrics=metrics,
                dropped=np.zeros(self._num_members, bool)))
        nonfinite = outputs['nonfinite'].numpy()
        if len(iterations) > 1 or not nonfinite.any():
            self._dropped_in_a_row = 0
        if nonfinite.any():
            # The metrics of an undone update are not written.
            iterations[-1].dropped = nonfinite > 0
            self._on_nonfinite_batch(nonfinite, {
                name: outputs[name].numpy() for name in ('nonfinite_envs', 'finite_variables')})
        return iterations

    def _on_damaged_cache(self, error):
        """Raises TrainingError for a compiled program that XLA's cache failed to load, having
        moved the cache's entries aside: TensorFlow keeps the failure for the process, and the
        next run compiles afresh."""
        kept = (f'the last checkpoint (step {self._saved_step}) is intact'
                if self._saved_step is not None else 'no checkpoint was saved yet')
        try:
            moved = f'its entries were moved to {xla_cache.quarantine()}'
        except OSError as move_error:
            moved = (f'moving its entries aside failed ({move_error}); delete '
                     f'{xla_cache.directory()}')
        raise TrainingError(
            f'XLA\'s compilation cache in {xla_cache.directory()} holds a damaged entry '
            f'({_tf_reason(error)}); {moved}. The run stopped; {kept}. Rerun the same command '
            'to resume: it compiles again.') from None

    def _restart_envs(self, failure):
        """Rebuilds the training environments after `failure`, or raises EnvironmentFailure."""
        steps = int(self.env_steps)
        what = _describe_env_failure(failure)
        kept = (f'the last checkpoint (step {self._saved_step}) is intact'
                if self._saved_step is not None else 'no checkpoint was saved yet')
        if self._on_env_failure == 'stop':
            raise EnvironmentFailure(
                f'{what} (in the iteration after step {steps}); the run stopped '
                '(train.on_env_failure = \'stop\'); '
                f'{kept}. Rerun the same command to resume.') from failure
        if self._env_restarts >= self._max_env_restarts:
            raise EnvironmentFailure(
                f'{what} (in the iteration after step {steps}), after {self._env_restarts} '
                'restarts of the training '
                f'environments since the last checkpoint (train.max_env_restarts = '
                f'{self._max_env_restarts}); the run stopped; {kept}.') from failure
        self._env_restarts += 1
        self._total_env_restarts += 1
        seed = self._seed + _RESTART_SEED_STRIDE * self._total_env_restarts
        logging.warning(
            '%s (in the iteration after step %d). Restarting all %d training environments with '
            'seed %d (restart %d of at most %d between checkpoints); the episodes in flight were '
            'dropped and the iteration is redone.', what, steps, len(self._train_env), seed,
            self._env_restarts, self._max_env_restarts)
        old = self._train_env.vector_env
        with contextlib.suppress(Exception):  # It is broken: closing is only tidying up.
            old.close(terminate=True)
        try:
            new = self._make_train_env()
        except Exception as error:
            raise EnvironmentFailure(
                f'{what} (in the iteration after step {steps}), and rebuilding the training '
                'environments failed: '
                f'{run_config.first_line(error)}; {kept}.') from error
        self._train_env.replace_vector_env(new, seed=seed)

    def _on_nonfinite_batch(self, codes, summary):
        """Stops the run, or logs the skipped batch (the update was undone in the graph).

        `codes`: what went non-finite, per member ([K]; a lone run's [1]; code k names the k-th
        of `_nonfinite_quantities`), or the name of what failed a rollout as a whole (`summary`
        None).
        """
        steps = int(self.env_steps)
        if summary is None:
            codes, quantities = np.ones(1, int), [codes]
        else:
            codes, quantities = np.atleast_1d(codes), self._nonfinite_quantities
        problems = []
        for member in np.flatnonzero(codes):
            code = int(codes[member])
            quantity = quantities[code - 1]
            where = ''
            if summary is None:
                pass
            elif quantity in (OBSERVATION, REWARD):
                envs = np.flatnonzero(np.reshape(
                    summary['nonfinite_envs'], [self._num_members, -1])[member])
                where = f' {envs.tolist()}'
            elif quantity == PARAMETER:
                names = [variable.name for variable, finite in zip(
                    self._float_variables, summary['finite_variables'][:, member], strict=True)
                    if not finite]
                where = f' ({", ".join(names[:3])}{" ..." if len(names) > 3 else ""})'
            of_member = (f' of {self._runs[member].name}'
                         if self._population and summary is not None else '')
            if summary is None:  # The rollout itself failed.
                problems.append(f'non-finite {quantity} in the iteration after step {steps}; '
                                'the rollout stopped before the update')
            else:
                problems.append(f'non-finite {quantity}{where}{of_member} in the iteration '
                                f'that ended at step {steps}; its update was undone')
        problem = '; '.join(problems)
        if self._on_nonfinite == 'stop':
            kept = (f'the last checkpoint (step {self._saved_step}) is intact and stays the '
                    'latest' if self._saved_step is not None else 'no checkpoint was saved')
            raise NonFiniteError(
                f'{problem} and the run stopped; {kept}. To drop such batches and go on, set '
                'train.on_nonfinite = \'skip\'.')
        self.skipped_batches += 1
        self._dropped_in_a_row += 1
        if self._dropped_in_a_row >= MAX_DROPPED_IN_A_ROW:
            raise NonFiniteError(
                f'{problem}; {self._dropped_in_a_row} batches in a row were dropped '
                f'(train.on_nonfinite = \'skip\'), so the run stopped: the fault does not pass.')
        logging.warning('%s; the batch was dropped (train.on_nonfinite = \'skip\'; %d so far).',
                        problem[0].upper() + problem[1:], self.skipped_batches)
        for member in np.flatnonzero(codes) if summary is not None else range(len(self._runs)):
            run = self._runs[member]
            run.skipped_batches += 1
            with self._writing(f'the summaries in {run.logdir}'), \
                    run.writer.as_default(step=steps):
                tf.summary.scalar('train/skipped_batches', run.skipped_batches)

    def _stop_on_signal(self, signum):
        """Saves a checkpoint (unless this step has one) and raises Interrupted."""
        steps = int(self.env_steps)
        name = signal.Signals(signum).name
        self._finish_save()
        if not steps:
            saved = 'nothing to save yet'
        elif self._saved_step != steps:
            self._save_checkpoint(steps)
            saved = f'saved a checkpoint at step {steps}'
        else:
            saved = f'the checkpoint of step {steps} is saved'
        self._flush_summaries()
        self._publish()
        raise Interrupted(signum, steps, f'interrupted by {name} at step {steps}; {saved}. '
                          'Rerun the same command to resume.')

    @contextlib.contextmanager
    def _writing(self, what):
        """Turns a failed write into a WriteError that names `what` and what was kept."""
        try:
            yield
        except (OSError, tf.errors.OpError) as caught:
            # Free what the failed write took (e.g. on a full disk); a write of the save in
            # flight that failed is the fault to report (it came first).
            earlier = self._wait_for_save()
            what, error = (earlier.what, earlier.error) if earlier else (what, caught)
            if isinstance(error, tf.errors.OpError):
                reason = _tf_reason(error)
            else:
                reason = error.strerror or str(error)
                if error.filename:
                    reason = f'{error.filename}: {reason}'
            kept = (f'the last complete checkpoint (step {self._saved_step}) is intact'
                    if self._saved_step is not None else 'no checkpoint was saved yet')
            for run in self._runs:
                with contextlib.suppress(OSError):
                    recovery.clean_partial_writes(run.logdir, run.checkpoint_dir, run.policy_dir)
            raise WriteError(f'cannot write {what}: {reason}. The run stopped; {kept}. Make '
                             'room or make the logdir writable, then rerun the same command to '
                             'resume.') from error

    def _flush_summaries(self):
        for run in self._runs:
            with self._writing(f'the summaries in {run.logdir}'):
                run.writer.flush()

    def _save_checkpoint(self, steps):
        """Writes the checkpoint of `steps` now."""
        self._finish_save()
        self._start_save([self._checkpoint_write(steps)], steps)

    def _checkpoint_write(self, steps):
        """(what, write) of the checkpoint of `steps`, whose state is copied now
        (`CheckpointSnapshot`; a population's members first), so that a thread can write it."""
        if self._population:
            self._agent.to_members()
        self._snapshot.take()

        def write():
            for run in self._runs:
                run.manager.save(checkpoint_number=steps)

        if len(self._runs) == 1:
            return f'the checkpoint of step {steps} to {self._runs[0].checkpoint_dir}', write
        return (f'the checkpoints of step {steps} to {self._logdir}/'
                f'{run_dir.MEMBER_DIR.format("*")}/{run_dir.CHECKPOINT_DIR}', write)

    def _start_save(self, writes, steps=None, background=False):
        """Runs `writes` ((what, write) pairs; with `steps`, the first is the checkpoint of
        `steps`) in order, stopping at the first that fails: here, or with `background` in the
        background thread while training goes on. `_finish_save` waits for them and raises the
        failure as WriteError.

        In one thread and in this order, a reader never finds a metrics line before its
        checkpoint, nor a policy whose checkpoint is pruned.
        """

        def write_all():
            for index, (what, write) in enumerate(writes):
                try:
                    write()
                except (OSError, tf.errors.OpError) as error:
                    raise _WriteFailed(what, error, checkpointed=steps is None or index > 0) \
                        from error

        # Named as kept from now on: every way out of the run waits for the save; a failed
        # checkpoint puts back the step before it.
        previous = self._saved_step
        if steps is not None:
            self._saved_step = steps
            self._env_restarts = 0
        self._pending_save = (previous, self._background_thread.submit(write_all)
                              if background else write_all)
        if not background:
            self._finish_save()

    def _finish_save(self):
        """Waits for the save in flight, if any; a failed write raises WriteError."""
        failure = self._wait_for_save()
        if failure is not None:
            with self._writing(failure.what):
                raise failure.error

    def _wait_for_save(self):
        """Waits for the save in flight, if any; returns its _WriteFailed, if a write failed."""
        if self._pending_save is None:
            return None
        (previous, work), self._pending_save = self._pending_save, None
        try:
            work.result() if isinstance(work, concurrent.futures.Future) else work()
        except _WriteFailed as failure:
            if not failure.checkpointed:
                self._saved_step = previous
            return failure
        return None

    def _write_member_config(self, run):
        """Writes a population member's `config.gin`: the population's configuration as a
        lone run of the member's seed and hyperparameters (rewritten when the population's
        budget was raised)."""
        path = os.path.join(run.logdir, run_config.CONFIG_FILE)
        text = run.configured(gin.config_str())
        if not os.path.isfile(path) or run_config.read_text(path) != text:
            os.makedirs(run.logdir, exist_ok=True)
            run_config.write_atomic(path, text)

    def _evaluate_and_save(self, steps, save_checkpoint=True, runs=None):
        """Evaluates; writes the checkpoint, the policy, the metrics line and summaries (of
        `runs`, default all: a population's members, whose evaluation records are returned
        too); returns the (first) evaluation record."""
        self._heartbeat.phase(f'the evaluation of step {steps}')
        returns, lengths = self._evaluate(steps)
        self._heartbeat.phase(f'saving step {steps}')
        records = []
        for run, member_returns, member_lengths in zip(
                self._runs, np.split(returns, self._num_members),
                np.split(lengths, self._num_members), strict=True):
            finite = np.isfinite(member_returns).all()
            if not finite:
                logging.warning('Evaluation at step %d%s: environments %s ended with a '
                                'non-finite return; its mean_return and std_return are null.',
                                steps, f' of {run.name}' if run.name else '',
                                np.flatnonzero(~np.isfinite(member_returns)).tolist())
            records.append({
                'step': steps,
                'mean_return': float(np.mean(member_returns)) if finite else None,
                'std_return': float(np.std(member_returns)) if finite else None,
                'episodes': len(member_returns),
                'mean_length': float(np.mean(member_lengths)),
                'env_steps_per_sec': float(self.steps_per_sec),
                'wall_time_s': float(self.wall_time),
            })
        runs = self._runs if runs is None else runs
        # The snapshot and the policies' copies below reuse the variables the save in flight
        # writes from.
        self._finish_save()
        writes = [self._checkpoint_write(steps)] if save_checkpoint else []
        exports, background = self._export_writes(steps, runs)
        writes.extend(exports)
        for run, record in zip(self._runs, records, strict=True):
            if run in runs:
                path = os.path.join(run.logdir, METRICS_FILE)
                writes.append((path, functools.partial(_append_line, path, record)))
        self._start_save(writes, steps if save_checkpoint else None, background)
        for run, record in zip(self._runs, records, strict=True):
            if run not in runs:
                continue
            with self._writing(f'the summaries in {run.logdir}'):
                with run.writer.as_default(step=steps):
                    for name in ('mean_return', 'std_return', 'mean_length'):
                        if record[name] is not None:
                            tf.summary.scalar(f'eval/{name}', record[name])
                run.writer.flush()
        self._publish()
        return records[0]

    def _publish(self):
        """Hands the complete save to `after_save`, once the save in flight is written."""
        if self._after_save is None:
            return
        self._finish_save()
        try:
            self._after_save()
        except Exception as error:  # Storage clients raise their own types.
            kept = ('its last stored checkpoint is intact' if self._saved_step is not None
                    else 'no checkpoint was stored yet')
            raise WriteError(f'cannot store the run: {type(error).__name__}: {error}. The run '
                             f'stopped; {kept}. Rerun the same command to resume.') from error

    def _export_writes(self, steps, runs):
        """The policy of the checkpoint of `steps`, as a SavedModel in <logdir>/policy/<step>/,
        copied now; policies of checkpoints no longer kept are deleted. Returns [(what, write)]
        and whether a thread may write it.

        The first export may not: `tf.saved_model.save` sets the process-wide log level to
        FATAL while it scans the policy's attributes (TensorFlow's AutoTrackable), which in a
        thread silenced what the run logged meanwhile (a restart warning went missing).
        A population's members already hold its state: copied by the checkpoint of `steps`, or
        restored from it.
        """
        exports = []
        for run in runs:
            if run.exporter is None:
                run.exporter = policy_export.PolicyExporter(
                    run.agent, self._eval_env.observation_space, self._eval_env.action_space)
            run.exporter.capture(step=steps,
                                 config=run.configured(gin.operative_config_str()))
            exports.append((run, os.path.join(run.policy_dir, str(steps))))

        def write():
            for run, directory in exports:
                run.exporter.write(directory)
                policy_export.prune_exports(run.policy_dir, [
                    recovery.checkpoint_step(path) for path in run.manager.checkpoints])

        what = (f'the policy of step {steps} to {exports[0][1]}' if len(exports) == 1 else
                f'the policies of step {steps} to {self._logdir}/{run_dir.MEMBER_DIR.format("*")}')
        return [(what, write)], all(run.exporter.program_saved for run, _ in exports)

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
        if not steps or not (self._eval_due(previous, steps) or at_stop):
            return None
        logged = [any(record.get('step') == steps for record in run_records)
                  for run_records in records]
        if all(logged):
            unexported = [run for run in self._runs
                          if not os.path.isdir(os.path.join(run.policy_dir, str(steps)))]
            if unexported:
                logging.info('Exporting the policy of step %d, which the previous run did not '
                             'finish.', steps)
                self._finish_save()
                self._start_save(self._export_writes(steps, unexported)[0])
            return None
        logging.warning('Completing the evaluation of step %d: the previous run saved its '
                        'checkpoint but stopped before logging it.', steps)
        return self._evaluate_and_save(
            steps, save_checkpoint=False,
            runs=[run for run, done in zip(self._runs, logged, strict=True) if not done])

    def _evaluate(self, steps):
        """One episode of the deterministic policy in each evaluation environment.

        The environments' first reset is seeded by the run's seed and `steps` alone, and the
        policy takes the mode of its distribution (no random numbers), so an evaluation depends
        on the weights and the step only: an extra one (at a stop) shifts no later one, and a
        resumed run's evaluations are those of the run uninterrupted.
        """
        warmup, self._eval_warmup = self._eval_warmup, None
        if warmup is not None:
            # Its errors (e.g. a non-finite action) are the evaluation's to raise.
            concurrent.futures.wait([warmup])
        self._eval_env.seed_next_reset(
            [evaluation_seed(run.seed, steps) for run in self._runs] if self._population
            else evaluation_seed(self._seed, steps))
        num_envs = len(self._eval_env)
        returns = np.zeros(num_envs)
        lengths = np.zeros(num_envs, np.int64)
        finished = np.zeros(num_envs, bool)
        reset = True
        while not finished.all():
            # The checkpoint of `steps` is saved on the way out; a resumed run evaluates it.
            self._check_signals()
            try:
                summary = self._eval_rollout(tf.constant(reset))
            except tf.errors.OpError as error:
                if xla_cache.damaged(error):
                    self._on_damaged_cache(error)
                if _NONFINITE_ACTION not in error.message:
                    raise
                raise NonFiniteError(
                    f'non-finite {ACTION} in the evaluation at step '
                    f'{steps}; the run stopped before saving step {steps}; the last checkpoint '
                    f'(step {self._saved_step}) is intact.') from None
            reset = False
            done = (summary['terminated'] | summary['truncated']).numpy()
            episode_return = summary['episode_return'].numpy()
            episode_length = summary['episode_length'].numpy()
            for step in range(done.shape[0]):
                new = done[step] & ~finished
                returns[new] = episode_return[step][new]
                lengths[new] = episode_length[step][new]
                finished |= new
        return returns, lengths

    def _eval_rollout_graph(self, reset):
        """`_EVAL_CHUNK` steps of the evaluation environments: what ended where, [T, N]."""
        transitions = self._eval_sim.rollout(_EVAL_CHUNK, reset=reset)
        return {'terminated': transitions.terminated, 'truncated': transitions.truncated,
                'episode_return': transitions.episode_return,
                'episode_length': transitions.episode_length}

    def _evaluation_graph(self, reset):
        """The chunks of `_eval_rollout_graph` until every environment's first episode ended,
        in one call (native environments); returns its result as a single step [1, N] at which
        every episode ends, which `_evaluate` reads as it reads chunks.
        """
        num_envs = len(self._eval_env)
        columns = tf.range(num_envs)

        def body(reset, finished, returns, lengths):
            chunk = self._eval_rollout_graph(reset)
            ends = (chunk['terminated'] | chunk['truncated']) & ~finished[None]
            first_end = tf.stack(
                [tf.argmax(tf.cast(ends, tf.int32), axis=0, output_type=tf.int32), columns], 1)
            ended = tf.reduce_any(ends, axis=0)
            returns = tf.where(ended, tf.gather_nd(chunk['episode_return'], first_end), returns)
            lengths = tf.where(ended, tf.gather_nd(chunk['episode_length'], first_end), lengths)
            return tf.constant(False), finished | ended, returns, lengths

        _, _, returns, lengths = tf.while_loop(
            lambda unused_reset, finished, *unused: ~tf.reduce_all(finished), body,
            (reset, tf.zeros([num_envs], tf.bool), tf.zeros([num_envs], tf.float32),
             tf.zeros([num_envs], tf.int32)), parallel_iterations=1)
        return {'terminated': tf.ones([1, num_envs], tf.bool),
                'truncated': tf.zeros([1, num_envs], tf.bool),
                'episode_return': returns[None], 'episode_length': lengths[None]}

    def _log_progress(self, steps, steps_per_sec, episodes, latest):
        """Logs a progress line; `episodes`: (count, summed return) of the training episodes that
        ended since the last one."""
        remaining = max(self._total_steps - steps, 0)
        eta = remaining / steps_per_sec if steps_per_sec > 0 else float('inf')
        count, return_sum = episodes
        train_return = f'{return_sum / count:.1f}' if count else 'n/a'
        eval_return = _format_return(latest['mean_return']) if latest else 'n/a'
        speed = f'{steps_per_sec:.0f} env steps/s'
        if self._population:
            # Steps count per member; the returns are the first member's (eval) and all
            # members' (train).
            speed = (f'{self._num_members} members x {steps_per_sec:.0f} = '
                     f'{self._num_members * steps_per_sec:.0f} env steps/s')
        logging.info('step %d/%d | %s | ETA %s | train return %s | eval return %s',
                     steps, self._total_steps, speed, _format_seconds(eta), train_return,
                     eval_return)
        self._heartbeat.beat()


class _RunDirectory:
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
        self.checkpoint_dir = os.path.join(logdir, CHECKPOINT_DIR)
        self.policy_dir = os.path.join(logdir, policy_export.POLICY_DIR)
        self.manager = None  # Made by `TrainingRun.restore`, once the checkpoints are recovered.
        self.corrupt = False  # Whether recovery moved a broken checkpoint aside.
        self.writer = None  # Made by `TrainingRun.run`: nothing is written before.
        self.exporter = None
        self.write_scalars = None  # A _ScalarWriter, once the names of the scalars are known.
        self.skipped_batches = 0

    def configured(self, config):
        """`config` (the population's, as gin writes it) as this run's own."""
        if self.bindings is None:
            return config
        return run_config.with_bindings(config, self.bindings, remove=POPULATION_BINDINGS)


# What marks a summary as a scalar for TensorBoard (as `tf.summary.scalar` writes it).
_SCALAR_METADATA = scalar_metadata.create_summary_metadata(display_name=None, description=None)


class _ScalarWriter:
    """Writes the scalars `values` [N, len(names)] of N steps to `writer` in one compiled call,
    skipping NaNs."""

    def __init__(self, writer, names):
        self.names = list(names)
        self._writer = writer
        # Any number of steps, one program.
        self._write = tf.function(self._graph, autograph=False, input_signature=[
            tf.TensorSpec([None], tf.int64), tf.TensorSpec([None, len(names)], tf.float32)])

    def __call__(self, steps, values):
        self._write(steps, values)

    def _graph(self, steps, values):
        names = tf.constant(self.names)
        written = tf.where(~tf.math.is_nan(values))  # [M, 2] (step, column), in that order.
        with self._writer.as_default():
            def body(index):
                row, column = written[index, 0], written[index, 1]
                # `tf.summary.write` keeps the tag as given (`tf.summary.scalar` would prefix
                # the loop's name scope).
                tf.summary.write(tf.gather(names, column), values[row, column],
                                 step=steps[row], metadata=_SCALAR_METADATA)
                return index + 1

            tf.while_loop(lambda index: index < tf.shape(written)[0], body, [tf.constant(0)])


class _Heartbeat:
    """Logs a progress line whenever none came for `period` seconds, naming the phase the run
    is in: the first iteration's compilation, a wait for a hung environment worker, a long
    evaluation. The main thread may be inside a compiled call meanwhile, so a thread logs it.
    """

    def __init__(self, period, line):
        """`line(phase, seconds)` is the text of the line."""
        self._period = period
        self._line = line
        self._phase = ('starting', time.monotonic())
        self._last = time.monotonic()
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._beat, name='heartbeat', daemon=True)

    def phase(self, name):
        """Notes that the run now does `name` (e.g. 'an iteration')."""
        self._phase = (name, time.monotonic())

    def beat(self):
        """Notes that a progress line was just logged."""
        self._last = time.monotonic()

    def _beat(self):
        while not self._stopped.wait(min(self._period, 1.0)):
            now = time.monotonic()
            if now - self._last >= self._period:
                name, since = self._phase
                if now - since >= self._period:
                    logging.info('%s', self._line(name, now - since))
                    self._last = now

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *unused_exc_info):
        self._stopped.set()
        self._thread.join()


def evaluation_seed(seed, steps):
    """The seed of the evaluation environments' first reset in the evaluation at `steps` of a
    run of `seed`: a 62-bit hash of both, far from the seeds of training (which count from
    `seed`) and of other steps' evaluations."""
    words = np.random.SeedSequence(
        [seed, environments.EVAL_SEED_OFFSET, steps]).generate_state(2, np.uint32)
    return (int(words[0]) << 30) | (int(words[1]) >> 2)


def _clear_scalar_cache():
    """Empties TensorFlow's cache of eager tensors made from Python numbers.

    The cache keeps every distinct number ever turned into an eager tensor (about 750 bytes
    each) and never evicts any; every iteration makes new ones (summary values and steps, the
    wall time), so without this a run's memory grew by ~10 KB per iteration. Tensors already
    made keep their values. A private TensorFlow function: where it is missing, nothing is done.
    """
    clear = getattr(pywrap_tfe, 'TFE_ClearScalarCache', None)
    if clear is not None:
        clear()


def _describe_env_failure(error):
    """'Environment 3 failed in step: ...' or 'BatchEnv worker process 1 (pid 9) hosting envs
    [4, 5] died unexpectedly (killed by SIGKILL)': the first line of the error, no advice."""
    text = run_config.first_line(error).split('; the batch is closed')[0].rstrip('.')
    return f'Training environment failure: {text}'


class _WriteFailed(Exception):
    """A write of a save failed: `what` it wrote, the `error`, and whether the save's
    checkpoint (its first write) was `checkpointed` before."""

    def __init__(self, what, error, checkpointed):
        super().__init__(what, error)
        self.what, self.error, self.checkpointed = what, error, checkpointed


def _append_line(path, record):
    with open(path, 'a', encoding='utf-8') as f:
        f.write(json.dumps(record) + '\n')


def _tf_reason(error):
    """The gist of a TensorFlow error: its first line without the op's decorations."""
    text = re.sub(r'\{\{[^}]*\}\}\s*', '', run_config.first_line(error))
    return re.sub(r'\s*\[Op:\w+\]', '', text).strip()


def _format_return(value):
    return 'n/a' if value is None else f'{value:.1f}'


def _format_seconds(seconds):
    if not np.isfinite(seconds):
        return '?'
    minutes, seconds = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f'{hours}:{minutes:02d}:{seconds:02d}'
