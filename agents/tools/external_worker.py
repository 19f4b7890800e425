"""Worker processes that each host several environments of a BatchEnv.

Every worker runs an EnvGroup on its rows of StepBuffers that live in shared memory. Parent and
worker talk through two pipes, read and written with plain `os.read` / `os.write`: per step, a
5-byte command and a 4-byte reply, longer only when there is something to say (reset arguments,
infos, errors, call results travel as pickles). A worker hosts several envs, so the inter-process
cost is paid once per worker per step, not once per env, and the parent sends all commands before
it waits for any reply, so the learner can work while envs simulate. With `host_in_caller`, the
calling process steps the first slice of envs itself while it waits for the workers: on few
cores, no core then idles while the parent waits, and one process fewer must be woken per step.
Where the caller and the workers have a core each, they poll for each other's messages a little
before they sleep (AdaptiveSpin), as waking a process costs more than a short step.

Workers start with forkserver or spawn (plain fork is unsafe once TensorFlow runs threads in the
parent) and never import the parent's `__main__` (it may import TensorFlow): env factories travel
with cloudpickle instead. A dead worker is noticed as soon as its pipe or process sentinel
closes, and within a liveness period otherwise; one that does not answer within the caller's
timeout is killed; every worker is reaped on `close`, on garbage collection and at interpreter
exit, and dies with the pool's process even when that is killed (see `_die_with_parent`). Another
thread may end a wait at any time (`cancel_wait`), e.g. to honour a signal promptly.
"""

import contextlib
import ctypes
import multiprocessing
import multiprocessing.forkserver
import os
import pickle
import select
import signal
import struct
import sys
import threading
import time
import weakref

import cloudpickle
import numpy as np
import psutil

from agents.tools import env_group

# Commands from the parent; RESET, CALL and SET_ATTR carry a pickle of their arguments.
STEP, RESET, CALL, SET_ATTR, CLOSE = b's', b'r', b'c', b'a', b'q'
# Reply meaning "done, nothing to report"; other replies are pickled (ok, payload) pairs.
EMPTY_REPLY = b''
# Frames on the pipes: a command byte and the body's length, or just the length for replies.
_COMMAND_HEADER = struct.Struct('=cI')
_REPLY_HEADER = struct.Struct('=I')

START_METHODS = ('forkserver', 'spawn')
# Host index of the envs that the calling process hosts itself (see WorkerPool).
CALLER = 0
# Seconds between checks that workers are alive while waiting for replies. Deaths usually show
# at once through the closed pipe; this bounds detection when they do not.
_LIVENESS_PERIOD = 0.25
# Seconds to wait for a worker to exit after SIGTERM before SIGKILL.
_TERMINATE_GRACE = 1.0


class WorkerDiedError(RuntimeError):
    """A worker process died or stopped answering; the envs it hosted are lost."""


class WorkerHungError(WorkerDiedError, multiprocessing.TimeoutError):
    """Workers did not answer within the pool's timeout and were killed."""


class WaitCancelled(RuntimeError):
    """`WorkerPool.cancel_wait` ended a wait (e.g. the process was asked to stop); the hosts
    that had not answered still owe their replies."""


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
    """Batched infos with numeric arrays as (dtype, shape, bytes), which pickle faster
    (measured; benchmarks/README.md)."""
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
        return 'columns', _descr(columns.dtype), columns.tobytes()
    return 'infos', pack_infos(batcher.batch(events))


_descrs = {}  # Structured dtype -> its descr as a tuple (dtype.descr takes microseconds).
_dtypes = {}  # The inverse.


def _descr(dtype):
    descr = _descrs.get(dtype)
    if descr is None:
        descr = _descrs[dtype] = tuple(dtype.descr)
    return descr


def _columns(descr, data):
    dtype = _dtypes.get(descr)
    if dtype is None:
        dtype = _dtypes[descr] = np.dtype(list(descr))
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


def _write_all(fd, data):
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _read_exactly(fd, size):
    """`size` bytes from `fd`; EOFError if the writer closed it first."""
    data = os.read(fd, size) if size else b''
    while len(data) < size:
        chunk = os.read(fd, size - len(data))
        if not chunk:
            raise EOFError(f'pipe closed after {len(data)} of {size} bytes')
        data += chunk
    return data


def _read_reply(fd):
    (size,) = _REPLY_HEADER.unpack(_read_exactly(fd, _REPLY_HEADER.size))
    return _read_exactly(fd, size)


class AdaptiveSpin:
    """How long to poll for a message before sleeping until it comes.

    Polling saves waking the waiting process, which costs tens of microseconds and, on a
    virtual machine whose other CPU is idle, up to hundreds; but it burns a core, and when the
    machine is busy it takes the core from the very process that should answer. So a waiter
    polls up to `limit` seconds, and after polling in vain it sleeps right away for the next 1,
    2, 4... up to MAX_BACKOFF waits: polling goes on while it pays, as in a loop of quick steps
    on a quiet machine, and costs little CPU where it does not.
    """

    MAX_BACKOFF = 64

    def __init__(self, limit):
        self.limit = limit
        self._backoff = 1  # Waits to sleep at once after the next vain poll.
        self._skips = 0  # Waits left to sleep at once.

    def deadline(self, start):
        """When to stop polling for a wait that began at `start` (time.monotonic())."""
        if self._skips:
            return start
        return start + self.limit

    def record(self, start):
        """Notes that the wait that began at `start` is over."""
        if self._skips:
            self._skips -= 1
        elif time.monotonic() - start < self.limit:
            self._backoff = 1
        else:
            self._skips = self._backoff
            self._backoff = min(2 * self._backoff, self.MAX_BACKOFF)


def _poll(poller, spin_until, sleep_until=None):
    """Ready (fd, event) pairs of `poller`: polls without sleeping until `spin_until`, then
    sleeps until an fd is ready or `sleep_until` (None: no limit) passes."""
    while time.monotonic() < spin_until:
        events = poller.poll(0)
        if events:
            return events
    if sleep_until is None:
        return poller.poll()
    return poller.poll(max(0.0, sleep_until - time.monotonic()) * 1000)


class EnvHost:
    """Carries out the parent's commands on an EnvGroup.

    Each worker process runs one, and so does the calling process for its own envs with
    `host_in_caller`, so that both behave alike down to the bytes of their replies.
    """

    def __init__(self, buffers, env_fns, first_index, observation_space, action_space,
                 autoreset_mode, collect_infos):
        """Makes the envs `first_index`.. of the batch, stepping in rows of `buffers`."""
        envs = env_group.create_envs(env_fns, first_index, observation_space, action_space)
        rows = buffers.slice(first_index, first_index + len(envs))
        self.group = env_group.EnvGroup(envs, rows, autoreset_mode, collect_infos, first_index)
        self._batcher = env_group.InfoBatcher(len(envs))

    def serve(self, command, body):
        """The reply to `command`: EMPTY_REPLY or a pickled (ok, payload), also for errors."""
        try:
            if command == STEP:
                result = pack_events(self._batcher, self.group.step())
            elif command == RESET:
                result = pack_events(self._batcher, self.group.reset(*pickle.loads(body)))
            elif command == CALL:
                result = self.group.call(*pickle.loads(body))
            elif command == SET_ATTR:
                result = self.group.set_attr(*pickle.loads(body))
            else:
                raise ValueError(f'unknown command {command!r}')
        except Exception as error:  # noqa: BLE001 - reported to the parent.
            return _error_reply(error)
        return pickle.dumps((True, result)) if result else EMPTY_REPLY


PR_SET_PDEATHSIG = 1


def _die_with_parent():
    """Has Linux SIGKILL this process when its parent ends, so that a worker never outlives the
    pool's process, not even when it hangs or is stopped (SIGSTOP) and that process is killed.

    A forkserver's worker is the child of the forkserver, which exits once no process holds
    the write end of its 'alive' pipe: the pool's process and, by inheritance, each worker. A
    worker lets go of its end, so the forkserver, and with it the worker, ends with the pool's
    process. Elsewhere than on Linux, nothing is done.
    """
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return
    forkserver = getattr(multiprocessing.forkserver, '_forkserver', None)
    alive_fd = getattr(forkserver, '_forkserver_alive_fd', None)
    if alive_fd is not None:  # Set in the children of a forkserver only.
        with contextlib.suppress(OSError):
            os.close(alive_fd)
        forkserver._forkserver_alive_fd = None
    parent = os.getppid()
    prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # The parent ended before the request took effect.
        os._exit(1)


def _worker_main(commands, replies, memory, num_envs, observation_space, action_space,
                 first_index, env_fns, autoreset_mode, collect_infos, spin_seconds,
                 die_with_parent):
    """Hosts envs from `first_index` on and serves the parent's commands until CLOSE."""
    # Ctrl-C reaches the whole process group; the parent decides when workers stop.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if die_with_parent:
        _die_with_parent()
    command_fd, reply_fd = commands.fileno(), replies.fileno()
    poller = select.poll()
    poller.register(command_fd, select.POLLIN)
    spin = AdaptiveSpin(spin_seconds)
    host = None
    try:
        try:
            buffers = env_group.StepBuffers.create(
                num_envs, observation_space, action_space, memory)
            host = EnvHost(buffers, env_fns.load(), first_index, observation_space,
                           action_space, autoreset_mode, collect_infos)
            reply = EMPTY_REPLY
        except Exception as error:  # noqa: BLE001 - reported to the parent.
            reply = _error_reply(error)
        while True:
            try:
                _write_all(reply_fd, _REPLY_HEADER.pack(len(reply)) + reply)
                if host is None:
                    return
                start = time.monotonic()
                _poll(poller, spin.deadline(start))
                spin.record(start)
                command, size = _COMMAND_HEADER.unpack(
                    _read_exactly(command_fd, _COMMAND_HEADER.size))
                body = _read_exactly(command_fd, size)
            except (EOFError, OSError):
                return  # The parent is gone.
            if command == CLOSE:
                return
            reply = host.serve(command, body)
    finally:
        if host is not None:
            try:
                host.group.close()
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


def _shutdown(creator_pid, processes, command_conns, reply_conns, caller_hosts, wakeup_fds,
              timeout, terminate=False, hung=()):
    """Stops and reaps the workers (CLOSE, then SIGTERM after `timeout` s, then SIGKILL; the
    hosts in `hung` get SIGKILL at once) and closes the envs of the calling process."""
    if os.getpid() != creator_pid:
        return  # A forked copy of the parent does not own the workers.
    for host in hung:
        processes[host].kill()  # Also ends a stopped process, which SIGTERM would not.
    if not terminate:
        for conn in command_conns.values():
            with contextlib.suppress(OSError):
                _write_all(conn.fileno(), _COMMAND_HEADER.pack(CLOSE, 0))
        deadline = time.monotonic() + timeout
        for process in processes.values():
            process.join(max(0.0, deadline - time.monotonic()))
    for process in processes.values():
        if process.is_alive():
            process.terminate()
    for process in processes.values():
        process.join(_TERMINATE_GRACE)
        if process.is_alive():
            process.kill()
            process.join()
    for conn in [*command_conns.values(), *reply_conns.values()]:
        conn.close()
    while wakeup_fds:
        os.close(wakeup_fds.pop())
    while caller_hosts:
        caller_hosts.pop().group.close()


def _process_state(pid):
    """' (it was stopped)' when process `pid` is stopped (e.g. by SIGSTOP), else ''."""
    try:
        status = psutil.Process(pid).status()
    except psutil.Error:  # Gone, or not readable.
        return ''
    stopped = status in (psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP)
    return ' (it was stopped)' if stopped else ''


def _check_pool_arguments(num_envs, num_workers, start_method, host_in_caller, spin_seconds):
    """Raises a ValueError naming the first argument a worker pool cannot start with."""
    if start_method not in START_METHODS:
        raise ValueError(
            f'start_method must be one of {START_METHODS} (plain fork is unsafe with '
            f'TensorFlow), got {start_method!r}')
    if num_workers < 1 or num_workers + bool(host_in_caller) > num_envs:
        raise ValueError(
            f'num_workers must be in [1, {num_envs - bool(host_in_caller)}] for {num_envs} '
            f'envs{" with host_in_caller" if host_in_caller else ""}, got {num_workers}')
    if spin_seconds < 0:
        raise ValueError(f'spin_seconds must be >= 0, got {spin_seconds}')

class WorkerPool:
    """Hosts contiguous slices of a batch of envs in worker processes, with shared buffers.

    Each slice has a host index; with `host_in_caller`, host CALLER (0) is the calling process,
    which steps its slice when `wait` is called, while the workers step theirs.

    Attributes:
      buffers: StepBuffers of the whole batch, in memory shared with the workers.
      env_slices: (first, stop) env indices of each host.
    """

    def __init__(self, env_fns, observation_space, action_space, num_workers, autoreset_mode,
                 collect_infos, start_method='forkserver', close_timeout=5.0,
                 host_in_caller=False, spin_seconds=0.0, start_timeout=None):
        """Starts `num_workers` workers (plus the caller's share with `host_in_caller`).

        `spin_seconds` limits how long `wait` and the workers poll for messages before they
        sleep (see AdaptiveSpin): worth it when the workers and the caller have a core each.
        Workers that have not made their envs within `start_timeout` seconds (None: no limit)
        are deemed hung (WorkerHungError). Workers die with the process that started them
        (when a forkserver started them, or the main thread; see `_die_with_parent`).
        """
        _check_pool_arguments(len(env_fns), num_workers, start_method, host_in_caller,
                              spin_seconds)
        num_envs = len(env_fns)
        self._host_in_caller = bool(host_in_caller)
        num_hosts = num_workers + self._host_in_caller
        context = multiprocessing.get_context(start_method)
        if start_method == 'forkserver':
            # Workers fork from a server that has already imported what they need.
            context.set_forkserver_preload(['numpy', 'gymnasium', __name__])
        self._memory = context.RawArray(
            ctypes.c_uint8, env_group.StepBuffers.nbytes(num_envs, observation_space,
                                                         action_space))
        self.buffers = env_group.StepBuffers.create(
            num_envs, observation_space, action_space, self._memory)
        bounds = np.linspace(0, num_envs, num_hosts + 1).round().astype(int).tolist()
        self.env_slices = list(zip(bounds[:-1], bounds[1:], strict=True))
        self._spin = AdaptiveSpin(spin_seconds)
        self._processes = {}  # Host -> worker process.
        self._command_conns = {}  # Host -> writing end of the pipe carrying its commands.
        self._reply_conns = {}  # Host -> reading end of the pipe carrying its replies.
        self._caller_hosts = []  # The EnvHost of the calling process, if any.
        self._caller_command = None  # (command, body) for the caller's envs, run by `wait`.
        self._closed = False
        self._death = None  # Why the pool was closed, if not by `close`.
        self._pending = set()  # Hosts that owe a reply.
        self._replies = {}  # Replies received so far from pending hosts.
        self._exited = set()  # Hosts whose worker was seen exiting while not pending.
        self._waiting_since = None  # time.monotonic() when the current wait began.
        # `cancel_wait` writes to this pipe, which every wait polls, and gives its reason.
        self._wakeup_fds = list(os.pipe())
        os.set_blocking(self._wakeup_fds[1], False)
        self._cancel_reason = None
        self._cancel_lock = threading.Lock()
        self._finalizer = weakref.finalize(
            self, _shutdown, os.getpid(), self._processes, self._command_conns,
            self._reply_conns, self._caller_hosts, self._wakeup_fds, close_timeout)
        try:
            first_worker = int(self._host_in_caller)
            self._start(context, env_fns, first_worker, observation_space, action_space,
                        autoreset_mode, collect_infos, spin_seconds,
                        die_with_parent=start_method == 'forkserver'
                        or threading.current_thread() is threading.main_thread())
            self._register_polling()
            if host_in_caller:  # While the workers make their envs.
                _, stop = self.env_slices[CALLER]
                self._caller_hosts.append(EnvHost(
                    self.buffers, env_fns[:stop], 0, observation_space, action_space,
                    autoreset_mode, collect_infos))
            self._pending.update(self._processes)
            for host, reply in self.wait(start_timeout, what='start').items():
                if reply:
                    raise_error_reply(pickle.loads(reply)[1], self.describe(host))
        except BaseException:
            self.close(terminate=True)
            raise


    def _register_polling(self):
        """Polls the wake-up pipe and each worker's replies and process sentinel."""
        self._poller = select.poll()
        self._poller.register(self._wakeup_fds[0], select.POLLIN)
        self._fd_owners = {}  # fd -> (host, whether it is the process sentinel).
        for host, process in self._processes.items():
            for fd, is_sentinel in ((self._reply_conns[host].fileno(), False),
                                    (process.sentinel, True)):
                self._poller.register(fd, select.POLLIN)
                self._fd_owners[fd] = (host, is_sentinel)
    def _start(self, context, env_fns, first_worker, observation_space, action_space,
               autoreset_mode, collect_infos, spin_seconds, die_with_parent):
        with _main_module_hidden():
            for host in range(first_worker, len(self.env_slices)):
                start, stop = self.env_slices[host]
                command_reader, command_writer = context.Pipe(duplex=False)
                reply_reader, reply_writer = context.Pipe(duplex=False)
                self._command_conns[host] = command_writer
                self._reply_conns[host] = reply_reader
                process = context.Process(
                    target=_worker_main, name=f'BatchEnvWorker-{host}', daemon=True,
                    args=(command_reader, reply_writer, self._memory, len(env_fns),
                          observation_space, action_space, start,
                          _CloudPickled(list(env_fns[start:stop])), autoreset_mode,
                          collect_infos, spin_seconds, die_with_parent))
                try:
                    process.start()
                except (pickle.PicklingError, TypeError, AttributeError) as error:
                    raise TypeError(
                        f'Could not send the factories of envs {start}..{stop - 1} to a worker '
                        f'process; they must be picklable with cloudpickle: {error}') from error
                finally:
                    command_reader.close()
                    reply_writer.close()
                self._processes[host] = process

    @property
    def num_workers(self):
        """Number of worker processes."""
        return len(self._processes)

    @property
    def num_hosts(self):
        """Number of env slices: the workers, and the caller if it hosts envs."""
        return len(self.env_slices)

    @property
    def pids(self):
        return tuple(process.pid for process in self._processes.values())

    def describe(self, host):
        """E.g. 'worker process 1 (pid 123) hosting envs [4, 5, 6, 7]'."""
        start, stop = self.env_slices[host]
        envs = f'hosting envs {list(range(start, stop))}'
        if host == CALLER and self._host_in_caller:
            return f'calling process (pid {os.getpid()}) {envs}'
        process = self._processes.get(host)
        return f'worker process {host} (pid {process and process.pid}) {envs}'

    def hosts_of(self, env_indices):
        """Indices of the hosts of any of `env_indices` (sorted ints)."""
        starts = np.array([start for start, _ in self.env_slices])
        return sorted(set(np.searchsorted(starts, env_indices, side='right') - 1))

    def send(self, host, command, body=b''):
        """Sends `command` with `body` to `host`, which will answer one reply for `wait`."""
        self.check_open()
        if host == CALLER and self._host_in_caller:  # Served by `wait`.
            self._caller_command = (command, body)
        else:
            if host in self._exited:
                self._died(host)
            try:
                _write_all(self._command_conns[host].fileno(),
                           _COMMAND_HEADER.pack(command, len(body)) + body)
            except OSError:
                self._died(host)
        self._pending.add(host)

    def send_all(self, command, body=b''):
        """Sends `command` to every host."""
        for host in range(self.num_hosts):
            self.send(host, command, body)

    def wait(self, timeout=None, what=None):
        """{host: reply bytes} of every host sent a command since the last full wait.

        First serves the caller's command, if any. When the workers take over `timeout` seconds
        more: with `what` (the command waited for, for the message), the hosts that did not
        answer are deemed hung, killed, and WorkerHungError raised (after closing the pool);
        without, multiprocessing.TimeoutError is raised and a later wait resumes. Raises
        WorkerDiedError (after closing the pool) when a worker dies, and WaitCancelled (a later
        wait resumes) after `cancel_wait`.
        """
        self.check_open()
        pending, replies = self._pending, self._replies
        if self._caller_command is not None:
            command, self._caller_command = self._caller_command, None
            pending.discard(CALLER)
            replies[CALLER] = self._caller_hosts[0].serve(*command)
        start = time.monotonic()
        deadline = None if timeout is None else start + timeout
        spin_until = self._spin.deadline(start)
        if deadline is not None:
            spin_until = min(spin_until, deadline)
        self._waiting_since = start
        try:
            while pending:
                sleep_until = time.monotonic() + _LIVENESS_PERIOD
                if deadline is not None:
                    sleep_until = min(sleep_until, deadline)
                events = _poll(self._poller, spin_until, sleep_until)
                if not events:
                    for host, process in self._processes.items():
                        if not process.is_alive():
                            self._died(host)
                    if deadline is not None and time.monotonic() >= deadline:
                        if what is not None:
                            self._hung(what, timeout)
                        raise multiprocessing.TimeoutError(
                            f'workers {sorted(pending)} did not answer within {timeout} s')
                    continue
                self._read_replies(events)
        finally:
            self._waiting_since = None
        self._spin.record(start)
        self._replies = {}
        return replies

    def _read_replies(self, events):
        """Reads the replies that `events` (of the poller) announce; notes exits and deaths."""
        pending, replies = self._pending, self._replies
        if any(fd == self._wakeup_fds[0] for fd, _ in events):
            self._take_cancellation()
        # Replies first: a worker may reply and exit at once (after failing to start).
        events.sort(key=lambda event: self._fd_owners[event[0]][1])
        for fd, _ in events:
            host, is_sentinel = self._fd_owners[fd]
            if host not in pending:
                # It exited or closed its pipe after replying: fail when next used.
                self._poller.unregister(fd)
                self._exited.add(host)
                continue
            reply_conn = self._reply_conns[host]
            if is_sentinel and not reply_conn.poll(0):
                self._died(host)
            try:
                replies[host] = _read_reply(reply_conn.fileno())
            except (EOFError, OSError):
                self._died(host)
            pending.discard(host)

    def cancel_wait(self, reason):
        """Ends the current wait, or the next one, with WaitCancelled(reason); any thread may
        call it (e.g. a signal's watcher while the waiting thread is in a compiled call)."""
        with self._cancel_lock:
            if self._closed:
                return
            self._cancel_reason = reason
            with contextlib.suppress(BlockingIOError):  # A wakeup is pending already.
                os.write(self._wakeup_fds[1], b'!')

    def _take_cancellation(self):
        with self._cancel_lock:
            with contextlib.suppress(BlockingIOError):
                os.read(self._wakeup_fds[0], 4096)
            reason, self._cancel_reason = self._cancel_reason, None
        raise WaitCancelled(reason)

    def waiting(self):
        """(seconds, descriptions of the workers that owe a reply) of the wait going on, or
        None; for progress reports from other threads."""
        since = self._waiting_since
        try:
            hosts = sorted(tuple(self._pending))
        except RuntimeError:  # The waiting thread changed the set meanwhile.
            return None
        if since is None or not hosts:
            return None
        return time.monotonic() - since, [self.describe(host) for host in hosts]

    def _hung(self, what, timeout):
        """Kills the workers that owe a reply, closes the pool, raises WorkerHungError."""
        hosts = sorted(self._pending)
        described = ' and '.join(
            self.describe(host) + _process_state(self._processes[host].pid) for host in hosts)
        self.close(terminate=True, hung=hosts)
        self._death = (f'BatchEnv {described} did not answer {what} within {timeout} s and '
                       f'{"was" if len(hosts) == 1 else "were"} killed; the batch is closed, '
                       'create a new one.')
        raise WorkerHungError(self._death)

    def _died(self, host):
        """Closes the pool and raises WorkerDiedError about the worker of `host`."""
        description = self.describe(host)
        process = self._processes[host]
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

    def close(self, terminate=False, hung=()):
        """Stops and reaps every worker; with `terminate`, without waiting for them to finish;
        the hosts in `hung` are killed at once."""
        with self._cancel_lock:
            self._closed = True
        state = self._finalizer.detach()
        if state:
            _, function, args, _ = state
            function(*args, terminate=terminate, hung=hung)
