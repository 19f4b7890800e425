"""Tests for run_config: gin loading errors, path resolution and logdir checks."""

import functools
import os
import subprocess
import sys
from unittest import mock

import gin
from absl.testing import absltest

from agents.runs import run_config, run_dir
from agents.storage import locations


@gin.configurable
def configurable_for_test(value=1):
    return value


@gin.configurable(denylist=['made_by_caller'])
def configurable_with_caller_argument(made_by_caller=None, value=1):
    return made_by_caller, value


class LoadTest(absltest.TestCase):

    def setUp(self):
        super().setUp()
        self.dir = self.create_tempdir()
        self.addCleanup(gin.clear_config)

    def test_parses_files_and_bindings(self):
        # Not base.gin: gin's search path, which every load extends, holds the bundled one.
        base = self.dir.create_file('shared_for_test.gin', 'configurable_for_test.value = 2\n')
        task = self.dir.create_file('task.gin', "include 'shared_for_test.gin'\n")
        del base
        config = run_config.load([task.full_path], ['configurable_for_test.value = 3'])
        self.assertEqual(configurable_for_test(), 3)
        self.assertIn('configurable_for_test.value = 3', config)

    def test_a_seed_given_once_stands_and_two_that_disagree_are_refused(self):
        task = self.dir.create_file('task.gin', '')
        load = functools.partial(run_config.load, [task.full_path],
                                 seed_binding='configurable_for_test.value', default_seed=0)
        # A binding alone (train.seed = 3 without --seed) is not overridden by the default.
        self.assertIn('configurable_for_test.value = 3',
                      load(['configurable_for_test.value = 3']))
        self.assertEqual(configurable_for_test(), 3)
        # Neither: the default, written into the configuration.
        self.assertIn('configurable_for_test.value = 0', load([]))
        # The seed alone, or both agreeing.
        self.assertIn('configurable_for_test.value = 7', load([], seed=7))
        load(['configurable_for_test.value = 3'], seed=3)
        with self.assertRaisesRegex(run_config.ConfigError, r'the seed 4 \(--seed\) and '
                                    r'configurable_for_test.value = 3 of the configuration '
                                    'disagree; give the seed once'):
            load(['configurable_for_test.value = 3'], seed=4)

    def test_relative_paths_resolve_against_the_callers_directory(self):
        self.dir.create_file('task.gin', 'configurable_for_test.value = 5\n')
        with mock.patch.dict(os.environ, {'BUILD_WORKING_DIRECTORY': self.dir.full_path}):
            run_config.load(['task.gin'], [])
            self.assertEqual(locations.resolve('logs/x'),
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

    def test_binding_an_argument_the_caller_passes_is_refused_by_name(self):
        task = self.dir.create_file('task.gin', 'configurable_with_caller_argument.value = 2\n')
        with self.assertRaisesRegex(
                run_config.ConfigError, 'configurable_with_caller_argument.made_by_caller cannot '
                'be bound: the code that makes configurable_with_caller_argument passes '
                'made_by_caller itself, so a binding would do nothing'):
            run_config.load([task.full_path],
                            ['configurable_with_caller_argument.made_by_caller = 3'])

    def test_syntax_error(self):
        task = self.dir.create_file('task.gin', 'configurable_for_test.value = (\n')
        with self.assertRaisesRegex(run_config.ConfigError, 'invalid gin configuration'):
            run_config.load([task.full_path], [])


class PrepareLogdirTest(absltest.TestCase):

    def test_new_logdir_stores_the_config(self):
        logdir = os.path.join(self.create_tempdir().full_path, 'a', 'b')
        self.assertEqual(run_config.prepare_logdir(logdir, 'x = 1\n'), logdir)
        with open(os.path.join(logdir, run_dir.CONFIG_FILE)) as f:
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
        with open(os.path.join(logdir.full_path, run_dir.CONFIG_FILE)) as f:
            self.assertEqual(f.read(), 'x = 1\n')

    def test_config_difference(self):
        self.assertEqual(run_config.config_difference('x = 1\n', 'x = 1\n', 'a', 'b'), '')
        self.assertEqual(run_config.config_difference('x = 1\ny = 2\n', 'x = 1\ny = 3\n',
                                                      'a', 'b'),
                         '--- a\n+++ b\n@@ -1,2 +1,2 @@\n x = 1\n-y = 2\n+y = 3\n')

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


def gin_config(total_steps='1000', learning_rate='0.001', algorithm='@PPO'):
    """A configuration as gin.config_str writes it."""
    return (f'# Parameters for PPO:\n# {"=" * 78}\nPPO.learning_rate = {learning_rate}\n'
            f'PPO.policy_network = @FeedForwardGaussianPolicy\n\n'
            f'# Parameters for train:\n# {"=" * 78}\ntrain.algorithm = {algorithm}\n'
            f"train.env_id = 'Pendulum-v1'\ntrain.total_steps = {total_steps}\n"
            "train.wrappers = \\\n    ['range_normalize',\n     'ClipAction']\n")


class BudgetTest(absltest.TestCase):
    """A rerun may raise a run's train.total_steps, and change nothing else."""

    def run_of(self, config):
        logdir = self.create_tempdir()
        run_config.prepare_logdir(logdir.full_path, config)
        logdir.create_file('metrics.jsonl', '{"step": 1000}\n')
        return logdir.full_path

    def read_config(self, logdir):
        with open(os.path.join(logdir, run_dir.CONFIG_FILE)) as f:
            return f.read()

    def test_raised_budget_is_resumed_with_a_warning_and_stored(self):
        logdir = self.run_of(gin_config('1000'))
        # Checking changes nothing.
        self.assertTrue(run_config.check_logdir(logdir, gin_config('5000')))
        self.assertEqual(self.read_config(logdir), gin_config('1000'))
        with mock.patch.object(run_config.logging, 'warning') as warning:
            self.assertEqual(run_config.prepare_logdir(logdir, gin_config('5000')), logdir)
        warning.assert_called_once()
        message = warning.call_args[0][0] % warning.call_args[0][1:]
        self.assertIn(f'Raising the budget of the run in {logdir} from train.total_steps = 1000 '
                      'to 5000', message)
        self.assertIn('schedules (learning-rate annealing), which were set for 1000 steps, now '
                      'run to 5000 from the current step on', message)
        self.assertEqual(self.read_config(logdir), gin_config('5000'))
        self.assertEqual(sorted(os.listdir(logdir)), ['config.gin', 'metrics.jsonl'])
        # Then it is the run's configuration: no warning again.
        with mock.patch.object(run_config.logging, 'warning') as warning:
            run_config.prepare_logdir(logdir, gin_config('5000'))
        warning.assert_not_called()

    def test_lowered_budget_is_refused_pointing_to_stop_at_step(self):
        logdir = self.run_of(gin_config('5000'))
        with self.assertRaisesRegex(
                run_config.ConfigError, f'logdir {logdir} holds a run of train.total_steps = '
                '5000, and a budget can only be raised, not lowered to 1000; to stop the run '
                r'early, keep train.total_steps = 5000 and pass --stop_at_step=1000'):
            run_config.prepare_logdir(logdir, gin_config('1000'))
        self.assertEqual(self.read_config(logdir), gin_config('5000'))

    def test_any_other_difference_is_refused_with_the_difference(self):
        logdir = self.run_of(gin_config('1000'))
        for config in (gin_config('5000', learning_rate='0.0001'),
                       gin_config('1000', learning_rate='0.0001'),
                       gin_config('5000', algorithm='@A2C'),
                       gin_config('%STEPS'),  # A macro: not an integer.
                       gin_config('5000').replace('train.total_steps', 'eval/train.total_steps'),
                       gin_config('5000') + 'train.total_steps = 6000\n'):
            with self.subTest(config=config), self.assertRaisesRegex(
                    run_config.ConfigError, r'holds a run of a different configuration(.|\n)*'
                    r'\+\+\+ this run'):
                run_config.prepare_logdir(logdir, config)
        self.assertEqual(self.read_config(logdir), gin_config('1000'))

    def test_budget_change_parses_the_binding_not_its_formatting(self):
        stored = gin_config('1000')
        self.assertEqual(run_config.budget_change(stored, gin_config('5000')), (1000, 5000))
        self.assertEqual(run_config.budget_change(stored, gin_config('500')), (1000, 500))
        for written in ('train.total_steps=5_000', 'train.total_steps  =  5000  ',
                        'train.total_steps = \\\n    5000'):
            changed = stored.replace('train.total_steps = 1000', written)
            self.assertEqual(run_config.budget_change(stored, changed), (1000, 5000), written)
        # The same budget written otherwise is the same run.
        logdir = self.run_of(stored)
        self.assertTrue(run_config.check_logdir(
            logdir, stored.replace('train.total_steps = 1000', 'train.total_steps = 1_000')))
        self.assertIsNone(run_config.budget_change(stored, stored.replace('1000', "'1000'")))
        self.assertIsNone(run_config.budget_change('x = 1\n', 'x = 2\n'))
        # A continuation line (of the wrapped list) is no binding.
        moved = stored.replace('train.total_steps = 1000\n', '').replace(
            "     'ClipAction']", "     'ClipAction']\n    train.total_steps = 5000")
        self.assertIsNone(run_config.budget_change(stored, moved))


class LogdirLockTest(absltest.TestCase):

    def hold_in_another_process(self, logdir):
        """A process holding the logdir's lock until its stdin closes; returns it."""
        holder = subprocess.Popen(
            [sys.executable, '-c', 'import sys; from agents.runs import run_config; '
             f'lock = run_config.lock_logdir({logdir!r}); print("locked", flush=True); '
             'sys.stdin.read()'],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            env=dict(os.environ, PYTHONPATH=run_config.PACKAGE_ROOT))
        self.addCleanup(holder.wait)
        self.addCleanup(holder.stdin.close)
        self.assertEqual(holder.stdout.readline().strip(), 'locked')
        return holder

    def test_held_lock_refuses_with_the_holder_and_changes_nothing(self):
        logdir = self.create_tempdir().full_path
        run_config.prepare_logdir(logdir, 'x = 1\n')
        holder = self.hold_in_another_process(logdir)
        before = sorted(os.listdir(logdir))
        pattern = rf'logdir {logdir} is in use by another trainer: pid {holder.pid} on \S+ since'
        with self.assertRaisesRegex(run_config.ConfigError, pattern):
            run_config.check_logdir(logdir, 'x = 1\n')
        with self.assertRaisesRegex(run_config.ConfigError, pattern):
            run_config.lock_logdir(logdir)
        self.assertEqual(sorted(os.listdir(logdir)), before)
        holder.stdin.close()
        holder.wait()
        # Its lock died with it: the file stays and tells who held the logdir last.
        lock = run_config.lock_logdir(logdir)
        self.assertEqual(lock.previous_holder['pid'], holder.pid)
        self.assertEqual(lock.holder['pid'], os.getpid())
        lock.release()

    def test_own_lock_does_not_block_its_holder(self):
        logdir = os.path.join(self.create_tempdir().full_path, 'run')
        lock = run_config.lock_logdir(logdir)
        self.assertFalse(run_config.check_logdir(logdir, 'x = 1\n'))  # Only .lock: empty.
        self.assertEqual(run_config.prepare_logdir(logdir, 'x = 1\n'), logdir)
        self.assertTrue(run_config.check_logdir(logdir, 'x = 1\n'))
        lock.release()

    def test_unwritable_parent_is_found_before_anything_is_created(self):
        parent = self.create_tempfile('file').full_path
        with self.assertRaisesRegex(run_config.ConfigError,
                                    f'cannot write to logdir {parent}/a/b: {parent} is not a '
                                    'writable directory'):
            run_config.check_logdir(os.path.join(parent, 'a', 'b'), 'x = 1\n')
        with self.assertRaisesRegex(run_config.ConfigError, 'cannot write to logdir'):
            run_config.lock_logdir(os.path.join(parent, 'a'))


class PythonPathTest(absltest.TestCase):

    def test_python_path_puts_this_tree_first_once(self):
        root = run_config.PACKAGE_ROOT
        self.assertEqual(run_config.python_path(''), root)
        self.assertEqual(run_config.python_path(os.pathsep.join(['/a', root, '', '/b', '/a'])),
                         os.pathsep.join([root, '/a', '/b']))


class ReplaceDirectoryTest(absltest.TestCase):

    def _directory(self, path, text):
        os.makedirs(path)
        with open(os.path.join(path, 'file'), 'w') as f:
            f.write(text)

    def _read(self, path):
        with open(os.path.join(path, 'file')) as f:
            return f.read()

    def test_moves_and_replaces(self):
        root = self.create_tempdir().full_path
        new, destination = os.path.join(root, 'new'), os.path.join(root, 'destination')
        self._directory(new, 'first')
        run_config.replace_directory(new, destination)
        self.assertEqual(self._read(destination), 'first')
        self._directory(new, 'second')
        run_config.replace_directory(new, destination)
        self.assertEqual(self._read(destination), 'second')
        self.assertEqual(sorted(os.listdir(root)), ['destination'])

    def test_keeps_the_earlier_directory_when_the_move_fails(self):
        root = self.create_tempdir().full_path
        destination = os.path.join(root, 'destination')
        self._directory(destination, 'earlier')
        with self.assertRaises(OSError):
            run_config.replace_directory(os.path.join(root, 'missing'), destination)
        self.assertEqual(self._read(destination), 'earlier')
        self.assertEqual(sorted(os.listdir(root)), ['destination'])


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
