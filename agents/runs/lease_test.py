"""Tests of the lease on a gs:// run directory, against a GCS emulator."""

import json
import os
import socket
import subprocess
import sys
import threading
import time
from unittest import mock

from absl.testing import absltest

from agents.runs import lease as lease_lib
from agents.storage import gcs_testing

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
URL = 'gs://runs/run'
LEASE = 'run/.lease'
TTL_S = 2.0  # Of leases let expire.
# Of leases kept alive: renewed every second, seen renewed well before an acquirer's patience
# (a ttl) runs out, even on a loaded machine.
LIVE_TTL_S = 4.0


def on_another_host(ttl_s=TTL_S):
    """A Lease of URL as a trainer on another machine would hold it."""
    with mock.patch.object(lease_lib.socket, 'gethostname', return_value='machine-b'):
        return lease_lib.Lease(URL, ttl_s=ttl_s)


class LeaseTest(absltest.TestCase):

    def setUp(self):
        super().setUp()
        self.emulator = self.enter_context(gcs_testing.GcsEmulator(buckets=('runs',)))

    def holder(self):
        return json.loads(self.emulator.objects('runs', 'run/')[LEASE])

    def acquire(self, lease):
        lease.acquire()
        self.addCleanup(lease.release)
        return lease

    def test_acquire_creates_the_lease_and_release_deletes_it(self):
        lease = self.acquire(lease_lib.Lease(URL, ttl_s=TTL_S))
        holder = self.holder()
        self.assertEqual(holder['pid'], os.getpid())
        self.assertEqual(holder['host'], socket.gethostname())
        self.assertGreater(holder['expires'], time.time())
        lease.check()
        lease.release()
        self.assertEqual(self.emulator.objects('runs'), {})
        self.assertFalse(lease._thread.is_alive())
        lease.release()  # Twice is no error.

    def test_the_holder_renews_it(self):
        lease = self.acquire(lease_lib.Lease(URL, ttl_s=TTL_S))
        first = self.holder()
        time.sleep(TTL_S)
        renewed = self.holder()
        self.assertGreater(renewed['expires'], first['expires'])
        self.assertEqual(renewed['started'], first['started'])  # When it was taken.
        lease.check()

    def test_a_lease_renewed_by_another_trainer_is_refused(self):
        self.acquire(lease_lib.Lease(URL, ttl_s=LIVE_TTL_S))
        second = on_another_host(LIVE_TTL_S)
        start = time.time()
        with self.assertRaises(lease_lib.LeaseHeld) as raised:
            second.acquire()
        self.assertLess(time.time() - start, LIVE_TTL_S)  # Told at its first renewal seen.
        message = str(raised.exception)
        self.assertIn(f'pid {os.getpid()} on {socket.gethostname()}', message)
        self.assertIn('in use by another trainer', message)
        self.assertEqual(self.holder()['host'], socket.gethostname())
        second.release()  # Releasing a lease never held leaves the holder's alone.
        self.assertIn(LEASE, self.emulator.objects('runs'))

    def test_a_live_process_of_this_host_keeps_its_lease(self):
        # Another trainer on this machine, holding and renewing the lease.
        holder = subprocess.Popen(
            [sys.executable, '-c',
             'import sys; from agents.runs import lease; '
             f'held = lease.Lease({URL!r}, ttl_s={LIVE_TTL_S}).acquire(); '
             'print("held", flush=True);'
             ' sys.stdin.read(); held.release()'],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            env=dict(self.emulator.environment(), PYTHONPATH=ROOT))
        self.addCleanup(holder.wait, 30)
        self.addCleanup(holder.stdin.close)
        self.assertEqual(holder.stdout.readline().strip(), 'held')
        with self.assertRaises(lease_lib.LeaseHeld) as raised:
            lease_lib.Lease(URL, ttl_s=LIVE_TTL_S).acquire()
        self.assertIn(f'pid {holder.pid} on {socket.gethostname()}', str(raised.exception))

    def test_a_lease_no_longer_renewed_is_taken_over_after_its_ttl(self):
        first = self.acquire(lease_lib.Lease(URL, ttl_s=TTL_S))
        first._stop.set()  # Its trainer hangs: the lease stays, not renewed.
        first._thread.join()
        stopped = time.time()
        second = self.acquire(on_another_host())
        self.assertGreaterEqual(time.time() - stopped, TTL_S - 1.0)
        self.assertLess(time.time() - stopped, TTL_S + 5.0)
        self.assertEqual(self.holder()['host'], 'machine-b')
        second.check()
        # The first trainer, back, finds it lost.
        with self.assertRaises(lease_lib.LeaseHeld):
            first.renew()
        self.assertTrue(first.lost)
        with self.assertRaisesRegex(lease_lib.LeaseHeld, 'lost the lease on gs://runs/run'):
            first.check()
        first.release()  # Leaves the new holder's lease alone.
        self.assertEqual(self.holder()['host'], 'machine-b')

    def test_a_lease_of_a_dead_process_of_this_host_is_taken_over_at_once(self):
        dead = subprocess.Popen(['true'])
        dead.wait()
        self.emulator.client().bucket('runs').blob(LEASE).upload_from_string(json.dumps(
            {'pid': dead.pid, 'host': socket.gethostname(), 'expires': time.time() + 3600}))
        start = time.time()
        self.acquire(lease_lib.Lease(URL, ttl_s=60))
        self.assertLess(time.time() - start, 10.0)  # Not after a ttl.
        self.assertEqual(self.holder()['pid'], os.getpid())

    def test_a_lease_of_another_host_is_not_judged_by_its_pid(self):
        # Pid 1 of another machine says nothing of this one's: only renewals tell.
        dead = subprocess.Popen(['true'])
        dead.wait()
        self.emulator.client().bucket('runs').blob(LEASE).upload_from_string(json.dumps(
            {'pid': dead.pid, 'host': 'machine-b', 'expires': time.time() + 3600}))
        start = time.time()
        self.acquire(lease_lib.Lease(URL, ttl_s=TTL_S))  # Not renewed within ttl: taken over.
        self.assertGreaterEqual(time.time() - start, TTL_S - 0.5)
        self.assertEqual(self.holder()['pid'], os.getpid())

    def test_check_free_refuses_only_a_live_holder_of_this_host_and_writes_nothing(self):
        blob = self.emulator.client().bucket('runs').blob(LEASE)
        lease = lease_lib.Lease(URL, ttl_s=60)
        lease.check_free()  # No lease.
        live = subprocess.Popen(['sleep', '60'])
        self.addCleanup(live.wait)
        self.addCleanup(live.kill)
        dead = subprocess.Popen(['true'])
        dead.wait()
        future = time.time() + 3600
        for holder, refused in (
                ({'pid': live.pid, 'host': socket.gethostname(), 'expires': future}, True),
                ({'pid': live.pid, 'host': socket.gethostname(), 'expires': time.time() - 1},
                 False),  # Expired: taken over.
                ({'pid': dead.pid, 'host': socket.gethostname(), 'expires': future}, False),
                ({'pid': os.getpid(), 'host': socket.gethostname(), 'expires': future}, False),
                ({'pid': live.pid, 'host': 'machine-b', 'expires': future}, False),  # Waits.
                ('{not json', False)):
            with self.subTest(holder=holder):
                blob.upload_from_string(holder if isinstance(holder, str) else
                                        json.dumps(holder))
                before = self.emulator.objects('runs')
                if refused:
                    with self.assertRaises(lease_lib.LeaseHeld) as raised:
                        lease.check_free()
                    self.assertIn(f'pid {live.pid} on {socket.gethostname()}',
                                  str(raised.exception))
                else:
                    lease.check_free()
                self.assertEqual(self.emulator.objects('runs'), before)

    def test_an_unreadable_lease_is_taken_over(self):
        self.emulator.client().bucket('runs').blob(LEASE).upload_from_string(b'{not json')
        self.acquire(lease_lib.Lease(URL, ttl_s=60))
        self.assertEqual(self.holder()['pid'], os.getpid())

    def test_renewal_finds_the_lease_taken_over(self):
        lease = self.acquire(lease_lib.Lease(URL, ttl_s=TTL_S))
        # Another trainer overwrites it (as a takeover does).
        self.emulator.client().bucket('runs').blob(LEASE).upload_from_string(json.dumps(
            {'pid': 1, 'host': 'machine-b', 'expires': time.time() + 3600}))
        deadline = time.time() + 3 * TTL_S
        while not lease.lost and time.time() < deadline:
            time.sleep(0.1)
        self.assertTrue(lease.lost)
        with self.assertRaisesRegex(lease_lib.LeaseHeld, 'another trainer'):
            lease.check()
        lease.release()
        self.assertEqual(self.holder()['host'], 'machine-b')  # Not deleted: not ours.

    def test_a_failed_renewal_is_retried(self):
        from google.api_core import exceptions
        lease = self.acquire(lease_lib.Lease(URL, ttl_s=TTL_S))
        acquired = self.holder()['expires']
        fail = threading.Event()
        fail.set()
        renew = lease_lib.Lease.renew

        def flaky_renew(self):
            if fail.is_set():
                fail.clear()
                raise exceptions.ServiceUnavailable('try again')
            renew(self)

        with mock.patch.object(lease_lib.Lease, 'renew', flaky_renew):
            time.sleep(TTL_S)
        self.assertFalse(fail.is_set())
        self.assertIsNone(lease.lost)
        lease.check()
        self.assertGreater(self.holder()['expires'], acquired)  # Renewed after the failure.

    def test_a_lease_not_renewed_for_its_ttl_stays_held_until_another_takes_it(self):
        """An outage longer than the ttl loses nothing by itself: `check` renews the lease
        first, which reaching the bucket tells whether another trainer took it over."""
        from google.api_core import exceptions
        lease = self.acquire(lease_lib.Lease(URL, ttl_s=TTL_S))
        renew = lease_lib.Lease.renew
        with mock.patch.object(lease_lib.Lease, 'renew',
                               side_effect=exceptions.ServiceUnavailable('unreachable')):
            time.sleep(1.5 * TTL_S)
            self.assertIsNone(lease.lost)
            with self.assertRaises(exceptions.ServiceUnavailable):
                lease.check()  # Not renewed for a ttl: it must reach the bucket to tell.
        with mock.patch.object(lease_lib.Lease, 'renew', renew):
            lease.check()  # The bucket is back and the lease still ours: renewed.
        self.assertGreater(self.holder()['expires'], time.time() + TTL_S / 2)
        # Another trainer takes it over during the next outage (inside it: were it written after
        # the outage, a renewal by the background thread in between would let `check` pass).
        with mock.patch.object(lease_lib.Lease, 'renew',
                               side_effect=exceptions.ServiceUnavailable('unreachable')):
            time.sleep(1.5 * TTL_S)
            self.emulator.client().bucket('runs').blob(LEASE).upload_from_string(
                b'{"pid": 1, "host": "machine-b", "expires": 1e12}')
        with self.assertRaisesRegex(lease_lib.LeaseHeld, 'lost the lease'):
            lease.check()
        self.assertIn('machine-b', self.holder()['host'])

    def test_release_with_the_bucket_out_of_reach_leaves_the_lease_to_expire(self):
        with gcs_testing.GcsEmulator(buckets=('runs',), faults=True) as emulator:
            lease = lease_lib.Lease(URL, ttl_s=LIVE_TTL_S)
            lease.acquire()
            emulator.faults.refuse()
            began = time.monotonic()
            with self.assertLogs(level='WARNING') as logs:
                lease.release()
            self.assertLess(time.monotonic() - began, 2 * lease_lib.RELEASE_TIMEOUT_S + 5)
            self.assertIn(f'Could not release the lease {URL}/.lease', logs.output[0])
            self.assertIn(f'it expires by itself within {LIVE_TTL_S:.0f} s', logs.output[0])
            emulator.faults.restore()
            self.assertIn(LEASE, emulator.objects('runs'))  # Left in place, to expire.

    def test_acquire_after_release(self):
        lease = self.acquire(lease_lib.Lease(URL, ttl_s=TTL_S))
        lease.release()
        lease.acquire()
        self.assertTrue(lease._thread.is_alive())
        self.assertIn(LEASE, self.emulator.objects('runs'))


if __name__ == '__main__':
    absltest.main()
