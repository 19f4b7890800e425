"""Tests of riding out an outage: transient failures retried up to the limit, then one sentence;
permanent ones raised at once; no retries at the default limit."""

from absl.testing import absltest
from google.api_core import exceptions

from agents.storage import failures, outages

URL = 'gs://sweeps/out/rungs.jsonl'


class Clock:
    """A fake clock that `sleep` advances."""

    def __init__(self):
        self.now = 0.0
        self.sleeps = []

    def __call__(self):
        return self.now

    def sleep(self, seconds):
        self.sleeps.append(seconds)
        self.now += seconds


def failing(times, error):
    calls = []

    def call():
        calls.append(1)
        if len(calls) <= times:
            raise error
        return 'done'
    return call, calls


class OutagesTest(absltest.TestCase):

    def setUp(self):
        super().setUp()
        self.addCleanup(outages.set_limit, 0)

    def ride_out(self, call, clock):
        return outages.ride_out(URL, call, clock=clock, sleep=clock.sleep)

    def test_without_a_limit_a_failure_is_raised_at_once(self):
        call, calls = failing(1, ConnectionRefusedError('refused'))
        with self.assertRaises(ConnectionRefusedError):
            self.ride_out(call, Clock())
        self.assertLen(calls, 1)

    def test_an_outage_is_ridden_out_with_growing_jittered_waits(self):
        outages.set_limit(600)
        clock = Clock()
        call, calls = failing(6, exceptions.ServiceUnavailable('down'))
        with self.assertLogs(level='WARNING') as logs:
            self.assertEqual(self.ride_out(call, clock), 'done')
        self.assertLen(calls, 7)
        for wait, ceiling in zip(clock.sleeps, (1, 2, 4, 8, 16, 30), strict=True):
            self.assertBetween(wait, ceiling / 2, ceiling)
        self.assertIn('Storage unreachable for 0 s', logs.output[0])
        self.assertIn('retrying up to max_outage_s = 600', logs.output[0])

    def test_past_the_limit_one_sentence_names_the_url_and_the_limit(self):
        outages.set_limit(20)
        clock = Clock()
        call, calls = failing(100, ConnectionResetError('[Errno 104] Connection reset by peer'))
        with self.assertLogs(level='WARNING'), self.assertRaises(
                failures.StorageError) as raised:
            self.ride_out(call, clock)
        message = str(raised.exception)
        self.assertRegex(message, rf'^{URL}: storage unreachable for \d+ s, longer than '
                                  r'max_outage_s = 20 \(cannot access .*Connection reset')
        self.assertNotIn('\n', message)
        self.assertGreater(clock.now, 20)
        self.assertLess(clock.now, 20 + 30)

    def test_permanent_failures_are_not_retried(self):
        outages.set_limit(600)
        for error in (exceptions.Forbidden('denied'), exceptions.NotFound('no bucket'),
                      exceptions.PreconditionFailed('changed'), FileNotFoundError('gone'),
                      failures.StorageError('no filesystem for gs:// paths is installed'),
                      ModuleNotFoundError("No module named 'google.cloud'")):
            call, calls = failing(1, error)
            with self.assertRaises(type(error)):
                self.ride_out(call, Clock())
            self.assertLen(calls, 1, error)

    def test_a_call_that_does_not_return_counts_as_an_outage(self):
        """A client library retrying a refused connection inside one call for its own deadline
        does not stretch the limit."""
        import threading
        import time
        outages.set_limit(0.5)
        answer = threading.Event()
        self.addCleanup(answer.set)
        began = time.monotonic()
        with self.assertRaises(failures.StorageError) as raised:
            outages.ride_out(URL, answer.wait)
        self.assertBetween(time.monotonic() - began, 0.5, 2.0)
        self.assertRegex(str(raised.exception), rf'^{URL}: storage not answering for \d+ s, '
                                                r'longer than max_outage_s = 0.5$')
        outages.set_limit(5)
        answer.clear()
        threading.Timer(0.3, answer.set).start()
        self.assertTrue(outages.ride_out(URL, answer.wait))  # Slow, but within the limit.

    def test_a_bad_limit_is_refused(self):
        for value in (-1, 'long', True):
            with self.assertRaisesRegex(ValueError, 'max_outage_s must be a non-negative'):
                outages.set_limit(value)


class RealOutageTest(absltest.TestCase):
    """Through fake-gcs-server behind a proxy that refuses every connection for a while."""

    def test_writes_and_reads_ride_out_a_refusing_bucket(self):
        import threading
        import time

        from agents.storage import file_io, gcs_testing
        outages.set_limit(60)
        self.addCleanup(outages.set_limit, 0)
        with gcs_testing.GcsEmulator(buckets=('sweeps',), faults=True) as emulator:
            path = 'gs://sweeps/out/rungs.jsonl'
            emulator.faults.refuse()
            threading.Timer(3.0, emulator.faults.restore).start()
            began = time.monotonic()
            file_io.write_text(path, '{"rung": 0}\n')
            self.assertGreater(time.monotonic() - began, 2.5)  # It waited for the bucket.
            self.assertEqual(emulator.objects('sweeps'), {'out/rungs.jsonl': b'{"rung": 0}\n'})
            emulator.faults.refuse()
            threading.Timer(3.0, emulator.faults.restore).start()
            self.assertEqual(file_io.read_text(path), '{"rung": 0}\n')

    def test_a_silent_bucket_is_ridden_out_and_past_the_limit_told_in_one_sentence(self):
        """Connections accepted and never answered: the client library would wait for its
        own timeouts; the limit holds regardless."""
        import threading
        import time

        from agents.storage import file_io, gcs_testing
        self.addCleanup(outages.set_limit, 0)
        with gcs_testing.GcsEmulator(buckets=('sweeps',), faults=True) as emulator:
            path = 'gs://sweeps/out/trials.jsonl'
            outages.set_limit(60)
            emulator.faults.stall()
            threading.Timer(3.0, emulator.faults.restore).start()  # Cuts the silent calls.
            file_io.write_text(path, '{"trial": 1}\n')
            self.assertEqual(emulator.objects('sweeps'), {'out/trials.jsonl': b'{"trial": 1}\n'})
            outages.set_limit(2)
            emulator.faults.stall()
            began = time.monotonic()
            with self.assertRaises(failures.OutageError) as raised:
                file_io.write_text(path, '{"trial": 2}\n')
            self.assertLess(time.monotonic() - began, 10)
            self.assertRegex(str(raised.exception), rf'^{path}: storage not answering for \d+ s, '
                                                    r'longer than max_outage_s = 2$')
            emulator.faults.restore()


if __name__ == '__main__':
    absltest.main()
