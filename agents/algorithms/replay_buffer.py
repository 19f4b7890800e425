"""A replay buffer in TF variables: a ring of `capacity` transitions, filled and sampled inside
compiled calls (no Python per step), as TF-Agents' TFUniformReplayBuffer keeps one.

An off-policy algorithm (algorithm.OffPolicyAlgorithm) owns one: its `observe` adds an
iteration's time-major batch, its `train` samples minibatches. The buffer is part of the
algorithm's checkpoint (a resumed run continues with the same transitions) but not of what a
non-finite update undoes.
"""

import math

import tensorflow as tf

from agents.tools import memory

# What a transition holds: (name, dtype or None for the observation's).
FIELDS = ('observ', 'action', 'reward', 'next_observ', 'terminated')


class ReplayBuffer(tf.Module):
    """The last `capacity` transitions of observations `observ_shape` and actions
    `action_shape` (`action_dtype`)."""

    def __init__(self, capacity, observ_shape, action_shape, action_dtype=tf.float32,
                 observ_dtype=tf.float32, name='replay_buffer', available_bytes=None):
        """Raises ValueError for a `capacity` that is no positive integer, or whose ring cannot
        fit in `available_bytes` (default: this machine's memory), before allocating it."""
        super().__init__(name=name)
        if not isinstance(capacity, int) or isinstance(capacity, bool) or capacity < 1:
            raise ValueError(f'capacity must be a positive integer, got {capacity!r}.')
        self.capacity = capacity
        shapes = {'observ': (observ_shape, observ_dtype), 'action': (action_shape, action_dtype),
                  'reward': ((), tf.float32), 'next_observ': (observ_shape, observ_dtype),
                  'terminated': ((), tf.bool)}
        _check_fits(capacity, shapes, available_bytes)
        with self.name_scope:
            self.storage = {
                field: tf.Variable(tf.zeros([capacity, *shape], dtype), trainable=False,
                                   name=field)
                for field, (shape, dtype) in shapes.items()}
            # Transitions added so far; the next one goes to `added % capacity`.
            self.added = tf.Variable(0, dtype=tf.int64, trainable=False, name='added')

    @property
    def size(self):
        """How many transitions the buffer holds (a tensor)."""
        return tf.minimum(self.added, self.capacity)

    def add(self, batch, keep=True):
        """Adds the transitions of a time-major batch `[T, N, ...]` (of `FIELDS`), step by step,
        if `keep` ([] bool); returns the op. More than `capacity` at once keeps the last
        `capacity`. Not keeping writes the rows' own values back, rather than branching: XLA
        copies the whole ring when a conditional writes it."""
        flat = {field: tf.reshape(tf.cast(batch[field], self.storage[field].dtype),
                                  [-1, *self.storage[field].shape[1:]]) for field in FIELDS}
        count = tf.shape(flat['reward'], out_type=tf.int64)[0]
        kept = tf.minimum(count, self.capacity)
        indices = (self.added + count - kept + tf.range(kept)) % self.capacity
        keep = tf.convert_to_tensor(keep, tf.bool)
        writes = []
        for field, values in flat.items():
            storage = self.storage[field]
            values = tf.where(tf.reshape(keep, [1] * values.shape.rank), values[count - kept:],
                              tf.gather(storage, indices))
            writes.append(storage.scatter_nd_update(indices[:, None], values))
        with tf.control_dependencies(writes):
            return self.added.assign_add(tf.where(keep, count, 0))

    def sample(self, batch_size, seed):
        """`batch_size` transitions drawn uniformly (with replacement) from those held, by the
        stateless `seed` ([2] int); {field: [batch_size, ...]}. The buffer must hold some."""
        indices = tf.random.stateless_uniform(
            [batch_size], seed=seed, maxval=self.size, dtype=tf.int64)
        return {field: tf.gather(values, indices) for field, values in self.storage.items()}


def _check_fits(capacity, shapes, available_bytes=None):
    """Raises ValueError naming the ring's size when it exceeds `available_bytes`."""
    available = memory.physical_bytes() if available_bytes is None else available_bytes
    row = sum(math.prod(shape) * tf.as_dtype(dtype).size for shape, dtype in shapes.values())
    if capacity * row > available:
        raise ValueError(
            f'a replay buffer of {capacity} transitions ({row} bytes each) needs '
            f'{memory.describe(capacity * row)}, more than this machine\'s '
            f'{memory.describe(available)}; use a smaller buffer_size')
