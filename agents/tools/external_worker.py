"""Worker processes that each host several environments of a BatchEnv.

Every worker runs an EnvGroup on its rows of StepBuffers that live in shared memory. Parent and
workers exchange tiny messages over pipes: one command byte per step and an empty reply, or a
pickle when there is something to say (infos, errors, call results). A worker hosts several envs,
so the inter-process cost is paid once per worker per step, not once per env, and the parent
sends all commands before it waits for any reply, so the learner can work while envs simulate.

Workers start with forkserver or spawn (plain fork is unsafe once TensorFlow runs threads in the
parent) and never import the parent's `__main__` (it may import TensorFlow): env factories travel
with cloudpickle instead. A dead worker is noticed as soon as its pipe or process sentinel
closes, and within a liveness period otherwise; every worker is reaped on `close`, on garbage
collection and at interpreter exit.
"""

import contextlib
import ctypes
import multiprocessing
import os
import pickle
import select
import signal
import struct
import sys
import time
import weakref

import cloudpickle
import numpy as np

from agents.tools import env_group

# One-byte commands from the parent; RESET, CALL and SET_ATTR carry a pickle after the byte.
STEP, RESET, CALL, SET_ATTR, CLOSE = b's', b'r', b'c', b'a', b'q'
# Reply meaning "done, nothing to report"; other replies are pickled (ok, payload) pairs.
EMPTY_REPLY = b''

START_METHODS = ('forkserver', 'spawn')
# Seconds between checks that workers are alive while waiting for replies. Deaths usually show
# at once through the closed pipe; this bounds detection when they do not.
_LIVENESS_PERIOD = 0.25
# Seconds to wait for a worker to exit after SIGTERM before SIGKILL.
_TERMINATE_GRACE = 1.0


class WorkerDiedError(RuntimeError):
    """A worker process died or stopped answering; the envs it hosted are lost."""


class _CloudPickled:
    """Pickles its object with cloudpickle and unpickles it only on `load`.

    cloudpickle carries functions and classes of `__main__` by value, so workers need not
    import the parent's main module; loading late lets the worker report a failure to unpickle
    as an error instead of dying during start-up.
    """

    def __init__(self, obj):
        self._obj = obj

    def __getstate__(self):
        return cloudpickle.dumps(self._obj)

    def __setstate__(self, data):
        self._data = data

    def load(self):
        return cloudpickle.loads(self._data)


def pack_infos(infos):
    """Batched infos with numeric arrays as (dtype, shape, bytes), which pickle 4x faster."""
    return {
        key: pack_infos(value) if isinstance(value, dict)
        else value if value.dtype.hasobject else (value.dtype.str, value.shape, value.tobytes())
        for key, value in infos.items()}


def unpack_infos(packed):
    """Inverse of pack_infos (arrays come back read-only)."""
    return {
        key: unpack_infos(value) if isinstance(value, dict)
        else np.frombuffer(value[2], value[0]).reshape(value[1]) if isinstance(value, tuple)
        else value
        for key, value in packed.items()}


def pack_events(batcher, events):
    """A worker's infos for the parent: None, ('columns', dtype descr, bytes) for uniform numeric
    infos (see InfoBatcher.columns), else ('infos', packed batched infos)."""
    if not events:
        return None
    columns = batcher.columns(events)
    if columns is not None:
        return 'columns', columns.dtype.descr, columns.tobytes()
    return 'infos', pack_infos(batcher.batch(events))


_dtypes = {}  # Structured dtypes by their descr, as tuples.


def _columns(descr, data):
    key = tuple(descr)
    dtype = _dtypes.get(key)
    if dtype is None:
        dtype = _dtypes[key] = np.dtype(descr)
    return np.frombuffer(data, dtype)


def merge_worker_infos(worker_infos, num_envs):
    """The batch's infos from `pack_events` of workers, as (first env, payload) in env order.

    When every worker sent columns of the same keys and types, they are simply joined.
    """
    descr = worker_infos[0][1][1]
    if all(payload[0] == 'columns' and payload[1] == descr for _, payload in worker_infos):
        columns = _columns(descr, b''.join(payload[2] for _, payload in worker_infos))
        if len(columns) == num_envs:  # Every worker reported (columns cover whole groups).
            return env_group.columns_to_infos(columns)
    infos = {}
    for start, payload in worker_infos:
        group_infos = (env_group.columns_to_infos(_columns(payload[1], payload[2]))
                       if payload[0] == 'columns' else unpack_infos(payload[1]))
        env_group.merge_infos(infos, group_infos, start, num_envs)
    return infos


def _error_reply(error):
    """The pickled reply that reports `error` (an EnvError or any other exception)."""
    if isinstance(error, env_group.EnvError):
        index, method, message, cause = error.env_index, error.method, str(error), error.__cause__
    else:
        index, method, cause = None, None, error
        message = (f'{type(error).__name__}: {error}\n\n'
                   f'Original traceback:\n{env_group.format_traceback(error)}')
    try:
        cause = pickle.loads(pickle.dumps(cause))
    except Exception:  # noqa: BLE001 - unpicklable exceptions travel as text only.
        cause = None
    return pickle.dumps((False, (index, method, cause, message)))


def _worker_main(conn, memory, num_envs, observation_space, action_space, first_index,
                 stop_index, env_fns, autoreset_mode, collect_infos):
    """Hosts envs first_index..stop_index-1 and serves the parent's commands until CLOSE."""
    # Ctrl-C reaches the whole process group; the parent decides when workers stop.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    group = None
    try:
        try:
            buffers = env_group.StepBuffers.create(
                num_envs, observation_space, action_space, memory).slice(first_index, stop_index)
            envs = env_group.create_envs(
                env_fns.load(), first_index, observation_space, action_space)
            group = env_group.EnvGroup(envs, buffers, autoreset_mode, collect_infos, first_index)
            batcher = env_group.InfoBatcher(stop_index - first_index)
        except Exception as error:  # noqa: BLE001 - reported to the parent.
            conn.send_bytes(_error_reply(error))
            return
        conn.send_bytes(EMPTY_REPLY)
        while True:
            try:
                message = conn.recv_bytes()
            except (EOFError, OSError):
                return  # The parent is gone.
            command = message[:1]
            if command == CLOSE:
                return
            try:
                if command == STEP:
                    result = pack_events(batcher, group.step())
                elif command == RESET:
                    result = pack_events(batcher, group.reset(*pickle.loads(message[1:])))
                elif command == CALL:
                    result = group.call(*pickle.loads(message[1:]))
                elif command == SET_ATTR:
                    result = group.set_attr(*pickle.loads(message[1:]))
                else:
                    raise ValueError(f'unknown command {message[:20]!r}')
                reply = pickle.dumps((True, result)) if result else EMPTY_REPLY
            except Exception as error:  # noqa: BLE001 - reported to the parent.
                reply = _error_reply(error)
            conn.send_bytes(reply)
    finally:
        if group is not None:
            try:
                group.close()
            except env_group.EnvError as error:
                print(f'BatchEnv worker: {error}', file=sys.stderr)


def raise_error_reply(payload, where):
    """Re-raises an error that a worker reported, saying `where` it happened."""
    index, method, cause, message = payload
    message = f'{message}(raised in BatchEnv {where})'
    if index is None:
        raise RuntimeError(message) from cause
    raise env_group.EnvError(index, method, message) from cause


@contextlib.contextmanager
def _main_module_hidden():
    """Keeps multiprocessing from re-importing `__main__` in the workers it starts."""
    main = sys.modules.get('__main__')
    saved = {name: getattr(main, name) for name in ('__file__', '__spec__')
             if hasattr(main, name)}
    try:
        if main is not None:
            main.__spec__ = None
            if '__file__' in saved:
                del main.__file__
        yield
    finally:
        for name, value in saved.items():
            setattr(main, name, value)


def _exit_description(exitcode):
    if exitcode is None:
        return 'it stopped answering but is still running'
    if exitcode < 0:
        try:
            return f'killed by {signal.Signals(-exitcode).name}'
        except ValueError:
            return f'killed by signal {-exitcode}'
    return f'exit code {exitcode}'


def _shutdown(creator_pid, processes, connections, timeout, terminate=False):
    """Stops and reaps the workers: CLOSE, then SIGTERM after `timeout` s, then SIGKILL."""
    if os.getpid() != creator_pid:
        return  # A forked copy of the parent does not own the workers.
    if not terminate:
        for conn in connections:
            with contextlib.suppress(OSError):
                conn.send_bytes(CLOSE)
        deadline = time.monotonic() + timeout
        for process in processes:
            process.join(max(0.0, deadline - time.monotonic()))
    for process in processes:
        if process.is_alive():
            process.terminate()
    for process in processes:
        process.join(_TERMINATE_GRACE)
        if process.is_alive():
            process.kill()
            process.join()
    for conn in connections:
        conn.close()


class WorkerPool:
    """Worker processes hosting contiguous slices of a batch of envs, and their shared buffers.

    Attributes:
      buffers: StepBuffers of the whole batch, in memory shared with the workers.
      env_slices: (first, stop) env indices hosted by each worker.
    """

    def __init__(self, env_fns, observation_space, action_space, num_workers, autoreset_mode,
                 collect_infos, start_method='forkserver', close_timeout=5.0):
        if start_method not in START_METHODS:
            raise ValueError(
                f'start_method must be one of {START_METHODS} (plain fork is unsafe with '
                f'TensorFlow), got {start_method!r}')
        num_envs = len(env_fns)
        if not 1 <= num_workers <= num_envs:
            raise ValueError(f'num_workers must be in [1, {num_envs}], got {num_workers}')
        context = multiprocessing.get_context(start_method)
        if start_method == 'forkserver':
            # Workers fork from a server that has already imported what they need.
            context.set_forkserver_preload(['numpy', 'gymnasium', __name__])
        self._memory = context.RawArray(
            ctypes.c_uint8, env_group.StepBuffers.nbytes(num_envs, observation_space,
                                                         action_space))
        self.buffers = env_group.StepBuffers.create(
            num_envs, observation_space, action_space, self._memory)
        bounds = np.linspace(0, num_envs, num_workers + 1).round().astype(int).tolist()
        self.env_slices = list(zip(bounds[:-1], bounds[1:], strict=True))
        self.processes = []
        self.connections = []
        self._closed = False
        self._death = None  # Why the pool was closed, if not by `close`.
        self._pending = set()  # Workers that owe a reply.
        self._replies = {}  # Replies received so far from pending workers.
        self._exited = set()  # Workers seen exiting while not pending.
        self._finalizer = weakref.finalize(
            self, _shutdown, os.getpid(), self.processes, self.connections, close_timeout)
        try:
            self._start(context, env_fns, observation_space, action_space, autoreset_mode,
                        collect_infos)
            self._write_fds = [conn.fileno() for conn in self.connections]
            self._poller = select.poll()
            self._fd_owners = {}
            for worker, (process, conn) in enumerate(
                    zip(self.processes, self.connections, strict=True)):
                for fd, is_sentinel in ((conn.fileno(), False), (process.sentinel, True)):
                    self._poller.register(fd, select.POLLIN)
                    self._fd_owners[fd] = (worker, is_sentinel)
            self._pending.update(range(num_workers))
            for worker, reply in self.wait().items():
                if reply:
                    raise_error_reply(pickle.loads(reply)[1], self.describe(worker))
        except BaseException:
            self.close(terminate=True)
            raise

    def _start(self, context, env_fns, observation_space, action_space, autoreset_mode,
               collect_infos):
        with _main_module_hidden():
            for worker, (start, stop) in enumerate(self.env_slices):
                parent_conn, child_conn = context.Pipe()
                process = context.Process(
                    target=_worker_main, name=f'BatchEnvWorker-{worker}', daemon=True,
                    args=(child_conn, self._memory, len(env_fns), observation_space,
                          action_space, start, stop, _CloudPickled(list(env_fns[start:stop])),
                          autoreset_mode, collect_infos))
                try:
                    process.start()
                except (pickle.PicklingError, TypeError, AttributeError) as error:
                    parent_conn.close()
                    raise TypeError(
                        f'Could not send the factories of envs {start}..{stop - 1} to a worker '
                        f'process; they must be picklable with cloudpickle: {error}') from error
                finally:
                    child_conn.close()
                self.processes.append(process)
                self.connections.append(parent_conn)

    @property
    def num_workers(self):
        return len(self.env_slices)

    @property
    def pids(self):
        return tuple(process.pid for process in self.processes)

    def describe(self, worker):
        """E.g. 'worker process 1 (pid 123) hosting envs [4, 5, 6, 7]'."""
        start, stop = self.env_slices[worker]
        pid = self.processes[worker].pid if worker < len(self.processes) else None
        return f'worker process {worker} (pid {pid}) hosting envs {list(range(start, stop))}'

    def workers_of(self, env_indices):
        """Indices of the workers hosting any of `env_indices` (sorted ints)."""
        starts = np.array([start for start, _ in self.env_slices])
        return sorted(set(np.searchsorted(starts, env_indices, side='right') - 1))

    def send(self, worker, message):
        """Sends `message` to `worker`, which will answer one reply for `wait`."""
        self.check_open()
        if worker in self._exited:
            self._died(worker)
        # The framing of Connection.send_bytes, in one raw write: this is the per-step path.
        frame = struct.pack('!i', len(message)) + message
        try:
            view = memoryview(frame)
            while view:
                view = view[os.write(self._write_fds[worker], view):]
        except OSError:
            self._died(worker)
        self._pending.add(worker)

    def send_all(self, message):
        """Sends `message` to every worker."""
        for worker in range(len(self._write_fds)):
            self.send(worker, message)

    @property
    def waiting(self):
        return bool(self._pending)

    def wait(self, timeout=None):
        """{worker: reply bytes} of every worker sent a message since the last full wait.

        Raises multiprocessing.TimeoutError after `timeout` seconds (a later wait resumes), and
        WorkerDiedError (after closing the pool) when a worker dies.
        """
        self.check_open()
        pending, replies = self._pending, self._replies
        deadline = None if timeout is None else time.monotonic() + timeout
        while pending:
            wait_seconds = _LIVENESS_PERIOD
            if deadline is not None:
                wait_seconds = max(0.0, min(wait_seconds, deadline - time.monotonic()))
            events = self._poller.poll(wait_seconds * 1000)
            if not events:
                for worker, process in enumerate(self.processes):
                    if not process.is_alive():
                        self._died(worker)
                if deadline is not None and time.monotonic() >= deadline:
                    raise multiprocessing.TimeoutError(
                        f'workers {sorted(pending)} did not answer within {timeout} s')
                continue
            # Replies first: a worker may reply and exit at once (after failing to start).
            events.sort(key=lambda event: self._fd_owners[event[0]][1])
            for fd, _ in events:
                worker, is_sentinel = self._fd_owners[fd]
                if worker not in pending:
                    # It exited or closed its pipe after replying: fail when next used.
                    self._poller.unregister(fd)
                    self._exited.add(worker)
                    continue
                connection = self.connections[worker]
                if is_sentinel and not connection.poll(0):
                    self._died(worker)
                try:
                    replies[worker] = connection.recv_bytes()
                except (EOFError, OSError):
                    self._died(worker)
                pending.discard(worker)
        self._replies = {}
        return replies

    def _died(self, worker):
        """Closes the pool and raises WorkerDiedError about `worker`."""
        description = self.describe(worker)
        process = self.processes[worker]
        process.join(_LIVENESS_PERIOD)
        exitcode = process.exitcode
        self.close(terminate=True)
        self._death = (f'BatchEnv {description} died unexpectedly '
                       f'({_exit_description(exitcode)}); the batch is closed, create a new one.')
        raise WorkerDiedError(self._death)

    def check_open(self):
        """Raises WorkerDiedError if the pool was closed, saying why."""
        if self._closed:
            raise WorkerDiedError(
                self._death or 'the worker processes of this BatchEnv were closed')

    def abandon(self, reason):
        """Terminates the workers, e.g. when they hang; later uses raise WorkerDiedError(reason)."""
        self.close(terminate=True)
        self._death = reason

    def close(self, terminate=False):
        """Stops and reaps every worker; with `terminate`, without waiting for them to finish."""
        self._closed = True
        state = self._finalizer.detach()
        if state:
            _, function, args, _ = state
            function(*args, terminate=terminate)
