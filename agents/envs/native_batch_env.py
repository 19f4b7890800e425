"""A batch of native environments behind the interface of `InGraphBatchEnv`.

`NativeBatchEnv` keeps the states of N environments of a `native_env.NativeEnv` in variables,
next to the `observ`, `action`, `reward`, `terminated` and `truncated` variables that
`simulate.Simulator` reads, so it replaces an `InGraphBatchEnv` without changes to the code that
drives it, and a whole rollout is TF ops only (no Python, no numpy function per step). Resets are
explicit, as there: after an episode ends `observ` keeps its final observation until
`reset(indices)`, and every environment starts out truncated ("needs a reset").

Gymnasium's time limit becomes truncation after `max_episode_steps`, and the wrappers the
trainer configures by name (`range_normalize`, `ClipAction`) are applied in TF with Gymnasium's
float32 arithmetic, so the agent sees what it would see through the wrapped Gymnasium env.
"""

import gin
import gymnasium as gym
import numpy as np
import tensorflow as tf

from agents.envs import native_env

# Wrapper names that `NativeBatchEnv` applies itself (the names of `wrappers.apply_wrappers`).
WRAPPERS = ('range_normalize', 'ClipAction')


# Arguments that gin refuses to bind: the code that makes a NativeBatchEnv passes them
# (`agents.envs.make`, which the trainer calls with `train.env_id`, `train.num_envs`,
# `train.seed` and `train.wrappers`), and an explicit argument would silently win over a binding.
# Adding a name here breaks restoring runs whose operative_config.gin lists it.
NOT_GIN_BINDABLE = ('env', 'num_envs', 'seed', 'wrappers', 'check_inputs')


@gin.configurable(denylist=NOT_GIN_BINDABLE)
class NativeBatchEnv(tf.Module):
    """`num_envs` environments of a `NativeEnv`, stepped and reset by TF ops.

    Attributes:
      env: the `NativeEnv`.
      observation_space, action_space: the spaces of one environment after the wrappers, as the
        agent sees them (also as `single_observation_space`, `single_action_space`).
      state: [N, state_size] physical states, of the env's dtype.
      elapsed: [N] int32 steps of each environment's current episode.
      observ: [N, *observation_shape] float32 current (or final) observations.
      action: [N, *action_shape] last actions as the agent gave them.
      reward: [N] float32 rewards of the last step (zero after a reset).
      terminated: [N] bool, the last step ended the episode in a terminal state.
      truncated: [N] bool, the last step reached the time limit (or the env needs a reset).

    Gin binds only `name`; binding one of `NOT_GIN_BINDABLE` is an error when the config is
    parsed.
    """

    # The whole state is in the variables: a checkpoint of them (the trainer's, on this backend)
    # holds the episodes in flight, which a resumed run continues.
    state_in_variables = True
    # No VectorEnv behind it: stepping runs no Python, nothing can crash or hang.
    vector_env = None
    # All environments step as one batch (simulate.py's interface).
    num_groups = 1

    def __init__(self, env, num_envs, seed=0, wrappers=(), check_inputs=True, name=None):
        """Creates the variables; every environment needs a reset before its first step.

        Args:
          env: a `native_env.NativeEnv`.
          num_envs: positive number of environments.
          seed: int; start states come from the stateless RNG with seeds (seed, reset count),
            so the same seed and actions give the same trajectories (`seed_next_reset` sets
            the count). A list of K ints makes K equal blocks of environments (a population's
            members), block k drawing its start states as `num_envs / K` environments of seed
            k would: with its own seed and its own reset count.
          wrappers: names among `WRAPPERS`, innermost first, as in `wrappers.apply_wrappers`.
          check_inputs: check in the graph that stepped environments are running, actions are
            finite (and in range for discrete actions) and reset indices exist. The checks cost
            little and are skipped by XLA, which cannot raise errors.
        """
        super().__init__(name=name)
        if not isinstance(env, native_env.NativeEnv):
            raise TypeError(f'env must be a native_env.NativeEnv, got {env!r}')
        if isinstance(num_envs, bool) or not isinstance(num_envs, (int, np.integer)) \
                or num_envs < 1:
            raise ValueError(f'num_envs must be a positive integer, got {num_envs!r}')
        seeds = list(seed) if isinstance(seed, (list, tuple)) else [seed]
        if not seeds or any(isinstance(value, bool) or not isinstance(value, (int, np.integer))
                            for value in seeds):
            raise TypeError(f'seed must be an integer or a list of integers, got {seed!r}')
        if num_envs % len(seeds):
            raise ValueError(f'{num_envs} environments do not split into {len(seeds)} blocks '
                             'of equal size (one per seed)')
        self.env = env
        self._num_envs = int(num_envs)
        # Blocks of environments with a seed each; a plain int seed keeps scalar variables.
        self._blocks = len(seeds) if isinstance(seed, (list, tuple)) else None
        seed = [int(value) for value in seeds] if self._blocks else int(seed)
        self._check_inputs = bool(check_inputs)
        (self.observation_space, self.action_space, self._transform_observ,
         self._transform_action) = _apply_wrappers(env, wrappers)
        self.single_observation_space = self.observation_space
        self.single_action_space = self.action_space
        batch = (self._num_envs,)
        with self.name_scope:
            self.state = tf.Variable(
                tf.zeros(batch + (env.state_size,), env.dtype), trainable=False, name='state')
            self.elapsed = tf.Variable(tf.zeros(batch, tf.int32), trainable=False, name='elapsed')
            self.observ = tf.Variable(
                tf.zeros(batch + self.observation_space.shape, tf.float32), trainable=False,
                name='observ')
            self.action = tf.Variable(
                tf.zeros(batch + self.action_space.shape, self.action_space.dtype),
                trainable=False, name='action')
            self.reward = tf.Variable(tf.zeros(batch, tf.float32), trainable=False, name='reward')
            self.terminated = tf.Variable(
                tf.zeros(batch, tf.bool), trainable=False, name='terminated')
            self.truncated = tf.Variable(
                tf.ones(batch, tf.bool), trainable=False, name='truncated')
            # The second half of the RNG seed of the next reset: counts the reset calls (from
            # the value of `seed_next_reset`, if it was called).
            self.resets = tf.Variable(
                tf.zeros([self._blocks] if self._blocks else [], tf.int64), trainable=False,
                name='resets')
            # The first half: a variable, not a constant of the graph, so that the compiled
            # programs of runs that differ only in their seed are the same (one XLA cache entry).
            self.seed = tf.Variable(tf.constant(seed, tf.int64), trainable=False, name='seed')

    def __len__(self):
        return self._num_envs

    def __repr__(self):
        return f'NativeBatchEnv({self.env!r}, num_envs={self._num_envs})'

    @property
    def num_envs(self):
        return self._num_envs

    @property
    def done(self):
        """[N] bool, the episode of each environment has ended (terminated or truncated)."""
        return tf.logical_or(self.terminated, self.truncated)

    def step(self, action):
        """Steps all environments; returns (observ, reward, terminated, truncated) tensors.

        `action` of another dtype of the same kind (float or integer) is cast to the dtype of
        the action space. Stepping an environment whose episode ended (or never started) is an
        error: reset it first.
        """
        action = self._cast_action(tf.convert_to_tensor(action))
        checks = self._step_checks(action) if self._check_inputs else []
        with tf.control_dependencies(checks):
            state, reward, terminated = self.env.dynamics(
                self.state, self._transform_action(action))
        elapsed = self.elapsed + 1
        truncated = elapsed >= self.env.max_episode_steps
        observ = self._transform_observ(self.env.observe(state))
        reward = tf.cast(reward, tf.float32)
        self.state.assign(state)
        self.elapsed.assign(elapsed)
        self.action.assign(action)
        self.observ.assign(observ)
        self.reward.assign(reward)
        self.terminated.assign(terminated)
        self.truncated.assign(truncated)
        return observ, reward, terminated, truncated

    def reset(self, indices=None):
        """Resets the environments at `indices` (all if None); returns their new observations.

        Their rewards become zero and their done flags false; other environments keep their
        state. Duplicate indices are reset once.
        """
        if indices is None:
            return self.reset_mask(tf.ones([self._num_envs], tf.bool))
        indices = self._check_indices(indices)
        self.reset_mask(self._mask(indices))
        return tf.gather(self.observ, indices)

    def reset_mask(self, mask):
        """Resets the environments where the [N] bool `mask` is true; returns all observations.

        Same as `reset(indices)` but of static shapes throughout, for XLA-compiled programs.
        """
        mask = tf.convert_to_tensor(mask)
        if mask.dtype != tf.bool or not mask.shape.is_compatible_with([self._num_envs]):
            raise ValueError(
                f'reset mask must be a bool vector of {self._num_envs} entries, got '
                f'{mask.dtype.name} of shape {mask.shape}')
        seed, resets = self.seed.read_value(), self.resets.read_value()
        self.resets.assign_add(tf.ones_like(resets))
        if self._blocks:
            size = self._num_envs // self._blocks
            state = tf.concat([
                self.env.sample_initial_state(size, tf.stack([seed[block], resets[block]]))
                for block in range(self._blocks)], 0)
        else:
            state = self.env.sample_initial_state(self._num_envs, tf.stack([seed, resets]))
        self._set(mask, state)
        return self.observ.read_value()

    def seed_next_reset(self, seed):
        """Restarts the stream of reset seeds: the next reset draws its start states with the
        stateless seed (seed of the constructor, `seed`), the one after it with (..., `seed` + 1),
        and so on (`seed`: a non-negative integer below 2**62, or a list of one per block).

        E.g. an evaluation that reseeds its environments before its first reset depends on the
        seed and the policy alone, not on the evaluations before it.
        """
        seeds = list(seed) if isinstance(seed, (list, tuple)) else [seed]
        if any(isinstance(value, bool) or not isinstance(value, (int, np.integer))
               for value in seeds):
            raise TypeError(f'seed must be an integer or a list of integers, got {seed!r}')
        if any(not 0 <= value < 2**62 for value in seeds):
            raise ValueError(f'seed must be in [0, 2**62), got {seed}')
        if len(seeds) > 1 and len(seeds) != self._blocks:
            raise ValueError(f'{len(seeds)} seeds for {self._blocks or 1} blocks of environments')
        self.resets.assign(tf.broadcast_to(tf.constant(seeds, tf.int64)
                                           if self._blocks and len(seeds) > 1
                                           else tf.constant(seeds[0], tf.int64),
                                           self.resets.shape))

    def set_state(self, state, indices=None, elapsed=0):
        """Puts the environments at `indices` (all if None) into the physical `state`.

        `state` is [len(indices), state_size] (see `NativeEnv.from_gym_state` for Gymnasium's
        states); their episodes go on from there as if `elapsed` (a scalar or one per index)
        steps had passed, with zero reward and done flags false. For tests, replays and
        rendering.
        """
        if indices is None:
            indices = tf.range(self._num_envs)
        indices = self._check_indices(indices)
        state = tf.cast(tf.convert_to_tensor(state), self.env.dtype)
        expected = tf.TensorShape([indices.shape[0], self.env.state_size])
        if not state.shape.is_compatible_with(expected):
            raise ValueError(f'state shape {state.shape} does not match {expected}')
        elapsed = tf.broadcast_to(tf.cast(elapsed, tf.int32), tf.shape(indices))
        checks = [tf.debugging.assert_non_negative(
            elapsed, message='set_state: elapsed must be >= 0')] if self._check_inputs else []
        with tf.control_dependencies(checks):
            full_state = tf.tensor_scatter_nd_update(self.state, indices[:, None], state)
            full_elapsed = tf.tensor_scatter_nd_update(self.elapsed, indices[:, None], elapsed)
        self._set(self._mask(indices), full_state, full_elapsed)
        return tf.gather(self.observ, indices)

    def env_action(self, action):
        """`action` as the native env receives it, after the action wrappers."""
        return self._transform_action(tf.convert_to_tensor(action, self.action_space.dtype))

    def close(self):
        """Nothing to release; here for the interface of `InGraphBatchEnv`."""

    def _set(self, mask, state, elapsed=0):
        """Starts episodes from `state` where `mask` is true, `elapsed` steps in."""
        state = tf.where(tf.reshape(mask, [-1, 1]), state, self.state)
        observ = self._transform_observ(self.env.observe(state))
        observ_mask = tf.reshape(mask, [-1] + [1] * len(self.observation_space.shape))
        not_reset = tf.logical_not(mask)
        self.state.assign(state)
        self.elapsed.assign(tf.where(mask, elapsed, self.elapsed))
        self.observ.assign(tf.where(observ_mask, observ, self.observ))
        self.reward.assign(tf.where(mask, tf.zeros_like(self.reward), self.reward))
        self.terminated.assign(tf.logical_and(self.terminated, not_reset))
        self.truncated.assign(tf.logical_and(self.truncated, not_reset))

    def _mask(self, indices):
        """[N] bool, true at `indices`."""
        hits = tf.scatter_nd(indices[:, None], tf.ones_like(indices), [self._num_envs])
        return hits > 0

    def _check_indices(self, indices):
        indices = tf.convert_to_tensor(indices)
        if not indices.dtype.is_integer:
            raise TypeError(f'indices must be integers, got dtype {indices.dtype.name}')
        if indices.shape.rank != 1:
            raise ValueError(f'indices must be a vector, got shape {indices.shape}')
        indices = tf.cast(indices, tf.int32)
        if not self._check_inputs:
            return indices
        checks = [
            tf.debugging.assert_non_negative(indices, message='indices must be >= 0'),
            tf.debugging.assert_less(
                indices, self._num_envs, message=f'indices must be < {self._num_envs}')]
        with tf.control_dependencies(checks):
            return tf.identity(indices)

    def _cast_action(self, action):
        """Casts `action` to the action space's dtype unless that would change its meaning."""
        wanted = tf.as_dtype(self.action_space.dtype)
        if action.dtype != wanted:
            same_kind = (
                (action.dtype.is_floating and wanted.is_floating)
                or (action.dtype.is_integer and wanted.is_integer))
            if not same_kind:
                raise TypeError(
                    f'action dtype {action.dtype.name} does not fit the action space dtype '
                    f'{wanted.name}')
            action = tf.cast(action, wanted)
        expected = tf.TensorShape((self._num_envs,) + self.action_space.shape)
        if not action.shape.is_compatible_with(expected):
            raise ValueError(f'action shape {action.shape} does not match {expected}')
        return action

    def _step_checks(self, action):
        checks = [tf.debugging.Assert(
            tf.logical_not(tf.reduce_any(self.done)),
            ['step() of environments whose episode ended (or never started): reset them first; '
             'done:', self.done], summarize=16)]
        if action.dtype.is_floating:
            checks.append(tf.debugging.assert_all_finite(action, 'action contains NaN or infinity'))
        if isinstance(self.action_space, gym.spaces.Discrete):
            space = self.action_space
            checks.append(tf.debugging.Assert(
                tf.reduce_all((action >= space.start) & (action < space.start + space.n)),
                [f'actions must be in {space}, got', action], summarize=16))
        return checks


def _apply_wrappers(env, wrappers):
    """(observation space, action space, observation transform, action transform) of `env`
    wrapped in `wrappers` (names among WRAPPERS, innermost first)."""
    if isinstance(wrappers, str):
        raise TypeError(f'wrappers must be a list of names, got the single name {wrappers!r}')
    observation_space, action_space = env.observation_space, env.action_space
    observ_fns, action_fns = [], []
    for name in wrappers:
        if name == 'range_normalize':
            bounds = _unit_bounds(observation_space)
            if bounds:
                observation_space, forward, _ = _rescale_box(observation_space, *bounds)
                observ_fns.append(forward)
            bounds = _unit_bounds(action_space)
            if bounds:
                action_space, _, backward = _rescale_box(action_space, *bounds)
                action_fns.append(backward)
        elif name == 'ClipAction':
            if not isinstance(action_space, gym.spaces.Box):
                raise TypeError(f'ClipAction requires a Box action space, got {action_space}')
            low, high = action_space.low, action_space.high
            action_fns.append(lambda action, low=low, high=high: tf.clip_by_value(
                action, low, high))
            action_space = gym.spaces.Box(
                -np.inf, np.inf, shape=action_space.shape, dtype=action_space.dtype)
        else:
            raise ValueError(
                f'unknown wrapper {name!r} for a native env; known: {list(WRAPPERS)}')

    def transform_observ(observ):
        for fn in observ_fns:
            observ = fn(observ)
        return observ

    def transform_action(action):
        for fn in reversed(action_fns):  # The outermost wrapper sees the action first.
            action = fn(action)
        return action

    return observation_space, action_space, transform_observ, transform_action


def _unit_bounds(space):
    """Bounds mapping the bounded components of a Box to [-1, 1] (`wrappers.range_normalize`),
    or None where nothing is to rescale."""
    if not isinstance(space, gym.spaces.Box):
        return None
    bounded = np.isfinite(space.low) & np.isfinite(space.high)
    if not bounded.any():
        return None
    low = np.where(bounded, -1, space.low).astype(space.dtype)
    high = np.where(bounded, 1, space.high).astype(space.dtype)
    return low, high


def _rescale_box(box, new_min, new_max):
    """The Box and the forward and backward TF maps of `gymnasium.wrappers.utils.rescale_box`,
    with its coefficients computed the same way, so results agree to the bit."""
    diff_dtype = getattr(np, 'float128', np.float64)
    min_finite, max_finite = np.isfinite(new_min), np.isfinite(new_max)
    both_finite = min_finite & max_finite
    high_low_diff = (np.array(box.high[both_finite], dtype=diff_dtype)
                     - np.array(box.low[both_finite], dtype=diff_dtype))
    gradient = np.ones_like(new_min, dtype=box.dtype)
    gradient[both_finite] = (new_max[both_finite] - new_min[both_finite]) / high_low_diff
    intercept = np.zeros_like(new_min, dtype=box.dtype)
    intercept[max_finite] = new_max[max_finite] - box.high[max_finite]
    intercept[min_finite] = gradient[min_finite] * -box.low[min_finite] + new_min[min_finite]
    new_box = gym.spaces.Box(low=new_min, high=new_max, shape=box.shape, dtype=box.dtype)
    gradient, intercept = tf.constant(gradient), tf.constant(intercept)
    return (new_box, lambda x: gradient * x + intercept,
            lambda x: (x - intercept) / gradient)
