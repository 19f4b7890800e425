"""Tests of file_io: file operations on disk and on a GCS emulator."""

import os
from unittest import mock

from absl.testing import absltest

from agents.storage import failures, file_io, gcs_testing


class LocalFilesTest(absltest.TestCase):

    def setUp(self):
        super().setUp()
        self.dir = self.create_tempdir().full_path

    def test_writes_atomically_and_reads_back(self):
        path = os.path.join(self.dir, 'a', 'b', 'result.json')
        file_io.write_text(path, 'one\n')
        file_io.write_text(path, 'two\n')
        self.assertEqual(file_io.read_text(path), 'two\n')
        self.assertTrue(file_io.exists(path))
        self.assertEqual(os.listdir(os.path.dirname(path)), ['result.json'])  # No temp files.

    def test_failed_write_keeps_the_old_file(self):
        path = os.path.join(self.dir, 'trials.jsonl')
        file_io.write_text(path, 'old\n')
        with mock.patch('os.replace', side_effect=OSError('disk full')):
            with self.assertRaises(OSError):
                file_io.write_text(path, 'new\n')
        self.assertEqual(file_io.read_text(path), 'old\n')
        self.assertEqual(os.listdir(self.dir), ['trials.jsonl'])

    def test_missing_file(self):
        with self.assertRaises(FileNotFoundError):
            file_io.read_bytes(os.path.join(self.dir, 'missing'))
        self.assertFalse(file_io.exists(os.path.join(self.dir, 'missing')))

    def test_list_files(self):
        for name in ('b', 'a', 'c'):
            file_io.write_text(os.path.join(self.dir, 'trials', name, 'result.json'), '{}')
        file_io.write_text(os.path.join(self.dir, 'trials', 'd', 'other.json'), '{"x": 1}')
        self.assertEqual(file_io.list_files(os.path.join(self.dir, 'trials')), {
            'a/result.json': 2, 'b/result.json': 2, 'c/result.json': 2, 'd/other.json': 8})
        self.assertEqual(file_io.list_files(os.path.join(self.dir, 'none')), {})

    def test_is_empty_directory(self):
        self.assertTrue(file_io.is_empty_directory(self.dir))
        self.assertTrue(file_io.is_empty_directory(os.path.join(self.dir, 'missing')))
        file_io.write_text(os.path.join(self.dir, 'x'), '')
        self.assertFalse(file_io.is_empty_directory(self.dir))
        self.assertTrue(file_io.is_empty_directory(self.dir, ignore=('x', 'y')))
        os.makedirs(os.path.join(self.dir, 'sub'))
        self.assertFalse(file_io.is_empty_directory(self.dir, ignore=('x',)))

    def test_delete(self):
        path = os.path.join(self.dir, 'x')
        file_io.write_text(path, '')
        file_io.delete([path, os.path.join(self.dir, 'missing')])
        self.assertEqual(os.listdir(self.dir), [])
        file_io.delete([])

    def test_upload_tree(self):
        source = os.path.join(self.dir, 'source')
        file_io.write_text(os.path.join(source, 'metrics.jsonl'), '{"step": 1}\n')
        file_io.write_text(os.path.join(source, 'checkpoints', 'ckpt-1.index'), 'index')
        destination = os.path.join(self.dir, 'destination', 'trials', 'abc-seed0')
        file_io.upload_tree(source, destination)
        self.assertEqual(file_io.read_text(os.path.join(destination, 'metrics.jsonl')),
                         '{"step": 1}\n')
        self.assertEqual(file_io.read_text(
            os.path.join(destination, 'checkpoints', 'ckpt-1.index')), 'index')

    def test_check_writable_is_a_no_op_locally(self):
        file_io.check_writable(self.dir)
        self.assertEqual(os.listdir(self.dir), [])

    def test_open_regular(self):
        path = os.path.join(self.dir, 'config.gin')
        file_io.write_bytes(path, b'x = 1\n\xff')
        with file_io.open_regular(path) as f:
            self.assertEqual(f.read(), b'x = 1\n\xff')
        with file_io.open_regular(path, text=True) as f:
            self.assertEqual(f.read(), 'x = 1\n\ufffd')
        fifo = os.path.join(self.dir, 'fifo')
        os.mkfifo(fifo)  # Opened without blocking, then refused.
        for special in (fifo, self.dir):
            with self.assertRaisesRegex(OSError, f'{special} is not a regular file'):
                file_io.open_regular(special)

class GcsFilesTest(absltest.TestCase):

    def setUp(self):
        super().setUp()
        self.emulator = self.enter_context(gcs_testing.GcsEmulator(buckets=('runs',)))
        self.dir = self.create_tempdir().full_path

    def test_write_read_exists(self):
        url = 'gs://runs/run/a/b.txt'
        self.assertFalse(file_io.exists(url))
        file_io.write_text(url, 'one\n')
        file_io.write_text(url, 'two\n')
        self.assertTrue(file_io.exists(url))
        self.assertEqual(file_io.read_text(url), 'two\n')
        file_io.write_bytes('gs://runs/run/c.bin', b'\x00\xff')
        self.assertEqual(file_io.read_bytes('gs://runs/run/c.bin'), b'\x00\xff')
        self.assertEqual(self.emulator.objects('runs'),
                         {'run/a/b.txt': b'two\n', 'run/c.bin': b'\x00\xff'})

    def test_missing_file(self):
        with self.assertRaises(FileNotFoundError):
            file_io.read_text('gs://runs/run/missing')
        with self.assertRaises(FileNotFoundError):
            file_io.read_text('gs://runs/missing-prefix/x')

    def test_list_files_and_is_empty_directory(self):
        self.assertEqual(file_io.list_files('gs://runs/run'), {})
        self.assertTrue(file_io.is_empty_directory('gs://runs/run'))
        file_io.write_text('gs://runs/run/metrics.jsonl', '{"step": 1}\n')
        file_io.write_text('gs://runs/run/checkpoints/ckpt-1.index', 'index')
        file_io.write_text('gs://runs/other/x', 'x')
        file_io.write_text('gs://runs/run-2/x', 'x')  # Shares the prefix, not the directory.
        self.assertEqual(file_io.list_files('gs://runs/run'),
                         {'metrics.jsonl': 12, 'checkpoints/ckpt-1.index': 5})
        self.assertEqual(file_io.list_files('gs://runs/run/'),
                         {'metrics.jsonl': 12, 'checkpoints/ckpt-1.index': 5})
        self.assertFalse(file_io.is_empty_directory('gs://runs/run'))
        self.assertFalse(file_io.is_empty_directory('gs://runs/run', ignore=('metrics.jsonl',)))
        self.assertTrue(file_io.is_empty_directory('gs://runs/other', ignore=('x',)))

    def test_delete(self):
        file_io.write_text('gs://runs/run/a', 'a')
        file_io.write_text('gs://runs/run/b', 'b')
        file_io.delete(['gs://runs/run/a', 'gs://runs/run/missing'])
        self.assertEqual(self.emulator.objects('runs'), {'run/b': b'b'})

    def test_upload_and_download(self):
        source = os.path.join(self.dir, 'source.bin')
        data = os.urandom(3 << 20)  # Beyond one copy buffer.
        with open(source, 'wb') as f:
            f.write(data)
        file_io.upload(source, 'gs://runs/run/x.bin')
        self.assertEqual(self.emulator.objects('runs'), {'run/x.bin': data})
        destination = os.path.join(self.dir, 'copy', 'x.bin')
        file_io.download('gs://runs/run/x.bin', destination)
        with open(destination, 'rb') as f:
            self.assertEqual(f.read(), data)
        self.assertEqual(os.listdir(os.path.dirname(destination)), ['x.bin'])

    def test_failed_download_leaves_no_file(self):
        from google.api_core import exceptions
        destination = os.path.join(self.dir, 'copy', 'x.bin')
        with self.assertRaises((FileNotFoundError, exceptions.NotFound)):
            file_io.download('gs://runs/run/missing', destination)
        self.assertEqual(os.listdir(os.path.dirname(destination)), [])

    def capture_writers(self):
        from apache_beam.io.filesystems import FileSystems
        writers = []
        create = FileSystems.create

        def capturing_create(*args, **kwargs):
            writers.append(create(*args, **kwargs))
            return writers[-1]

        self.enter_context(mock.patch.object(FileSystems, 'create', capturing_create))
        return writers

    def test_a_failed_write_is_not_tried_again_later(self):
        # A writer left open is closed by the garbage collector, which would upload it again.
        writers = self.capture_writers()
        with self.assertRaisesRegex(Exception, '404'):  # The client library's own type.
            file_io.write_text('gs://missing-bucket/x', 'x')
        self.assertLen(writers, 1)
        self.assertTrue(writers[0].closed)

    def test_a_failed_upload_stores_nothing(self):
        source = os.path.join(self.dir, 'source.bin')
        with open(source, 'wb') as f:
            f.write(b'x' * 1000)
        writers = self.capture_writers()

        def failing_copy(source, destination, length):
            destination.write(source.read(10))
            raise OSError('read error')

        with mock.patch.object(file_io.shutil, 'copyfileobj', failing_copy):
            with self.assertRaisesRegex(OSError, 'read error'):
                file_io.upload(source, 'gs://runs/run/x.bin')
        self.assertTrue(writers[0].closed)
        self.assertEqual(self.emulator.objects('runs'), {})

    def test_upload_tree_and_download_tree(self):
        source = os.path.join(self.dir, 'source')
        files = {'metrics.jsonl': b'{"step": 1}\n', 'checkpoints/ckpt-1.index': b'index',
                 'policy/100/variables/variables.index': b'v', 'train.log': b'log'}
        for relative, data in files.items():
            file_io.write_bytes(os.path.join(source, *relative.split('/')), data)
        file_io.upload_tree(source, 'gs://runs/run')
        self.assertEqual(self.emulator.objects('runs'),
                         {f'run/{relative}': data for relative, data in files.items()})
        destination = os.path.join(self.dir, 'destination')
        copied = file_io.download_tree('gs://runs/run', destination, skip=('train.log',))
        self.assertEqual(copied, sorted(set(files) - {'train.log'}))
        self.assertEqual(file_io.list_files(destination),
                         {relative: len(files[relative]) for relative in copied})
        for relative in copied:
            self.assertEqual(file_io.read_bytes(os.path.join(destination, relative)),
                             files[relative])

    def test_download_tree_of_an_empty_prefix(self):
        destination = os.path.join(self.dir, 'destination')
        self.assertEqual(file_io.download_tree('gs://runs/nothing', destination), [])

    def test_check_writable_leaves_nothing_behind(self):
        file_io.write_text('gs://runs/run/metrics.jsonl', '')
        file_io.check_writable('gs://runs/run')
        file_io.check_writable('gs://runs/new-run')
        self.assertEqual(self.emulator.objects('runs'), {'run/metrics.jsonl': b''})

    def test_check_writable_of_a_missing_bucket(self):
        with self.assertRaises(failures.StorageError) as raised:
            file_io.check_writable('gs://missing-bucket/run')
        message = str(raised.exception)
        self.assertIn('missing-bucket', message)
        self.assertIn('does not exist', message)
        self.assertNotIn('\n', message)
        self.assertEqual(self.emulator.client().lookup_bucket('missing-bucket'), None)

    def test_a_second_emulator_is_reached(self):
        # Clients are cached per process: one made for an endpoint must not serve another.
        file_io.delete(['gs://runs/run/x'])  # Makes the client of this emulator.
        with gcs_testing.GcsEmulator(buckets=('other',)) as other:
            file_io.write_text('gs://other/x', 'x')
            file_io.delete(['gs://other/x'])
            self.assertEqual(other.objects('other'), {})
        file_io.write_text('gs://runs/run/x', 'x')
        file_io.delete(['gs://runs/run/x'])
        self.assertEqual(self.emulator.objects('runs'), {})


class StorageErrorTest(absltest.TestCase):

    def test_unknown_scheme(self):
        for call in (lambda: file_io.exists('nosuch://b/x'),
                     lambda: file_io.read_text('nosuch://b/x'),
                     lambda: file_io.write_text('nosuch://b/x', ''),
                     lambda: file_io.list_files('nosuch://b/x'),
                     lambda: file_io.check_writable('nosuch://b/x')):
            with self.assertRaises(failures.StorageError) as raised:
                call()
            self.assertEqual(str(raised.exception),
                             'no filesystem for nosuch:// paths (nosuch://b/x) is installed')

    def test_gs_without_the_gcp_extra(self):
        # Beam without its gcp extra knows no gs:// filesystem: get_filesystem raises ValueError.
        from apache_beam.io.filesystems import FileSystems
        with mock.patch.object(FileSystems, 'get_filesystem',
                               side_effect=ValueError('Unable to get filesystem from specified '
                                                      'path, please use the correct path')):
            for call in (lambda: file_io.exists('gs://runs/x'),
                         lambda: file_io.check_writable('gs://runs/x')):
                with self.assertRaises(failures.StorageError) as raised:
                    call()
                self.assertIn("pip install 'apache-beam[gcp]'", str(raised.exception))
                self.assertIn('gs://', str(raised.exception))

    def test_check_writable_of_a_denied_bucket(self):
        from google.api_core import exceptions
        with mock.patch.object(file_io, 'write_bytes',
                               side_effect=exceptions.Forbidden('no storage.objects.create')):
            with self.assertRaises(failures.StorageError) as raised:
                file_io.check_writable('gs://runs/run')
        self.assertIn('permission denied on gs://runs/run', str(raised.exception))


if __name__ == '__main__':
    absltest.main()
