"""Compiled simulation of a batch of environments driven by a learning algorithm.

One `Simulator.step` resets the environments whose episodes ended, asks the algorithm for
actions, steps the environments, hands the transition to the algorithm and keeps track of
episode returns and lengths. `Simulator.rollout` runs T such steps in one `tf.while_loop`, so
Python runs once per rollout, not once per step, and returns the transitions stacked over time.
The environment only needs the interface of `InGraphBatchEnv` (`observ`, `terminated`,
`truncated` variables, `step(action)`, `reset(indices)`, `len`), so a native TF environment can
replace it.
"""

import operator
import time
from typing import Any, NamedTuple

import gin
import gymnasium as gym
import numpy as np
import tensorflow as tf

from agents.tools import in_graph_batch_env


class Transition(NamedTuple):
    """One step of all N environments; a rollout stacks each field to [T, N, ...].

    Attributes:
      observ: observations the algorithm acted on.
      action: actions as the algorithm returned them.
      reward: float32 rewards.
      terminated: the episode reached a terminal state: do not bootstrap.
      truncated: the episode was cut short (time limit): bootstrap from `next_observ`.
      next_observ: observations after the step; where the episode ended, its final observation.
      first: the step is the first of its episode (the environment was reset before it); lets
        recurrent policies reset their state when they replay the rollout.
      extras: the nested structure of tensors that `Algorithm.perform` returned along with the
        actions (log-probabilities, values, distribution parameters...).
      episode_return: float32 return of the episode so far, including this step; where the
        episode ended (terminated or truncated), the return of the completed episode.
      episode_length: int32 number of steps of the episode so far, including this step.
    """
    observ: Any
    action: Any
    reward: Any
    terminated: Any
    truncated: Any
    next_observ: Any
    first: Any
    extras: Any
    episode_return: Any
    episode_length: Any


class Algorithm:
    """What the simulator asks of an algorithm: the batch-ppo episode protocol.

    All methods run inside the compiled simulation, act through TF ops (typically on
    variables) and receive int32 vectors of environment indices. They are traced without
    AutoGraph (converting the code costs seconds per trace), so control flow that depends on
    tensor values must use `tf.cond` / `tf.while_loop`. Only `perform` must be implemented; the
    hooks do nothing by default.
    """

    def begin_episode(self, agent_indices):
        """The environments at `agent_indices` were reset; e.g. zero recurrent state there."""
        del agent_indices

    def perform(self, agent_indices, observ):
        """Returns (action, extras); extras is a nested structure of [N, ...] tensors, or ()."""
        raise NotImplementedError(f'{type(self).__name__} must implement perform()')

    def experience(self, agent_indices, transition):
        """Receives the `Transition` of the environments that just stepped."""
        del agent_indices, transition

    def end_episode(self, agent_indices):
        """The episodes of the environments at `agent_indices` ended with the last step."""
        del agent_indices


@gin.configurable
class Simulator(tf.Module):
    """Runs an `Algorithm` in a batch of in-graph environments, in compiled steps.

    Attributes:
      score: [N] float32 return of each environment's current (or just ended) episode.
      length: [N] int32 length of each environment's current (or just ended) episode.
    """

    def __init__(self, env, algorithm, name=None):
        super().__init__(name=name)
        if not isinstance(algorithm, Algorithm):
            raise TypeError(f'algorithm must be a simulate.Algorithm, got {type(algorithm)}')
        self._env = env
        self._algorithm = algorithm
        # Skipping the end-of-episode check for algorithms that ignore it saves a conditional
        # per step.
        self._calls_end_episode = type(algorithm).end_episode is not Algorithm.end_episode
        with self.name_scope:
            self.score = tf.Variable(
                tf.zeros((len(env),), tf.float32), trainable=False, name='score')
            self.length = tf.Variable(
                tf.zeros((len(env),), tf.int32), trainable=False, name='length')

    @tf.function(autograph=False)
    def step(self, reset=False):
        """Simulates one step of all environments and returns its `Transition`.

        Environments whose episode ended are reset first, and all of them if `reset` is true
        (an aborted episode is not reported to `end_episode`).
        """
        return self._simulate_step(reset)

    @tf.function(autograph=False)
    def rollout(self, num_steps, reset=False):
        """Simulates `num_steps` steps in one call; returns a `Transition` stacked to [T, N...].

        `reset` applies to the first step as in `step`. Pass a Python int for `num_steps`; each
        new value compiles the rollout again.
        """
        num_steps = _positive_int(num_steps, 'num_steps')
        # The first step runs outside the loop: it tells the dtypes and shapes of the extras
        # for the TensorArrays, and lets the algorithm create variables on first use.
        initial = self._simulate_step(reset)
        arrays = tf.nest.map_structure(
            lambda x: tf.TensorArray(x.dtype, size=num_steps, element_shape=x.shape).write(0, x),
            initial)

        def body(index, arrays):
            transition = self._simulate_step(False)
            arrays = tf.nest.map_structure(lambda a, x: a.write(index, x), arrays, transition)
            return index + 1, arrays

        _, arrays = tf.while_loop(
            lambda index, _: index < num_steps, body, (tf.constant(1), arrays),
            parallel_iterations=1)
        return tf.nest.map_structure(lambda array: array.stack(), arrays)

    def _simulate_step(self, reset):
        env, algorithm = self._env, self._algorithm
        first = tf.logical_or(env.terminated, env.truncated)
        if reset is not False:
            first = tf.logical_or(first, tf.convert_to_tensor(reset, tf.bool))
        tf.cond(tf.reduce_any(first), lambda: self._begin_episodes(first), lambda: None)
        observ = tf.convert_to_tensor(env.observ)
        agent_indices = tf.range(len(env))
        action, extras = algorithm.perform(agent_indices, observ)
        next_observ, reward, terminated, truncated = env.step(action)
        score = tf.where(first, tf.zeros_like(reward), self.score) + reward
        length = tf.where(first, tf.zeros_like(self.length), self.length) + 1
        self.score.assign(score)
        self.length.assign(length)
        transition = Transition(
            observ, action, reward, terminated, truncated, next_observ, first, extras, score,
            length)
        algorithm.experience(agent_indices, transition)
        if self._calls_end_episode:
            done = tf.logical_or(terminated, truncated)
            tf.cond(
                tf.reduce_any(done), lambda: algorithm.end_episode(_where(done)), lambda: None)
        return transition

    def _begin_episodes(self, mask):
        indices = _where(mask)
        self._env.reset(indices)
        self._algorithm.begin_episode(indices)


def _where(mask):
    """int32 indices of the true entries of a bool vector."""
    return tf.cast(tf.reshape(tf.where(mask), [-1]), tf.int32)


def _positive_int(value, name):
    try:
        value = operator.index(value)
    except TypeError:
        raise TypeError(f'{name} must be a Python int, got {value!r}') from None
    if value < 1:
        raise ValueError(f'{name} must be >= 1, got {value}')
    return value


class ConstantAlgorithm(Algorithm):
    """Performs the same action everywhere: the trivial policy of throughput benchmarks."""

    def __init__(self, action):
        self._action = tf.constant(action)

    def perform(self, agent_indices, observ):
        del observ
        shape = tf.concat([tf.shape(agent_indices), tf.shape(self._action)], 0)
        return tf.broadcast_to(self._action, shape), ()


def neutral_action(space):
    """An action in `space` that is valid and unremarkable: the middle of a Box, else the start."""
    if isinstance(space, gym.spaces.Box):
        finite = np.isfinite(space.low) & np.isfinite(space.high)
        action = np.clip(np.zeros(space.shape), space.low, space.high)
        action[finite] = (space.low[finite] + space.high[finite]) / 2
        return action.astype(space.dtype)
    if isinstance(space, (gym.spaces.Discrete, gym.spaces.MultiDiscrete)):
        return np.asarray(space.start, space.dtype)
    if isinstance(space, gym.spaces.MultiBinary):
        return np.zeros(space.shape, space.dtype)
    raise TypeError(f'no neutral action for space {space!r}')


def benchmark_rollout(vector_env, num_steps=1000, repeats=3):
    """Environment steps per second of compiled rollouts with a constant policy, per repeat.

    Shows what simulating inside the graph costs on top of `vector_env` (AutoresetMode.DISABLED;
    compare `benchmark_raw_loop`). The first rollout compiles the graph and is not timed. With
    environments stepping in this process on few cores, a program that calls
    `tf.config.threading.set_inter_op_parallelism_threads(1)` before using TF simulates faster:
    no handing ops between threads around each environment step.
    """
    env = in_graph_batch_env.InGraphBatchEnv(vector_env)
    simulator = Simulator(env, ConstantAlgorithm(neutral_action(env.action_space)))
    simulator.rollout(num_steps)
    rates = []
    for _ in range(repeats):
        start = time.perf_counter()
        simulator.rollout(num_steps)
        rates.append(num_steps * len(env) / (time.perf_counter() - start))
    return rates


def benchmark_raw_loop(vector_env, num_steps=1000, repeats=3):
    """Environment steps per second of a Python loop calling `vector_env.step`, per repeat.

    The loop resets finished environments like the simulator does, so the two are comparable.
    """
    action = neutral_action(vector_env.single_action_space)
    actions = np.broadcast_to(action, (vector_env.num_envs,) + action.shape).copy()
    vector_env.reset()
    rates = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(num_steps):
            _, _, terminated, truncated, _ = vector_env.step(actions)
            done = terminated | truncated
            if done.all():
                vector_env.reset()
            elif done.any():
                vector_env.reset(options={'reset_mask': done})
        rates.append(num_steps * vector_env.num_envs / (time.perf_counter() - start))
    return rates
