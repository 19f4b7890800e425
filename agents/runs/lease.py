"""A lease on a run directory in a bucket: one trainer at a time, across machines.

A local logdir is guarded by flock (run_config.LogdirLock), which cannot reach across machines.
A gs:// logdir holds a lease object, `<logdir>/.lease`, created only if absent and renewed only
if unchanged (GCS generation preconditions), so two trainers can never both believe they hold
it. The holder renews it every `ttl_s / 4` seconds from a background thread; a lease not renewed
for `ttl_s` seconds belongs to a trainer that died (a lost worker) and is taken over, as is one
whose holder was a process of this machine that no longer runs.
"""

import contextlib
import json
import os
import socket
import threading
import time

from absl import logging

from agents.runs import run_config, run_dir
from agents.storage import backends, failures, locations

DEFAULT_TTL_S = 60.0
RELEASE_TIMEOUT_S = 10.0  # How long a release waits for the bucket before leaving the lease.


class LeaseHeld(failures.StorageError):
    """Another live trainer holds the lease."""


class Lease:
    """The lease of run directory `url` (gs://); `acquire` it, then `release` it."""

    def __init__(self, url, ttl_s=DEFAULT_TTL_S, clock=time.time, user='trainer',
                 flag='--logdir'):
        self.url = url
        self._user, self._flag = user, flag  # Who holds such a lease, for messages.
        self._path = locations.join(url, run_dir.LEASE_FILE)
        self._bucket, self._name = locations.split_gcs_path(self._path)
        self._ttl_s = ttl_s
        self._clock = clock
        # Who this trainer is, fixed for the lease's life: written into the lease and compared
        # with a holder's to tell whether its pid can be checked here.
        self._host = socket.gethostname()
        self._started = None  # When this trainer took the lease (renewals keep it).
        self._generation = None
        self._renewed = None  # When the lease was last written.
        self._stop = threading.Event()
        self._thread = None
        self._lock = threading.Lock()
        self.lost = None  # Why the lease was lost while held, if it was.

    def _blob(self):
        return backends.gcs_client(self._path).bucket(self._bucket).blob(self._name)

    def _holder(self):
        return {'pid': os.getpid(), 'host': self._host,
                'expires': self._clock() + self._ttl_s,
                'started': self._started}

    def acquire(self):
        """Takes the lease, waiting up to `ttl_s` for a holder that stopped renewing it; raises
        LeaseHeld naming a holder that keeps it alive."""
        from google.api_core import exceptions
        self._stop.clear()  # A released lease may be acquired again.
        self.lost = None
        self._started = time.strftime('%Y-%m-%d %H:%M:%S %z')
        deadline = self._clock() + self._ttl_s
        seen = None
        while True:
            blob = self._blob()
            try:
                blob.upload_from_string(json.dumps(self._holder()), if_generation_match=0,
                                        content_type='application/json')
                self._generation = blob.generation
                self._renewed = self._clock()
                break
            except exceptions.PreconditionFailed:
                pass
            current = self._blob()
            try:
                holder = json.loads(current.download_as_bytes())
                generation = current.generation
            except exceptions.NotFound:
                continue  # Released meanwhile: try again at once.
            except ValueError:
                holder, generation = {}, current.generation
            if self._is_stale(holder) or (seen is not None and generation == seen and
                                          self._clock() >= deadline):
                try:
                    blob = self._blob()
                    blob.upload_from_string(json.dumps(self._holder()),
                                            if_generation_match=generation,
                                            content_type='application/json')
                    self._generation = blob.generation
                    self._renewed = self._clock()
                    break
                except exceptions.PreconditionFailed:
                    continue  # Someone else renewed or took it: look again.
            if seen is not None and generation != seen:
                raise LeaseHeld(_held_message(self.url, holder, self._user, self._flag))
            seen = generation
            if self._clock() >= deadline:
                continue
            time.sleep(min(1.0, max(0.0, deadline - self._clock())))
        self._thread = threading.Thread(target=self._renew_loop, name='lease-renewal',
                                        daemon=True)
        self._thread.start()
        return self

    def check_free(self):
        """Raises LeaseHeld if a live process on this host holds the lease; reads only, without
        waiting. A holder on another host is told only by watching it renew, which `acquire`
        does; an absent, unreadable or unreachable lease is left to `acquire` as well."""
        try:
            holder = json.loads(self._blob().download_as_bytes())
        except Exception:  # Each client library raises its own types; `acquire` tells.
            return
        if (isinstance(holder, dict) and holder.get('host') == self._host
                and not self._is_stale(holder)):
            raise LeaseHeld(_held_message(self.url, holder, self._user, self._flag))

    def _is_stale(self, holder):
        if holder.get('expires', 0) < self._clock():
            return True
        if holder.get('host') == self._host and isinstance(holder.get('pid'), int):
            return not _process_runs(holder['pid']) or holder['pid'] == os.getpid()
        return False

    def _renew_loop(self):
        while not self._stop.wait(self._ttl_s / 4):
            try:
                self.renew()
            except LeaseHeld:
                return  # Taken over: renewing again cannot succeed.
            except Exception:  # pylint: disable=broad-except
                # The storage service out of reach: retried at the next renewal. Once it has not
                # been renewed for a whole ttl another trainer may take it over, which the first
                # renewal that reaches the bucket finds (and `check` confirms before uploads).
                pass

    def renew(self):
        """Extends the lease by `ttl_s`; if another trainer took it over, sets `lost` (and
        raises LeaseHeld)."""
        from google.api_core import exceptions
        with self._lock:
            if self._generation is None:
                return
            blob = self._blob()
            try:
                blob.upload_from_string(json.dumps(self._holder()),
                                        if_generation_match=self._generation,
                                        content_type='application/json')
            except exceptions.PreconditionFailed as error:
                # The lease object changed or went away: it is someone else's now (or no one's),
                # and this trainer stops renewing (and will not delete) it.
                self._generation = None
                self.lost = ('it was changed by another trainer '
                             f'({failures.first_line(error, limit=200)})')
                raise LeaseHeld(f'lost the lease on {self.url} ({self.lost})') from None
            self._generation = blob.generation
            self._renewed = self._clock()

    def check(self):
        """Raises LeaseHeld if the lease was lost (another trainer took it over). A lease not
        renewed for `ttl_s` (the bucket out of reach) is renewed first, which tells whether
        another trainer took it over meanwhile; a failure to reach the bucket raises as is."""
        if not self.lost and self._generation is not None and (
                self._clock() - self._renewed >= self._ttl_s):
            with contextlib.suppress(LeaseHeld):  # Told below.
                self.renew()
        if self.lost:
            raise LeaseHeld(f'lost the lease on {self.url} ({self.lost}); another trainer may '
                            'be writing it')

    def abandon(self):
        """Stops renewing without waiting or deleting: the lease expires after its ttl."""
        self._stop.set()
        self._generation = None

    def release(self):
        """Stops renewing and deletes the lease (if it is still ours), waiting at most about
        RELEASE_TIMEOUT_S: with the bucket out of reach the lease is left to expire after its
        ttl, with a warning."""
        from google.api_core import exceptions
        from google.cloud.storage.retry import DEFAULT_RETRY
        self._stop.set()
        deadline = time.monotonic() + RELEASE_TIMEOUT_S
        if self._thread is not None:
            self._thread.join(RELEASE_TIMEOUT_S)  # A renewal may be riding out an outage.
        if not self._lock.acquire(timeout=max(0.0, deadline - time.monotonic())):
            self._left_to_expire('a renewal is still waiting for the bucket')
            return
        try:
            if self._generation is None:
                return
            try:
                self._blob().delete(if_generation_match=self._generation,
                                    timeout=RELEASE_TIMEOUT_S,
                                    retry=DEFAULT_RETRY.with_timeout(
                                        max(1.0, deadline - time.monotonic())))
            except (exceptions.NotFound, exceptions.PreconditionFailed):
                pass
            except Exception as error:  # Each client library raises its own types.
                self._left_to_expire(failures.first_line(error, limit=200))
            self._generation = None
        finally:
            self._lock.release()

    def _left_to_expire(self, why):
        logging.warning('Could not release the lease %s (%s); it expires by itself within %.0f '
                        's.', locations.join(self.url, run_dir.LEASE_FILE), why, self._ttl_s)


def _process_runs(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _held_message(url, holder, user, flag):
    return run_config.in_use_message(
        url, holder, f' (it holds the lease {run_dir.LEASE_FILE} and renews it)', user, flag)
