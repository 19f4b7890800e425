"""Tests of sweep storage on the local filesystem, through the same Beam FileSystems calls."""

import os
from unittest import mock

from absl.testing import absltest

from pipelines import storage


class StorageTest(absltest.TestCase):

    def setUp(self):
        super().setUp()
        self.dir = self.create_tempdir().full_path

    def test_local_and_remote_paths(self):
        self.assertTrue(storage.is_local('/tmp/x'))
        self.assertTrue(storage.is_local('relative/x'))
        self.assertTrue(storage.is_local('file:///tmp/x'))
        self.assertFalse(storage.is_local('gs://bucket/sweep'))
        self.assertEqual(storage.resolve('gs://bucket/sweep'), 'gs://bucket/sweep')

    def test_relative_paths_resolve_against_the_callers_directory(self):
        with mock.patch.dict(os.environ, {'BUILD_WORKING_DIRECTORY': self.dir}):
            self.assertEqual(storage.resolve('out/sweep'), os.path.join(self.dir, 'out', 'sweep'))
            self.assertEqual(storage.resolve('file:///abs/x'), '/abs/x')

    def test_writes_atomically_and_reads_back(self):
        path = os.path.join(self.dir, 'a', 'b', 'result.json')
        storage.write_text(path, 'one\n')
        storage.write_text(path, 'two\n')
        self.assertEqual(storage.read_text(path), 'two\n')
        self.assertTrue(storage.exists(path))
        self.assertEqual(os.listdir(os.path.dirname(path)), ['result.json'])  # No temp files.

    def test_failed_write_keeps_the_old_file(self):
        path = os.path.join(self.dir, 'trials.jsonl')
        storage.write_text(path, 'old\n')
        with mock.patch('os.replace', side_effect=OSError('disk full')):
            with self.assertRaises(OSError):
                storage.write_text(path, 'new\n')
        self.assertEqual(storage.read_text(path), 'old\n')
        self.assertEqual(os.listdir(self.dir), ['trials.jsonl'])

    def test_glob(self):
        for name in ('b', 'a', 'c'):
            storage.write_text(os.path.join(self.dir, 'trials', name, 'result.json'), '{}')
        storage.write_text(os.path.join(self.dir, 'trials', 'd', 'other.json'), '{}')
        self.assertEqual(storage.glob(os.path.join(self.dir, 'trials', '*', 'result.json')), [
            os.path.join(self.dir, 'trials', name, 'result.json') for name in 'abc'])
        self.assertEqual(storage.glob(os.path.join(self.dir, 'none', '*')), [])

    def test_is_empty_directory(self):
        self.assertTrue(storage.is_empty_directory(self.dir))
        self.assertTrue(storage.is_empty_directory(os.path.join(self.dir, 'missing')))
        storage.write_text(os.path.join(self.dir, 'x'), '')
        self.assertFalse(storage.is_empty_directory(self.dir))

    def test_upload_tree(self):
        source = os.path.join(self.dir, 'source')
        storage.write_text(os.path.join(source, 'metrics.jsonl'), '{"step": 1}\n')
        storage.write_text(os.path.join(source, 'checkpoints', 'ckpt-1.index'), 'index')
        destination = os.path.join(self.dir, 'destination', 'trials', 'abc-seed0')
        storage.upload_tree(source, destination)
        self.assertEqual(storage.read_text(os.path.join(destination, 'metrics.jsonl')),
                         '{"step": 1}\n')
        self.assertEqual(storage.read_text(
            os.path.join(destination, 'checkpoints', 'ckpt-1.index')), 'index')


if __name__ == '__main__':
    absltest.main()
