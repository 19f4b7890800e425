"""Tests of backends: Beam's filesystems by scheme, and a GCS client per endpoint."""

from unittest import mock

from absl.testing import absltest

from agents.storage import backends, failures, gcs_testing


class FilesystemsTest(absltest.TestCase):

    def test_unknown_scheme(self):
        with self.assertRaises(failures.StorageError) as raised:
            backends.filesystems('nosuch://b/x')
        self.assertEqual(str(raised.exception),
                         'no filesystem for nosuch:// paths (nosuch://b/x) is installed')

    def test_gs_without_the_gcp_extra(self):
        from apache_beam.io.filesystems import FileSystems
        with mock.patch.object(FileSystems, 'get_filesystem', side_effect=ValueError('none')):
            with self.assertRaises(failures.StorageError) as raised:
                backends.filesystems('gs://runs/x')
        self.assertIn(backends.GCP_EXTRA, str(raised.exception))


class GcsClientTest(absltest.TestCase):

    def test_a_client_per_endpoint(self):
        with gcs_testing.GcsEmulator(buckets=('one',)):
            first = backends.gcs_client('gs://one/x')
            self.assertIs(backends.gcs_client('gs://one/y'), first)
            first.bucket('one').blob('x').upload_from_string(b'x')
            with gcs_testing.GcsEmulator(buckets=('two',)) as other:
                second = backends.gcs_client('gs://two/x')
                self.assertIsNot(second, first)
                second.bucket('two').blob('y').upload_from_string(b'y')
                self.assertEqual(other.objects('two'), {'y': b'y'})


if __name__ == '__main__':
    absltest.main()
