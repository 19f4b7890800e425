"""//pipelines:report on object storage: a GCS API server on loopback
(agents/storage/gcs_testing.py) holds the sweep and takes the report; and the errors of storage
that cannot be used."""

import html.parser
import json
import os
import posixpath
import subprocess
import sys
import tempfile
from unittest import mock

import imageio.v2 as imageio
from absl.testing import absltest, flagsaver

from agents.scripts import testing_utils as script_testing
from agents.storage import failures, file_io, gcs_testing
from pipelines.report import report, report_fixtures, report_html, run_reader

FAST = {'bootstrap_reps': 2000, 'curve_bootstrap_reps': 200}
FAST_FLAGS = ['--bootstrap_reps=2000', '--curve_bootstrap_reps=200']
IN_PROCESS = '--direct_running_mode=in_memory'
SWEEP = 'gs://reports/sweep'


class Links(html.parser.HTMLParser):
    """The href and src attributes of a page."""

    def __init__(self):
        super().__init__()
        self.links = []

    def handle_starttag(self, tag, attrs):
        self.links += [value for name, value in attrs if name in ('href', 'src') and value]


def links(path):
    parser = Links()
    with open(path, encoding='utf-8') as f:
        parser.feed(f.read())
    return parser.links


def report_command(*args):
    return [sys.executable, '-m', 'pipelines.report', *args]


class ReportOnStorageTest(absltest.TestCase):

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        tmp = tempfile.mkdtemp(dir=absltest.get_default_test_tmpdir())
        cls.tmp = tmp
        cls.policy = report_fixtures.train_tiny_policy(os.path.join(tmp, 'tiny'))
        cls.sweep = report_fixtures.make_sweep(os.path.join(tmp, 'sweep'), cls.policy)
        cls.emulator = cls.enterClassContext(gcs_testing.GcsEmulator(buckets=('reports',)))
        file_io.upload_tree(cls.sweep, SWEEP)
        # The same sweep reported from and to local directories, for comparison.
        cls.local = os.path.join(tmp, 'local-report')
        with flagsaver.flagsaver(input=cls.sweep, output_dir=cls.local, video_max_steps=30,
                                 video_size=128, **FAST):
            assert report.main(['report', IN_PROCESS]) == 3
        cls.local_files = set(file_io.list_files(cls.local))

    def environment(self):
        return self.emulator.environment(dict(os.environ, PYTHONPATH=script_testing.ROOT))

    def run_main(self, argv=(IN_PROCESS,), **flag_values):
        with flagsaver.flagsaver(**flag_values):
            return report.main(['report', *argv])

    def stored(self, prefix):
        """{name under gs://reports/<prefix>/: bytes}."""
        return {name[len(prefix) + 1:]: data
                for name, data in self.emulator.objects('reports', prefix + '/').items()}

    def test_report_from_and_to_storage_in_worker_processes(self):
        process = subprocess.run(
            report_command(f'--input={SWEEP}/', '--output_dir=gs://reports/report',
                           '--video_max_steps=30', '--video_size=128', '--direct_num_workers=2',
                           *FAST_FLAGS),
            env=self.environment(), capture_output=True, text=True, timeout=600, check=False)
        self.assertEqual(process.returncode, 3, process.stderr[-3000:])
        self.assertIn('Report of 7 runs in 2 configurations (2 skipped', process.stdout)
        self.assertIn('gs://reports/report/index.html', process.stdout)
        stored = self.stored('report')
        # The files of the local report, no more: no staging or probe objects.
        self.assertEqual(set(stored), self.local_files)
        with open(os.path.join(self.local, 'report.json'), encoding='utf-8') as f:
            local = json.load(f)
        # The same report but for the input's location (in 'input', logdirs and policies).
        remote = json.loads(stored['report.json'].decode().replace(SWEEP, self.sweep))
        self.assertEqual(remote, local)
        self.assertLen([name for name in stored if name.startswith('videos/')], 2)
        self.assertGreater(len([name for name in stored if name.endswith('.svg')]), 10)
        types = {blob.name.rsplit('.', 1)[-1]: blob.content_type
                 for blob in self.emulator.client().list_blobs('reports', prefix='report/')}
        self.assertEqual(types['svg'], 'image/svg+xml')
        self.assertEqual(types['mp4'], 'video/mp4')
        self.assertTrue(types['html'].startswith('text/html'))

        # Copied down, the report is whole: every page links only to files in its folder.
        copy = self.create_tempdir().full_path
        file_io.download_tree('gs://reports/report', copy)
        pages = ['index.html'] + [run['page'] for run in remote['runs']]
        for page in pages:
            for link in links(os.path.join(copy, page)):
                with self.subTest(page=page, link=link):
                    target = link.split('#')[0]
                    if not target or target == 'data:,':
                        continue  # An anchor in the page itself, or the empty favicon.
                    self.assertNotRegex(target, r'^[a-z]+:|^/')
                    path = posixpath.normpath(posixpath.join(posixpath.dirname(page), target))
                    self.assertFalse(path.startswith('..'), path)
                    self.assertTrue(os.path.isfile(os.path.join(copy, path)), path)
        for config in remote['configurations']:
            reader = imageio.get_reader(os.path.join(copy, config['video']['path']),
                                        format='FFMPEG')
            try:
                self.assertEqual(reader.count_frames(), 31)  # Reset + 30 steps.
            finally:
                reader.close()

    def test_rerun_replaces_the_report_and_a_failed_one_keeps_it(self):
        runs = 'gs://reports/small'
        output = 'gs://reports/small-report'
        logdir = report_fixtures.make_run(os.path.join(self.create_tempdir().full_path, 'a'),
                                          [-500.0, -200.0])
        file_io.upload_tree(logdir, f'{runs}/a')
        self.assertEqual(self.run_main(input=runs, output_dir=output, videos=False, **FAST), 0)
        first = self.stored('small-report')
        self.assertIn(report_html.INDEX_FILE, first)
        # A failure keeps the earlier report as it was, and no staging files.
        file_io.upload_tree(logdir, f'{runs}/b')
        with mock.patch.object(report_html, 'write_report', side_effect=OSError('disk full')):
            with self.assertRaisesRegex(Exception, 'disk full'):
                self.run_main(input=runs, output_dir=output, videos=False, **FAST)
        self.assertEqual(self.stored('small-report'), first)
        # A rerun replaces it: run a is gone, and so are its page and plot.
        file_io.delete([f'{runs}/a/{name}' for name in file_io.list_files(f'{runs}/a')])
        self.assertEqual(self.run_main(input=runs, output_dir=output, videos=False, **FAST), 0)
        second = self.stored('small-report')
        written = json.loads(second['report.json'])
        self.assertEqual([run['id'] for run in written['runs']], ['b'])
        self.assertEqual(set(second), {'index.html', 'report.json', 'plots/learning_curves.svg',
                                       'plots/iqm.svg', written['configurations'][0]['plot'],
                                       written['runs'][0]['page'], written['runs'][0]['plot']})

    def test_unknown_bucket_is_one_line_before_anything_is_written(self):
        for args in ([f'--input={self.sweep}', '--output_dir=gs://no-such-bucket/report'],
                     ['--input=gs://no-such-bucket/sweep',
                      f'--output_dir={os.path.join(self.tmp, "never")}']):
            with self.subTest(args):
                process = subprocess.run(report_command(*args), env=self.environment(),
                                         capture_output=True, text=True, timeout=300,
                                         check=False)
                self.assertEqual(process.returncode, 2, process.stderr[-3000:])
                message = process.stderr.strip().splitlines()[-1]
                self.assertRegex(message, r'^report: error: bucket no-such-bucket of '
                                 r'gs://no-such-bucket/\w+ does not exist')
                self.assertEqual(
                    [line for line in process.stderr.splitlines() if 'report:' in line],
                    [message])
                self.assertNotIn('Traceback', process.stderr)
        self.assertFalse(os.path.exists(os.path.join(self.tmp, 'never')))
        self.assertEqual([bucket.name for bucket in self.emulator.client().list_buckets()],
                         ['reports'])

    def test_storage_without_the_gcp_extra_names_the_package(self):
        shim = self.create_tempdir()
        # As if apache-beam were installed without its [gcp] extra.
        shim.create_file('sitecustomize.py',
                         "import sys\nsys.modules['apache_beam.io.gcp'] = None\n")
        env = dict(self.environment(), PYTHONPATH=f'{shim.full_path}:{script_testing.ROOT}')
        for args in ([f'--input={self.sweep}', '--output_dir=gs://reports/nowhere'],
                     [f'--input={SWEEP}', f'--output_dir={os.path.join(self.tmp, "never")}']):
            with self.subTest(args):
                process = subprocess.run(report_command(*args), env=env, capture_output=True,
                                         text=True, timeout=300, check=False)
                self.assertEqual(process.returncode, 2, process.stderr[-3000:])
                self.assertRegex(process.stderr.strip().splitlines()[-1],
                                 r"^report: error: no filesystem for gs:// paths \(gs://reports/"
                                 r"\w+\) is installed: pip install 'apache-beam\[gcp\]'$")
        self.assertFalse(os.path.exists(os.path.join(self.tmp, 'never')))
        self.assertEqual(self.stored('nowhere'), {})

    def test_paths_that_cannot_take_the_report(self):
        file_io.write_text('gs://reports/foreign/notes.txt', 'keep me')
        file_io.write_text('gs://reports/a-file', 'keep me too')
        denied = failures.StorageError('permission denied on gs://reports/denied: the credentials '
                                      'in use may not read and write bucket reports (Forbidden)')
        cases = [
            ({'output_dir': 'gs://reports/foreign'}, 'holds no earlier report'),
            ({'output_dir': 'gs://reports/a-file'}, 'is a file, not a folder'),
            ({'output_dir': 'gs://reports'}, 'contains the input'),
            ({'input': 'gs://reports/nothing-here'}, 'does not exist: nothing is stored'),
        ]
        for flag_values, message in cases:
            with self.subTest(message), mock.patch('sys.stderr') as stderr:
                flag_values = dict({'input': SWEEP, 'output_dir': 'gs://reports/out'},
                                   **flag_values)
                self.assertEqual(self.run_main(**flag_values), 2)
                printed = ''.join(call.args[0] for call in stderr.write.call_args_list)
                self.assertIn(message, printed)
        with mock.patch('sys.stderr') as stderr, \
                mock.patch.object(file_io, 'check_writable', side_effect=denied):
            self.assertEqual(self.run_main(input=SWEEP, output_dir='gs://reports/denied'), 2)
            self.assertEqual(''.join(call.args[0] for call in stderr.write.call_args_list),
                             f'report: error: {denied}\n')
        # Workers on other machines cannot reach this one's paths.
        with mock.patch('sys.stderr') as stderr:
            self.assertEqual(self.run_main(['--runner=DataflowRunner'], input=SWEEP,
                                           output_dir=os.path.join(self.tmp, 'never')), 2)
            self.assertIn('cannot reach the local --output_dir: give gs:// URLs',
                          ''.join(call.args[0] for call in stderr.write.call_args_list))
        self.assertEqual(self.stored('foreign'), {'notes.txt': b'keep me'})
        self.assertEqual(self.stored('out'), {})
        self.assertFalse(os.path.exists(os.path.join(self.tmp, 'never')))


class FindRemoteRunsTest(absltest.TestCase):
    """run_reader on a URL finds and reads what it does in a local directory."""

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.emulator = cls.enterClassContext(gcs_testing.GcsEmulator(buckets=('runs',)))

    def test_finds_and_reads_runs_as_in_a_local_tree(self):
        root = self.create_tempdir().full_path
        make = lambda name, **kwargs: report_fixtures.make_run(  # noqa: E731
            os.path.join(root, name), [-3.0, -1.0], **kwargs)
        make('x/a', train_returns=[-4.0, -2.0])
        make('x/y/b', events=False)
        os.makedirs(os.path.join(root, 'x/a/policy/512'))
        open(os.path.join(root, 'x/a/policy/512/saved_model.pb'), 'wb').close()
        make('x/a/nested/inner')
        make('.hidden/c')
        make('report/d')
        with open(os.path.join(root, 'trials.jsonl'), 'w') as f:
            f.write(json.dumps({'id': 'gone', 'status': 'failed', 'error': 'killed'}) + '\n')
        url = 'gs://runs/tree'
        file_io.upload_tree(root, url)
        local = run_reader.find_runs(root, exclude=[os.path.join(root, 'report')])
        remote = run_reader.find_runs(url + '/', exclude=[url + '/report'])
        self.assertEqual(remote.runs, [(f'{url}/x/a', None), (f'{url}/x/y/b', None)])
        self.assertEqual([run.error.replace(url, root) for run in remote.missing],
                         [run.error for run in local.missing])
        for (logdir, _), (local_logdir, _) in zip(remote.runs, local.runs, strict=True):
            read = run_reader.read_run(logdir, url)
            expected = run_reader.read_run(local_logdir, root)
            self.assertEqual(read.policy_dir and read.policy_dir.replace(url, root),
                             expected.policy_dir)
            self.assertEqual(dataclass_fields(read), dataclass_fields(expected))
        self.assertEqual(run_reader.read_run(f'{url}/x/a', f'{url}/x/a').run_id, 'a')
        with self.assertRaisesRegex(NotADirectoryError, 'not a directory'):
            run_reader.find_runs('gs://runs/nothing')


def dataclass_fields(run):
    """A run's fields but where it was read from."""
    fields = dict(vars(run))
    del fields['logdir'], fields['policy_dir']
    return fields


if __name__ == '__main__':
    absltest.main()
