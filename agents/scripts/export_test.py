"""Tests of the export binary: SavedModels of any checkpoint on demand, bad input."""

import os
import tempfile

import numpy as np
from absl.testing import absltest, flagsaver

from agents.runs import policy_export
from agents.scripts import export, testing_utils
from agents.storage import file_io, gcs_testing


def observations(count):
    return np.random.default_rng(0).uniform(-1, 1, (count, 3)).astype(np.float32)


def run_with_bucket(emulator, tmpdir, *args):
    """Runs the export binary against `emulator`, with temporary directory `tmpdir`."""
    return testing_utils.run_script('export', *args, env=emulator.environment(
        dict(os.environ, TMPDIR=tmpdir)))


class ExportTest(absltest.TestCase):

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.logdir = testing_utils.train_tiny_run(
            os.path.join(tempfile.mkdtemp(dir=absltest.TEST_TMPDIR.value), 'run'),
            bindings=testing_utils.UNCOMPILED)

    def test_exports_a_checkpoint_like_the_trainer_did(self):
        outdir = os.path.join(self.create_tempdir().full_path, 'exported')
        result = testing_utils.run_script('export', f'--logdir={self.logdir}',
                                          '--checkpoint=256', f'--outdir={outdir}')
        self.assertEqual(result.returncode, 0, result.stderr[-3000:])
        self.assertEqual(result.stdout.strip(), outdir)
        for noise in ('Writing fingerprint', 'Assets written', 'contains input name(s)'):
            self.assertNotIn(noise, result.stderr)
        exported = policy_export.SavedPolicy(outdir)
        by_trainer = policy_export.SavedPolicy(os.path.join(self.logdir, 'policy', '256'))
        self.assertEqual(exported.step, 256)
        self.assertEqual(exported.metadata['observation_space'],
                         by_trainer.metadata['observation_space'])
        self.assertIn("train.env_id = 'Pendulum-v1'", exported.config)
        observ = observations(100)
        np.testing.assert_allclose(exported(observ, (), None)[0], by_trainer(observ, (), None)[0],
                                   atol=1e-6)

    def test_default_outdir_replaces_the_export_of_the_latest_checkpoint(self):
        target = os.path.join(self.logdir, 'policy', '512')
        before = policy_export.SavedPolicy(target)(observations(10), (), None)[0]
        inode = os.stat(target).st_ino
        with flagsaver.flagsaver(logdir=self.logdir):
            export.main(['export'])
        self.assertNotEqual(os.stat(target).st_ino, inode)  # A new directory took its place.
        self.assertEqual(sorted(os.listdir(os.path.join(self.logdir, 'policy'))),
                         ['256', '512'])
        after = policy_export.SavedPolicy(target)
        self.assertEqual(after.step, 512)
        np.testing.assert_allclose(after(observations(10), (), None)[0], before, atol=1e-6)

    def assert_fails(self, message, **flags):
        with flagsaver.flagsaver(**flags):
            with self.assertRaises(SystemExit) as raised:
                export.main(['export'])
        self.assertIn('export: error: ', str(raised.exception.code))
        self.assertRegex(str(raised.exception.code), message)

    def test_bad_input_fails_clearly_and_writes_nothing(self):
        directory = self.create_tempdir()
        outdir = os.path.join(directory.full_path, 'out')
        blocker = directory.create_file('file', content='keep')
        foreign = directory.mkdir('foreign')
        foreign.create_file('notes.txt', content='keep')
        fresh = directory.mkdir('fresh')
        fresh.create_file('config.gin', content="train.env_id = 'Pendulum-v1'\n")
        before = testing_utils.snapshot(directory.full_path)
        self.assert_fails('--logdir is required', outdir=outdir)
        self.assert_fails('holds no checkpoint yet', logdir=fresh.full_path, outdir=outdir)
        self.assert_fails('not a training run', logdir=foreign.full_path, outdir=outdir)
        self.assert_fails('checkpoint 9 not found', logdir=self.logdir, checkpoint='9',
                          outdir=outdir)
        self.assert_fails('exists and is not a directory', logdir=self.logdir,
                          outdir=blocker.full_path)
        self.assert_fails('holds other files than an exported policy', logdir=self.logdir,
                          outdir=foreign.full_path)
        self.assert_fails('cannot write to outdir', logdir=self.logdir,
                          outdir=os.path.join(blocker.full_path, 'below'))
        self.assertEqual(testing_utils.snapshot(directory.full_path), before)
        self.assertEqual(sorted(os.listdir(directory.full_path)), ['file', 'foreign', 'fresh'])

    def test_run_in_a_bucket_exports_into_it(self):
        emulator = self.enter_context(gcs_testing.GcsEmulator(buckets=('runs',)))
        tmpdir = self.create_tempdir().full_path
        file_io.upload_tree(self.logdir, 'gs://runs/run')
        stale = 'gs://runs/run/policy/256/variables/variables.data-00001-of-00002'
        file_io.write_bytes(stale, b'of an earlier export')
        result = run_with_bucket(emulator, tmpdir, '--logdir=gs://runs/run', '--checkpoint=256')
        self.assertEqual(result.returncode, 0, result.stderr[-3000:])
        self.assertEqual(result.stdout.strip(), 'gs://runs/run/policy/256')  # The default.
        stored = emulator.objects('runs', 'run/policy/256/')
        self.assertIn('run/policy/256/saved_model.pb', stored)
        self.assertNotIn(stale[len('gs://runs/'):], stored)  # The earlier export is replaced.
        local = os.path.join(self.create_tempdir().full_path, '256')
        file_io.download_tree('gs://runs/run/policy/256', local)
        exported = policy_export.SavedPolicy(local)
        by_trainer = policy_export.SavedPolicy(os.path.join(self.logdir, 'policy', '256'))
        self.assertEqual(exported.step, 256)
        observ = observations(100)
        np.testing.assert_allclose(exported(observ, (), None)[0], by_trainer(observ, (), None)[0],
                                   atol=1e-6)
        self.assertIn('Exported the policy of gs://runs/run/checkpoints/ckpt-256', result.stderr)
        self.assertNotIn('batchppo-copy-', result.stderr)  # URLs, never the local copies.
        self.assertEmpty(testing_utils.local_copies(tmpdir))  # They are gone.

    def test_missing_bucket_fails_in_one_line(self):
        emulator = self.enter_context(gcs_testing.GcsEmulator(buckets=('runs',)))
        tmpdir = self.create_tempdir().full_path
        before = testing_utils.snapshot(self.logdir)
        result = run_with_bucket(emulator, tmpdir, f'--logdir={self.logdir}',
                                 '--outdir=gs://missing-bucket/policy')
        self.assertNotEqual(result.returncode, 0)
        errors = testing_utils.error_lines(result.stderr)
        self.assertLen(errors, 1, result.stderr[-3000:])
        self.assertRegex(errors[0], r'^export: error: bucket missing-bucket of '
                         r'gs://missing-bucket/policy does not exist')
        self.assertNotIn('Traceback', result.stderr)
        self.assertEqual(result.stdout, '')
        self.assertEqual(testing_utils.snapshot(self.logdir), before)
        self.assertEmpty(testing_utils.local_copies(tmpdir))
        # A bucket directory of other files is refused, as a local one is.
        file_io.write_bytes('gs://runs/foreign/notes.txt', b'keep')
        self.assert_fails('outdir gs://runs/foreign holds other files than an exported policy',
                          logdir=self.logdir, outdir='gs://runs/foreign')
        self.assertEqual(emulator.objects('runs'), {'foreign/notes.txt': b'keep'})


if __name__ == '__main__':
    absltest.main()
