"""Tests of locations: local paths and URLs, resolved, joined and named."""

import os
from unittest import mock

from absl.testing import absltest

from agents.storage import locations


class PathTest(absltest.TestCase):

    def test_scheme(self):
        self.assertEqual(locations.scheme('gs://bucket/run'), 'gs')
        self.assertEqual(locations.scheme('S3://bucket/run'), 's3')
        self.assertEqual(locations.scheme('file:///tmp/run'), 'file')
        self.assertEqual(locations.scheme('hdfs://namenode/run'), 'hdfs')
        self.assertIsNone(locations.scheme('/tmp/run'))
        self.assertIsNone(locations.scheme('runs/a'))
        self.assertIsNone(locations.scheme('runs/gs://a'))  # Not at the start: no scheme.

    def test_local_and_remote_paths(self):
        self.assertFalse(locations.is_remote('/tmp/x'))
        self.assertFalse(locations.is_remote('relative/x'))
        self.assertFalse(locations.is_remote('file:///tmp/x'))
        self.assertTrue(locations.is_remote('gs://bucket/sweep'))
        self.assertTrue(locations.is_remote('s3://bucket/sweep'))
        self.assertEqual(locations.resolve('gs://bucket/sweep'), 'gs://bucket/sweep')

    def test_resolve_never_rewrites_a_url(self):
        with mock.patch.dict(os.environ, {'BUILD_WORKING_DIRECTORY': '/somewhere'}):
            for url in ('gs://bucket/sweep', 'gs://bucket/a/../b//c/', 's3://Bucket/Run',
                        'hdfs://namenode:8020/run'):
                self.assertEqual(locations.resolve(url), url)

    def test_relative_paths_resolve_against_the_callers_directory(self):
        directory = self.create_tempdir().full_path
        with mock.patch.dict(os.environ, {'BUILD_WORKING_DIRECTORY': directory}):
            self.assertEqual(locations.resolve('out/sweep'),
                             os.path.join(directory, 'out', 'sweep'))
            self.assertEqual(locations.resolve('./out/../run'), os.path.join(directory, 'run'))
            self.assertEqual(locations.resolve('file:///abs/x'), '/abs/x')
            self.assertEqual(locations.resolve('/abs/x'), '/abs/x')
            self.assertEqual(locations.caller_directory(), directory)

    def test_relative_paths_resolve_against_the_working_directory_without_bazel(self):
        environment = {k: v for k, v in os.environ.items() if k != 'BUILD_WORKING_DIRECTORY'}
        with mock.patch.dict(os.environ, environment, clear=True):
            self.assertEqual(locations.resolve('out'), os.path.join(os.getcwd(), 'out'))

    def test_join_and_basename(self):
        self.assertEqual(locations.join('gs://bucket/run', 'checkpoints', 'checkpoint'),
                         'gs://bucket/run/checkpoints/checkpoint')
        self.assertEqual(locations.join('gs://bucket/run/', '/policy/', '100'),
                         'gs://bucket/run/policy/100')
        self.assertEqual(locations.join('s3://bucket', 'a'), 's3://bucket/a')
        self.assertEqual(locations.join('/tmp/run', 'a', 'b'), os.path.join('/tmp/run', 'a', 'b'))
        self.assertEqual(locations.join('run', 'a'), os.path.join('run', 'a'))
        self.assertEqual(locations.basename('gs://bucket/run/'), 'run')
        self.assertEqual(locations.basename('/tmp/run'), 'run')

    def test_unwritable_ancestor(self):
        self.dir = self.create_tempdir().full_path
        self.assertIsNone(locations.unwritable_ancestor(self.dir))
        self.assertIsNone(locations.unwritable_ancestor(os.path.join(self.dir, 'new', 'run')))
        # A path below a regular file cannot be created, whoever runs the test (even root).
        blocker = os.path.join(self.dir, 'file')
        open(blocker, 'w').close()
        self.assertEqual(locations.unwritable_ancestor(os.path.join(blocker, 'a', 'b')), blocker)
        self.assertEqual(locations.unwritable_ancestor(blocker), blocker)
        with mock.patch('os.access', return_value=False):
            self.assertEqual(locations.unwritable_ancestor(os.path.join(self.dir, 'new')),
                             self.dir)


if __name__ == '__main__':
    absltest.main()
