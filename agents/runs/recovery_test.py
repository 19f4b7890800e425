"""Tests for recovery: leftovers of killed writes, broken checkpoints, cut metrics lines."""

import os

import tensorflow as tf
from absl.testing import absltest

from agents.runs import recovery, run_dir


def make_checkpoints(directory, steps):
    """Checkpoints of one variable (value = step) through a CheckpointManager."""
    variable = tf.Variable(0.0)
    manager = tf.train.CheckpointManager(tf.train.Checkpoint(v=variable), directory,
                                         max_to_keep=len(steps))
    for step in steps:
        variable.assign(float(step))
        manager.save(checkpoint_number=step)
    return manager


def restored_value(path):
    variable = tf.Variable(-1.0)
    tf.train.Checkpoint(v=variable).restore(path).assert_existing_objects_matched()
    return float(variable.numpy())


class CheckpointsTestCase(absltest.TestCase):
    """Three checkpoints, of steps 10, 20 and 30, in `self.directory`."""

    def setUp(self):
        super().setUp()
        self.directory = os.path.join(self.create_tempdir().full_path, 'checkpoints')
        make_checkpoints(self.directory, [10, 20, 30])

    def path(self, step, suffix=''):
        return os.path.join(self.directory, f'ckpt-{step}{suffix}')


class CheckpointRecoveryTest(CheckpointsTestCase):

    def state(self):
        state = tf.train.get_checkpoint_state(self.directory)
        return ([recovery.checkpoint_step(path) for path in state.all_model_checkpoint_paths],
                recovery.checkpoint_step(state.model_checkpoint_path))

    def test_intact_checkpoints_are_left_alone(self):
        with open(os.path.join(self.directory, 'checkpoint')) as f:
            before = f.read()
        recovered = recovery.recover_checkpoints(self.directory)
        self.assertEqual(recovered.valid, [self.path(10), self.path(20), self.path(30)])
        self.assertEqual(recovered.corrupt, [])
        with open(os.path.join(self.directory, 'checkpoint')) as f:
            self.assertEqual(f.read(), before)

    def test_problems_of_broken_checkpoints(self):
        self.assertIsNone(recovery.checkpoint_problem(self.path(30)))
        data = self.path(30, '.data-00000-of-00001')
        with open(data, 'r+b') as f:
            f.truncate(os.path.getsize(data) // 2)
        self.assertIsNotNone(recovery.checkpoint_problem(self.path(30)))
        with open(self.path(20, '.index'), 'wb') as f:
            f.write(b'garbage')
        self.assertIsNotNone(recovery.checkpoint_problem(self.path(20)))
        self.assertEqual(recovery.checkpoint_problem(self.path(40)), 'ckpt-40.index is missing')

    def test_overwritten_data_is_caught_by_the_checksums(self):
        data = self.path(30, '.data-00000-of-00001')
        size = os.path.getsize(data)
        with open(data, 'r+b') as f:
            f.write(b'\x7f' * size)
        self.assertRegex(recovery.checkpoint_problem(self.path(30)), '(?i)checksum|corrupt|data')

    def test_broken_latest_is_moved_aside_and_the_state_names_the_rest(self):
        with open(self.path(30, '.index'), 'wb') as f:
            f.write(b'garbage')
        recovered = recovery.recover_checkpoints(self.directory)
        self.assertEqual(recovered.latest, self.path(20))
        self.assertEqual([path for path, _ in recovered.corrupt], [self.path(30)])
        self.assertEqual(self.state(), ([10, 20], 20))
        self.assertCountEqual(os.listdir(os.path.join(self.directory, 'corrupt')),
                              ['ckpt-30.index', 'ckpt-30.data-00000-of-00001'])
        self.assertEqual(restored_value(tf.train.latest_checkpoint(self.directory)), 20.0)
        # A manager made now rotates the recovered checkpoints as its own.
        manager = make_checkpoints(self.directory, [40, 50])
        self.assertEqual(manager.checkpoints, [self.path(40), self.path(50)])
        self.assertFalse(os.path.exists(self.path(10, '.index')))

    def test_complete_checkpoint_missing_from_the_state_is_used(self):
        # Killed after writing ckpt-40 but before the state file named it.
        os.rename(os.path.join(self.directory, 'checkpoint'), os.path.join(self.directory, 'x'))
        make_checkpoints(self.directory, [40])
        os.replace(os.path.join(self.directory, 'x'), os.path.join(self.directory, 'checkpoint'))
        self.assertEqual(self.state(), ([10, 20, 30], 30))
        self.assertEqual(recovery.recover_checkpoints(self.directory).latest, self.path(40))
        self.assertEqual(self.state(), ([10, 20, 30, 40], 40))

    def test_unreadable_state_file_is_rebuilt(self):
        with open(os.path.join(self.directory, 'checkpoint'), 'w') as f:
            f.write('garbage {{{')
        self.assertEqual(recovery.recover_checkpoints(self.directory).latest, self.path(30))
        self.assertEqual(self.state(), ([10, 20, 30], 30))

    def test_checkpoint_deleted_by_rotation_is_dropped_quietly(self):
        for name in os.listdir(self.directory):
            if name.startswith('ckpt-10.'):
                os.remove(os.path.join(self.directory, name))
        recovered = recovery.recover_checkpoints(self.directory)
        self.assertEqual(recovered.corrupt, [])
        self.assertEqual(self.state(), ([20, 30], 30))

    def test_nothing_readable_raises_and_changes_nothing(self):
        for step in (10, 20, 30):
            with open(self.path(step, '.index'), 'wb') as f:
                f.write(b'garbage')
        before = sorted(os.listdir(self.directory))
        with self.assertRaisesRegex(recovery.RecoveryError,
                                    r'no checkpoint in .* reads back \(ckpt-10: .*ckpt-30'):
            recovery.recover_checkpoints(self.directory)
        self.assertEqual(sorted(os.listdir(self.directory)), before)

    def test_no_directory_is_no_checkpoint(self):
        recovered = recovery.recover_checkpoints(os.path.join(self.directory, 'nope'))
        self.assertIsNone(recovered.latest)


def snapshot(directory):
    """{name: bytes} of the files in `directory` (to show that nothing changed)."""
    files = {}
    for name in sorted(os.listdir(directory)):
        with open(os.path.join(directory, name), 'rb') as f:
            files[name] = f.read()
    return files


class NewestReadableCheckpointTest(CheckpointsTestCase):

    def truncate(self, step):
        data = self.path(step, '.data-00000-of-00001')
        with open(data, 'r+b') as f:
            f.truncate(os.path.getsize(data) // 2)

    def test_intact_latest_is_taken(self):
        self.assertEqual(recovery.newest_readable_checkpoint(self.directory),
                         (self.path(30), []))

    def test_broken_newer_ones_are_passed_over_and_left_in_place(self):
        self.truncate(30)
        with open(self.path(20, '.index'), 'wb') as f:
            f.write(b'garbage')
        before = snapshot(self.directory)
        path, broken = recovery.newest_readable_checkpoint(self.directory)
        self.assertEqual(path, self.path(10))
        self.assertEqual([broken_path for broken_path, _ in broken],
                         [self.path(20), self.path(30)])
        self.assertIn('Read less bytes than requested', broken[1][1])
        self.assertEqual(snapshot(self.directory), before)
        self.assertRegex(recovery.describe_problems(broken),
                         r'^ckpt-20: .+; ckpt-30: Read less bytes than requested$')

    def test_checkpoint_the_state_file_does_not_name_is_considered(self):
        os.remove(os.path.join(self.directory, 'checkpoint'))
        self.assertEqual(recovery.newest_readable_checkpoint(self.directory)[0], self.path(30))

    def test_nothing_readable_or_no_checkpoint(self):
        for step in (10, 20, 30):
            self.truncate(step)
        path, broken = recovery.newest_readable_checkpoint(self.directory)
        self.assertIsNone(path)
        self.assertLen(broken, 3)
        self.assertEqual(recovery.newest_readable_checkpoint(self.path(99)), (None, []))


class CleanPartialWritesTest(absltest.TestCase):

    def test_removes_leftovers_and_restores_a_moved_export(self):
        # policy/9 holds the variables of an upload cut before its saved_model.pb.
        logdir = self.create_tempdir()
        checkpoints = os.path.join(logdir.full_path, 'checkpoints')
        policy = os.path.join(logdir.full_path, 'policy')
        keep = [logdir.create_file('config.gin').full_path,
                logdir.create_file('checkpoints/ckpt-5.index').full_path,
                logdir.create_file('checkpoints/ckpt-5.data-00000-of-00001').full_path,
                logdir.create_file('policy/5/saved_model.pb').full_path]
        gone = [logdir.create_file('checkpoints/ckpt-9_temp/part-00000').full_path,
                logdir.create_file('checkpoints/checkpoint.tmp1234').full_path,
                logdir.create_file('checkpoints/ckpt-9.data-00000-of-00001').full_path,
                logdir.create_file('policy/.9.partial-abc/saved_model.pb').full_path,
                logdir.create_file('policy/.5.old-xyz/saved_model.pb').full_path,
                logdir.create_file('operative_config.gin.tmp-77').full_path,
                os.path.dirname(os.path.dirname(
                    logdir.create_file('policy/9/variables/variables.index').full_path))]
        logdir.create_file('policy/.7.old-def/saved_model.pb', 'the only export of step 7')
        removed = recovery.clean_partial_writes(logdir.full_path, checkpoints, policy)
        self.assertLen(removed, len(gone))
        for path in keep:
            self.assertTrue(os.path.exists(path), path)
        for path in gone:
            self.assertFalse(os.path.exists(path), path)
        with open(os.path.join(policy, '7', 'saved_model.pb')) as f:
            self.assertEqual(f.read(), 'the only export of step 7')


class CheckpointPathTest(absltest.TestCase):

    def test_path_and_step(self):
        path = recovery.checkpoint_path('/run/checkpoints', 512)
        self.assertEqual(path, '/run/checkpoints/ckpt-512')
        self.assertEqual(recovery.checkpoint_step(path), 512)


class RepairMetricsTest(absltest.TestCase):

    def write(self, text):
        self.path = self.create_tempdir().create_file('metrics.jsonl', text).full_path

    def read(self, name='metrics.jsonl'):
        with open(os.path.join(os.path.dirname(self.path), name)) as f:
            return f.read()

    def test_cut_last_line_is_dropped(self):
        self.write('{"step": 1}\n{"step": 2}\n{"st')
        self.assertEqual(recovery.repair_metrics(self.path, 5), [{'step': 1}, {'step': 2}])
        self.assertEqual(self.read(), '{"step": 1}\n{"step": 2}\n')

    def test_complete_last_line_without_newline_is_kept(self):
        self.write('{"step": 1}\n{"step": 2}')
        self.assertLen(recovery.repair_metrics(self.path, 5), 2)
        self.assertEqual(self.read(), '{"step": 1}\n{"step": 2}\n')

    def test_evaluations_past_the_checkpoint_are_moved_aside(self):
        self.write('{"step": 1}\n{"step": 2}\n{"step": 3}\n')
        self.assertEqual(recovery.repair_metrics(self.path, 1), [{'step': 1}])
        self.assertEqual(self.read(), '{"step": 1}\n')
        self.assertEqual(self.read(run_dir.ORPHANED_METRICS_FILE),
                         '{"step": 2}\n{"step": 3}\n')

    def test_other_lines_are_left_in_place(self):
        text = '{"step": 1}\nnot json\n{"no_step": 1}\n\n{"step": 2}\n'
        self.write(text)
        self.assertEqual(recovery.repair_metrics(self.path, 5), [{'step': 1}, {'step': 2}])
        self.assertEqual(self.read(), text)

    def test_line_json_cannot_take_is_left_in_place(self):
        text = '{"step": 1}\n' + '[' * 100000 + '\n{"step": 2}\n'
        self.write(text)
        self.assertEqual(recovery.repair_metrics(self.path, 1), [{'step': 1}])
        self.assertEqual(self.read(), '{"step": 1}\n' + '[' * 100000 + '\n')

    def test_missing_file(self):
        self.assertEqual(recovery.repair_metrics(
            os.path.join(self.create_tempdir().full_path, 'metrics.jsonl'), 5), [])


if __name__ == '__main__':
    absltest.main()
