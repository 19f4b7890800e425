"""Tests of the fault-injecting proxy in front of fake-gcs-server: each fault does what it says,
and `restore` brings the bucket back on the same address."""

import contextlib
import socket
import urllib.error
import urllib.request

from absl.testing import absltest

from agents.storage import gcs_testing


class FaultProxyTest(absltest.TestCase):

    def setUp(self):
        super().setUp()
        self.emulator = self.enter_context(gcs_testing.GcsEmulator(buckets=('runs',),
                                                                   faults=True))
        self.buckets_url = f'{self.emulator.url}/storage/v1/b'

    def get(self, timeout=5.0):
        with urllib.request.urlopen(self.buckets_url, timeout=timeout) as response:
            return response.status

    def test_passes_requests_and_the_client_library_works_through_it(self):
        from google.auth.credentials import AnonymousCredentials
        from google.cloud import storage
        self.assertEqual(self.get(), 200)
        # STORAGE_EMULATOR_HOST names the proxy; emulator.client() goes around it.
        through_proxy = storage.Client(project='test', credentials=AnonymousCredentials())
        self.assertEqual(through_proxy.api_endpoint, self.emulator.faults.url)
        through_proxy.bucket('runs').blob('a').upload_from_string(b'x')
        self.assertEqual(self.emulator.objects('runs'), {'a': b'x'})

    def test_refuse_then_restore(self):
        self.emulator.faults.refuse()
        with self.assertRaises(ConnectionRefusedError):
            socket.create_connection(('127.0.0.1', self.emulator.faults.port), timeout=2)
        self.emulator.faults.restore()
        self.assertEqual(self.get(), 200)

    def test_stall_accepts_and_never_answers(self):
        self.emulator.faults.stall()
        with self.assertRaises((TimeoutError, socket.timeout, urllib.error.URLError)):
            self.get(timeout=0.5)
        self.emulator.faults.restore()
        self.assertEqual(self.get(), 200)

    def test_cut_closes_open_connections(self):
        connection = socket.create_connection(('127.0.0.1', self.emulator.faults.port),
                                              timeout=2)
        self.addCleanup(connection.close)
        connection.sendall(b'GET /storage/v1/b HTTP/1.1\r\nHost: x\r\n\r\n')
        connection.settimeout(0.5)
        answer = b''
        with contextlib.suppress(socket.timeout):
            while True:  # The whole answer; the connection is kept alive after it.
                answer += connection.recv(4096)
        self.assertIn(b'200', answer)
        self.emulator.faults.cut()
        connection.settimeout(2)
        try:
            data = connection.recv(100)
        except ConnectionResetError:
            data = b''
        self.assertEqual(data, b'')  # Closed by the proxy.
        self.assertEqual(self.get(), 200)  # New connections pass.


if __name__ == '__main__':
    absltest.main()
