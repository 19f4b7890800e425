"""Tests of the pieces of external_worker that BatchEnv's tests cannot pin down."""

import os
import threading
import time

from absl.testing import absltest

from agents.tools import external_worker


def _polls(spin):
    start = time.monotonic()
    return spin.deadline(start) != start


class AdaptiveSpinTest(absltest.TestCase):

    def assert_polls(self, spin, polls):
        start = time.monotonic()
        self.assertEqual(spin.deadline(start), start + spin.limit if polls else start)

    def test_backs_off_exponentially_after_vain_polls(self):
        spin = external_worker.AdaptiveSpin(limit=10.0)
        late = time.monotonic() - 20.0  # A wait that began long ago: polling was in vain.
        self.assert_polls(spin, True)
        spin.record(late)
        expected_skips = [1, 2, 4]
        for skips in expected_skips:
            for _ in range(skips):
                self.assert_polls(spin, False)
                spin.record(late)  # Waits without polling do not change the backoff.
            self.assert_polls(spin, True)
            spin.record(late)
        for _ in range(8):
            self.assert_polls(spin, False)
            spin.record(time.monotonic())
        self.assert_polls(spin, True)
        spin.record(time.monotonic())  # Polling paid off: the next vain poll skips 1 again.
        spin.record(late)
        self.assert_polls(spin, False)
        spin.record(time.monotonic())
        self.assert_polls(spin, True)

    def test_backoff_is_bounded(self):
        spin = external_worker.AdaptiveSpin(limit=10.0)
        late = time.monotonic() - 20.0
        for _ in range(20):  # 20 vain polls, with the waits skipped in between.
            while not _polls(spin):
                spin.record(late)
            spin.record(late)
        skips = 0
        while not _polls(spin):
            spin.record(late)
            skips += 1
        self.assertEqual(skips, spin.MAX_BACKOFF)

    def test_zero_limit_never_polls(self):
        spin = external_worker.AdaptiveSpin(limit=0.0)
        for _ in range(3):
            self.assert_polls(spin, False)
            spin.record(time.monotonic())


class PipeFramingTest(absltest.TestCase):

    def pipe(self):
        read_fd, write_fd = os.pipe()
        self.addCleanup(os.close, read_fd)
        return read_fd, write_fd

    def test_reads_a_reply_written_in_pieces(self):
        read_fd, write_fd = self.pipe()
        body = bytes(range(256)) * 1000  # More than a pipe holds.
        frame = external_worker._REPLY_HEADER.pack(len(body)) + body

        def write_in_pieces():
            for start in range(0, len(frame), 7000):
                external_worker._write_all(write_fd, frame[start:start + 7000])
            os.close(write_fd)

        writer = threading.Thread(target=write_in_pieces)
        writer.start()
        self.assertEqual(external_worker._read_reply(read_fd), body)
        writer.join()

    def test_closed_pipe_mid_message_raises_eof(self):
        read_fd, write_fd = self.pipe()
        os.write(write_fd, external_worker._REPLY_HEADER.pack(10) + b'abc')
        os.close(write_fd)
        with self.assertRaisesRegex(EOFError, '3 of 10 bytes'):
            external_worker._read_reply(read_fd)


if __name__ == '__main__':
    absltest.main()
