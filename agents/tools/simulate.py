"""Compiled simulation of a batch of environments driven by a learning algorithm.

One `Simulator.step` resets the environments whose episodes ended, asks the algorithm for
actions, steps the environments, hands the transition to the algorithm and keeps track of
episode returns and lengths. `Simulator.rollout` runs T such steps in one `tf.while_loop`, so
Python runs once per rollout, not once per step, and returns the transitions stacked over time;
its loop holds as few ops as it can, since every op there costs more next to the environments'
Python than alone.
The environment only needs the interface of `InGraphBatchEnv` (`observ`, `terminated`,
`truncated` variables, `step(action)`, `reset(indices)`, `len`, `num_groups`), so a native TF
environment can replace it. An environment of several groups (`num_groups` > 1: a
PipelinedVectorEnv behind an InGraphBatchEnv) also has `group_indices`, `send` and `receive`,
and its rollouts step one group while the algorithm acts for the next, with the same
transitions as one batch's.
"""

import collections
import operator
from typing import Any, NamedTuple

import numpy as np
import tensorflow as tf


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
        """Receives the `Transition` of the environments that just stepped.

        Rollouts of algorithms that leave this hook alone derive the episode statistics after
        their loop instead of step by step, which makes each step cheaper.
        """
        del agent_indices, transition

    def end_episode(self, agent_indices):
        """The episodes of the environments at `agent_indices` ended with the last step."""
        del agent_indices


class Simulator(tf.Module):
    """Runs an `Algorithm` in a batch of in-graph environments, in compiled steps.

    Not gin-configurable: the run passes the environments and the algorithm, and nothing else
    here is a setting, so a `Simulator.*` binding is refused as unknown.

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
        self._calls_experience = type(algorithm).experience is not Algorithm.experience
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
        if self._env.num_groups > 1:
            if self._calls_experience:
                raise ValueError(f'{type(self._algorithm).__name__} takes each step\'s '
                                 'transition (experience), which an environment of groups '
                                 'completes group by group; step it as one batch.')
            first = self._episode_starts(reset)
            steps = self._pipelined_steps(num_steps, first)
        elif self._calls_experience:
            # The algorithm sees each step's complete transition, episode statistics included.
            return _stack_over_time(self._simulate_step, num_steps, reset)
        else:
            # Otherwise the loop keeps to the environment step and the rest is derived
            # afterwards, vectorised over the rollout: next to the environments' Python, each op
            # in the loop costs more than it costs alone (measured; benchmarks/README.md).
            first = self._episode_starts(reset)
            # The first step runs before the loop and the others in it: one trace serves both
            # (tracing the step is most of the time to build the rollout).
            act_and_step = tf.function(
                self._act_and_step, autograph=False).get_concrete_function(
                    tf.TensorSpec(first.shape, tf.bool))
            steps = _stack_over_time(
                lambda reset: act_and_step(self._episode_starts(reset)), num_steps, reset)
        done = tf.logical_or(steps.terminated, steps.truncated)
        first = tf.concat([first[None], done[:-1]], 0)
        score, length = _episode_statistics(first, steps.reward, self.score, self.length)
        self.score.assign(score[-1])
        self.length.assign(length[-1])
        return Transition(
            steps.observ, steps.action, steps.reward, steps.terminated, steps.truncated,
            steps.next_observ, first, steps.extras, score, length)

    def _episode_starts(self, reset):
        """[N] bool, the environments' next step begins an episode."""
        first = tf.logical_or(self._env.terminated, self._env.truncated)
        if reset is not False:
            first = tf.logical_or(first, tf.convert_to_tensor(reset, tf.bool))
        return first

    def _act_and_step(self, first):
        """One step without episode statistics: resets the environments where `first`, acts,
        steps, reports the episodes that ended."""
        env, algorithm = self._env, self._algorithm
        tf.cond(tf.reduce_any(first), lambda: self._begin_episodes(first), lambda: None)
        observ = tf.convert_to_tensor(env.observ)
        action, extras = algorithm.perform(tf.range(len(env)), observ)
        next_observ, reward, terminated, truncated = env.step(action)
        if self._calls_end_episode:
            done = tf.logical_or(terminated, truncated)
            tf.cond(
                tf.reduce_any(done), lambda: algorithm.end_episode(_where(done)), lambda: None)
        return _EnvStep(
            observ=observ, action=action, reward=reward, terminated=terminated,
            truncated=truncated, next_observ=next_observ, extras=extras)

    def _pipelined_steps(self, num_steps, first):
        """The steps of a rollout of an environment in groups (`num_groups` > 1): each group's
        environments step while the algorithm acts for the next group's.

        Round t starts with the actions of every group sent; it receives group g's outcome,
        resets its ended environments, acts for it and sends its next actions, then does the
        same for group g + 1, which stepped meanwhile. The last round only receives, so every
        environment steps `num_steps` times, as in one batch, and the steps are [T, N] in the
        order of the environments. Returns them as an `_EnvStep` stacked over time."""
        env, algorithm = self._env, self._algorithm
        groups = [env.group_indices(group) for group in range(env.num_groups)]
        tf.cond(tf.reduce_any(first), lambda: self._begin_episodes(first), lambda: None)

        def act_and_send(group, token):
            observ = tf.gather(env.observ, groups[group])
            action, extras = algorithm.perform(groups[group], observ)
            return (observ, action, extras), env.send(group, action, after=token)

        def round_(acted, token, act_again):
            """Receives every group's step (and sends its next actions if `act_again`)."""
            steps, next_acted = [], []
            for group, indices in enumerate(groups):
                next_observ, reward, terminated, truncated = env.receive(group, token)
                observ, action, extras = acted[group]
                steps.append(_EnvStep(observ=observ, action=action, reward=reward,
                                      terminated=terminated, truncated=truncated,
                                      next_observ=next_observ, extras=extras))
                done = tf.logical_or(terminated, truncated)
                ended = tf.boolean_mask(indices, done)
                if self._calls_end_episode:
                    tf.cond(tf.reduce_any(done), lambda ended=ended: algorithm.end_episode(ended),
                            lambda: None)
                if act_again:
                    tf.cond(tf.reduce_any(done), lambda ended=ended: self._begin_at(ended),
                            lambda: None)
                    group_acted, token = act_and_send(group, token)
                    next_acted.append(group_acted)
            step = tf.nest.map_structure(lambda *parts: tf.concat(parts, 0), *steps)
            return step, next_acted, token

        acted, token = [], None
        for group in range(len(groups)):
            group_acted, token = act_and_send(group, token)
            acted.append(group_acted)
        if num_steps == 1:
            step, _, _ = round_(acted, token, act_again=False)
            return tf.nest.map_structure(lambda x: x[None], step)
        step, acted, token = round_(acted, token, act_again=True)
        arrays = tf.nest.map_structure(
            lambda x: tf.TensorArray(x.dtype, size=num_steps, element_shape=x.shape).write(0, x),
            step)

        def body(index, arrays, acted, token):
            step, acted, token = round_(acted, token, act_again=True)
            arrays = tf.nest.map_structure(lambda a, x: a.write(index, x), arrays, step)
            return index + 1, arrays, acted, token

        index, arrays, acted, token = tf.while_loop(
            lambda index, *unused: index < num_steps - 1, body,
            (tf.constant(1), arrays, acted, token), parallel_iterations=1)
        step, _, _ = round_(acted, token, act_again=False)
        arrays = tf.nest.map_structure(lambda a, x: a.write(index, x), arrays, step)
        return tf.nest.map_structure(lambda array: array.stack(), arrays)

    def _begin_at(self, indices):
        self._env.reset(indices)
        self._algorithm.begin_episode(indices)

    def _simulate_step(self, reset):
        """One step with its episode statistics, which `Algorithm.experience` receives."""
        first = self._episode_starts(reset)
        step = self._act_and_step(first)
        score, length = _episode_statistics(
            first[None], step.reward[None], self.score, self.length)
        score, length = score[0], length[0]
        self.score.assign(score)
        self.length.assign(length)
        transition = Transition(
            step.observ, step.action, step.reward, step.terminated, step.truncated,
            step.next_observ, first, step.extras, score, length)
        self._algorithm.experience(tf.range(len(self._env)), transition)
        return transition

    def _begin_episodes(self, mask):
        indices = _where(mask)
        self._env.reset(indices)
        self._algorithm.begin_episode(indices)


# The fields of a `Transition` that a rollout's step loop records; the others are derived.
_EnvStep = collections.namedtuple('_EnvStep', [
    field for field in Transition._fields
    if field not in ('first', 'episode_return', 'episode_length')])


def _stack_over_time(step_fn, num_steps, reset):
    """Runs `step_fn(reset)`, then `step_fn(False)` num_steps - 1 times in a tf.while_loop;
    returns the outputs stacked to [T, ...]."""
    # The first step runs outside the loop: it tells the dtypes and shapes of the outputs for
    # the TensorArrays, and lets the algorithm create variables on first use.
    initial = step_fn(reset)
    arrays = tf.nest.map_structure(
        lambda x: tf.TensorArray(x.dtype, size=num_steps, element_shape=x.shape).write(0, x),
        initial)

    def body(index, arrays):
        outputs = step_fn(False)
        arrays = tf.nest.map_structure(lambda a, x: a.write(index, x), arrays, outputs)
        return index + 1, arrays

    _, arrays = tf.while_loop(
        lambda index, _: index < num_steps, body, (tf.constant(1), arrays),
        parallel_iterations=1)
    return tf.nest.map_structure(lambda array: array.stack(), arrays)


def _episode_statistics(first, reward, score_before, length_before):
    """[T, N] return and length of each step's episode so far, the step included.

    `first` and `reward` are T steps' [T, N] flags and rewards, `score_before` and
    `length_before` the [N] return and length of the episodes running before them. Returns are
    summed in float64 and rounded once, so they may differ from float32 running sums in the
    last bit; non-finite rewards give what a running sum gives (NaN, or an infinity) until their
    episode ends. Both `Simulator.step` and rollouts use it, so their statistics agree.
    """
    num_steps, num_envs = first.shape
    # Each environment's episodes in the rollout, numbered from 0 for the one running before it.
    episode = tf.cumsum(tf.cast(first, tf.int32), axis=0)
    began = episode > 0
    segment = episode + tf.range(num_envs) * (num_steps + 1)

    def running_sum(values):
        """Sums of `values` [T, N, ...] from the start of each step's episode, or of the rollout
        for episode 0."""
        before = tf.cumsum(values, axis=0, exclusive=True)
        starts = tf.reshape(first, first.shape + (1,) * (values.shape.rank - 2))
        at_start = tf.math.unsorted_segment_sum(
            tf.where(starts, before, tf.zeros_like(before)), segment,
            num_envs * (num_steps + 1))
        return tf.cumsum(values, axis=0) - tf.gather(at_start, segment)

    length = running_sum(tf.ones_like(episode)) + tf.where(began, 0, length_before[None])
    reward = tf.cast(reward, tf.float64)
    zero = tf.zeros_like(reward)
    finite = tf.math.is_finite(reward)
    # Non-finite rewards would spoil the differences of sums; they are counted instead.
    kinds = tf.stack([tf.math.is_nan(reward), reward == np.inf, reward == -np.inf], -1)
    seen = running_sum(tf.cast(kinds, tf.int32)) > 0
    nonfinite = tf.reduce_sum(
        tf.where(seen, tf.constant([np.nan, np.inf, -np.inf], tf.float64), zero[..., None]), -1)
    score = (running_sum(tf.where(finite, reward, zero)) + nonfinite
             + tf.where(began, zero, tf.cast(score_before, tf.float64)[None]))
    return tf.cast(score, tf.float32), length


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
