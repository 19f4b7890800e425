"""Uploads in a background thread that ride out an unreachable bucket.

A trainer must not stop for its bucket: it hands each save to an `UploadQueue` and goes on. The
queue's thread uploads the newest save handed to it (a newer save replaces the older ones still
waiting, as it holds everything they hold), retrying a failure with exponential backoff and
jitter. While uploads fail, `status()` says for how long and how many saves wait; after
`max_outage_s` of failures without a success the queue gives up and `error` tells the bucket,
the last save that reached it and where the rest is. `wait_for_room` holds a trainer whose
saves not yet in the bucket exceed `max_pending`, which bounds the work that would be lost with
the machine.
"""

import threading
import time

from absl import logging

from agents.storage import failures

# An upload that takes longer is told in progress lines as storage that does not answer.
STUCK_S = 10.0


class UploadQueue:
    """Calls `upload(save)` in a background thread for the newest submitted save, retried until
    it succeeds or the outage lasts `max_outage_s`.

    A save is any object with `step` (for messages) and `discard()` (called when a newer save
    replaces it unuploaded, or when the queue closes with it waiting). `upload` raises its
    storage client's errors: transient ones (failures.is_transient) are retried, others (no
    credentials, permission denied, no bucket) and the types in `fatal` (a lost lease) give up at
    once. `describe_pending()` names where saves not yet uploaded are kept, for messages.
    """

    def __init__(self, url, upload, describe_pending, max_outage_s, max_pending, fatal=(),
                 initial_backoff_s=1.0, max_backoff_s=30.0, clock=time.monotonic):
        self.url = url
        self._upload = upload
        self._fatal = tuple(fatal)
        self._describe_pending = describe_pending
        self.max_outage_s = max_outage_s
        self.max_pending = max_pending
        self._initial_backoff_s = initial_backoff_s
        self._max_backoff_s = max_backoff_s
        self._clock = clock
        self._condition = threading.Condition()
        self._waiting = None  # The newest save not yet taken by the thread.
        self._in_flight = None  # The save being uploaded.
        self._in_flight_since = None  # When its upload began.
        self.pending = 0  # Saves submitted since the last that reached the bucket.
        self.uploaded_step = None  # Of the last save that reached the bucket.
        self.outage_since = None  # When uploads began to fail (None: the last one succeeded).
        self.last_failure = None  # The last failure's sentence, during an outage.
        self.error = None  # StorageError once the outage outlasted max_outage_s.
        self._closing = False
        self._retry = threading.Event()  # Set to end a backoff early (close, a newer save).
        self._thread = threading.Thread(target=self._work, name='uploads', daemon=True)
        self._thread.start()

    def submit(self, save):
        """Queues `save` for upload, replacing a waiting older one; raises `error` if the queue
        gave up."""
        with self._condition:
            self._check_limit()
            if self.error is not None:
                save.discard()
                raise self.error
            replaced, self._waiting = self._waiting, save
            self.pending += 1
            self._condition.notify_all()
        if replaced is not None:
            replaced.discard()

    def status(self):
        """A phrase for progress lines while uploads fail or do not get through, else None."""
        with self._condition:
            self._check_limit()
            if self.error is not None:
                return f'storage unreachable: {self.error}'
            outage = self._outage_phrase()
            if outage is None:
                return None
            saves = f'{self.pending} save{"s" if self.pending != 1 else ""} pending'
            if self.outage_since is not None:
                return f'{outage[0]}, {saves}, retrying ({self.last_failure})'
            return f'{outage[0]}, {saves}, waiting'

    def _outage_phrase(self):
        """(what the storage does and for how long, the last failure or None), or None."""
        if self.outage_since is not None:
            return (f'storage unreachable for {self._clock() - self.outage_since:.0f} s',
                    self.last_failure)
        stuck = self._stuck_since()
        return (None if stuck is None
                else (f'storage not answering for {self._clock() - stuck:.0f} s', None))

    def _stuck_since(self):
        """When the upload in flight began, once it has gone on for STUCK_S (a client library
        retrying a refused or silent connection inside one call), else None."""
        if self._in_flight is None or self._clock() - self._in_flight_since < STUCK_S:
            return None
        return self._in_flight_since

    def _check_limit(self):
        """Gives up once the outage (failures, or a call that does not return) outlasts
        max_outage_s; the thread may be stuck in a call, so its callers check too."""
        if self.error is not None:
            return
        began = self.outage_since if self.outage_since is not None else self._stuck_since()
        if began is None or self._clock() - began <= self.max_outage_s:
            return
        cause = self.last_failure or 'no answer'
        self.error = failures.OutageError(self._what_is_where(
            f'{self.url} unreachable for {self._clock() - began:.0f} s, longer than '
            f'max_outage_s = {self.max_outage_s:g} ({cause})', self._waiting or self._in_flight))
        self._condition.notify_all()

    def _what_is_where(self, failure, newest):
        """`failure`, then what reached the bucket and where the saves up to `newest` are."""
        reached = (f'the last step that reached the bucket is {self.uploaded_step}'
                   if self.uploaded_step is not None else 'no save reached the bucket')
        return (f'{failure}; {reached}; saves up to step {newest.step} are in '
                f'{self._describe_pending()}, and a rerun on this machine uploads them and '
                'resumes')

    def idle(self):
        """Whether every submitted save reached the bucket."""
        with self._condition:
            return self._waiting is None and self._in_flight is None

    def wait_for_room(self, should_stop=lambda: False, report=None, report_every_s=10.0):
        """Blocks while more than `max_pending` saves are not in the bucket, until then, the
        queue gives up (raises `error`) or `should_stop()`; calls `report(phrase)` every
        `report_every_s` seconds while it waits."""
        last_report = None
        with self._condition:
            while (self.pending > self.max_pending and self.error is None
                   and not should_stop()):
                self._check_limit()
                now = self._clock()
                if report is not None and (last_report is None
                                           or now - last_report >= report_every_s):
                    last_report = now
                    phrase = (f'waiting for storage: {self.pending} saves not in {self.url} '
                              f'exceed max_pending_saves = {self.max_pending}')
                    outage = self._outage_phrase()
                    status = outage and (f'{outage[0]} ({outage[1]})' if outage[1]
                                         else outage[0])
                    self._condition.release()
                    try:
                        report(phrase + (f'; {status}' if status else ''))
                    finally:
                        self._condition.acquire()
                self._condition.wait(0.5)
            if self.error is not None:
                raise self.error

    def drain(self, timeout_s, should_stop=lambda: False):
        """Waits up to `timeout_s` for every save to reach the bucket (or the queue to give up,
        or `should_stop()`); returns whether they all did."""
        deadline = self._clock() + timeout_s
        with self._condition:
            self._retry.set()  # A save waiting out a backoff is tried at once.
            while (self._waiting is not None or self._in_flight is not None) and (
                    self.error is None and not should_stop()):
                self._check_limit()
                remaining = deadline - self._clock()
                if remaining <= 0:
                    break
                self._condition.wait(min(remaining, 0.5))
            return self._waiting is None and self._in_flight is None

    def close(self):
        """Stops the thread (an upload in progress is abandoned: the thread is a daemon) and
        discards the save still waiting, whose files stay where they are."""
        with self._condition:
            self._closing = True
            waiting, self._waiting = self._waiting, None
            self._condition.notify_all()
        self._retry.set()
        if waiting is not None:
            waiting.discard()
        self._thread.join(timeout=1.0)

    def describe(self):
        """What reached the bucket and what is only local, in one sentence."""
        with self._condition:
            reached = (f'step {self.uploaded_step} reached {self.url}'
                       if self.uploaded_step is not None else f'no save reached {self.url}')
            if self._waiting is None and self._in_flight is None:
                return f'{reached}; nothing is only local'
            newest = self._waiting or self._in_flight
        return (f'{reached}; saves up to step {newest.step} are only in '
                f'{self._describe_pending()} (rerun on this machine to upload them and resume)')

    def _work(self):
        delays = None  # The backoff of the failures in a row.
        while True:
            with self._condition:
                while self._waiting is None and not self._closing:
                    self._condition.wait()
                if self._closing or self.error is not None:
                    return
                save, self._waiting, self._in_flight = self._waiting, None, self._waiting
                self._in_flight_since = self._clock()
                pending = self.pending
            try:
                self._upload(save)
            except self._fatal as error:
                self._give_up(save, str(error))
                return
            except Exception as error:  # Storage clients raise their own types.
                if not failures.is_transient(error):  # No credentials, no access, no bucket.
                    self._give_up(save, failures.describe_error(self.url, error))
                    return
                if self._failed(save, error):
                    return
                delays = delays or failures.backoff_delays(self._initial_backoff_s,
                                                           self._max_backoff_s)
                self._retry.clear()
                self._retry.wait(next(delays))
                continue
            delays = None
            self._succeeded(save, pending)

    def _failed(self, save, error):
        """Records a failed upload of `save`, which goes back in line unless a newer save came;
        returns whether the queue gave up."""
        sentence = failures.describe_error(self.url, error)
        with self._condition:
            now = self._clock()
            if self.outage_since is None:
                # Since the failed call began if it went on for long (a client's own retries).
                self.outage_since = (self._in_flight_since
                                     if now - self._in_flight_since >= STUCK_S else now)
                logging.warning('Cannot upload to %s (%s); training goes on, retrying.',
                                self.url, sentence)
            self.last_failure = failures.first_line(sentence, limit=120)
            self._in_flight = None
            if self._waiting is None:
                self._waiting = save
            else:
                save.discard()
            if self._closing:
                return True
            self._check_limit()
            self._condition.notify_all()
            return self.error is not None

    def _give_up(self, save, failure):
        """Stops for `failure` (a sentence), which waiting cannot mend."""
        with self._condition:
            self.error = failures.StorageError(self._what_is_where(failure, save))
            self._in_flight = None
            if self._waiting is None:
                self._waiting = save
            else:
                save.discard()
            self._condition.notify_all()

    def _succeeded(self, save, pending):
        with self._condition:
            began = self.outage_since if self.outage_since is not None else self._stuck_since()
            if began is not None:
                logging.info('%s is reachable again after %.0f s; uploaded the saves up to step '
                             '%s.', self.url, self._clock() - began, save.step)
            self.outage_since = None
            self.last_failure = None
            self.uploaded_step = save.step
            self._in_flight = None
            self.pending -= pending
            self._condition.notify_all()
        save.discard()
