"""Tests of StagedLogdir, a bucket run's local staging directory, against a GCS emulator."""

import json
import os
import re
import tempfile
from unittest import mock

import gin
from absl.testing import absltest

from agents.runs import lease as lease_lib
from agents.runs import recovery, remote_logdir, run_config, run_dir
from agents.storage import failures, file_io, gcs_testing, locations

URL = 'gs://runs/run'

# What a trainer's evaluation leaves in its logdir.
SAVE = {
    'config.gin': b'train.env_id = "Pendulum-v1"\n',
    'operative_config.gin': b'# everything\n',
    'events.out.tfevents.1.host': b'events',
    'checkpoints/checkpoint': b'model_checkpoint_path: "ckpt-1"\n',
    'checkpoints/ckpt-1.index': b'index-1',
    'checkpoints/ckpt-1.data-00000-of-00001': b'data-1',
    'policy/2048/saved_model.pb': b'graph',
    'policy/2048/fingerprint.pb': b'fingerprint',
    'policy/2048/variables/variables.index': b'variables-index',
    'policy/2048/variables/variables.data-00000-of-00001': b'variables-data',
    'metrics.jsonl': b'{"step": 2048}\n',
}


def write(directory, files):
    for relative, data in files.items():
        path = os.path.join(directory, *relative.split('/'))
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, 'wb') as f:
            f.write(data)


class StagedLogdirTest(absltest.TestCase):

    def setUp(self):
        super().setUp()
        # StagedLogdir stages in the system's temporary directory: here the test's own.
        self.staging_parent = self.create_tempdir().full_path
        self.enter_context(mock.patch.object(tempfile, 'tempdir', self.staging_parent))
        self.staging_root = self.create_tempdir().full_path
        self.enter_context(mock.patch.dict(os.environ, {
            remote_logdir.STAGING_ENV: self.staging_root}))
        self.emulator = self.enter_context(gcs_testing.GcsEmulator(buckets=('runs',)))

    def run_objects(self):
        return {name[len('run/'):]: data
                for name, data in self.emulator.objects('runs', 'run/').items()}

    def staging_dirs(self):
        return os.listdir(self.staging_root) + [
            name for name in os.listdir(self.staging_parent) if name.startswith('batchppo-run-')]

    def open(self, url=URL, **kwargs):
        staged = remote_logdir.StagedLogdir(url, lease_ttl_s=kwargs.pop('lease_ttl_s', 4.0),
                                            **kwargs)
        local = staged.open()
        self.addCleanup(staged.close, sync=False)
        return staged, local

    def record_uploads(self):
        """The relative paths uploaded and deleted, in order, while the context is open."""
        calls = []
        upload, delete = file_io.upload, file_io.delete

        def recording_upload(local_path, url):
            calls.append(('upload', url[len(URL) + 1:]))
            upload(local_path, url)

        def recording_delete(paths):
            paths = list(paths)
            calls.extend(('delete', path[len(URL) + 1:]) for path in paths)
            delete(paths)

        self.enter_context(mock.patch.object(file_io, 'upload', recording_upload))
        self.enter_context(mock.patch.object(file_io, 'delete', recording_delete))
        return calls

    def test_open_an_empty_prefix(self):
        staged, local = self.open()
        self.assertTrue(os.path.isdir(local))
        self.assertEqual(os.listdir(local), [])
        self.assertEqual(list(self.run_objects()), [run_dir.LEASE_FILE])
        staged.flush()  # Nothing to upload.
        self.assertEqual(list(self.run_objects()), [run_dir.LEASE_FILE])

    def test_sync_uploads_what_a_file_refers_to_before_it(self):
        staged, local = self.open()
        write(local, SAVE)
        calls = self.record_uploads()
        staged.flush()
        uploaded = [relative for kind, relative in calls if kind == 'upload']
        self.assertCountEqual(uploaded, SAVE)
        self.assertNotIn('delete', [kind for kind, _ in calls])
        position = {relative: index for index, relative in enumerate(uploaded)}
        for data in ('checkpoints/ckpt-1.index', 'checkpoints/ckpt-1.data-00000-of-00001',
                     'policy/2048/variables/variables.index',
                     'policy/2048/variables/variables.data-00000-of-00001'):
            for referring in ('checkpoints/checkpoint', 'policy/2048/saved_model.pb'):
                self.assertLess(position[data], position[referring], (data, referring))
        self.assertEqual(uploaded[-1], 'metrics.jsonl')
        self.assertEqual({relative: data for relative, data in self.run_objects().items()
                          if relative != run_dir.LEASE_FILE}, SAVE)

        # Unchanged files are not uploaded again; changed ones are.
        calls.clear()
        staged.flush()
        self.assertEqual(calls, [])
        with open(os.path.join(local, 'metrics.jsonl'), 'ab') as f:
            f.write(b'{"step": 4096}\n')
        staged.flush()
        self.assertEqual(calls, [('upload', 'metrics.jsonl')])
        self.assertEqual(self.run_objects()['metrics.jsonl'],
                         b'{"step": 2048}\n{"step": 4096}\n')

    def test_a_populations_members_upload_each_as_a_run(self):
        staged, local = self.open()
        members = {f'member-{index}/{relative}': data for index in (0, 1)
                   for relative, data in SAVE.items()}
        write(local, {'population.gin': b'train.population = 2\n', **members})
        calls = self.record_uploads()
        staged.flush()
        uploaded = [relative for kind, relative in calls if kind == 'upload']
        position = {relative: index for index, relative in enumerate(uploaded)}
        for member in ('member-0', 'member-1'):
            for data in ('checkpoints/ckpt-1.index', 'policy/2048/variables/variables.index'):
                for referring in ('checkpoints/checkpoint', 'policy/2048/saved_model.pb',
                                  'metrics.jsonl'):
                    self.assertLess(position[f'{member}/{data}'],
                                    position[f'{member}/{referring}'], (member, data, referring))
        self.assertCountEqual(uploaded[-2:], ['member-0/metrics.jsonl', 'member-1/metrics.jsonl'])

    def test_sync_deletes_what_the_trainer_removed_after_uploading(self):
        staged, local = self.open()
        write(local, SAVE)
        staged.flush()
        # The next save: a new checkpoint and policy, the old ones removed.
        for relative in SAVE:
            if relative.startswith(('checkpoints/ckpt-1', 'policy/2048/')):
                os.remove(os.path.join(local, *relative.split('/')))
        write(local, {'checkpoints/checkpoint': b'model_checkpoint_path: "ckpt-2"\n',
                      'checkpoints/ckpt-2.index': b'index-2',
                      'checkpoints/ckpt-2.data-00000-of-00001': b'data-2',
                      'policy/4096/saved_model.pb': b'graph',
                      'policy/4096/variables/variables.index': b'v'})
        with open(os.path.join(local, 'metrics.jsonl'), 'ab') as f:
            f.write(b'{"step": 4096}\n')
        calls = self.record_uploads()
        staged.flush()
        kinds = [kind for kind, _ in calls]
        self.assertEqual(kinds, sorted(kinds, key=['upload', 'delete'].index))  # Deletes last.
        self.assertCountEqual([relative for kind, relative in calls if kind == 'delete'], [
            relative for relative in SAVE
            if relative.startswith(('checkpoints/ckpt-1', 'policy/2048/'))])
        objects = self.run_objects()
        self.assertFalse([name for name in objects if 'ckpt-1' in name or '2048/' in name])
        self.assertEqual(objects['checkpoints/ckpt-2.index'], b'index-2')
        self.assertEqual(objects['policy/4096/saved_model.pb'], b'graph')

    def test_a_sync_cut_at_any_object_leaves_what_resuming_repairs(self):
        # A trainer killed during a sync leaves the bucket with the sync's uploads and deletes
        # done up to some object. Each such bucket, downloaded and cleaned as a resuming
        # trainer does, must name no file it lacks: the checkpoint and policy data before what
        # refers to them, metrics never past a checkpoint.
        def save(step):
            return {f'checkpoints/ckpt-{step}.index': b'index',
                    f'checkpoints/ckpt-{step}.data-00000-of-00001': b'data',
                    f'policy/{step}/saved_model.pb': b'graph',
                    f'policy/{step}/fingerprint.pb': b'fingerprint',
                    f'policy/{step}/variables/variables.index': b'variables-index',
                    f'policy/{step}/variables/variables.data-00000-of-00001': b'variables-data'}

        staged, local = self.open()
        first = {'config.gin': b'', 'checkpoints/checkpoint': b'model_checkpoint_path: '
                 b'"ckpt-2048"\n', 'metrics.jsonl': b'{"step": 2048}\n', **save(2048)}
        write(local, first)
        staged.flush()
        # The next evaluation's save; the rotation removed the first checkpoint and policy.
        for relative in save(2048):
            os.remove(os.path.join(local, *relative.split('/')))
        write(local, {'checkpoints/checkpoint': b'model_checkpoint_path: "ckpt-4096"\n',
                      'metrics.jsonl': b'{"step": 2048}\n{"step": 4096}\n', **save(4096)})
        calls = self.record_uploads()
        staged.flush()
        self.assertLen(calls, 14)  # 8 uploads (the save, the state file, metrics), 6 deletes.

        bucket = dict(first)
        for cut in range(len(calls) + 1):
            if cut:
                kind, relative = calls[cut - 1]
                if kind == 'upload':
                    with open(os.path.join(local, *relative.split('/')), 'rb') as f:
                        bucket[relative] = f.read()
                else:
                    del bucket[relative]
            resumed = self.create_tempdir().full_path
            write(resumed, bucket)
            checkpoints = os.path.join(resumed, 'checkpoints')
            recovery.clean_partial_writes(resumed, checkpoints, os.path.join(resumed, 'policy'))
            names = set(file_io.list_files(resumed))
            where = f'cut after {calls[:cut]}'
            steps = set()
            for name in names:
                if name.startswith('checkpoints/ckpt-'):
                    prefix = name.split('.')[0]
                    self.assertLessEqual({f'{prefix}.index', f'{prefix}.data-00000-of-00001'},
                                         names, where)
                    steps.add(int(prefix.split('-')[-1]))
                if name.startswith('policy/'):
                    export = '/'.join(name.split('/')[:2])
                    self.assertLessEqual({f'{export}/saved_model.pb',
                                          f'{export}/variables/variables.index',
                                          f'{export}/variables/variables.data-00000-of-00001'},
                                         names, where)
            with open(os.path.join(checkpoints, 'checkpoint')) as f:
                named = int(f.read().split('ckpt-')[1].split('"')[0])
            self.assertIn(named, steps, where)
            with open(os.path.join(resumed, 'metrics.jsonl')) as f:
                logged = max(json.loads(line)['step'] for line in f)
            self.assertLessEqual(logged, max(steps), where)

    def test_temporary_files_are_not_uploaded(self):
        staged, local = self.open()
        write(local, {'metrics.jsonl.tmp-123': b'partial', 'config.gin': b'x'})
        staged.flush()
        self.assertEqual(sorted(self.run_objects()), [run_dir.LEASE_FILE, 'config.gin'])

    def test_trial_files_are_neither_downloaded_nor_touched(self):
        write_remote = {'train.log': b'trial output\n', 'result.json': b'{"ok": true}',
                        'config.gin': b'x', 'checkpoints/ckpt-1.index': b'i'}
        for relative, data in write_remote.items():
            file_io.write_bytes(locations.join(URL, relative), data)
        staged, local = self.open()
        self.assertEqual(file_io.list_files(local), {'config.gin': 1,
                                                     'checkpoints/ckpt-1.index': 1})
        # The trainer removes its checkpoint and writes files of the trial's names.
        os.remove(os.path.join(local, 'checkpoints', 'ckpt-1.index'))
        write(local, {'train.log': b'local', run_dir.LOCK_FILE: b''})
        staged.flush()
        staged.close()
        self.assertEqual(self.run_objects(), {'train.log': b'trial output\n',
                                              'result.json': b'{"ok": true}',
                                              'config.gin': b'x'})

    def test_a_second_staged_logdir_downloads_the_run(self):
        first, local = self.open()
        write(local, SAVE)
        first.close()
        self.assertFalse(os.path.exists(local))
        self.assertNotIn(run_dir.LEASE_FILE, self.run_objects())
        self.assertEqual(self.staging_dirs(), [])
        second, copy = self.open()
        self.assertEqual({relative: file_io.read_bytes(os.path.join(copy, relative))
                          for relative in file_io.list_files(copy)}, SAVE)
        # Downloaded files are not uploaded again.
        calls = self.record_uploads()
        second.flush()
        self.assertEqual(calls, [])

    def test_close_releases_the_lease_and_removes_the_staging_dir(self):
        staged, local = self.open()
        self.assertIn(run_dir.LEASE_FILE, self.run_objects())
        write(local, {'metrics.jsonl': b'{"step": 1}\n'})
        staged.close()  # Syncs first.
        self.assertEqual(self.run_objects(), {'metrics.jsonl': b'{"step": 1}\n'})
        self.assertFalse(os.path.exists(local))
        self.assertEqual(self.staging_dirs(), [])
        staged.close()  # Twice is no error.

    def test_unsaved_work_stays_for_a_rerun_which_uploads_it(self):
        staged, local = self.open()
        write(local, SAVE)
        staged.flush()
        # The trainer saved once more, and stopped before that save reached the bucket.
        write(local, {'checkpoints/checkpoint': b'model_checkpoint_path: "ckpt-2"\n',
                      'checkpoints/ckpt-2.index': b'index-2',
                      'checkpoints/ckpt-2.data-00000-of-00001': b'data-2',
                      'metrics.jsonl': b'{"step": 2048}\n{"step": 4096}\n'})
        staged.close(sync=False)
        self.assertLen(self.staging_dirs(), 1)
        self.assertTrue(os.path.isfile(os.path.join(local, 'checkpoints', 'ckpt-2.index')))
        self.assertNotIn('checkpoints/ckpt-2.index', self.run_objects())
        # A rerun on this machine resumes from the local copy (newer than the bucket's) and
        # uploads only what the bucket lacks.
        calls = self.record_uploads()
        rerun, copy = self.open()
        self.assertEqual(copy, local)
        rerun.close()
        self.assertCountEqual([relative for kind, relative in calls if kind == 'upload'], [
            'checkpoints/checkpoint', 'checkpoints/ckpt-2.index',
            'checkpoints/ckpt-2.data-00000-of-00001', 'metrics.jsonl'])
        self.assertEqual(self.run_objects()['checkpoints/ckpt-2.index'], b'index-2')
        self.assertEqual(self.staging_dirs(), [])

    def test_a_local_copy_older_than_the_bucket_is_replaced(self):
        staged, local = self.open()
        write(local, {'checkpoints/ckpt-1.index': b'old', 'metrics.jsonl': b'{"step": 1}\n'})
        staged.close(sync=False)  # Left behind, never uploaded.
        # Another machine went further meanwhile.
        for relative, data in {'checkpoints/ckpt-5.index': b'new',
                               'metrics.jsonl': b'{"step": 5}\n'}.items():
            file_io.write_bytes(locations.join(URL, relative), data)
        rerun, copy = self.open()
        self.assertEqual(file_io.list_files(copy), {'checkpoints/ckpt-5.index': 3,
                                                    'metrics.jsonl': 12})

    def test_close_without_sync_of_a_copy_the_bucket_holds(self):
        write_remote = {'config.gin': b'x'}
        for relative, data in write_remote.items():
            file_io.write_bytes(locations.join(URL, relative), data)
        staged, local = self.open()
        staged.close(sync=False)
        self.assertEqual(self.staging_dirs(), [])
        self.assertEqual(self.run_objects(), write_remote)

    def test_open_a_missing_bucket(self):
        staged = remote_logdir.StagedLogdir('gs://missing-bucket/run', lease_ttl_s=4.0)
        with self.assertRaises(failures.StorageError) as raised:
            staged.open()
        self.assertIn('missing-bucket', str(raised.exception))
        self.assertIn('does not exist', str(raised.exception))
        self.assertIsNone(staged.local)
        self.assertEqual(self.staging_dirs(), [])
        self.assertIsNone(staged._lease._generation)  # No lease taken, none renewed.
        self.assertIsNone(staged._lease._thread)

    def test_open_a_run_another_trainer_holds(self):
        with mock.patch.object(lease_lib.socket, 'gethostname', return_value='machine-b'):
            holder = lease_lib.Lease(URL, ttl_s=4.0).acquire()
        self.addCleanup(holder.release)
        write_remote = {'config.gin': b'x'}
        for relative, data in write_remote.items():
            file_io.write_bytes(locations.join(URL, relative), data)
        staged = remote_logdir.StagedLogdir(URL, lease_ttl_s=4.0)
        with self.assertRaisesRegex(lease_lib.LeaseHeld, 'machine-b'):
            staged.open()
        self.assertIsNone(staged.local)
        self.assertEqual(self.staging_dirs(), [])
        self.assertEqual(self.run_objects()[run_dir.LEASE_FILE][:1], b'{')
        self.assertIn('machine-b', self.run_objects()[run_dir.LEASE_FILE].decode())

    def test_open_when_the_lease_cannot_be_written(self):
        from google.api_core import exceptions
        staged = remote_logdir.StagedLogdir(URL, lease_ttl_s=4.0)
        with mock.patch.object(lease_lib.Lease, 'acquire', side_effect=exceptions.Forbidden(
                'no storage.objects.create access to runs/run/.lease')):
            with self.assertRaisesRegex(failures.StorageError, 'permission denied'):
                staged.open()
        self.assertIsNone(staged.local)
        self.assertEqual(self.staging_dirs(), [])

    def test_a_failed_upload_is_told_and_retried(self):
        from google.api_core import exceptions
        staged, local = self.open()
        write(local, {'config.gin': b'x', 'metrics.jsonl': b'{"step": 1}\n'})
        upload = file_io.upload

        def failing_upload(local_path, url):
            if url.endswith('metrics.jsonl'):
                raise exceptions.ServiceUnavailable('try again\nlater')
            upload(local_path, url)

        with mock.patch.object(file_io, 'upload', failing_upload):
            staged.sync()  # Returns at once: the upload fails in the background.
            with self.assertRaises(failures.StorageError) as raised:
                staged.flush(timeout_s=0.5)
            self.assertRegex(staged.status(), r'^storage unreachable for \d+ s, 2 saves pending')
        self.assertIn('cannot access gs://runs/run', str(raised.exception))
        self.assertIn(f'only in {os.path.dirname(local)}', str(raised.exception))
        self.assertNotIn('\n', str(raised.exception))
        self.assertNotIn('metrics.jsonl', self.run_objects())
        calls = self.record_uploads()
        staged.flush()
        self.assertEqual(calls, [('upload', 'metrics.jsonl')])
        self.assertEqual(self.run_objects()['metrics.jsonl'], b'{"step": 1}\n')
        self.assertIsNone(staged.status())

    def test_sync_after_the_lease_was_lost_uploads_nothing(self):
        staged, local = self.open(lease_ttl_s=2.0)
        self.emulator.client().bucket('runs').blob('run/' + run_dir.LEASE_FILE).upload_from_string(
            b'{"pid": 1, "host": "machine-b", "expires": 1e12}')
        with self.assertRaises(lease_lib.LeaseHeld):
            staged._lease.renew()
        write(local, {'metrics.jsonl': b'{"step": 1}\n'})
        with self.assertRaisesRegex(failures.StorageError, 'lost the lease'):
            staged.flush()
        self.assertNotIn('metrics.jsonl', self.run_objects())
        with self.assertRaisesRegex(failures.StorageError, 'lost the lease'):
            staged.close()
        # This trainer's work stays on this machine; the bucket's run is the other trainer's.
        self.assertTrue(os.path.isfile(os.path.join(local, 'metrics.jsonl')))
        self.assertIn('machine-b', self.run_objects()[run_dir.LEASE_FILE].decode())

    def test_read_only(self):
        file_io.write_bytes(locations.join(URL, 'metrics.jsonl'), b'{"step": 1}\n')
        staged, local = self.open(read_only=True)
        self.assertEqual(file_io.list_files(local), {'metrics.jsonl': 12})
        write(local, {'config.gin': b'x'})
        staged.close()
        self.assertEqual(self.run_objects(), {'metrics.jsonl': b'{"step": 1}\n'})


class StagingSettingsTest(absltest.TestCase):

    def tearDown(self):
        gin.clear_config()
        super().tearDown()

    def test_defaults_and_bindings(self):
        self.assertEqual(remote_logdir.staging_settings(),
                         remote_logdir.StagingSettings(1800.0, 20))
        gin.parse_config(['staging.max_outage_s = 30', 'staging.max_pending_saves = 3'])
        self.assertEqual(remote_logdir.staging_settings(),
                         remote_logdir.StagingSettings(30.0, 3))

    def test_bad_settings_are_refused_by_name(self):
        for binding, message in (
                ('staging.max_outage_s = 0', 'staging.max_outage_s must be a positive number of '
                                             'seconds, got 0'),
                ("staging.max_outage_s = 'long'", "got 'long'"),
                ('staging.max_pending_saves = 2.5', 'staging.max_pending_saves must be a '
                                                    'positive integer, got 2.5'),
                ('staging.max_pending_saves = True', 'got True')):
            gin.clear_config()
            gin.parse_config([binding])
            with self.assertRaisesWithLiteralMatch(run_config.ConfigError, message) if (
                    message.startswith('staging')) else self.assertRaisesRegex(
                        run_config.ConfigError, re.escape(message)):
                remote_logdir.staging_settings()


if __name__ == '__main__':
    absltest.main()
