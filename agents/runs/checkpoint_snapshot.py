"""Checkpoints saved from a snapshot of their variables, so a thread can write them while
training goes on.

`take()` copies every variable of the checkpoints into a copy of its own, in one compiled call
(milliseconds); each checkpoint's saver then serializes the copies in place of the variables
(the object map TensorFlow's own async checkpointing hands it), so `CheckpointManager.save`
in another thread writes the values of the snapshot whatever training does meanwhile. The files
are those of an ordinary save: same object graph, same keys; a restore reads them into the
variables themselves.

TensorFlow's `CheckpointOptions(experimental_enable_async_checkpoint=True)` does the same, but
with Keras 3 variables its copy fails on the second save (Keras creates a new `tf.Variable`
inside TensorFlow's traced copy function), and it traces one copy function per checkpoint.
"""

import tensorflow as tf
from tensorflow.python.util import object_identity


class CheckpointSnapshot:
    """Copies of the variables of `checkpoints` (tf.train.Checkpoint roots), from which their
    saves read.

    Variables shared between checkpoints (a population's step counter) get one copy. The
    variables are collected at the first `take()`, when every one exists (an optimizer creates
    its slots at the first update), and again whenever the checkpoints hold other variables.
    """

    def __init__(self, checkpoints):
        self._checkpoints = list(checkpoints)
        self._originals = None  # The variables copied, in the order of `_copy`'s assignments.
        self._copy = None

    def take(self):
        """Copies the current values; the next saves of the checkpoints write these."""
        originals = self._variables()
        if self._originals is None or not _same(originals, self._originals):
            self._build(originals)
        self._copy()

    def _variables(self):
        """The variables the checkpoints save, each once, save counters excluded (the manager
        counts its saves in the thread that saves)."""
        counters = object_identity.ObjectIdentitySet(
            checkpoint.save_counter for checkpoint in self._checkpoints)
        seen = object_identity.ObjectIdentitySet()
        variables = []
        for checkpoint in self._checkpoints:
            for trackable in tf.train.TrackableView(checkpoint).descendants():
                if trackable in seen or trackable in counters:
                    continue
                seen.add(trackable)
                if isinstance(trackable, tf.Variable) or _is_keras_variable(trackable):
                    variables.append(trackable)
                elif _serializes_tensors(trackable):
                    raise TypeError(
                        f'cannot snapshot {type(trackable).__name__} {trackable!r}: a checkpoint '
                        'saved from a snapshot may hold variables only.')
        return variables

    def _build(self, originals):
        copies = object_identity.ObjectIdentityDictionary()
        pairs = []
        for original in originals:
            value = _value(original)
            copy = tf.Variable(tf.zeros(value.shape, value.dtype), trainable=False,
                               name='snapshot')
            copies[original] = copy
            pairs.append((copy, value))

        def copy_all():
            for copy, value in pairs:
                copy.assign(value, read_value=False)

        self._copy = tf.function(copy_all, autograph=False)
        self._originals = originals
        for checkpoint in self._checkpoints:
            # The hook TensorFlow's AsyncCheckpointHelper sets: saves serialize the mapped
            # objects; restores still read into the originals.
            checkpoint._saver._object_map = copies  # pylint: disable=protected-access


def _same(variables, others):
    return len(variables) == len(others) and all(
        a is b for a, b in zip(variables, others, strict=True))


def _is_keras_variable(trackable):
    """A Keras 3 variable: a tracked wrapper of the tf.Variable in its `value`."""
    return isinstance(trackable, tf.keras.Variable)


def _value(variable):
    return variable.value if _is_keras_variable(variable) else variable


def _serializes_tensors(trackable):
    base = tf.__internal__.tracking.Trackable
    return (type(trackable)._serialize_to_tensors is not base._serialize_to_tensors
            or type(trackable)._gather_saveables_for_checkpoint
            is not base._gather_saveables_for_checkpoint)
