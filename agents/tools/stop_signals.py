"""SIGTERM and SIGINT as a request to stop, seen at once even while Python cannot run.

Python runs a signal's handler in the main thread only, between two bytecodes. While the main
thread is inside a compiled TensorFlow call, that waits until the call returns: seconds for the
first call, which compiles, and forever when the call waits for an environment worker that
hangs. But the interpreter's C-level handler also writes the signal's number to the wakeup fd
(`signal.set_wakeup_fd`) at once, and here a watcher thread reads it there. On the first
signal the watcher logs it, records it in `signum` and calls the `on_stop` callbacks (e.g. to
end a wait for environment workers); a second signal ends the process at once, with exit
status 128 + the signal's number, as shells report a process killed by it. So does a process
that has not stopped `grace_s` seconds after the first (a compilation or a native call that
does not return): a preemption notice is 30 s, and a stop must come within it. `last_words`,
called then, tells what is kept (whatever the process saved stays as it was saved).

Until `deferred()` is entered, the first signal also raises `StopRequested` in the main
thread, for phases with nothing to save (building, tracing); within it, the main thread checks
`signum` where it can stop cleanly (e.g. after saving a checkpoint).
"""

import contextlib
import os
import signal
import socket
import sys
import threading
import time

from absl import logging

SIGNALS = (signal.SIGTERM, signal.SIGINT)


class StopRequested(BaseException):
    """A stop signal came while there was nothing to save. Like KeyboardInterrupt, not an
    Exception, so that handlers of errors let it through."""

    def __init__(self, signum):
        super().__init__(f'interrupted by {signal.Signals(signum).name}')
        self.signum = signum


class StopSignals:
    """Watches for SIGTERM and SIGINT while entered (in the main thread; elsewhere, e.g. in a
    test runner's thread, signals keep their usual effect and `signum` stays None)."""

    def __init__(self, grace_s=None, last_words=None):
        self.signum = None
        self.grace_s = grace_s
        self.received_at = None  # time.monotonic() of the first signal.
        self.last_words = last_words  # () -> a sentence, or None.
        self._count = 0
        self._callbacks = []
        self._lock = threading.Lock()
        self._deferred = 0
        self._raised = False
        self._active = False
        self._previous_handlers = {}
        self._previous_wakeup_fd = None
        self._sockets = None
        self._watcher = None

    @property
    def active(self):
        """Whether signals are watched (entered in the main thread)."""
        return self._active

    def __enter__(self):
        if threading.current_thread() is not threading.main_thread():
            return self
        reader, writer = socket.socketpair()
        reader.setblocking(True)
        writer.setblocking(False)
        self._sockets = reader, writer
        for signum in SIGNALS:
            self._previous_handlers[signum] = signal.signal(signum, self._handle)
        self._previous_wakeup_fd = signal.set_wakeup_fd(
            writer.fileno(), warn_on_full_buffer=False)
        self._watcher = threading.Thread(target=self._watch, name='stop-signals', daemon=True)
        self._watcher.start()
        self._active = True
        return self

    def __exit__(self, *unused_exc_info):
        if not self._active:
            return
        self._active = False
        signal.set_wakeup_fd(self._previous_wakeup_fd)
        for signum, handler in self._previous_handlers.items():
            signal.signal(signum, handler)
        self._previous_handlers = {}
        reader, writer = self._sockets
        writer.close()  # The watcher reads the end of the stream and returns.
        self._watcher.join()
        reader.close()

    def on_stop(self, callback):
        """Calls `callback(signum)` in the watcher thread when the first signal comes (at once
        if it came already); returns a function that unregisters it."""
        with self._lock:
            signum = self.signum
            if signum is None:
                self._callbacks.append(callback)
        if signum is not None:
            callback(signum)

        def unregister():
            with self._lock, contextlib.suppress(ValueError):
                self._callbacks.remove(callback)
        return unregister

    @contextlib.contextmanager
    def deferred(self):
        """Within, the first signal raises nothing: the main thread checks `signum`."""
        self._deferred += 1
        try:
            yield self
        finally:
            self._deferred -= 1

    def _handle(self, signum, frame):
        """The Python-level handler, run by the main thread when it runs Python."""
        del frame
        if not self._deferred and not self._raised:
            self._raised = True
            raise StopRequested(signum)

    def _watch(self):
        reader = self._sockets[0]
        while True:
            try:
                data = reader.recv(64)
            except OSError:
                return
            if not data:
                return
            for signum in data:
                if signum in SIGNALS:
                    self._received(signum)

    def _received(self, signum):
        name = signal.Signals(signum).name
        with self._lock:
            self._count += 1
            first = self._count == 1
            if first:
                self.signum = signum
                self.received_at = time.monotonic()
                callbacks = list(self._callbacks)
        if not first:
            logging.warning('Received %s again: stopping at once (exit %d); what was not saved '
                            'is lost.', name, 128 + signum)
            logging.flush()
            sys.stderr.flush()
            os._exit(128 + signum)
        if self._deferred:
            logging.warning('Received %s: stopping after the current step of work, with a '
                            'checkpoint (send it again to stop at once).', name)
        else:
            logging.warning('Received %s: stopping (send it again to stop at once).', name)
        if self.grace_s is not None:
            overdue = threading.Timer(self.grace_s, self._overdue, (signum,))
            overdue.daemon = True
            overdue.start()
        for callback in callbacks:
            try:
                callback(signum)
            except Exception:  # noqa: BLE001 - the stop goes on; the traceback is logged.
                logging.exception('A stop callback failed.')

    def _overdue(self, signum):
        """Ends a process that did not stop within `grace_s` of the first signal."""
        if not self._active:
            return
        words = ''
        if self.last_words is not None:
            try:
                words = self.last_words() or ''
            except Exception as error:  # noqa: BLE001 - the exit goes on.
                words = f'(what is kept could not be told: {error})'
        message = (f'still running {self.grace_s:g} s after {signal.Signals(signum).name}: '
                   f'stopping at once (exit {128 + signum}); the last complete save stays'
                   f'{"; " + words if words else ""}')
        logging.warning('%s', message)
        logging.flush()
        sys.stderr.write(f'stopped: {message}\n')
        sys.stderr.flush()
        os._exit(128 + signum)
