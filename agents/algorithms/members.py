"""The member axis: K agents of one algorithm computed as one batch.

A population trains K members of one algorithm in the same compiled calls, as PureJaxRL vmaps
one seed's program. Here the member axis is written into the shared parts (networks, normalizers,
optimizers): every variable of an agent has a leading axis of K, one slice per member, and every
op keeps the members apart (no op reduces across that axis, a loss summed over the members has
per-member gradients). A lone agent is a population of one, computed by the same code.
"""

import tensorflow as tf


def seeds_of(seed):
    """The members' seeds: `seed` an int (one member) or a sequence of ints (one per member)."""
    try:
        seeds = (seed,) if isinstance(seed, int) and not isinstance(seed, bool) else tuple(seed)
    except TypeError:  # Not iterable (a float, a bool, None).
        seeds = ()
    if not seeds or any(not isinstance(value, int) or isinstance(value, bool)
                        for value in seeds):
        raise ValueError(f'seed must be an integer or a non-empty sequence of integers (one per '
                         f'member), got {seed!r}.')
    return seeds


def broadcast(values, like):
    """`values` [K, ...] shaped to broadcast against `like` [K, ..., *values.shape[1:]]: ones
    inserted after the member axis."""
    values = tf.convert_to_tensor(values)
    extra = like.shape.rank - values.shape.rank
    if values.shape.is_fully_defined():  # One op (in graph mode every op costs).
        return tf.reshape(values, [values.shape[0]] + [1] * extra + values.shape[1:].as_list())
    return tf.reshape(values, tf.concat(
        [tf.shape(values)[:1], tf.ones([extra], tf.int32), tf.shape(values)[1:]], 0))


def split(tensor, num_members, axis=0):
    """`[..., K * N, ...]` -> `[..., K, N, ...]` at `axis`: member k's block is the k-th."""
    tensor = tf.convert_to_tensor(tensor)
    if tensor.shape.is_fully_defined():  # One op (in graph mode every op costs).
        shape = tensor.shape.as_list()
        return tf.reshape(tensor, shape[:axis] + [num_members, -1] + shape[axis + 1:])
    shape = tf.shape(tensor)
    return tf.reshape(tensor, tf.concat(
        [shape[:axis], [num_members, -1], shape[axis + 1:]], 0))


def merge(tensor, axis=0):
    """The inverse of `split`: `[..., K, N, ...]` -> `[..., K * N, ...]` at `axis`."""
    if tensor.shape.is_fully_defined():
        shape = tensor.shape.as_list()
        return tf.reshape(tensor, shape[:axis] + [-1] + shape[axis + 2:])
    shape = tf.shape(tensor)
    return tf.reshape(tensor, tf.concat([shape[:axis], [-1], shape[axis + 2:]], 0))


def mean(tensor):
    """The per-member mean of `tensor` [K, ...]: [K]."""
    return tf.reduce_mean(tensor, axis=list(range(1, tensor.shape.rank)))


def global_norm(tensors):
    """The per-member global norm of a list of [K, ...] tensors: [K]."""
    return tf.sqrt(tf.add_n([
        tf.reduce_sum(tf.square(tensor), axis=list(range(1, tensor.shape.rank)))
        for tensor in tensors]))


def clip_by_global_norm(tensors, clip_norm):
    """`tf.clip_by_global_norm` per member: (clipped tensors, [K] norms)."""
    norm = global_norm(tensors)
    scale = clip_norm * tf.minimum(1.0 / norm, 1.0 / clip_norm)
    return [tensor * broadcast(scale, tensor) for tensor in tensors], norm


class SeedStream(tf.Module):
    """One stream of stateless random seeds per member: draw t of member k is `[seed_k, t]`,
    so a member draws as a lone agent of its seed does, and its position is a [K] counter that
    checkpoints, undoes and moves between a population and its members like any variable."""

    def __init__(self, seeds, name='sampling_seeds'):
        super().__init__(name=name)
        self.seeds = tf.Variable(tf.constant(seeds, tf.int64), trainable=False, name='seeds')
        self.draws = tf.Variable(tf.zeros([len(seeds)], tf.int64), trainable=False,
                                 name='draws')

    def next(self):
        """The members' next seeds: [K, 2] int32 (the seed type XLA's stateless categorical
        takes), one stateless seed per member."""
        seeds = tf.cast(tf.stack([self.seeds, self.draws.read_value()], axis=1), tf.int32)
        with tf.control_dependencies([seeds]):
            self.draws.assign_add(tf.ones_like(self.draws))
        return seeds


def copy_to_members(stacked, lone):
    """Assigns member k's slice of each `[K, ...]` variable of `stacked` to the `[1, ...]`
    variable in the same place of `lone[k]` (the K lone agents' variables, each in the order of
    `stacked`)."""
    for index, variables in enumerate(lone):
        for source, target in zip(stacked, variables, strict=True):
            target.assign(source[index:index + 1], read_value=False)


def copy_from_members(stacked, lone):
    """The inverse of `copy_to_members`: stacks the lone agents' variables."""
    for position, target in enumerate(stacked):
        target.assign(tf.concat([variables[position] for variables in lone], 0),
                      read_value=False)
