"""Tests of a run's store: saves in order, what a failed write keeps, members' checkpoints."""

import os

import tensorflow as tf
from absl.testing import absltest

from agents.runs import faults, run_dir, run_store


class _Agent:
    """What the store asks of an agent: copy a population's state out before a save."""

    def __init__(self):
        self.copies = 0

    def to_members(self):
        self.copies += 1


def _store(logdir, names=('',)):
    runs = []
    for name in names:
        directory = os.path.join(logdir, name) if name else logdir
        checkpoint = tf.train.Checkpoint(value=tf.Variable(1.0))
        runs.append(run_store.RunDirectory(directory, None, 0, checkpoint, name=name))
    return run_store.RunStore(logdir, runs, 2, None, None)


class RunStoreTest(absltest.TestCase):

    def test_saves_the_checkpoint_then_the_metrics_line_and_names_the_step_kept(self):
        logdir = self.create_tempdir().full_path
        store, agent = _store(logdir), _Agent()
        with store.open():
            self.assertEqual(store.recover(), [None])
            self.assertEqual(store.open_logs(0), [[]])
            run = store.runs[0]
            writes = [store.checkpoint_write(64, agent)]
            writes += store.metrics_writes([run], {run: {'step': 64}})
            store.start(writes, 64, background=True)
            self.assertEqual(store.saved_step, 64)  # Named as kept at once.
            store.finish()
        self.assertEqual(agent.copies, 1)
        self.assertTrue(os.path.exists(os.path.join(logdir, run_dir.CHECKPOINT_DIR,
                                                    'ckpt-64.index')))
        with open(os.path.join(logdir, run_dir.METRICS_FILE), encoding='utf-8') as f:
            self.assertEqual(f.read(), '{"step": 64}\n')
        again = _store(logdir)
        with again.open():
            (path,) = again.recover()
        self.assertTrue(path.endswith('ckpt-64'))

    def test_a_failed_checkpoint_puts_back_the_step_before_it(self):
        logdir = self.create_tempdir().full_path
        store = _store(logdir)

        def full_disk():
            raise OSError(28, 'No space left on device', os.path.join(logdir, 'x'))

        with self.assertRaisesRegex(
                faults.WriteError, r'^cannot write the checkpoint of step 128: .*x: No space '
                r'left on device\. The run stopped; the last checkpoint \(step 64\) is intact\.'):
            with store.open():
                store.saved_step = 64
                store.start([('the checkpoint of step 128', full_disk)], 128, background=True)
                store.finish()
        self.assertEqual(store.saved_step, 64)

    def test_members_resume_from_the_newest_step_all_of_them_kept(self):
        logdir = self.create_tempdir().full_path
        store, agent = _store(logdir, ('member-0', 'member-1')), _Agent()
        with store.open():
            store.recover()
            for step in (64, 128):
                store.start([store.checkpoint_write(step, agent)], step)
            # Member 1 was killed before its save of 192.
            store.runs[0].manager.save(checkpoint_number=192)
        resumed = _store(logdir, ('member-0', 'member-1'))
        with resumed.open(), self.assertLogs(level='WARNING') as logs:
            paths = resumed.recover()
        self.assertEqual([os.path.basename(path) for path in paths], ['ckpt-128'] * 2)
        self.assertIn('has checkpoints past step 128', logs.output[0])


if __name__ == '__main__':
    absltest.main()
