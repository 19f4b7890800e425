"""A batch of environments inside the TensorFlow graph.

The current observation, action, reward and done flags live in `tf.Variable`s and `step` and
`reset` are TF ops, so a whole rollout compiles into one `tf.function` and Python only runs
inside the wrapped VectorEnv. A native TF environment offering the same attributes and methods
can replace this class without changes to the code that drives it.
"""

import ctypes
import functools
import threading

import gin
import gymnasium as gym
import numpy as np
import tensorflow as tf

from agents.tools import pipelined_env

# Spaces whose samples are single arrays of a fixed shape and dtype.
_ARRAY_SPACES = (
    gym.spaces.Box, gym.spaces.Discrete, gym.spaces.MultiDiscrete, gym.spaces.MultiBinary)


def _array_spec(space, what):
    """Shape and numpy dtype of one sample of `space`; other spaces are rejected."""
    if not isinstance(space, _ARRAY_SPACES):
        raise TypeError(
            f'{what} space must be one of {[s.__name__ for s in _ARRAY_SPACES]}, got {space!r}')
    return tuple(space.shape), np.dtype(space.dtype)


def check_seed(seed):
    """`seed` as an int if it is a non-negative integer (or None); else raises."""
    if seed is None:
        return None
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise TypeError(f'seed must be an integer or None, got {seed!r}')
    if seed < 0:
        raise ValueError(f'seed must be non-negative, got {seed}')
    return int(seed)


_thread_state = threading.local()


def _keep_python_thread_state():
    """Keeps the Python thread state of the calling TF thread alive between numpy functions.

    TF runs numpy functions on its own threads inside PyGILState_Ensure/Release, which creates
    and destroys a Python thread state (and its frame stack) on every call: tens of
    microseconds, as much as stepping several cheap environments. One extra Ensure, never
    released, per thread keeps the state (as pybind11's gil_scoped_acquire.inc_ref() does). The
    cost is one small thread state per TF thread until the interpreter exits.
    """
    if getattr(_thread_state, 'kept', False):
        return
    if threading.get_ident() != threading.main_thread().ident:
        ctypes.pythonapi.PyGILState_Ensure()
    _thread_state.kept = True


# Arguments that gin refuses to bind: the code that makes an InGraphBatchEnv passes them (the
# trainer its batch of `train.num_envs` environments and seeds from `train.seed`), and an
# explicit argument would silently win over a binding. Adding a name here breaks restoring runs
# whose operative_config.gin lists it (gin refuses those lines too).
NOT_GIN_BINDABLE = ('vector_env', 'seed')


@gin.configurable(denylist=NOT_GIN_BINDABLE)
class InGraphBatchEnv(tf.Module):
    """Drives a `gymnasium.vector.VectorEnv` in AutoresetMode.DISABLED from TF ops.

    Resets are explicit (`reset(indices)`), so after an episode ends the observation variable
    still holds its final observation, which bootstraps truncated episodes. Every environment
    starts out truncated, meaning "needs a reset", so a simulator that resets finished
    environments before stepping also starts them.

    Attributes:
      observ: [N, *observation_shape] current observations, dtype of the observation space.
      action: [N, *action_shape] last actions, dtype of the action space.
      reward: [N] float32 rewards of the last step (zero after a reset).
      terminated: [N] bool, the last step ended the episode in a terminal state.
      truncated: [N] bool, the last step ended the episode for another reason (time limit).

    Gin binds `keep_thread_states` and `name`; binding `vector_env` or `seed` is an error when
    the config is parsed (`train.seed` seeds the trainer's environments).
    """

    # The environments' state lives in the VectorEnv (in worker processes, for one), out of
    # reach of a TF checkpoint: a resumed run starts new episodes (see `NativeBatchEnv`).
    state_in_variables = False

    def __init__(self, vector_env, seed=None, keep_thread_states=True, name=None):
        """Wraps `vector_env`; `seed` goes to its first reset (then resets are unseeded).

        `keep_thread_states` makes each call into Python cheaper, see
        `_keep_python_thread_state`.
        """
        super().__init__(name=name)
        mode = vector_env.metadata.get('autoreset_mode')
        if mode is None or gym.vector.AutoresetMode(mode) != gym.vector.AutoresetMode.DISABLED:
            raise ValueError(
                'InGraphBatchEnv needs a VectorEnv with metadata["autoreset_mode"] = '
                f'AutoresetMode.DISABLED, because it resets environments itself; got {mode!r}')
        self._env = vector_env
        self._pipelined = isinstance(vector_env, pipelined_env.PipelinedVectorEnv)
        self._seed = seed
        self._keep_thread_states = keep_thread_states
        self._num_envs = int(vector_env.num_envs)
        self.observation_space = vector_env.single_observation_space
        self.action_space = vector_env.single_action_space
        self._observ_shape, self._observ_dtype = _array_spec(
            self.observation_space, 'observation')
        self._action_shape, self._action_dtype = _array_spec(self.action_space, 'action')
        batch = (self._num_envs,)
        with self.name_scope:
            self.observ = tf.Variable(
                tf.zeros(batch + self._observ_shape, self._observ_dtype), trainable=False,
                name='observ')
            self.action = tf.Variable(
                tf.zeros(batch + self._action_shape, self._action_dtype), trainable=False,
                name='action')
            self.reward = tf.Variable(tf.zeros(batch, tf.float32), trainable=False, name='reward')
            self.terminated = tf.Variable(
                tf.zeros(batch, tf.bool), trainable=False, name='terminated')
            self.truncated = tf.Variable(
                tf.ones(batch, tf.bool), trainable=False, name='truncated')

    def __len__(self):
        return self._num_envs

    @property
    def done(self):
        """[N] bool, the episode of each environment has ended (terminated or truncated)."""
        return tf.logical_or(self.terminated, self.truncated)

    def step(self, action):
        """Steps all environments; returns (observ, reward, terminated, truncated) tensors.

        `action` of another dtype of the same kind (float or integer) is cast to the dtype of
        the action space. Stepping while an environment's episode has ended (or not yet begun)
        is an error: reset it first.
        """
        action = tf.convert_to_tensor(action)
        action = self._cast_action(action)
        # Each output of a numpy function costs several microseconds of conversion, so the
        # reward and done flags come back together as float32 columns.
        observ, outcome = tf.numpy_function(
            self._step_numpy, [action, self.done], [self._observ_dtype, tf.float32],
            stateful=True, name='env_step')
        observ.set_shape(self.observ.shape)
        outcome.set_shape((self._num_envs, 3))
        reward, terminated, truncated = tf.unstack(outcome, axis=1)
        terminated, truncated = terminated > 0, truncated > 0
        self.action.assign(action)
        self.observ.assign(observ)
        self.reward.assign(reward)
        self.terminated.assign(terminated)
        self.truncated.assign(truncated)
        return observ, reward, terminated, truncated

    @property
    def num_groups(self):
        """Groups of environments that step apart (`send`, `receive`): those of a
        PipelinedVectorEnv, else 1."""
        return self._env.num_groups if self._pipelined else 1

    def group_indices(self, group):
        """int32 indices of the environments of `group`."""
        rows = self._env.group_slice(group) if self._pipelined else slice(0, self._num_envs)
        return tf.range(rows.start, rows.stop)

    def send(self, group, action, after=None):
        """Starts the step of the environments of `group` (a Python int) with their `action`
        (see `step`) and returns at once; returns a token for `receive`. `after`: a token of an
        earlier `send`, which this call then follows (numpy functions that share no variable
        run in any order)."""
        rows = self._env.group_slice(group)
        action = self._cast_action(tf.convert_to_tensor(action), rows.stop - rows.start)
        inputs = [action, self.done] + ([] if after is None else [after])
        token = tf.numpy_function(
            functools.partial(self._send_numpy, group), inputs, tf.int32, stateful=True,
            name='env_send')
        token.set_shape([])
        self.action[rows].assign(action)
        return token

    def receive(self, group, token):
        """Waits for the step of `group` that `send` started (`token`: its token, or a later
        one); returns that group's (observ, reward, terminated, truncated) and updates its rows
        of the variables."""
        rows = self._env.group_slice(group)
        size = rows.stop - rows.start
        observ, outcome = tf.numpy_function(
            functools.partial(self._receive_numpy, group), [token, self.done],
            [self._observ_dtype, tf.float32], stateful=True, name='env_receive')
        observ.set_shape((size,) + self._observ_shape)
        outcome.set_shape((size, 3))
        reward, terminated, truncated = tf.unstack(outcome, axis=1)
        terminated, truncated = terminated > 0, truncated > 0
        self.observ[rows].assign(observ)
        self.reward[rows].assign(reward)
        self.terminated[rows].assign(terminated)
        self.truncated[rows].assign(truncated)
        return observ, reward, terminated, truncated

    def reset(self, indices=None):
        """Resets the environments at `indices` (all if None); returns their new observations.

        Their rewards become zero and their done flags false; other environments keep their
        state. Duplicate indices are reset once.
        """
        if indices is None:
            indices = tf.range(self._num_envs)
        indices = tf.convert_to_tensor(indices)
        if not indices.dtype.is_integer:
            raise TypeError(f'reset indices must be integers, got dtype {indices.dtype.name}')
        if indices.shape.rank != 1:
            raise ValueError(f'reset indices must be a vector, got shape {indices.shape}')
        indices = tf.cast(indices, tf.int32)
        observ = tf.numpy_function(
            self._reset_numpy, [indices, self.done], self._observ_dtype, stateful=True,
            name='env_reset')
        observ.set_shape(self.observ.shape)
        mask = tf.reduce_any(
            tf.equal(tf.expand_dims(indices, 1), tf.range(self._num_envs)), axis=0)
        observ_mask = tf.reshape(mask, (self._num_envs,) + (1,) * len(self._observ_shape))
        self.observ.assign(tf.where(observ_mask, observ, self.observ))
        self.reward.assign(tf.where(mask, tf.zeros_like(self.reward), self.reward))
        not_reset = tf.logical_not(mask)
        self.terminated.assign(tf.logical_and(self.terminated, not_reset))
        self.truncated.assign(tf.logical_and(self.truncated, not_reset))
        return tf.gather(observ, indices)

    def close(self):
        self._env.close()

    @property
    def vector_env(self):
        """The wrapped VectorEnv."""
        return self._env

    def replace_vector_env(self, vector_env, seed=None):
        """Swaps in `vector_env` (e.g. after a worker of the old one died); returns the old one.

        The new VectorEnv must have the same spaces and number of environments. Compiled
        functions keep working, since they call into whichever VectorEnv is current. Every
        environment is marked as needing a reset, which a simulator does before its next step:
        the episodes in flight are dropped. `seed` goes to that first reset.
        """
        mode = vector_env.metadata.get('autoreset_mode')
        if mode is None or gym.vector.AutoresetMode(mode) != gym.vector.AutoresetMode.DISABLED:
            raise ValueError('the new VectorEnv must have metadata["autoreset_mode"] = '
                             f'AutoresetMode.DISABLED, got {mode!r}')
        if (int(vector_env.num_envs) != self._num_envs
                or vector_env.single_observation_space != self.observation_space
                or vector_env.single_action_space != self.action_space):
            raise ValueError(
                f'the new VectorEnv ({vector_env.num_envs} envs, observations '
                f'{vector_env.single_observation_space}, actions '
                f'{vector_env.single_action_space}) does not match the old one '
                f'({self._num_envs} envs, {self.observation_space}, {self.action_space})')
        groups = (vector_env.num_groups
                  if isinstance(vector_env, pipelined_env.PipelinedVectorEnv) else 1)
        if groups != self.num_groups:
            raise ValueError(f'the new VectorEnv steps in {groups} groups, the old one in '
                             f'{self.num_groups}')
        old, self._env, self._seed = self._env, vector_env, seed
        self.request_reset()
        return old

    def seed_next_reset(self, seed):
        """Passes `seed` (a non-negative int, or None) to the VectorEnv's next reset, as the
        constructor's `seed` (env i gets seed + i); the resets after it are unseeded again.

        E.g. an evaluation that reseeds its environments before its first (full) reset depends
        on the seed and the policy alone, not on the evaluations before it.
        """
        self._seed = check_seed(seed)

    def request_reset(self):
        """Marks every environment as needing a reset (e.g. after a rollout failed midway), so
        that a simulator resets all of them before its next step; their episodes are dropped."""
        self.terminated.assign(tf.zeros_like(self.terminated))
        self.truncated.assign(tf.ones_like(self.truncated))

    def _cast_action(self, action, num_envs=None):
        """Casts `action` to the action space's dtype unless that would change its meaning."""
        wanted = tf.as_dtype(self._action_dtype)
        if action.dtype != wanted:
            same_kind = (
                (action.dtype.is_floating and wanted.is_floating)
                or (action.dtype.is_integer and wanted.is_integer))
            if not same_kind:
                raise TypeError(
                    f'action dtype {action.dtype.name} does not fit the action space dtype '
                    f'{wanted.name}')
            action = tf.cast(action, wanted)
        expected = tf.TensorShape((num_envs or self._num_envs,) + self._action_shape)
        if not action.shape.is_compatible_with(expected):
            raise ValueError(f'action shape {action.shape} does not match {expected}')
        return action

    # Both calls take the done flags, which both update afterwards: TF orders stateful ops in a
    # graph only where they share a variable, and this makes steps and resets run in program
    # order, also when one of them sits inside a tf.cond.

    def _step_numpy(self, action, done):
        if self._keep_thread_states:
            _keep_python_thread_state()
        # count_nonzero: cheaper than any() and all() on small arrays, on every step.
        if np.count_nonzero(done):
            raise RuntimeError(
                f'step() of environments {np.flatnonzero(done).tolist()} whose episode ended '
                '(or never started): reset them first')
        if (self._action_dtype.kind == 'f'
                and np.count_nonzero(np.isfinite(action)) != action.size):
            raise ValueError(f'action contains NaN or infinity: {action}')
        observ, reward, terminated, truncated, _ = self._env.step(action)
        outcome = np.empty((self._num_envs, 3), np.float32)
        outcome[:, 0] = reward
        outcome[:, 1] = terminated
        outcome[:, 2] = truncated
        return self._check_observ(observ, 'step'), outcome

    def _send_numpy(self, group, action, done, *unused_after):
        if self._keep_thread_states:
            _keep_python_thread_state()
        rows = self._env.group_slice(group)
        if done[rows].any():
            raise RuntimeError(
                f'step() of environments {(np.flatnonzero(done[rows]) + rows.start).tolist()} '
                'whose episode ended (or never started): reset them first')
        if self._action_dtype.kind == 'f' and not np.isfinite(action).all():
            raise ValueError(f'action contains NaN or infinity: {action}')
        self._env.step_group_async(group, action)
        return np.int32(group)

    def _receive_numpy(self, group, token, done):
        del token, done  # Only order the call.
        if self._keep_thread_states:
            _keep_python_thread_state()
        observ, reward, terminated, truncated = self._env.step_group_wait(group)
        outcome = np.empty((len(reward), 3), np.float32)
        outcome[:, 0] = reward
        outcome[:, 1] = terminated
        outcome[:, 2] = truncated
        return self._check_observ(observ, 'step', len(reward)), outcome

    def _reset_numpy(self, indices, done):
        del done  # Only orders the call.
        if self._keep_thread_states:
            _keep_python_thread_state()
        if ((indices < 0) | (indices >= self._num_envs)).any():
            raise ValueError(
                f'reset indices must be in [0, {self._num_envs}), got {indices.tolist()}')
        mask = np.zeros(self._num_envs, np.bool_)
        mask[indices] = True
        if not mask.any():
            return np.zeros((self._num_envs,) + self._observ_shape, self._observ_dtype)
        seed, self._seed = self._seed, None
        if mask.all():
            observ, _ = self._env.reset(seed=seed)
        else:
            observ, _ = self._env.reset(seed=seed, options={'reset_mask': mask})
        return self._check_observ(observ, 'reset')

    def _check_observ(self, observ, method, num_envs=None):
        observ = np.asarray(observ)
        expected = (num_envs or self._num_envs,) + self._observ_shape
        if observ.shape != expected:
            raise ValueError(
                f'VectorEnv.{method} returned observations of shape {observ.shape}, expected '
                f'{expected} from the observation space')
        # A copy, because TF may keep using the buffer while the VectorEnv reuses it.
        return np.array(observ, self._observ_dtype, copy=True)
