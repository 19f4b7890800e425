"""Tests of run_dir: paths local or URL, and file operations on disk and on a GCS emulator."""

import os
from unittest import mock

from absl.testing import absltest

from agents.runs import gcs_testing, run_dir


class PathTest(absltest.TestCase):

    def test_scheme(self):
        self.assertEqual(run_dir.scheme('gs://bucket/run'), 'gs')
        self.assertEqual(run_dir.scheme('S3://bucket/run'), 's3')
        self.assertEqual(run_dir.scheme('file:///tmp/run'), 'file')
        self.assertEqual(run_dir.scheme('hdfs://namenode/run'), 'hdfs')
        self.assertIsNone(run_dir.scheme('/tmp/run'))
        self.assertIsNone(run_dir.scheme('runs/a'))
        self.assertIsNone(run_dir.scheme('runs/gs://a'))  # Not at the start: no scheme.

    def test_local_and_remote_paths(self):
        self.assertFalse(run_dir.is_remote('/tmp/x'))
        self.assertFalse(run_dir.is_remote('relative/x'))
        self.assertFalse(run_dir.is_remote('file:///tmp/x'))
        self.assertTrue(run_dir.is_remote('gs://bucket/sweep'))
        self.assertTrue(run_dir.is_remote('s3://bucket/sweep'))
        self.assertEqual(run_dir.resolve('gs://bucket/sweep'), 'gs://bucket/sweep')

    def test_resolve_never_rewrites_a_url(self):
        with mock.patch.dict(os.environ, {'BUILD_WORKING_DIRECTORY': '/somewhere'}):
            for url in ('gs://bucket/sweep', 'gs://bucket/a/../b//c/', 's3://Bucket/Run',
                        'hdfs://namenode:8020/run'):
                self.assertEqual(run_dir.resolve(url), url)

    def test_relative_paths_resolve_against_the_callers_directory(self):
        directory = self.create_tempdir().full_path
        with mock.patch.dict(os.environ, {'BUILD_WORKING_DIRECTORY': directory}):
            self.assertEqual(run_dir.resolve('out/sweep'),
                             os.path.join(directory, 'out', 'sweep'))
            self.assertEqual(run_dir.resolve('./out/../run'), os.path.join(directory, 'run'))
            self.assertEqual(run_dir.resolve('file:///abs/x'), '/abs/x')
            self.assertEqual(run_dir.resolve('/abs/x'), '/abs/x')
            self.assertEqual(run_dir.caller_directory(), directory)

    def test_relative_paths_resolve_against_the_working_directory_without_bazel(self):
        environment = {k: v for k, v in os.environ.items() if k != 'BUILD_WORKING_DIRECTORY'}
        with mock.patch.dict(os.environ, environment, clear=True):
            self.assertEqual(run_dir.resolve('out'), os.path.join(os.getcwd(), 'out'))

    def test_join_and_basename(self):
        self.assertEqual(run_dir.join('gs://bucket/run', 'checkpoints', 'checkpoint'),
                         'gs://bucket/run/checkpoints/checkpoint')
        self.assertEqual(run_dir.join('gs://bucket/run/', '/policy/', '100'),
                         'gs://bucket/run/policy/100')
        self.assertEqual(run_dir.join('s3://bucket', 'a'), 's3://bucket/a')
        self.assertEqual(run_dir.join('/tmp/run', 'a', 'b'), os.path.join('/tmp/run', 'a', 'b'))
        self.assertEqual(run_dir.join('run', 'a'), os.path.join('run', 'a'))
        self.assertEqual(run_dir.basename('gs://bucket/run/'), 'run')
        self.assertEqual(run_dir.basename('/tmp/run'), 'run')


class LocalFilesTest(absltest.TestCase):

    def setUp(self):
        super().setUp()
        self.dir = self.create_tempdir().full_path

    def test_writes_atomically_and_reads_back(self):
        path = os.path.join(self.dir, 'a', 'b', 'result.json')
        run_dir.write_text(path, 'one\n')
        run_dir.write_text(path, 'two\n')
        self.assertEqual(run_dir.read_text(path), 'two\n')
        self.assertTrue(run_dir.exists(path))
        self.assertEqual(os.listdir(os.path.dirname(path)), ['result.json'])  # No temp files.

    def test_failed_write_keeps_the_old_file(self):
        path = os.path.join(self.dir, 'trials.jsonl')
        run_dir.write_text(path, 'old\n')
        with mock.patch('os.replace', side_effect=OSError('disk full')):
            with self.assertRaises(OSError):
                run_dir.write_text(path, 'new\n')
        self.assertEqual(run_dir.read_text(path), 'old\n')
        self.assertEqual(os.listdir(self.dir), ['trials.jsonl'])

    def test_missing_file(self):
        with self.assertRaises(FileNotFoundError):
            run_dir.read_bytes(os.path.join(self.dir, 'missing'))
        self.assertFalse(run_dir.exists(os.path.join(self.dir, 'missing')))

    def test_list_files(self):
        for name in ('b', 'a', 'c'):
            run_dir.write_text(os.path.join(self.dir, 'trials', name, 'result.json'), '{}')
        run_dir.write_text(os.path.join(self.dir, 'trials', 'd', 'other.json'), '{"x": 1}')
        self.assertEqual(run_dir.list_files(os.path.join(self.dir, 'trials')), {
            'a/result.json': 2, 'b/result.json': 2, 'c/result.json': 2, 'd/other.json': 8})
        self.assertEqual(run_dir.list_files(os.path.join(self.dir, 'none')), {})

    def test_is_empty_directory(self):
        self.assertTrue(run_dir.is_empty_directory(self.dir))
        self.assertTrue(run_dir.is_empty_directory(os.path.join(self.dir, 'missing')))
        run_dir.write_text(os.path.join(self.dir, 'x'), '')
        self.assertFalse(run_dir.is_empty_directory(self.dir))

    def test_delete(self):
        path = os.path.join(self.dir, 'x')
        run_dir.write_text(path, '')
        run_dir.delete([path, os.path.join(self.dir, 'missing')])
        self.assertEqual(os.listdir(self.dir), [])
        run_dir.delete([])

    def test_upload_tree(self):
        source = os.path.join(self.dir, 'source')
        run_dir.write_text(os.path.join(source, 'metrics.jsonl'), '{"step": 1}\n')
        run_dir.write_text(os.path.join(source, 'checkpoints', 'ckpt-1.index'), 'index')
        destination = os.path.join(self.dir, 'destination', 'trials', 'abc-seed0')
        run_dir.upload_tree(source, destination)
        self.assertEqual(run_dir.read_text(os.path.join(destination, 'metrics.jsonl')),
                         '{"step": 1}\n')
        self.assertEqual(run_dir.read_text(
            os.path.join(destination, 'checkpoints', 'ckpt-1.index')), 'index')

    def test_check_writable_is_a_no_op_locally(self):
        run_dir.check_writable(self.dir)
        self.assertEqual(os.listdir(self.dir), [])

    def test_open_regular(self):
        path = os.path.join(self.dir, 'config.gin')
        run_dir.write_bytes(path, b'x = 1\n\xff')
        with run_dir.open_regular(path) as f:
            self.assertEqual(f.read(), b'x = 1\n\xff')
        with run_dir.open_regular(path, text=True) as f:
            self.assertEqual(f.read(), 'x = 1\n\ufffd')
        fifo = os.path.join(self.dir, 'fifo')
        os.mkfifo(fifo)  # Opened without blocking, then refused.
        for special in (fifo, self.dir):
            with self.assertRaisesRegex(OSError, f'{special} is not a regular file'):
                run_dir.open_regular(special)

    def test_unwritable_ancestor(self):
        self.assertIsNone(run_dir.unwritable_ancestor(self.dir))
        self.assertIsNone(run_dir.unwritable_ancestor(os.path.join(self.dir, 'new', 'run')))
        # A path below a regular file cannot be created, whoever runs the test (even root).
        blocker = os.path.join(self.dir, 'file')
        run_dir.write_text(blocker, '')
        self.assertEqual(run_dir.unwritable_ancestor(os.path.join(blocker, 'a', 'b')), blocker)
        self.assertEqual(run_dir.unwritable_ancestor(blocker), blocker)
        with mock.patch('os.access', return_value=False):
            self.assertEqual(run_dir.unwritable_ancestor(os.path.join(self.dir, 'new')),
                             self.dir)


class GcsFilesTest(absltest.TestCase):

    def setUp(self):
        super().setUp()
        self.emulator = self.enter_context(gcs_testing.GcsEmulator(buckets=('runs',)))
        self.dir = self.create_tempdir().full_path

    def test_write_read_exists(self):
        url = 'gs://runs/run/a/b.txt'
        self.assertFalse(run_dir.exists(url))
        run_dir.write_text(url, 'one\n')
        run_dir.write_text(url, 'two\n')
        self.assertTrue(run_dir.exists(url))
        self.assertEqual(run_dir.read_text(url), 'two\n')
        run_dir.write_bytes('gs://runs/run/c.bin', b'\x00\xff')
        self.assertEqual(run_dir.read_bytes('gs://runs/run/c.bin'), b'\x00\xff')
        self.assertEqual(self.emulator.objects('runs'),
                         {'run/a/b.txt': b'two\n', 'run/c.bin': b'\x00\xff'})

    def test_missing_file(self):
        with self.assertRaises(FileNotFoundError):
            run_dir.read_text('gs://runs/run/missing')
        with self.assertRaises(FileNotFoundError):
            run_dir.read_text('gs://runs/missing-prefix/x')

    def test_list_files_and_is_empty_directory(self):
        self.assertEqual(run_dir.list_files('gs://runs/run'), {})
        self.assertTrue(run_dir.is_empty_directory('gs://runs/run'))
        run_dir.write_text('gs://runs/run/metrics.jsonl', '{"step": 1}\n')
        run_dir.write_text('gs://runs/run/checkpoints/ckpt-1.index', 'index')
        run_dir.write_text('gs://runs/other/x', 'x')
        run_dir.write_text('gs://runs/run-2/x', 'x')  # Shares the prefix, not the directory.
        self.assertEqual(run_dir.list_files('gs://runs/run'),
                         {'metrics.jsonl': 12, 'checkpoints/ckpt-1.index': 5})
        self.assertEqual(run_dir.list_files('gs://runs/run/'),
                         {'metrics.jsonl': 12, 'checkpoints/ckpt-1.index': 5})
        self.assertFalse(run_dir.is_empty_directory('gs://runs/run'))

    def test_delete(self):
        run_dir.write_text('gs://runs/run/a', 'a')
        run_dir.write_text('gs://runs/run/b', 'b')
        run_dir.delete(['gs://runs/run/a', 'gs://runs/run/missing'])
        self.assertEqual(self.emulator.objects('runs'), {'run/b': b'b'})

    def test_upload_and_download(self):
        source = os.path.join(self.dir, 'source.bin')
        data = os.urandom(3 << 20)  # Beyond one copy buffer.
        with open(source, 'wb') as f:
            f.write(data)
        run_dir.upload(source, 'gs://runs/run/x.bin')
        self.assertEqual(self.emulator.objects('runs'), {'run/x.bin': data})
        destination = os.path.join(self.dir, 'copy', 'x.bin')
        run_dir.download('gs://runs/run/x.bin', destination)
        with open(destination, 'rb') as f:
            self.assertEqual(f.read(), data)
        self.assertEqual(os.listdir(os.path.dirname(destination)), ['x.bin'])

    def test_failed_download_leaves_no_file(self):
        from google.api_core import exceptions
        destination = os.path.join(self.dir, 'copy', 'x.bin')
        with self.assertRaises((FileNotFoundError, exceptions.NotFound)):
            run_dir.download('gs://runs/run/missing', destination)
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
            run_dir.write_text('gs://missing-bucket/x', 'x')
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

        with mock.patch.object(run_dir.shutil, 'copyfileobj', failing_copy):
            with self.assertRaisesRegex(OSError, 'read error'):
                run_dir.upload(source, 'gs://runs/run/x.bin')
        self.assertTrue(writers[0].closed)
        self.assertEqual(self.emulator.objects('runs'), {})

    def test_upload_tree_and_download_tree(self):
        source = os.path.join(self.dir, 'source')
        files = {'metrics.jsonl': b'{"step": 1}\n', 'checkpoints/ckpt-1.index': b'index',
                 'policy/100/variables/variables.index': b'v', 'train.log': b'log'}
        for relative, data in files.items():
            run_dir.write_bytes(os.path.join(source, *relative.split('/')), data)
        run_dir.upload_tree(source, 'gs://runs/run')
        self.assertEqual(self.emulator.objects('runs'),
                         {f'run/{relative}': data for relative, data in files.items()})
        destination = os.path.join(self.dir, 'destination')
        copied = run_dir.download_tree('gs://runs/run', destination, skip=('train.log',))
        self.assertEqual(copied, sorted(set(files) - {'train.log'}))
        self.assertEqual(run_dir.list_files(destination),
                         {relative: len(files[relative]) for relative in copied})
        for relative in copied:
            self.assertEqual(run_dir.read_bytes(os.path.join(destination, relative)),
                             files[relative])

    def test_download_tree_of_an_empty_prefix(self):
        destination = os.path.join(self.dir, 'destination')
        self.assertEqual(run_dir.download_tree('gs://runs/nothing', destination), [])

    def test_check_writable_leaves_nothing_behind(self):
        run_dir.write_text('gs://runs/run/metrics.jsonl', '')
        run_dir.check_writable('gs://runs/run')
        run_dir.check_writable('gs://runs/new-run')
        self.assertEqual(self.emulator.objects('runs'), {'run/metrics.jsonl': b''})

    def test_check_writable_of_a_missing_bucket(self):
        with self.assertRaises(run_dir.StorageError) as raised:
            run_dir.check_writable('gs://missing-bucket/run')
        message = str(raised.exception)
        self.assertIn('missing-bucket', message)
        self.assertIn('does not exist', message)
        self.assertNotIn('\n', message)
        self.assertEqual(self.emulator.client().lookup_bucket('missing-bucket'), None)

    def test_a_second_emulator_is_reached(self):
        # Clients are cached per process: one made for an endpoint must not serve another.
        run_dir.delete(['gs://runs/run/x'])  # Makes the client of this emulator.
        with gcs_testing.GcsEmulator(buckets=('other',)) as other:
            run_dir.write_text('gs://other/x', 'x')
            run_dir.delete(['gs://other/x'])
            self.assertEqual(other.objects('other'), {})
        run_dir.write_text('gs://runs/run/x', 'x')
        run_dir.delete(['gs://runs/run/x'])
        self.assertEqual(self.emulator.objects('runs'), {})


class MessageTest(absltest.TestCase):

    def test_first_line(self):
        self.assertEqual(run_dir.first_line(ValueError('\n first\nsecond')), 'first')
        self.assertEqual(run_dir.first_line(ValueError('abcdef'), limit=3), 'abc')
        self.assertEqual(run_dir.first_line(ValueError()), 'ValueError')
        error = ValueError('with the traceback')
        error.message = 'the message\ntraceback'  # As TensorFlow's errors have it.
        self.assertEqual(run_dir.first_line(error), 'the message')
        self.assertEqual(run_dir.first_line('a text\nmore'), 'a text')

    def test_one_line(self):
        self.assertEqual(run_dir.one_line(ValueError("No configurable 'x'.\n  In file a.gin\n")),
                         "No configurable 'x'. In file a.gin")
        self.assertEqual(run_dir.one_line(ValueError('a  b\tc'), limit=3), 'a b')
        self.assertEqual(run_dir.one_line(KeyError()), 'KeyError')


class StorageErrorTest(absltest.TestCase):

    def test_unknown_scheme(self):
        for call in (lambda: run_dir.exists('nosuch://b/x'),
                     lambda: run_dir.read_text('nosuch://b/x'),
                     lambda: run_dir.write_text('nosuch://b/x', ''),
                     lambda: run_dir.list_files('nosuch://b/x'),
                     lambda: run_dir.check_writable('nosuch://b/x')):
            with self.assertRaises(run_dir.StorageError) as raised:
                call()
            self.assertEqual(str(raised.exception),
                             'no filesystem for nosuch:// paths (nosuch://b/x) is installed')

    def test_gs_without_the_gcp_extra(self):
        # Beam without its gcp extra knows no gs:// filesystem: get_filesystem raises ValueError.
        from apache_beam.io.filesystems import FileSystems
        with mock.patch.object(FileSystems, 'get_filesystem',
                               side_effect=ValueError('Unable to get filesystem from specified '
                                                      'path, please use the correct path')):
            for call in (lambda: run_dir.exists('gs://runs/x'),
                         lambda: run_dir.check_writable('gs://runs/x')):
                with self.assertRaises(run_dir.StorageError) as raised:
                    call()
                self.assertIn("pip install 'apache-beam[gcp]'", str(raised.exception))
                self.assertIn('gs://', str(raised.exception))

    def test_describe_permission_denied(self):
        from google.api_core import exceptions
        error = exceptions.Forbidden('POST https://storage.googleapis.com/upload/storage/v1/b/'
                                     'runs/o: someone@example.com does not have '
                                     'storage.objects.create access\nmore detail')
        message = run_dir.describe_error('gs://runs/run', error)
        self.assertIn('permission denied', message)
        self.assertIn('bucket runs', message)
        self.assertNotIn('\n', message)

    def test_describe_permission_denied_behind_another_error(self):
        from google.api_core import exceptions
        try:
            try:
                raise exceptions.Forbidden('denied')
            except exceptions.Forbidden as cause:
                raise OSError('upload failed') from cause
        except OSError as error:
            message = run_dir.describe_error('gs://runs/run', error)
        self.assertIn('permission denied', message)

    def test_describe_no_credentials(self):
        from google.api_core import exceptions
        from google.auth import exceptions as auth_exceptions
        for error in (auth_exceptions.DefaultCredentialsError(
                          'Your default credentials were not found.\nTo set up ...'),
                      exceptions.Unauthorized('Anonymous caller does not have access')):
            message = run_dir.describe_error('gs://runs/run', error)
            self.assertIn('no credentials', message)
            self.assertIn('gcloud auth application-default login', message)
            self.assertNotIn('\n', message)

    def test_describe_missing_bucket(self):
        from google.api_core import exceptions
        message = run_dir.describe_error('gs://missing-bucket/run',
                                         exceptions.NotFound('The specified bucket does not '
                                                             'exist.'))
        self.assertIn('bucket missing-bucket', message)
        self.assertIn('does not exist', message)

    def test_describe_anything_else(self):
        message = run_dir.describe_error('gs://runs/run', ConnectionError('refused\nmore'))
        self.assertEqual(message, 'cannot access gs://runs/run: ConnectionError: refused')

    def test_check_writable_of_a_denied_bucket(self):
        from google.api_core import exceptions
        with mock.patch.object(run_dir, 'write_bytes',
                               side_effect=exceptions.Forbidden('no storage.objects.create')):
            with self.assertRaises(run_dir.StorageError) as raised:
                run_dir.check_writable('gs://runs/run')
        self.assertIn('permission denied on gs://runs/run', str(raised.exception))


if __name__ == '__main__':
    absltest.main()
