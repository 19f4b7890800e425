"""Tests for run_config: gin loading errors, path resolution and logdir checks."""

import os
from unittest import mock

import gin
from absl.testing import absltest

from agents.scripts import run_config


@gin.configurable
def configurable_for_test(value=1):
    return value


class LoadTest(absltest.TestCase):

    def setUp(self):
        super().setUp()
        self.dir = self.create_tempdir()
        self.addCleanup(gin.clear_config)

    def test_parses_files_bindings_and_seed(self):
        base = self.dir.create_file('base.gin', 'configurable_for_test.value = 2\n')
        task = self.dir.create_file('task.gin', "include 'base.gin'\n")
        del base
        config = run_config.load([task.full_path], ['configurable_for_test.value = 3'], seed=7,
                                 seed_binding='configurable_for_test.value')
        self.assertEqual(configurable_for_test(), 7)
        self.assertIn('configurable_for_test.value = 7', config)

    def test_relative_paths_resolve_against_the_callers_directory(self):
        self.dir.create_file('task.gin', 'configurable_for_test.value = 5\n')
        with mock.patch.dict(os.environ, {'BUILD_WORKING_DIRECTORY': self.dir.full_path}):
            run_config.load(['task.gin'], [])
            self.assertEqual(run_config.resolve_path('logs/x'),
                             os.path.join(self.dir.full_path, 'logs', 'x'))
        self.assertEqual(configurable_for_test(), 5)

    def test_finds_bundled_configs(self):
        self.assertEqual(run_config.find_gin_file('pendulum.gin'),
                         os.path.join(run_config.BUNDLED_CONFIGS, 'pendulum.gin'))

    def test_missing_file(self):
        with self.assertRaisesRegex(run_config.ConfigError, "gin file 'nope.gin' not found"):
            run_config.load(['nope.gin'], [])

    def test_no_file(self):
        with self.assertRaisesRegex(run_config.ConfigError, 'no --gin_file'):
            run_config.load([], [])

    def test_unknown_configurable(self):
        task = self.dir.create_file('task.gin', 'no_such_thing.value = 1\n')
        with self.assertRaisesRegex(run_config.ConfigError, 'no_such_thing'):
            run_config.load([task.full_path], [])

    def test_unknown_parameter_in_binding(self):
        task = self.dir.create_file('task.gin', '')
        with self.assertRaisesRegex(run_config.ConfigError, 'no_such_parameter'):
            run_config.load([task.full_path], ['configurable_for_test.no_such_parameter = 1'])

    def test_syntax_error(self):
        task = self.dir.create_file('task.gin', 'configurable_for_test.value = (\n')
        with self.assertRaisesRegex(run_config.ConfigError, 'invalid gin configuration'):
            run_config.load([task.full_path], [])


class PrepareLogdirTest(absltest.TestCase):

    def test_new_logdir_stores_the_config(self):
        logdir = os.path.join(self.create_tempdir().full_path, 'a', 'b')
        self.assertEqual(run_config.prepare_logdir(logdir, 'x = 1\n'), logdir)
        with open(os.path.join(logdir, run_config.CONFIG_FILE)) as f:
            self.assertEqual(f.read(), 'x = 1\n')

    def test_same_config_resumes(self):
        logdir = self.create_tempdir().full_path
        run_config.prepare_logdir(logdir, 'x = 1\n')
        self.assertEqual(run_config.prepare_logdir(logdir, 'x = 1\n'), logdir)

    def test_different_config_is_refused_and_untouched(self):
        logdir = self.create_tempdir()
        run_config.prepare_logdir(logdir.full_path, 'x = 1\n')
        logdir.create_file('metrics.jsonl', '{"step": 1}\n')
        before = sorted(os.listdir(logdir.full_path))
        with self.assertRaisesRegex(run_config.ConfigError, r'different configuration(.|\n)*'
                                    r'-x = 1(.|\n)*\+x = 2'):
            run_config.prepare_logdir(logdir.full_path, 'x = 2\n')
        self.assertEqual(sorted(os.listdir(logdir.full_path)), before)
        with open(os.path.join(logdir.full_path, run_config.CONFIG_FILE)) as f:
            self.assertEqual(f.read(), 'x = 1\n')

    def test_foreign_non_empty_directory_is_refused(self):
        logdir = self.create_tempdir()
        logdir.create_file('notes.txt', 'mine')
        with self.assertRaisesRegex(run_config.ConfigError, 'not a BatchPPO run'):
            run_config.prepare_logdir(logdir.full_path, 'x = 1\n')
        self.assertEqual(os.listdir(logdir.full_path), ['notes.txt'])

    def test_logdir_that_is_a_file(self):
        path = self.create_tempfile().full_path
        with self.assertRaisesRegex(run_config.ConfigError, 'not a directory'):
            run_config.prepare_logdir(path, 'x = 1\n')

    def test_unwritable_logdir(self):
        # A path below a regular file cannot be created, whoever runs the test (even root).
        parent = self.create_tempfile('file').full_path
        with self.assertRaisesRegex(run_config.ConfigError, 'cannot write to logdir'):
            run_config.prepare_logdir(os.path.join(parent, 'run'), 'x = 1\n')
        self.assertTrue(os.path.isfile(parent))


class WriteAtomicTest(absltest.TestCase):

    def test_replaces_whole_file_and_leaves_no_temporary(self):
        directory = self.create_tempdir()
        path = os.path.join(directory.full_path, 'f.txt')
        run_config.write_atomic(path, 'one')
        run_config.write_atomic(path, 'two')
        with open(path) as f:
            self.assertEqual(f.read(), 'two')
        self.assertEqual(os.listdir(directory.full_path), ['f.txt'])


if __name__ == '__main__':
    absltest.main()
