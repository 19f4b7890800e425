"""Tests that a checkpoint saved from a snapshot holds the snapshot's values, in the files of an
ordinary save, whatever the variables hold when it is written."""

import os
import threading

import numpy as np
import tensorflow as tf
from absl.testing import absltest

from agents.runs import checkpoint_snapshot


def _model():
    """A Keras 3 layer and optimizer (Keras variables) beside a tf.Variable."""
    layer = tf.keras.layers.Dense(3)
    layer.build((None, 2))
    optimizer = tf.keras.optimizers.Adam(1e-3)
    optimizer.build(layer.trainable_variables)
    return tf.train.Checkpoint(layer=layer, optimizer=optimizer,
                               step=tf.Variable(0, dtype=tf.int64))


def _values(checkpoint):
    return {v.path if hasattr(v, 'path') else v.name: np.array(v) for v in (
        *checkpoint.layer.weights, *checkpoint.optimizer.variables, checkpoint.step)}


def _perturb(checkpoint, amount):
    for variable in (*checkpoint.layer.weights, *checkpoint.optimizer.variables):
        variable.assign(variable + tf.cast(amount, variable.dtype))
    checkpoint.step.assign_add(amount)


class CheckpointSnapshotTest(absltest.TestCase):

    def setUp(self):
        super().setUp()
        self.directory = self.create_tempdir().full_path

    def test_saves_the_values_of_the_snapshot_in_the_files_of_an_ordinary_save(self):
        checkpoint = _model()
        _perturb(checkpoint, 1)
        ordinary = tf.train.CheckpointManager(
            checkpoint, os.path.join(self.directory, 'ordinary'), max_to_keep=1).save()
        snapshot = checkpoint_snapshot.CheckpointSnapshot([checkpoint])
        snapshot.take()
        taken = _values(checkpoint)
        _perturb(checkpoint, 5)
        manager = tf.train.CheckpointManager(checkpoint, self.directory, max_to_keep=2)
        path = manager.save(checkpoint_number=1)
        self.assertEqual(dict(tf.train.list_variables(path)).keys(),
                         dict(tf.train.list_variables(ordinary)).keys())
        _perturb(checkpoint, 7)
        checkpoint.restore(path).assert_consumed()
        for name, value in _values(checkpoint).items():
            np.testing.assert_array_equal(value, taken[name], err_msg=name)

    def test_each_take_is_the_next_saves(self):
        checkpoint = _model()
        snapshot = checkpoint_snapshot.CheckpointSnapshot([checkpoint])
        manager = tf.train.CheckpointManager(checkpoint, self.directory, max_to_keep=3)
        taken = []
        for number in (1, 2, 3):
            _perturb(checkpoint, number)
            snapshot.take()
            taken.append(_values(checkpoint))
            _perturb(checkpoint, 100)
            manager.save(checkpoint_number=number)
        for path, values in zip(manager.checkpoints, taken, strict=True):
            checkpoint.restore(path)
            for name, value in _values(checkpoint).items():
                np.testing.assert_array_equal(value, values[name], err_msg=f'{path}: {name}')

    def test_a_thread_writes_the_snapshot_while_the_variables_change(self):
        checkpoint = _model()
        snapshot = checkpoint_snapshot.CheckpointSnapshot([checkpoint])
        snapshot.take()
        taken = _values(checkpoint)
        manager = tf.train.CheckpointManager(checkpoint, self.directory, max_to_keep=1)
        writer = threading.Thread(target=manager.save, kwargs=dict(checkpoint_number=1))
        writer.start()
        while writer.is_alive():
            _perturb(checkpoint, 1)
        writer.join()
        self.assertGreater(int(checkpoint.step), 0)
        checkpoint.restore(manager.latest_checkpoint)
        for name, value in _values(checkpoint).items():
            np.testing.assert_array_equal(value, taken[name], err_msg=name)

    def test_a_variable_shared_by_checkpoints_saves_the_same_value_in_each(self):
        shared = tf.Variable(3, dtype=tf.int64)
        first = tf.train.Checkpoint(step=shared, weight=tf.Variable(1.0))
        second = tf.train.Checkpoint(step=shared, weight=tf.Variable(2.0))
        snapshot = checkpoint_snapshot.CheckpointSnapshot([first, second])
        snapshot.take()
        shared.assign(9)
        first.weight.assign(10.0)
        paths = [checkpoint.write(os.path.join(self.directory, name))
                 for checkpoint, name in ((first, 'first'), (second, 'second'))]
        for path, weight in zip(paths, (1.0, 2.0), strict=True):
            values = {name: tf.train.load_variable(path, name)
                      for name, _ in tf.train.list_variables(path) if 'OBJECT_GRAPH' not in name}
            self.assertEqual(values['step/.ATTRIBUTES/VARIABLE_VALUE'], 3)
            self.assertEqual(values['weight/.ATTRIBUTES/VARIABLE_VALUE'], weight)

    def test_variables_added_after_a_take_are_snapshot_by_the_next(self):
        checkpoint = tf.train.Checkpoint(weight=tf.Variable(1.0))
        snapshot = checkpoint_snapshot.CheckpointSnapshot([checkpoint])
        snapshot.take()
        checkpoint.bias = tf.Variable(2.0)
        snapshot.take()
        checkpoint.weight.assign(10.0)
        checkpoint.bias.assign(20.0)
        path = checkpoint.write(os.path.join(self.directory, 'ckpt'))
        self.assertEqual(tf.train.load_variable(path, 'weight/.ATTRIBUTES/VARIABLE_VALUE'), 1.0)
        self.assertEqual(tf.train.load_variable(path, 'bias/.ATTRIBUTES/VARIABLE_VALUE'), 2.0)

    def test_refuses_state_that_is_not_a_variable(self):
        table = tf.lookup.experimental.MutableHashTable(tf.int64, tf.float32, default_value=0.0)
        checkpoint = tf.train.Checkpoint(table=table, weight=tf.Variable(1.0))
        snapshot = checkpoint_snapshot.CheckpointSnapshot([checkpoint])
        with self.assertRaisesRegex(TypeError, r'cannot snapshot MutableHashTable .*variables '
                                    'only'):
            snapshot.take()


if __name__ == '__main__':
    absltest.main()
