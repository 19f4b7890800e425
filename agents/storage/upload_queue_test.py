"""Tests of UploadQueue: the newest save goes up, failures are retried until the outage limit,
and a trainer waits only when too many saves are only local."""

import threading
import time

from absl.testing import absltest

from agents.storage import failures, upload_queue

URL = 'gs://runs/run'


class Save:

    def __init__(self, step):
        self.step = step
        self.discarded = False

    def discard(self):
        self.discarded = True


class Bucket:
    """An upload function that fails while `down`, and blocks while `stalled` is clear."""

    def __init__(self):
        self.uploaded = []
        self.attempts = 0
        self.down = False
        self.stalled = threading.Event()
        self.stalled.set()

    def upload(self, save):
        self.attempts += 1
        self.stalled.wait()
        if self.down:
            raise ConnectionRefusedError('[Errno 111] Connection refused')
        self.uploaded.append(save.step)


def wait_until(condition, timeout=5.0):
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError('condition not reached')
        time.sleep(0.01)


class UploadQueueTest(absltest.TestCase):

    def queue(self, bucket, max_outage_s=60.0, max_pending=10, **kwargs):
        queue = upload_queue.UploadQueue(
            URL, bucket.upload, lambda: '/staging/run', max_outage_s, max_pending,
            initial_backoff_s=0.01, max_backoff_s=0.05, **kwargs)
        self.addCleanup(queue.close)
        return queue

    def test_uploads_in_order_and_a_newer_save_replaces_a_waiting_one(self):
        bucket = Bucket()
        queue = self.queue(bucket)
        bucket.stalled.clear()
        first, second, third = Save(1), Save(2), Save(3)
        queue.submit(first)
        wait_until(lambda: bucket.attempts == 1)  # The first is in flight.
        queue.submit(second)
        queue.submit(third)
        self.assertTrue(second.discarded)  # Replaced while waiting: never uploaded.
        self.assertFalse(third.discarded)
        self.assertEqual(queue.pending, 3)
        bucket.stalled.set()
        self.assertTrue(queue.drain(5.0))
        self.assertEqual(bucket.uploaded, [1, 3])
        self.assertEqual(queue.pending, 0)
        self.assertEqual(queue.uploaded_step, 3)
        self.assertTrue(first.discarded and third.discarded)  # Uploaded: their copies go.
        self.assertIsNone(queue.status())
        self.assertEqual(queue.describe(), f'step 3 reached {URL}; nothing is only local')

    def test_an_outage_is_retried_told_and_ridden_out(self):
        bucket = Bucket()
        queue = self.queue(bucket)
        bucket.down = True
        queue.submit(Save(1))
        wait_until(lambda: bucket.attempts >= 3)  # Retried with backoff.
        status = queue.status()
        self.assertRegex(status, r'^storage unreachable for \d+ s, 1 save pending, retrying')
        self.assertIn('Connection refused', status)
        self.assertFalse(queue.drain(0.1))
        self.assertIn('saves up to step 1 are only in /staging/run', queue.describe())
        queue.submit(Save(2))
        self.assertIn('2 saves pending', queue.status())
        bucket.down = False
        self.assertTrue(queue.drain(5.0))
        self.assertEqual(bucket.uploaded, [2])
        self.assertIsNone(queue.status())
        self.assertIsNone(queue.error)

    def test_an_outage_past_the_limit_stops_with_what_is_where(self):
        bucket = Bucket()
        queue = self.queue(bucket, max_outage_s=0.3)
        queue.submit(Save(10))
        self.assertTrue(queue.drain(5.0))
        bucket.down = True
        queue.submit(Save(20))
        wait_until(lambda: queue.error is not None)
        message = str(queue.error)
        self.assertIsInstance(queue.error, failures.StorageError)
        for part in (URL, 'longer than max_outage_s = 0.3',
                     'the last step that reached the bucket is 10',
                     'saves up to step 20 are in /staging/run', 'Connection refused'):
            self.assertIn(part, message)
        self.assertNotIn('\n', message)
        later = Save(30)
        with self.assertRaises(failures.StorageError):
            queue.submit(later)
        self.assertTrue(later.discarded)
        attempts = bucket.attempts
        time.sleep(0.2)
        self.assertEqual(bucket.attempts, attempts)  # Gave up: no more retries.

    def test_a_fatal_error_gives_up_at_once(self):
        class Lost(failures.StorageError):
            pass

        def upload(save):
            raise Lost('lost the lease on gs://runs/run')

        queue = upload_queue.UploadQueue(URL, upload, lambda: '/staging/run', 60.0, 10,
                                         fatal=(Lost,))
        self.addCleanup(queue.close)
        queue.submit(Save(1))
        wait_until(lambda: queue.error is not None, timeout=2.0)
        self.assertIn('lost the lease', str(queue.error))
        self.assertFalse(queue.drain(0.1))

    def test_a_failure_that_waiting_cannot_mend_gives_up_at_once(self):
        from google.api_core import exceptions
        attempts = []

        def upload(save):
            attempts.append(save.step)
            raise exceptions.Forbidden('caller does not have storage.objects.create access')

        queue = upload_queue.UploadQueue(URL, upload, lambda: '/staging/run', 60.0, 10)
        self.addCleanup(queue.close)
        queue.submit(Save(1))
        wait_until(lambda: queue.error is not None, timeout=2.0)
        message = str(queue.error)
        self.assertStartsWith(message, f'permission denied on {URL}: ')
        self.assertIn('no save reached the bucket; saves up to step 1 are in /staging/run',
                      message)
        self.assertEqual(attempts, [1])  # Not retried.
        with self.assertRaises(failures.StorageError):
            queue.submit(Save(2))

    def test_training_waits_only_past_max_pending(self):
        bucket = Bucket()
        queue = self.queue(bucket, max_pending=2)
        bucket.down = True
        reports = []
        for step in (1, 2):
            queue.submit(Save(step))
            queue.wait_for_room(report=reports.append)  # At most 2 pending: no wait.
        self.assertEqual(reports, [])
        queue.submit(Save(3))
        wait_until(lambda: queue.outage_since is not None)
        waited = threading.Event()

        def trainer():
            queue.wait_for_room(report=reports.append, report_every_s=0.05)
            waited.set()

        thread = threading.Thread(target=trainer)
        thread.start()
        wait_until(lambda: len(reports) >= 2)
        self.assertFalse(waited.is_set())
        self.assertIn('waiting for storage: 3 saves not in gs://runs/run exceed '
                      'max_pending_saves = 2', reports[0])
        self.assertIn('storage unreachable for', reports[0])
        bucket.down = False
        thread.join(5.0)
        self.assertTrue(waited.is_set())
        self.assertEqual(queue.pending, 0)

    def test_waiting_ends_on_a_stop(self):
        bucket = Bucket()
        queue = self.queue(bucket, max_pending=1)
        bucket.down = True
        queue.submit(Save(1))
        queue.submit(Save(2))
        stop = threading.Event()
        threading.Timer(0.2, stop.set).start()
        began = time.monotonic()
        queue.wait_for_room(should_stop=stop.is_set)
        self.assertLess(time.monotonic() - began, 2.0)
        self.assertFalse(queue.drain(5.0, should_stop=stop.is_set))

    def test_an_upload_that_does_not_return_is_told(self):
        """A client library retrying a silent or refused connection inside one call."""
        bucket = Bucket()
        now = [100.0]
        queue = self.queue(bucket, clock=lambda: now[0])
        bucket.stalled.clear()
        queue.submit(Save(1))
        wait_until(lambda: bucket.attempts == 1)
        now[0] += upload_queue.STUCK_S - 1
        self.assertIsNone(queue.status())
        now[0] += 2
        self.assertEqual(queue.status(), 'storage not answering for 11 s, 1 save pending, '
                                         'waiting')
        now[0] += 60  # Past max_outage_s, the call still not returned: the queue gives up.
        self.assertIn('longer than max_outage_s = 60 (no answer); no save reached the bucket; '
                      'saves up to step 1 are in /staging/run', queue.status())
        with self.assertRaises(failures.StorageError):
            queue.submit(Save(2))
        bucket.stalled.set()

    def test_close_discards_the_waiting_save(self):
        bucket = Bucket()
        queue = self.queue(bucket)
        bucket.stalled.clear()
        queue.submit(Save(1))
        wait_until(lambda: bucket.attempts == 1)
        waiting = Save(2)
        queue.submit(waiting)
        queue.close()
        self.assertTrue(waiting.discarded)
        bucket.stalled.set()


if __name__ == '__main__':
    absltest.main()
