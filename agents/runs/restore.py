"""A trained agent back from a training run's logdir: its configuration, environment, weights.

A run's `operative_config.gin` (what the trainer actually used, defaults included) rebuilds the
wrapped environment the policy acted in and the agent's networks; a checkpoint of the run then
fills in the weights and observation statistics. Everything the user can get wrong (no such
run, no checkpoint, a damaged checkpoint, a checkpoint of another configuration) becomes a
`ConfigError` that names it. The latest checkpoint is the newest that reads back, as for a
resuming trainer (see recovery.py), but a broken one is only reported, never moved: these
tools leave the run as they found it.

Parsing a configuration replaces the process's gin configuration: this is for the tools that
work on a finished run, not for use inside training.
"""

import dataclasses
import functools
import os
import re
import tempfile
from typing import Any

import gin
import numpy as np
import tensorflow as tf
from tensorflow.core.protobuf import trackable_object_graph_pb2

from agents.runs import (
    agent_factory,
    environments,
    recovery,
    run_config,
    run_dir,
    run_settings,  # noqa: F401 (registers train.*, read from run configs)
)
from agents.storage import failures, locations
from agents.tools import envpool_atari

ConfigError = run_config.ConfigError
# Runs written before `train.algorithm` was a binding trained PPO (a binding, so this module
# imports no algorithm: the binaries register them).
_ALGORITHM_OF_OLDER_RUNS = 'train.algorithm = @PPO'


@dataclasses.dataclass(frozen=True)
class Environment:
    """The environment of a run as training saw it: id, kwargs, wrappers, and where the tools
    play it.

    `backend` 'gymnasium': Gymnasium's environment, `env_kwargs` those of `gymnasium.make` (a
    run on EnvPool of a task Gymnasium registers acts there too, without EnvPool's kwargs).
    'envpool': one of EnvPool's Atari games (envpool_atari.AtariEnv), `env_kwargs` the run's
    arguments of `envpool.make`, played with the evaluation settings (whole games, unclipped
    scores: envpool_atari.evaluation_kwargs) as the run's evaluations play them.
    """
    env_id: str
    env_kwargs: Any
    wrappers: Any
    backend: str = 'gymnasium'

    def factory(self, env_id=None, extra_wrappers=(), **make_kwargs):
        """A picklable function making the wrapped environment (see `make`).

        `extra_wrappers` wrap it outermost, after the run's wrappers.
        """
        if env_id is None or env_id == self.env_id:
            env_id, env_kwargs = self.env_id, self.env_kwargs
        else:
            env_kwargs = None  # Keyword arguments of one environment rarely fit another.
        wrappers = (*self.wrappers, *extra_wrappers)
        if self.backend == 'envpool':
            return functools.partial(
                envpool_atari.make_env, env_id,
                {**envpool_atari.evaluation_kwargs(env_kwargs), **make_kwargs}, wrappers)
        return environments.env_factory(env_id, env_kwargs, wrappers, **make_kwargs)

    def make(self, env_id=None, **make_kwargs):
        """One wrapped environment; another `env_id` gets the same wrappers but no env_kwargs
        (and for an EnvPool run, must be another of EnvPool's Atari games).

        `make_kwargs` (e.g. render_mode='rgb_array') go to `gymnasium.make`, or `envpool.make`.
        """
        try:
            return self.factory(env_id, **make_kwargs)()
        except Exception as error:  # The environment's own errors: bad id, kwargs, wrappers...
            raise ConfigError(f'cannot make environment {env_id or self.env_id!r}: '
                              f'{failures.first_line(error)}') from error


@dataclasses.dataclass(frozen=True)
class RestoredRun:
    """An agent restored from a checkpoint of a run, with the environment it was trained in."""
    agent: Any
    environment: Environment
    observation_space: Any
    action_space: Any
    checkpoint: str
    step: int
    config: str
    # (path, problem) of newer checkpoints passed over because they do not read back.
    skipped: tuple = ()

    @property
    def fallback_warning(self):
        """What to tell the user when the latest checkpoint was broken, or None."""
        if not self.skipped:
            return None
        listed = ', '.join(f'{path} ({problem})' for path, problem in self.skipped)
        subject = (f'Checkpoint {listed} does' if len(self.skipped) == 1
                   else f'Checkpoints {listed} do')
        return (f'{subject} not read back; using {self.checkpoint} (step {self.step}), the '
                'newest checkpoint that does. Nothing in the logdir was changed.')


def read_config(logdir):
    """The run's operative configuration (or its full one, if it never got to write the other)."""
    if not os.path.isdir(logdir):
        raise ConfigError(f'logdir {logdir} does not exist or is not a directory')
    for name in (run_dir.OPERATIVE_CONFIG_FILE, run_dir.CONFIG_FILE):
        path = os.path.join(logdir, name)
        if os.path.isfile(path):
            return _read_text(path)
    raise ConfigError(f'logdir {logdir} holds no {run_dir.OPERATIVE_CONFIG_FILE} or '
                      f'{run_dir.CONFIG_FILE}: not a training run')


def find_checkpoint(logdir, checkpoint=None):
    """The checkpoint to restore: (path, [(path, problem)] of newer ones passed over).

    `checkpoint` is a step number of the run (`12800` for `checkpoints/ckpt-12800`) or a path
    to any checkpoint (its prefix, without `.index`; relative to where the user ran the tool).
    Without it, the newest checkpoint of the run that reads back; a named checkpoint that does
    not read back is an error (the user asked for that one).
    """
    directory = os.path.join(logdir, run_dir.CHECKPOINT_DIR)
    if checkpoint is None:
        path, skipped = recovery.newest_readable_checkpoint(directory)
        if path is None and skipped:
            raise ConfigError(f'no checkpoint of logdir {logdir} reads back '
                              f'({recovery.describe_problems(skipped)})')
        if path is None:
            raise ConfigError(f'logdir {logdir} holds no checkpoint yet (nothing in {directory})')
        return path, skipped
    checkpoint = str(checkpoint)
    by_step = re.fullmatch(r'\d+', checkpoint) is not None
    path = (recovery.checkpoint_path(directory, checkpoint) if by_step
            else locations.resolve(checkpoint))
    if not os.path.isfile(f'{path}.index'):
        raise ConfigError(f'checkpoint {checkpoint} not found (no {path}.index)')
    if not by_step:
        check_same_configuration(logdir, path)
    problem = recovery.checkpoint_problem(path)
    if problem:
        raise ConfigError(f'checkpoint {path} is damaged: it does not read back ({problem})')
    return path, []


def checkpoint_run(path):
    """The run directory holding checkpoint `path` (the parent of its `checkpoints/`), or None
    for a checkpoint elsewhere."""
    directory = os.path.dirname(os.path.abspath(path))
    if os.path.basename(directory) != run_dir.CHECKPOINT_DIR:
        return None
    return os.path.dirname(directory)


def check_same_configuration(logdir, path):
    """Refuses checkpoint `path` of another run whose configuration differs from `logdir`'s.

    A checkpoint of another network or environment fails to restore (see `_mismatch`), but one
    of the same shapes (another activation, other wrappers) would restore and act wrongly.
    Compares the files the trainer compares on resume (`config.gin`, else the operative
    configurations); a checkpoint without a run configuration beside it is not checked.
    """
    run = checkpoint_run(path)
    if run is None or os.path.realpath(run) == os.path.realpath(logdir):
        return
    for name in (run_dir.CONFIG_FILE, run_dir.OPERATIVE_CONFIG_FILE):
        ours, theirs = os.path.join(logdir, name), os.path.join(run, name)
        if os.path.isfile(ours) and os.path.isfile(theirs):
            diff = run_config.config_difference(
                _read_text(ours), _read_text(theirs), 'logdir config', 'checkpoint\'s run config')
            if diff:
                raise ConfigError(
                    f'checkpoint {path} belongs to the run {run}, of a different configuration '
                    f'than logdir {logdir}; give --logdir={run} to use it with its own '
                    f'configuration. Difference:\n{diff}')
            return


def _read_text(path):
    with open(path, encoding='utf-8') as f:
        return f.read()


def environment_from_config(config):
    """Parses a run's gin configuration and returns its `Environment`.

    The parsed configuration stays in place, so the agent built next gets its networks.
    """
    _parse_run_config(config)
    values = {}
    for name, default in (('env_id', None), ('env_kwargs', None),
                          ('wrappers', environments.DEFAULT_WRAPPERS), ('env_backend', None)):
        try:
            values[name] = _resolve_references(gin.query_parameter(f'train.{name}'))
        except ValueError:
            values[name] = default
    if not isinstance(values['env_id'], str):
        raise ConfigError('the run\'s configuration does not name its environment '
                          '(no train.env_id binding)')
    if values.pop('env_backend') == 'envpool':
        if environments.plays_in_gymnasium(values['env_id']):
            # Gymnasium's environment of the same id takes none of envpool.make's arguments
            # (num_threads...).
            values['env_kwargs'] = None
        else:  # An Atari game (else the run could not have trained), in EnvPool.
            environments.check_env_id(values['env_id'], 'envpool')
            values['backend'] = 'envpool'
    return Environment(**values)


def _parse_run_config(config):
    """Parses a run's stored configuration into gin, skipping what this version's code no longer
    takes: unknown configurables, and bindings of arguments that became unbindable (an
    operative configuration lists every default of the code that ran, e.g. `BatchEnv.copy`)."""
    while True:
        gin.clear_config()
        try:
            gin.parse_config(config, skip_unknown=True)
            return
        except Exception as error:  # Gin raises many types; all mean an unusable configuration.
            refused = re.search(r"Configurable '([\w.]+)' has denylisted kwarg '(\w+)'",
                                str(error))
            lines = config.splitlines(keepends=True)
            kept = [line for line in lines if refused is None or not re.match(
                rf'{re.escape(refused[1])}\.{refused[2]}\s*=', line)]
            if len(kept) == len(lines):
                raise ConfigError(
                    f'cannot parse the run\'s gin configuration: {error}') from error
            config = ''.join(kept)


def _resolve_references(value):
    """Gin references (`@name`, `@name()`, macros) in a queried value, as gin would pass them."""
    if isinstance(value, gin.config.ConfigurableReference):
        function = value.scoped_configurable_fn
        return function() if value.evaluate else function
    if isinstance(value, (list, tuple)):
        return type(value)(_resolve_references(item) for item in value)
    if isinstance(value, dict):
        return {key: _resolve_references(item) for key, item in value.items()}
    return value


def restore_agent(logdir, checkpoint=None):
    """The run's agent with the weights and statistics of its latest (or the given) checkpoint.

    Restores what acting needs (`Algorithm.acting_modules`: e.g. not the optimizer nor PPO's
    reward scaler, whose shape depends on the training batch).
    """
    config = read_config(logdir)
    path, skipped = find_checkpoint(logdir, checkpoint)
    environment = environment_from_config(config)
    env = environment.make()
    try:
        observation_space, action_space = env.observation_space, env.action_space
    finally:
        env.close()
    try:
        algorithm = gin.query_parameter('train.algorithm')
    except ValueError:
        gin.parse_config(_ALGORITHM_OF_OLDER_RUNS)
        algorithm = gin.query_parameter('train.algorithm')
    if not isinstance(algorithm, gin.config.ConfigurableReference):
        raise ConfigError(f'the configuration of logdir {logdir} names an algorithm that is not '
                          f'registered (agents/algorithms/registry.py): '
                          f'@{getattr(algorithm, "selector", algorithm)}')
    algorithm = _resolve_references(algorithm)
    try:
        agent = agent_factory.build_algorithm(
            algorithm, observation_space, action_space, num_envs=1, seed=0)
    except ConfigError as error:
        raise ConfigError(f'cannot build the agent of logdir {logdir}: {error}') from error
    env_steps = tf.Variable(0, dtype=tf.int64, trainable=False)
    # The trainer's checkpoint layout, with only the parts that act.
    acting = tf.train.Checkpoint(agent=tf.train.Checkpoint(**agent.acting_modules()),
                                 env_steps=env_steps)
    mismatch = _mismatch(acting, path)
    if mismatch:
        raise ConfigError(f'checkpoint {path} does not fit the configuration of logdir '
                          f'{logdir} (is it from another run?): {mismatch}')
    # Partial on purpose: the optimizer and reward scaler stay in the checkpoint.
    acting.read(path).expect_partial().assert_existing_objects_matched()
    return RestoredRun(agent, environment, observation_space, action_space, path,
                       int(env_steps.numpy()), config, tuple(skipped))


def _mismatch(checkpoint, path):
    """What of `checkpoint`'s variables the checkpoint at `path` lacks or shapes otherwise.

    Checked before restoring: a failed restore leaves variables half-assigned and TensorFlow's
    messages do not say which variable failed. A checkpoint stores each variable once, under the
    first path to it (e.g. the optimizer's list of trainable variables), so variables are
    matched by following their path through the saved object graph, as restoring does.
    """
    try:
        saved = _ObjectGraph(path)
    except (tf.errors.OpError, ValueError) as error:
        return f'unreadable: {error}'
    with tempfile.TemporaryDirectory() as directory:
        expected = _ObjectGraph(checkpoint.write(os.path.join(directory, 'expected')))
    missing, reshaped = [], []
    for names, shape in expected.variables():
        name = '/'.join(names)
        saved_shape = saved.shape(names)
        if saved_shape is None:
            missing.append(name)
        elif saved_shape != shape:
            reshaped.append(f'{name} has shape {saved_shape}, expected {shape}')
    if missing:
        return (f'it lacks {len(missing)} variable(s) of the agent this configuration builds, '
                f'e.g. {missing[0]} (another network or environment?)')
    if reshaped:
        more = f' (and {len(reshaped) - 1} more)' if len(reshaped) > 1 else ''
        return reshaped[0] + more
    return None


class _ObjectGraph:
    """The object graph of a checkpoint: variables by their path of attribute names."""

    def __init__(self, path):
        reader = tf.train.load_checkpoint(path)
        self._graph = trackable_object_graph_pb2.TrackableObjectGraph()
        self._graph.ParseFromString(reader.get_tensor('_CHECKPOINTABLE_OBJECT_GRAPH'))
        self._shapes = reader.get_variable_to_shape_map()

    def _key(self, node):
        for attribute in node.attributes:
            if attribute.name == 'VARIABLE_VALUE':
                return attribute.checkpoint_key
        return None

    def variables(self):
        """(path, shape) of every variable, each under the first path found to it."""
        found, seen, queue = [], {0}, [((), 0)]
        for names, node_id in queue:
            node = self._graph.nodes[node_id]
            key = self._key(node)
            if key is not None:
                found.append((names, list(self._shapes[key])))
            for child in node.children:
                if child.node_id not in seen:
                    seen.add(child.node_id)
                    queue.append((names + (child.local_name,), child.node_id))
        return sorted(found)

    def shape(self, names):
        """The shape of the variable at this path, or None if there is none."""
        node = self._graph.nodes[0]
        for name in names:
            child = next((child for child in node.children if child.local_name == name), None)
            if child is None:
                return None
            node = self._graph.nodes[child.node_id]
        key = self._key(node)
        return None if key is None else list(self._shapes[key])


class AgentPolicy:
    """A live agent as a policy of `agents.tools.evaluation` (deterministic by default)."""

    def __init__(self, agent, greedy=True):
        self._agent = agent
        self._greedy = bool(greedy)

    def initial_state(self, batch_size):
        return self._agent.initial_state(batch_size)

    def __call__(self, observ, state, reset):
        # In the environment's dtype, as training's: the agent casts (frames stay bytes).
        action, _, state = self._agent.act(
            tf.constant(np.asarray(observ)), state, tf.constant(reset, tf.bool),
            greedy=self._greedy)
        return action.numpy(), state
