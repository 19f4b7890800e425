"""Steps a group of Gymnasium environments into preallocated numpy buffers.

The same loop serves an in-process BatchEnv (one group holding every environment, buffers in
local memory) and each external worker (a slice of the environments, buffers in shared memory),
so both execution modes behave alike and match `gymnasium.vector.SyncVectorEnv`, whose autoreset
and info batching rules this module reproduces (InfoBatcher batches a group's infos, merge_infos
combines the groups').
"""

import dataclasses
import traceback

import gymnasium as gym
import numpy as np

AutoresetMode = gym.vector.AutoresetMode

# Spaces whose samples are single numpy arrays of a fixed shape and dtype, so a batch of them is
# one array that can live in shared memory.
ARRAY_SPACES = (
    gym.spaces.Box, gym.spaces.Discrete, gym.spaces.MultiDiscrete, gym.spaces.MultiBinary)

# Byte alignment of each array in a StepBuffers memory block (a cache line).
_ALIGNMENT = 64


class EnvError(RuntimeError):
    """An environment raised inside `make`, `reset`, `step` or another call.

    Attributes:
      env_index: index of the environment in the batch.
      method: name of the failing call.
    """

    def __init__(self, env_index, method, message):
        super().__init__(message)
        self.env_index = env_index
        self.method = method

    def __reduce__(self):
        return type(self), (self.env_index, self.method, self.args[0])


def env_error(env_index, method, error):
    """An EnvError about `error`, raised by env `env_index` in `method`.

    Its message holds the original traceback, as wrappers such as gin or tf.py_function may drop
    the exception's cause.
    """
    return EnvError(env_index, method, (
        f'Environment {env_index} failed in {method}: {type(error).__name__}: {error}\n\n'
        f'Original traceback:\n{format_traceback(error)}'))


def format_traceback(error):
    """The full traceback of `error` as text, to travel between processes."""
    return ''.join(traceback.format_exception(error))


def array_spec(space, what):
    """Shape and dtype of one sample of `space`; other than array spaces are rejected."""
    if not isinstance(space, ARRAY_SPACES):
        raise TypeError(
            f'BatchEnv supports {what} spaces of types '
            f'{[cls.__name__ for cls in ARRAY_SPACES]}, got {space!r}; flatten other spaces, '
            'e.g. with gymnasium.wrappers.FlattenObservation')
    return tuple(space.shape), np.dtype(space.dtype)


@dataclasses.dataclass(frozen=True)
class StepBuffers:
    """The arrays that one step reads (actions) and writes (everything else), one row per env."""

    actions: np.ndarray
    observations: np.ndarray
    rewards: np.ndarray
    terminations: np.ndarray
    truncations: np.ndarray

    @staticmethod
    def _layout(num_envs, observation_space, action_space):
        """(field, shape, dtype, byte offset) of every array, and the total bytes."""
        observation_shape, observation_dtype = array_spec(observation_space, 'observation')
        action_shape, action_dtype = array_spec(action_space, 'action')
        fields = [
            ('actions', (num_envs, *action_shape), action_dtype),
            ('observations', (num_envs, *observation_shape), observation_dtype),
            ('rewards', (num_envs,), np.dtype(np.float64)),
            ('terminations', (num_envs,), np.dtype(np.bool_)),
            ('truncations', (num_envs,), np.dtype(np.bool_)),
        ]
        layout, offset = [], 0
        for name, shape, dtype in fields:
            layout.append((name, shape, dtype, offset))
            size = int(np.prod(shape)) * dtype.itemsize
            offset += -(-size // _ALIGNMENT) * _ALIGNMENT
        return layout, offset

    @classmethod
    def nbytes(cls, num_envs, observation_space, action_space):
        """Size of the memory block that `create` needs."""
        return cls._layout(num_envs, observation_space, action_space)[1]

    @classmethod
    def create(cls, num_envs, observation_space, action_space, memory=None):
        """Zeroed buffers in fresh memory, or views into `memory` (e.g. a shared RawArray)."""
        layout, nbytes = cls._layout(num_envs, observation_space, action_space)
        if memory is None:
            memory = bytearray(nbytes)
        block = np.frombuffer(memory, np.uint8, nbytes)
        arrays = {}
        for name, shape, dtype, offset in layout:
            size = int(np.prod(shape)) * dtype.itemsize
            arrays[name] = block[offset:offset + size].view(dtype).reshape(shape)
        return cls(**arrays)

    def slice(self, start, stop):
        """Views of the rows of envs start..stop-1."""
        return StepBuffers(**{
            field.name: getattr(self, field.name)[start:stop]
            for field in dataclasses.fields(self)})


def _is_number(value):
    """Whether gymnasium batches `value` into a numeric array of its type."""
    return type(value) in (int, float, bool) or isinstance(value, np.number)


class InfoBatcher:
    """Batches the info dicts of a group of envs exactly like gymnasium's VectorEnv._add_info.

    When every env reports the same keys with numbers of the same types (MuJoCo's infos), the
    infos become one structured array, several times faster than adding them one by one, and
    cheap to send between processes. (Split into groups, arrays take the type of the group's
    first value rather than the batch's: only values of one key with different types in
    different envs could tell the difference.)
    """

    _add_info = gym.vector.VectorEnv._add_info

    def __init__(self, num_envs):
        self.num_envs = num_envs
        self._dtypes = {}  # (keys, types) -> structured dtype.

    def columns(self, events):
        """The infos of `events` as a structured array with a field per key, or None if they
        are not uniform numeric infos of every env in order."""
        if len(events) != self.num_envs:
            return None
        first = events[0][1]
        keys, types = tuple(first), tuple(map(type, first.values()))
        dtype = self._dtypes.get((keys, types))
        if dtype is None:
            if not (all(type(key) is str and key for key in first)
                    and all(map(_is_number, first.values()))):
                return None
            dtype = self._dtypes[keys, types] = np.dtype(list(zip(keys, types, strict=True)))
        rows = []
        for index, (row, info) in enumerate(events):
            values = tuple(info.values())
            if row != index or tuple(info) != keys or tuple(map(type, values)) != types:
                return None
            rows.append(values)
        return np.array(rows, dtype)

    def batch(self, events):
        """Batched infos of `events`, a list of (row, info) in the order gymnasium adds them."""
        columns = self.columns(events)
        if columns is not None:
            return columns_to_infos(columns)
        infos = {}
        for row, info in events:
            infos = self._add_info(infos, info, row)
        return infos


def columns_to_infos(columns):
    """Gymnasium's batched infos from InfoBatcher.columns: an array and a mask per key."""
    infos = {}
    mask = np.ones(len(columns), np.bool_)
    for key in columns.dtype.names:
        infos[key] = columns[key].copy()
        infos[f'_{key}'] = mask.copy()
    return infos


def merge_infos(batch_infos, group_infos, offset, num_envs):
    """Copies the batched infos of a group of envs into those of the batch, at row `offset`.

    The result equals what `VectorEnv._add_info` would have built from the single infos.
    """
    for key, value in group_infos.items():
        if isinstance(value, dict):
            merge_infos(batch_infos.setdefault(key, {}), value, offset, num_envs)
            continue
        target = batch_infos.get(key)
        if target is None:
            shape = (num_envs, *value.shape[1:])
            if value.dtype == object:
                target = np.full(shape, None, dtype=object)
            else:
                target = np.zeros(shape, dtype=value.dtype)
            batch_infos[key] = target
        target[offset:offset + len(value)] = value
    return batch_infos


def create_envs(env_fns, first_index=0, observation_space=None, action_space=None):
    """Calls every factory; EnvError names the env that fails or whose spaces differ.

    The spaces must equal the given ones, or else those of the first env. On failure, the envs
    made so far are closed.
    """
    envs = []
    try:
        for row, env_fn in enumerate(env_fns):
            index = first_index + row
            try:
                env = env_fn()
            except Exception as error:
                raise env_error(index, 'make', error) from error
            envs.append(env)
            if observation_space is None:
                observation_space, action_space = env.observation_space, env.action_space
            for what, space, reference in (
                    ('observation', env.observation_space, observation_space),
                    ('action', env.action_space, action_space)):
                if space != reference:
                    raise EnvError(index, 'make', (
                        f'Environment {index} has {what} space {space}, which differs from '
                        f'{reference} of the batch; all envs of a batch need equal spaces'))
    except BaseException:
        for env in envs:
            env.close()
        raise
    return envs


class EnvGroup:
    """Environments that step together into the rows of a StepBuffers.

    `step` reads each env's action from `buffers.actions` and writes its observation, reward and
    flags; `reset` and `step` return the infos for InfoBatcher (with `collect_infos` False, only
    SAME_STEP's final_obs / final_info). Autoreset follows `autoreset_mode` exactly like
    SyncVectorEnv. Exceptions of the environments come out as EnvError naming the env's index
    in the batch (`first_index` + row).
    """

    def __init__(self, envs, buffers, autoreset_mode, collect_infos=True, first_index=0):
        self._envs = list(envs)
        self._buffers = buffers
        self._autoreset_mode = AutoresetMode(autoreset_mode)
        self._collect_infos = collect_infos
        self._first_index = first_index
        self._num_envs = len(self._envs)
        if buffers.actions.shape[0] != self._num_envs:
            raise ValueError(
                f'buffers hold {buffers.actions.shape[0]} rows for {self._num_envs} envs')
        # Rows of a 2+-d action buffer are views that stay valid; 1-d rows are read per step.
        self._action_rows = list(buffers.actions) if buffers.actions.ndim > 1 else None
        self._autoreset = [False] * self._num_envs

    @property
    def envs(self):
        return tuple(self._envs)

    def _fail(self, row, method, error):
        return env_error(self._first_index + row, method, error)

    def reset(self, seeds=None, options=None, rows=None):
        """Resets the envs in `rows` (all by default) with per-env `seeds` (None or a list).

        Returns the (row, info) pairs for InfoBatcher, in the order SyncVectorEnv adds them.
        """
        observations = self._buffers.observations
        events = []
        rows = range(self._num_envs) if rows is None else rows
        row = 0
        try:
            for row in rows:
                observation, info = self._envs[row].reset(
                    seed=None if seeds is None else seeds[row], options=options)
                observations[row] = observation
                self._autoreset[row] = False
                if info and self._collect_infos:
                    events.append((row, info))
        except Exception as error:
            raise self._fail(row, 'reset', error) from error
        self._buffers.terminations[rows] = False
        self._buffers.truncations[rows] = False
        return events

    def step(self):
        """Steps every env with its row of `buffers.actions`.

        Returns the (row, info) pairs for InfoBatcher, in the order SyncVectorEnv adds them.
        """
        envs = self._envs
        actions = self._action_rows or list(self._buffers.actions)
        observations = self._buffers.observations
        rewards = [0.0] * self._num_envs
        terminations = [False] * self._num_envs
        truncations = [False] * self._num_envs
        collect_infos = self._collect_infos
        events = []  # (row, info) to batch, in the order SyncVectorEnv adds them.
        row, method = 0, 'step'
        try:
            if self._autoreset_mode == AutoresetMode.NEXT_STEP:
                autoreset = self._autoreset
                for row, env in enumerate(envs):
                    if autoreset[row]:
                        method = 'reset'
                        observation, info = env.reset()
                        method = 'step'
                    else:
                        (observation, rewards[row], terminations[row], truncations[row],
                         info) = env.step(actions[row])
                    observations[row] = observation
                    if info and collect_infos:
                        events.append((row, info))
            elif self._autoreset_mode == AutoresetMode.SAME_STEP:
                for row, env in enumerate(envs):
                    (observation, rewards[row], terminations[row], truncations[row],
                     info) = env.step(actions[row])
                    if terminations[row] or truncations[row]:
                        events.append((row, {'final_obs': observation, 'final_info': info}))
                        method = 'reset'
                        observation, info = env.reset()
                        method = 'step'
                    observations[row] = observation
                    if info and collect_infos:
                        events.append((row, info))
            else:
                for row, env in enumerate(envs):
                    (observation, rewards[row], terminations[row], truncations[row],
                     info) = env.step(actions[row])
                    observations[row] = observation
                    if info and collect_infos:
                        events.append((row, info))
        except Exception as error:
            raise self._fail(row, method, error) from error
        self._buffers.rewards[:] = rewards
        self._buffers.terminations[:] = terminations
        self._buffers.truncations[:] = truncations
        self._autoreset = [
            bool(terminated or truncated)
            for terminated, truncated in zip(terminations, truncations, strict=True)]
        return events

    def call(self, name, args=(), kwargs=None):
        """`env.get_wrapper_attr(name)` of every env, called with the arguments if callable."""
        results = []
        for row, env in enumerate(self._envs):
            try:
                attribute = env.get_wrapper_attr(name)
                results.append(attribute(*args, **(kwargs or {})) if callable(attribute)
                               else attribute)
            except Exception as error:
                raise self._fail(row, name, error) from error
        return results

    def set_attr(self, name, values):
        """Sets attribute `name` of env row i to `values[i]`."""
        for row, (env, value) in enumerate(zip(self._envs, values, strict=True)):
            try:
                env.set_wrapper_attr(name, value)
            except Exception as error:
                raise self._fail(row, f'set_attr({name!r})', error) from error

    def close(self):
        """Closes every env, even if some raise; re-raises the first failure."""
        first_error = None
        for row, env in enumerate(self._envs):
            try:
                env.close()
            except Exception as error:
                first_error = first_error or self._fail(row, 'close', error)
        self._envs = []
        if first_error:
            raise first_error
