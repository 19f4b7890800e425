"""Tests for xla_cache: the directory, the size bound, damaged entries (the trainer's test runs
TensorFlow against a real damaged cache: agents/scripts/train_test.py)."""

import os
from unittest import mock

from absl.testing import absltest

from agents.runs import xla_cache

ENTRY = 'xla_compile_cache__{}__7__XLA_CPU_JIT.pb'


class XlaCacheTest(absltest.TestCase):

    def setUp(self):
        super().setUp()
        patcher = mock.patch.dict(os.environ, {'TF_XLA_FLAGS': '--tf_xla_auto_jit=0'})
        patcher.start()
        self.addCleanup(patcher.stop)
        self.addCleanup(setattr, xla_cache, '_directory', None)

    def _entry(self, directory, number, size, mtime):
        path = os.path.join(directory, ENTRY.format(number))
        with open(path, 'wb') as f:
            f.write(b'x' * size)
        os.utime(path, (mtime, mtime))
        return path

    def test_enable_creates_the_directory_and_sets_the_flag(self):
        directory = os.path.join(self.create_tempdir().full_path, 'a', 'xla')
        xla_cache.enable(directory)
        self.assertTrue(os.path.isdir(directory))
        self.assertEqual(os.environ['TF_XLA_FLAGS'], '--tf_xla_auto_jit=0 '
                         f'--tf_xla_persistent_cache_directory={directory}')
        self.assertEqual(xla_cache.directory(), directory)

    def test_the_oldest_entries_go_beyond_the_bound(self):
        directory = self.create_tempdir().full_path
        old = self._entry(directory, 1, 600, mtime=1000)
        middle = self._entry(directory, 2, 300, mtime=2000)
        new = self._entry(directory, 3, 300, mtime=3000)
        other = os.path.join(directory, 'notes.txt')  # Not the cache's: never touched.
        with open(other, 'w') as f:
            f.write('x' * 5000)
        xla_cache.enable(directory, max_bytes=700)
        self.assertFalse(os.path.exists(old))
        self.assertTrue(os.path.exists(middle) and os.path.exists(new) and os.path.exists(other))

    def test_a_directory_that_cannot_be_used_is_refused(self):
        parent = self.create_tempdir().full_path
        blocker = os.path.join(parent, 'file')
        with open(blocker, 'w') as f:
            f.write('')
        with self.assertRaisesRegex(xla_cache.CacheError,
                                    f'cannot use {blocker}/xla as the XLA compilation cache'):
            xla_cache.enable(os.path.join(blocker, 'xla'))
        self.assertIsNone(xla_cache.directory())
        self.assertEqual(os.environ['TF_XLA_FLAGS'], '--tf_xla_auto_jit=0')

    def test_enable_from_environment(self):
        directory = self.create_tempdir().full_path
        for value in (None, ''):
            with mock.patch.dict(os.environ, {xla_cache.ENV_VAR: value or ''}):
                if value is None:
                    del os.environ[xla_cache.ENV_VAR]
                xla_cache.enable_from_environment()
                self.assertIsNone(xla_cache.directory())
        with mock.patch.dict(os.environ, {xla_cache.ENV_VAR: directory}):
            xla_cache.enable_from_environment()
        self.assertEqual(xla_cache.directory(), directory)

    def test_a_cache_set_in_the_environment_already_is_refused(self):
        os.environ['TF_XLA_FLAGS'] = '--tf_xla_persistent_cache_directory=/elsewhere'
        directory = os.path.join(self.create_tempdir().full_path, 'xla')
        with self.assertRaisesRegex(xla_cache.CacheError, 'TF_XLA_FLAGS sets '
                                    '--tf_xla_persistent_cache_directory already'):
            xla_cache.enable(directory)
        self.assertFalse(os.path.exists(directory))  # Refused before anything is made.

    def test_damaged_recognizes_tensorflows_load_failures_only_with_a_cache(self):
        messages = (
            "Can't parse /c/xla_compile_cache__1__2__XLA_CPU_JIT.pb as binary proto [Op:f]",
            'Read less bytes than requested [Op:__inference_f_24]',
            'Failed to parse serialized CpuAotCompilationResult. [Op:f]',
            'Serialized cache key does not match. [Op:f]')
        error = mock.Mock()
        for message in messages:
            error.message = message
            self.assertFalse(xla_cache.damaged(error))
        xla_cache.enable(self.create_tempdir().full_path)
        for message in messages:
            error.message = message
            self.assertTrue(xla_cache.damaged(error), message)
        error.message = 'Incompatible shapes: [2] vs. [3]'
        self.assertFalse(xla_cache.damaged(error))

    def test_quarantine_moves_every_entry_aside(self):
        directory = self.create_tempdir().full_path
        entries = [self._entry(directory, number, 10, mtime=1000) for number in (1, 2)]
        other = os.path.join(directory, 'notes.txt')
        with open(other, 'w') as f:
            f.write('kept')
        xla_cache.enable(directory)
        moved = xla_cache.quarantine()
        self.assertEqual(os.path.dirname(moved), directory)
        self.assertRegex(os.path.basename(moved), r'^damaged-\d{8}-\d{6}$')
        self.assertEqual(sorted(os.listdir(moved)), sorted(map(os.path.basename, entries)))
        self.assertEqual(sorted(os.listdir(directory)), sorted([os.path.basename(moved),
                                                                'notes.txt']))


if __name__ == '__main__':
    absltest.main()
