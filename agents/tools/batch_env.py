"""A batch of Gymnasium environments behind one vectorized step, in-process or in workers.

BatchEnv implements the `gymnasium.vector.VectorEnv` API of Gymnasium 1.x, so Gymnasium's vector
wrappers work on it, and given the same envs, seeds and actions it returns exactly what
`gymnasium.vector.SyncVectorEnv` returns, in every autoreset mode. It adds what training needs:

- mode='external' steps the envs in worker processes that each host several envs and exchange
  data through shared memory, with non-blocking `step_async` / `step_wait`, so simulation runs
  on all cores while the learner works (the `ExternalProcess` idea of the original batch-ppo);
- mode='hybrid' is external mode where the caller steps the first slice of envs itself while it
  waits for the workers: on few cores, no core idles and fewer processes must be woken per step;
- mode='in_process' steps them in a loop in the caller, for cheap envs or debugging;
- vectorised checks that reject bad actions before any env is stepped;
- errors of envs and dead workers raised in the caller, naming the env, with its traceback;
  a worker that does not answer within `timeout` (a minute by default) is killed and raised
  about like a dead one, and workers die with the process that made them.
"""

import functools
import numbers
import os
import pickle

import gin
import gymnasium as gym
import numpy as np

from agents.tools import env_group, external_worker

AutoresetMode = gym.vector.AutoresetMode
EnvError = env_group.EnvError
WorkerDiedError = external_worker.WorkerDiedError
WorkerHungError = external_worker.WorkerHungError
WaitCancelled = external_worker.WaitCancelled

MODES = ('external', 'hybrid', 'in_process')
# Default spin_seconds when the caller and every worker can have a core of their own: longer
# than the caller and the workers usually wait for each other within a rollout.
SPIN_SECONDS = 0.001
# Default timeout: seconds a worker may take to answer before it is deemed hung. Slow healthy
# work (a step of several rendering or MuJoCo envs, a reset that loads assets) takes well
# under a second, so a minute only ever trips on a worker that hangs or was stopped.
TIMEOUT = 60.0


def make_env(env_id, env_kwargs=None, wrappers=()):
    """`gymnasium.make(env_id, **env_kwargs)` wrapped by each of `wrappers` in turn.

    A module-level function, so `functools.partial(make_env, ...)` pickles by reference.
    """
    env = gym.make(env_id, **(env_kwargs or {}))
    for wrapper in wrappers:
        env = wrapper(env)
    return env


def parse_autoreset_mode(mode):
    """An AutoresetMode from itself, its value ('NextStep') or its name ('NEXT_STEP')."""
    if isinstance(mode, AutoresetMode):
        return mode
    if isinstance(mode, str):
        try:
            return AutoresetMode(mode)
        except ValueError:
            if mode.upper() in AutoresetMode.__members__:
                return AutoresetMode[mode.upper()]
    raise ValueError(
        f'autoreset_mode must be one of {list(AutoresetMode)} or their names, got {mode!r}')


def _available_cores():
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # Not on Linux.
        return os.cpu_count() or 1


def _num_workers(num_workers, mode, num_envs):
    """Checked `num_workers`, by default one per core but the caller's in hybrid mode, and at
    most one per env (a worker fewer in hybrid mode, where the caller hosts envs too)."""
    hybrid = mode == 'hybrid'
    if num_workers is None:
        num_workers = max(1, _available_cores() - hybrid)
    if not isinstance(num_workers, numbers.Integral) or num_workers < 1:
        raise ValueError(f'num_workers must be a positive int, got {num_workers!r}')
    if hybrid and num_envs < 2:
        raise ValueError('hybrid mode needs at least 2 envs, one for the caller and one for a '
                         f'worker; got {num_envs}')
    return min(int(num_workers), num_envs - hybrid)


def _env_factory(env_fn, index):
    if isinstance(env_fn, str):
        return functools.partial(gym.make, env_fn)
    if not callable(env_fn):
        raise TypeError(
            f'env_fns[{index}] must be an env id or a callable that returns an env, '
            f'got {env_fn!r}')
    return env_fn


def env_seeds(seed, num_envs, unseeded=True):
    """One seed per env of an int (env i gets `seed` + i) or a list of `num_envs` ints (or None,
    an env left unseeded, where `unseeded`), as BatchEnv and EnvPoolBatchEnv take them."""
    if isinstance(seed, numbers.Integral) and not isinstance(seed, bool):
        return [int(seed) + index for index in range(num_envs)]
    if isinstance(seed, (str, bytes)) or not hasattr(seed, '__len__'):
        raise TypeError(f'seed must be None, an int or a list of ints, got {seed!r}')
    if len(seed) != num_envs:
        raise ValueError(f'a list of seeds needs one per env ({num_envs}), got {len(seed)}')
    for value in seed:
        if not ((value is None and unseeded) or (isinstance(value, numbers.Integral)
                                                 and not isinstance(value, bool))):
            kinds = 'ints or None' if unseeded else 'ints'
            raise TypeError(f'seeds must be {kinds}, got {value!r} in {seed!r}')
    return [None if value is None else int(value) for value in seed]


def check_reset_mask(mask, num_envs):
    """`options['reset_mask']` of a reset, checked as Gymnasium's vector envs check it."""
    if not isinstance(mask, np.ndarray):
        raise TypeError(f"options['reset_mask'] must be a numpy array, got {type(mask)}")
    if mask.shape != (num_envs,):
        raise ValueError(
            f"options['reset_mask'] must have shape ({num_envs},), got {mask.shape}")
    if mask.dtype != np.bool_:
        raise TypeError(f"options['reset_mask'] must have dtype bool, got {mask.dtype}")
    if not mask.any():
        raise ValueError(f"options['reset_mask'] must have a True value, got {mask}")
    return mask


def check_step_allowed(name, pending, needs_reset, ended):
    """Raises unless a batch env `name` may start a step: no call `pending`, no full reset
    needed (at the start and after a failure), no episode `ended` (a mask, with autoreset
    disabled; None otherwise) left without its reset."""
    if pending:
        raise gym.error.AlreadyPendingCallError(
            'step_async called twice without step_wait', pending)
    if needs_reset:
        raise RuntimeError(f'{name} needs a full reset() before stepping: at the start and '
                           'after an environment failed')
    # count_nonzero: cheaper than ended.any() on a small array, on every step.
    if ended is not None and np.count_nonzero(ended):
        raise RuntimeError(
            f'envs {np.flatnonzero(ended).tolist()} finished their episodes and autoreset is '
            'disabled: reset them with reset(options={"reset_mask": mask}) before stepping; '
            f'{NOTHING_STEPPED}')


# How a refusal of a step ends when the envs were left as they were.
NOTHING_STEPPED = 'nothing was stepped'


class ActionChecker:
    """Vectorised validation of a batch of actions against the single action space.

    `ActionChecker(space, num_envs)(actions)` returns `actions` as an array, or raises before
    anything is stepped: ValueError for a shape other than (num_envs, *space.shape), for NaN
    and for values outside the space (a Discrete's n values from its start, a Box's bounds);
    TypeError for a dtype of another kind (e.g. floats for a Discrete space). BatchEnv and
    envpool_env.EnvPoolBatchEnv check every step with it. Spaces: Box, Discrete,
    MultiDiscrete, MultiBinary.

    The two halves are also apart: `checked_form` (shape and dtype) and `check_values` (NaN
    and bounds), which EnvPoolBatchEnv runs on Box actions while EnvPool steps.
    """

    def __init__(self, space, num_envs):
        self._space = space
        self._shape = (num_envs, *space.shape)
        self._dtype = np.dtype(space.dtype)
        if isinstance(space, gym.spaces.Box):
            low, high = space.low, space.high
        elif isinstance(space, gym.spaces.Discrete):
            low, high = space.start, space.start + space.n - 1
        elif isinstance(space, gym.spaces.MultiDiscrete):
            low, high = space.start, space.start + space.nvec - 1
        else:  # MultiBinary
            low, high = 0, 1
        # Bounds of the batch's shape compare faster than bounds that broadcast.
        self._low = np.broadcast_to(low, self._shape).copy()
        self._high = np.broadcast_to(high, self._shape).copy()
        if self._dtype.kind == 'f':
            self._kinds = 'fiu'
        elif isinstance(space, gym.spaces.MultiBinary):
            self._kinds = 'biu'
        else:
            self._kinds = 'iu'

    def __call__(self, actions):
        """Returns `actions` as an array, or raises naming the first bad env and its action."""
        actions = self.checked_form(actions)
        self.check_values(actions)
        return actions

    def checked_form(self, actions):
        """Returns `actions` as an array, or raises if its shape or its dtype's kind is wrong."""
        actions = np.asarray(actions)
        if actions.shape != self._shape:
            raise ValueError(
                f'actions must have shape {self._shape} (num_envs, *single_action_space.shape) '
                f'for {self._space}, got shape {actions.shape}; {NOTHING_STEPPED}')
        if actions.dtype.kind not in self._kinds:
            raise TypeError(
                f'actions of dtype {actions.dtype} do not fit action space {self._space} '
                f'of dtype {self._dtype}; {NOTHING_STEPPED}')
        return actions

    def check_values(self, actions, consequence=NOTHING_STEPPED):
        """Raises ValueError naming the first env whose action (of `checked_form`) is NaN or
        outside the space, and all bad envs; the message ends with `consequence`."""
        within = (actions >= self._low) & (actions <= self._high)  # False for NaN too.
        if np.count_nonzero(within) == within.size:  # Cheaper than within.all(), every step.
            return
        bad_envs = np.flatnonzero(~within.reshape(len(actions), -1).all(axis=1))
        first = bad_envs[0]
        value = actions[first]
        problem = ('is NaN' if actions.dtype.kind == 'f' and np.isnan(value).any()
                   else f'is outside the action space {self._space}')
        others = (f' (bad actions also for envs {bad_envs[1:].tolist()})'
                  if len(bad_envs) > 1 else '')
        raise ValueError(f'The action for env {first}, {value!r}, {problem}{others}; {consequence}')


# Arguments of BatchEnv that gin refuses to bind: the code that makes a BatchEnv passes them
# (the trainer from train.env_mode and train.num_workers, `make_batch_env` from its own
# arguments), and an explicit argument would silently win over a binding. Adding a name here
# breaks restoring runs whose operative_config.gin lists it (gin refuses those lines too).
NOT_GIN_BINDABLE = ('env_fns', 'mode', 'num_workers', 'autoreset_mode', 'copy', 'collect_infos')


@gin.configurable(denylist=NOT_GIN_BINDABLE)
class BatchEnv(gym.vector.VectorEnv):
    """A batch of Gymnasium environments that step together, in-process or in worker processes.

    Observations, rewards, terminations, truncations and infos equal those of
    `gymnasium.vector.SyncVectorEnv` for the same env factories, seeds and actions (actions are
    cast to the action space's dtype first). Spaces must be Box, Discrete, MultiDiscrete or
    MultiBinary. A full `reset()` is needed before stepping, and again after an env raised.

    Gin binds `timeout`, `close_timeout`, `spin_seconds` and `start_method`; binding one of
    `NOT_GIN_BINDABLE` is an error when the config is parsed (`train.env_mode` and
    `train.num_workers` set the trainer's mode and workers, `make_batch_env.mode` etc. those of
    `make_batch_env`). `process_env.ProcessEnv` passes its own `start_method`.
    """

    def __init__(self, env_fns, mode='external', num_workers=None,
                 autoreset_mode=AutoresetMode.NEXT_STEP, copy=True, collect_infos=True,
                 start_method='forkserver', close_timeout=5.0, timeout=TIMEOUT,
                 spin_seconds=None):
        """Creates the envs.

        Args:
          env_fns: env ids or callables returning envs, one per env; external mode pickles
            them with cloudpickle, e.g. `functools.partial(gymnasium.make, id, **kwargs)`.
          mode: 'external' (worker processes), 'hybrid' (worker processes and the caller) or
            'in_process'.
          num_workers: worker processes in external and hybrid mode; default one per available
            core, less one for the caller in hybrid mode (at most one per env). Each hosts a
            contiguous slice of the envs; in hybrid mode the caller hosts the first slice and
            steps it in `step_wait`.
          autoreset_mode: a gymnasium AutoresetMode (or its value or name). With DISABLED,
            reset finished envs with `reset(options={'reset_mask': mask})` before stepping.
          copy: return fresh arrays; otherwise `step` and `reset` return internal buffers that
            the next call overwrites.
          collect_infos: batch the envs' info dicts into the returned infos as gymnasium does;
            False skips that work (infos then only hold SAME_STEP's final_obs / final_info).
          start_method: 'forkserver' or 'spawn', for worker processes.
          close_timeout: seconds `close` waits for workers to exit before terminating them.
          timeout: seconds that workers may take to start, and to answer `step`, `reset`,
            `call` and `set_attr`; workers that miss it are deemed hung: they are killed, the
            batch is closed and WorkerHungError (a WorkerDiedError and a
            multiprocessing.TimeoutError) names them. None waits as long as they live.
          spin_seconds: how long the caller and the workers may poll for each other's
            messages before they sleep until one comes; they poll only while answers come that
            quickly. Polling saves waking a sleeping process, which is dear on virtual machines,
            but burns a core, so it pays only when the caller and every worker have a core
            each. Default: SPIN_SECONDS then (as in hybrid mode with the default num_workers),
            else 0 (as in external mode with the default num_workers).
        """
        super().__init__()
        if isinstance(env_fns, str) or not hasattr(env_fns, '__len__') or not len(env_fns):
            raise ValueError(f'env_fns must be a non-empty sequence, got {env_fns!r}')
        if mode not in MODES:
            raise ValueError(f'mode must be one of {MODES}, got {mode!r}')
        if spin_seconds is not None and not (
                isinstance(spin_seconds, numbers.Real) and spin_seconds >= 0):
            raise ValueError(f'spin_seconds must be None or >= 0, got {spin_seconds!r}')
        if timeout is not None and not (
                isinstance(timeout, numbers.Real) and not isinstance(timeout, bool)
                and timeout > 0):
            raise ValueError(f'timeout must be None or a number of seconds > 0, got {timeout!r}')
        env_fns = [_env_factory(env_fn, index) for index, env_fn in enumerate(env_fns)]
        self.num_envs = len(env_fns)
        self.mode = mode
        self.autoreset_mode = parse_autoreset_mode(autoreset_mode)
        self.copy = copy
        self._timeout = timeout
        self._group = None
        self._pool = None
        self._pending = None  # 'step' between step_async and step_wait.
        self._needs_reset = True
        self._ended = np.zeros(self.num_envs, bool)  # Finished envs, tracked when DISABLED.

        if mode == 'in_process':
            envs = env_group.create_envs(env_fns)
            self._set_spaces(envs[0])
            self._buffers = env_group.StepBuffers.create(
                self.num_envs, self.single_observation_space, self.single_action_space)
            self._group = env_group.EnvGroup(
                envs, self._buffers, self.autoreset_mode, collect_infos)
            self._info_batcher = env_group.InfoBatcher(self.num_envs)
            first_env = envs[0]
        else:
            num_workers = _num_workers(num_workers, mode, self.num_envs)
            if spin_seconds is None:
                spin_seconds = SPIN_SECONDS if num_workers < _available_cores() else 0.0
            # Like AsyncVectorEnv, a throwaway env tells the spaces before workers start.
            first_env = env_group.create_envs(env_fns[:1])[0]
            try:
                self._set_spaces(first_env)
            finally:
                first_env.close()
            self._pool = external_worker.WorkerPool(
                env_fns, self.single_observation_space, self.single_action_space,
                num_workers, self.autoreset_mode, collect_infos, start_method, close_timeout,
                host_in_caller=mode == 'hybrid', spin_seconds=spin_seconds,
                start_timeout=timeout)
            self._buffers = self._pool.buffers
        self.metadata = dict(first_env.metadata)
        self.metadata['autoreset_mode'] = self.autoreset_mode
        self.render_mode = first_env.render_mode
        self._check_actions = ActionChecker(self.single_action_space, self.num_envs)

    def _set_spaces(self, env):
        env_group.array_spec(env.observation_space, 'observation')
        env_group.array_spec(env.action_space, 'action')
        self.single_observation_space = env.observation_space
        self.single_action_space = env.action_space
        self.observation_space = gym.vector.utils.batch_space(
            self.single_observation_space, self.num_envs)
        self.action_space = gym.vector.utils.batch_space(
            self.single_action_space, self.num_envs)

    @property
    def worker_pids(self):
        """Process ids of the workers (empty in-process)."""
        return self._pool.pids if self._pool is not None else ()

    @property
    def num_workers(self):
        return self._pool.num_workers if self._pool is not None else 0

    def _check_running(self):
        if self.closed:
            raise gym.error.ClosedEnvironmentError('the BatchEnv was closed')
        if self._pool is not None:
            self._pool.check_open()

    def reset(self, *, seed=None, options=None):
        """Resets all envs, or those in `options['reset_mask']` (a bool array), like gymnasium.

        `seed` is None, an int (env i gets seed + i) or a list of ints or None, one per env.
        The other options go to every reset env. Returns (observations, infos).
        """
        self._check_running()
        if self._pending:
            raise gym.error.AlreadyPendingCallError(
                'reset while a step_async awaits its step_wait', self._pending)
        seeds = self._seeds(seed)
        options, mask = self._split_reset_mask(options)
        rows = None if mask is None else np.flatnonzero(mask)
        if self._group is not None:
            try:
                infos = self._info_batcher.batch(self._group.reset(seeds, options, rows))
            except EnvError:
                self._needs_reset = True
                raise
        else:
            infos = self._reset_workers(seeds, options, rows)
        if mask is None:
            self._needs_reset = False
            self._ended[:] = False
        else:
            self._ended[mask] = False
        return self._output(self._buffers.observations), infos

    def _reset_workers(self, seeds, options, rows):
        pool = self._pool
        hosts = range(pool.num_hosts) if rows is None else pool.hosts_of(rows)
        for host in hosts:
            start, stop = pool.env_slices[host]
            host_seeds = None if seeds is None else seeds[start:stop]
            host_rows = None if rows is None else [
                int(row) - start for row in rows if start <= row < stop]
            pool.send(host, external_worker.RESET, pickle.dumps((host_seeds, options, host_rows)))
        return self._merged_infos(self._wait_for_workers('reset'))

    def _wait_for_workers(self, what):
        """The workers' replies to `what`; kills them if they take over `timeout` seconds."""
        return self._pool.wait(self._timeout, what=what)

    def _decode(self, replies):
        """{host: payload or None} of the hosts' replies; after reading them all, raises the
        error of the first failed host."""
        payloads, failure = {}, None
        for host in sorted(replies):
            reply = replies[host]
            if not reply:
                payloads[host] = None
                continue
            ok, payload = pickle.loads(reply)
            payloads[host] = payload
            if not ok and failure is None:
                failure = (payload, self._pool.describe(host))
        if failure:
            external_worker.raise_error_reply(*failure)
        return payloads

    def _merged_infos(self, replies):
        """The batch's infos from the workers' replies to a step or reset."""
        try:
            payloads = self._decode(replies)
        except EnvError:
            self._needs_reset = True
            raise
        worker_infos = [(self._pool.env_slices[host][0], payload)
                        for host, payload in payloads.items() if payload]
        if not worker_infos:
            return {}
        return external_worker.merge_worker_infos(worker_infos, self.num_envs)

    def _seeds(self, seed):
        return None if seed is None else env_seeds(seed, self.num_envs)

    def _split_reset_mask(self, options):
        """(options without 'reset_mask', the mask or None), checking the mask like gymnasium."""
        if options is None or 'reset_mask' not in options:
            return options, None
        options = dict(options)
        mask = check_reset_mask(options.pop('reset_mask'), self.num_envs)
        return options, mask

    def step(self, actions):
        """Steps every env with its row of `actions`; returns (obs, rewards, terminations,
        truncations, infos)."""
        self.step_async(actions)
        return self.step_wait()

    def step_async(self, actions):
        """Checks `actions` and starts stepping; in external and hybrid mode it returns at
        once (hybrid mode steps the caller's envs in `step_wait`)."""
        self._check_running()
        check_step_allowed(
            'BatchEnv', self._pending, self._needs_reset,
            self._ended if self.autoreset_mode == AutoresetMode.DISABLED else None)
        np.copyto(self._buffers.actions, self._check_actions(actions), casting='unsafe')
        if self._pool is not None:
            self._pool.send_all(external_worker.STEP)
        self._pending = 'step'

    def step_wait(self, timeout=None):
        """Waits for the step started by `step_async` and returns its results.

        In external and hybrid mode, with `timeout`, raises multiprocessing.TimeoutError when
        the workers take over `timeout` seconds more than the caller's envs; the step stays
        pending, so a later `step_wait` can collect it. Without, workers that take over the
        constructor's `timeout` are deemed hung (WorkerHungError). After `cancel_wait`, raises
        WaitCancelled; the step stays pending.
        """
        self._check_running()
        if self._pending != 'step':
            raise gym.error.NoAsyncCallError('step_wait without step_async', 'step')
        if self._group is not None:
            self._pending = None
            try:
                infos = self._info_batcher.batch(self._group.step())
            except EnvError:
                self._needs_reset = True
                raise
        else:
            if timeout is None:
                replies = self._wait_for_workers('step')
            else:
                replies = self._pool.wait(timeout)
            self._pending = None
            infos = self._merged_infos(replies)
        buffers = self._buffers
        if self.autoreset_mode == AutoresetMode.DISABLED:
            np.logical_or(buffers.terminations, buffers.truncations, out=self._ended)
        return (self._output(buffers.observations), self._output(buffers.rewards),
                self._output(buffers.terminations), self._output(buffers.truncations), infos)

    def _output(self, array):
        return array.copy() if self.copy else array

    def cancel_wait(self, reason):
        """Ends the wait for workers going on (or the next one) with WaitCancelled(reason);
        callable from any thread, e.g. to stop promptly on a signal while a step waits for a
        hung worker. In-process, there is no wait to end and nothing happens."""
        if self._pool is not None:
            self._pool.cancel_wait(reason)

    def waiting(self):
        """(seconds, descriptions of the workers) of a wait for workers going on, or None."""
        return self._pool.waiting() if self._pool is not None else None

    def call(self, name, *args, **kwargs):
        """Calls method `name` of every env (or reads the attribute); returns a tuple."""
        self._check_running()
        if self._pending:
            raise gym.error.AlreadyPendingCallError('call while a step is pending', 'step')
        if self._group is not None:
            return tuple(self._group.call(name, args, kwargs))
        self._pool.send_all(external_worker.CALL, pickle.dumps((name, args, kwargs)))
        payloads = self._decode(self._wait_for_workers(f'call({name!r})'))
        return tuple(result for host in sorted(payloads) for result in payloads[host])

    def get_attr(self, name):
        """Attribute `name` of every env, as a tuple."""
        return self.call(name)

    def set_attr(self, name, values):
        """Sets attribute `name` of every env; a list or tuple gives one value per env."""
        self._check_running()
        if self._pending:
            raise gym.error.AlreadyPendingCallError('set_attr while a step is pending', 'step')
        if not isinstance(values, (list, tuple)):
            values = [values] * self.num_envs
        if len(values) != self.num_envs:
            raise ValueError(
                f'set_attr needs one value per env ({self.num_envs}), got {len(values)}')
        if self._group is not None:
            self._group.set_attr(name, values)
            return
        for host, (start, stop) in enumerate(self._pool.env_slices):
            self._pool.send(host, external_worker.SET_ATTR, pickle.dumps(
                (name, list(values[start:stop]))))
        self._decode(self._wait_for_workers(f'set_attr({name!r})'))

    def render(self):
        """Frames of every env, as a tuple."""
        return self.call('render')

    def close_extras(self, terminate=False):
        """Closes the envs and reaps the workers (at once with `terminate`)."""
        if self._pool is not None:
            self._pool.close(terminate=terminate)
        if self._group is not None:
            self._group.close()

    def __repr__(self):
        workers = f', num_workers={self.num_workers}' if self._pool is not None else ''
        return f'BatchEnv(num_envs={self.num_envs}, mode={self.mode!r}{workers})'


@gin.configurable
def make_batch_env(env_id, num_envs, mode='external', num_workers=None,
                   autoreset_mode=AutoresetMode.NEXT_STEP, env_kwargs=None, wrappers=(),
                   **batch_env_kwargs):
    """A BatchEnv of `num_envs` copies of `gymnasium.make(env_id, **env_kwargs)`.

    `wrappers` are applied to each env in order (e.g. gymnasium.wrappers.ClipAction); the
    other arguments go to BatchEnv, so configs pick the execution mode with one binding.
    """
    if not isinstance(num_envs, numbers.Integral) or num_envs < 1:
        raise ValueError(f'num_envs must be a positive int, got {num_envs!r}')
    env_fn = functools.partial(make_env, env_id, dict(env_kwargs or {}), tuple(wrappers))
    return BatchEnv([env_fn] * int(num_envs), mode=mode, num_workers=num_workers,
                    autoreset_mode=autoreset_mode, **batch_env_kwargs)
