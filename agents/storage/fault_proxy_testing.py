"""A TCP proxy on loopback that injects network faults, for tests of storage outages.

Put between clients and a server (gcs_testing.GcsEmulator(faults=True) puts one in front of
fake-gcs-server), it forwards bytes both ways until told otherwise:

- `cut()`: closes every open connection (the clients see resets mid-request);
- `refuse()`: cuts, and closes the listening socket: new connections are refused;
- `stall()`: cuts, then accepts new connections and never answers them;
- `restore()`: forwards again, on the same port.
"""

import contextlib
import select
import socket
import threading

PASS, REFUSE, STALL = 'pass', 'refuse', 'stall'


class FaultProxy:
    """Forwards connections to 127.0.0.1:`target_port`, listening on `port` (0: a free one)."""

    def __init__(self, target_port, port=0):
        self.target_port = target_port
        self.mode = PASS
        self._lock = threading.Lock()
        self._connections = set()  # Sockets of open connections, both sides.
        self._listener = None
        self.port = port
        self._listen()

    @property
    def url(self):
        return f'http://127.0.0.1:{self.port}'

    def _listen(self):
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(('127.0.0.1', self.port))
        listener.listen(64)
        self.port = listener.getsockname()[1]
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True,
                         name='fault-proxy').start()

    def _accept(self, listener):
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # Closed by `refuse` or `close`.
            with self._lock:
                mode = self.mode
                self._connections.add(client)
            if mode == STALL:
                continue  # Held open, never answered, until cut or restored.
            try:
                server = socket.create_connection(('127.0.0.1', self.target_port), timeout=5)
            except OSError:
                self._close(client)
                continue
            with self._lock:
                self._connections.add(server)
            threading.Thread(target=self._forward, args=(client, server), daemon=True).start()

    def _forward(self, client, server):
        sockets = [client, server]
        try:
            while True:
                readable, _, _ = select.select(sockets, [], [], 1.0)
                if self.mode != PASS:
                    return
                for source in readable:
                    data = source.recv(65536)
                    if not data:
                        return
                    (server if source is client else client).sendall(data)
        except (OSError, ValueError):
            return
        finally:
            self._close(client)
            self._close(server)

    def _close(self, connection):
        with self._lock:
            self._connections.discard(connection)
        with contextlib.suppress(OSError):
            connection.shutdown(socket.SHUT_RDWR)
        connection.close()

    def cut(self):
        """Closes every open connection."""
        with self._lock:
            connections = list(self._connections)
        for connection in connections:
            self._close(connection)

    def _stop_listening(self):
        if self._listener is not None:
            # Shut down first: a close alone neither wakes the accepting thread nor stops the
            # socket listening while that thread waits in accept().
            with contextlib.suppress(OSError):
                self._listener.shutdown(socket.SHUT_RDWR)
            self._listener.close()
            self._listener = None

    def refuse(self):
        """Cuts, and refuses new connections."""
        self.mode = REFUSE
        self._stop_listening()
        self.cut()

    def stall(self):
        """Cuts, then accepts new connections and never answers them."""
        self.mode = STALL
        self.cut()
        if self._listener is None:
            self._listen()

    def restore(self):
        """Forwards new connections again (stalled ones are cut)."""
        self.cut()
        self.mode = PASS
        if self._listener is None:
            self._listen()

    def close(self):
        self.mode = REFUSE
        self._stop_listening()
        self.cut()
