"""Streaming normalization of observations and rewards, kept in TF variables.

Gymnasium's NormalizeObservation / NormalizeReward wrappers do the same in numpy, but here the
statistics must live in the agent's checkpoint and update inside compiled TF programs. Each of
K members (members.py) keeps statistics of its own: values are `[K, ...]`.
"""

import tensorflow as tf

from agents.algorithms import members


class StreamingNormalizer(tf.Module):
    """Running mean and (population) variance over a stream of batches.

    Merges each batch with Chan et al.'s parallel update, in float64 so that the count and the sums
    stay exact over long runs. Until two samples were seen, `normalize` only clips.
    """

    def __init__(self, shape=(), center=True, scale=True, clip=None, epsilon=1e-8, num_members=1,
                 name=None):
        super().__init__(name=name)
        if clip is not None and clip <= 0:
            raise ValueError(f'clip must be positive or None, got {clip}.')
        self.shape = tf.TensorShape(shape)
        self._center = center
        self._scale = scale
        self._clip = clip
        self._epsilon = epsilon
        self.num_members = num_members
        self.count = tf.Variable(tf.zeros([num_members], tf.float64), trainable=False,
                                 name='count')
        self.mean = tf.Variable(tf.zeros([num_members, *self.shape], tf.float64),
                                trainable=False, name='mean')
        self.sum_squared_deviations = tf.Variable(
            tf.zeros([num_members, *self.shape], tf.float64), trainable=False,
            name='sum_squared_deviations')

    @property
    def variance(self):
        """[K, *shape]."""
        return self.sum_squared_deviations / members.broadcast(
            tf.maximum(self.count, 1.0), self.sum_squared_deviations)

    def _check(self, values):
        values = tf.convert_to_tensor(values)
        rank = self.shape.rank
        if values.shape.rank is not None and (
                values.shape.rank < rank + 1 or
                not values.shape[:1].is_compatible_with([self.num_members]) or
                not values.shape[values.shape.rank - rank:].is_compatible_with(self.shape)):
            raise ValueError(f'{self.name}: values of shape {values.shape} are not [members '
                             f'({self.num_members}), ..., *{self.shape}].')
        return values

    def update(self, values):
        """Adds all entries of each member's `values` (shape `[K, ..., *shape]`) to its
        statistics."""
        values = tf.cast(self._check(values), tf.float64)
        values = tf.reshape(values, tf.concat([[self.num_members, -1], tf.shape(values)[
            tf.rank(values) - self.shape.rank:]], 0))
        batch_count = tf.cast(tf.shape(values)[1], tf.float64)
        batch_mean = tf.reduce_mean(values, 1)
        batch_sum_squared = tf.reduce_sum(tf.square(values - batch_mean[:, None]), 1)
        total = self.count + batch_count
        fraction = members.broadcast(batch_count / tf.maximum(total, 1.0), self.mean)
        delta = batch_mean - self.mean
        # An empty batch would make batch_mean NaN: leave the statistics unchanged then.
        has_data = batch_count > 0
        self.sum_squared_deviations.assign(tf.where(
            has_data,
            self.sum_squared_deviations + batch_sum_squared + tf.square(delta) *
            members.broadcast(self.count, self.mean) * fraction, self.sum_squared_deviations))
        self.mean.assign(tf.where(has_data, self.mean + delta * fraction, self.mean))
        self.count.assign(total)

    def normalize(self, values):
        """Returns float32 `(values - mean) / sqrt(variance + epsilon)` of each member's
        `values` `[K, ..., *shape]`, then clipped."""
        values = tf.cast(self._check(values), tf.float32)
        ready = members.broadcast(self.count > 1.0, values)

        def per_member(statistic):  # [K, *shape] -> [K, 1..., *shape] against `values`.
            return tf.cast(members.broadcast(statistic, values), tf.float32)

        if self._center:
            values -= tf.where(ready, per_member(self.mean), 0.0)
        if self._scale:
            std = per_member(tf.sqrt(self.variance + self._epsilon))
            values /= tf.where(ready, std, 1.0)
        if self._clip is not None:
            values = tf.clip_by_value(values, -self._clip, self._clip)
        return values


class RewardScaler(tf.Module):
    """Divides rewards by the running std of the discounted return, then clips them.

    The same scheme as SB3's VecNormalize and gymnasium's NormalizeReward: it keeps the value
    targets in a stable range without shifting rewards (which would change the optimal policy).
    The per-environment discounted return carries over between batches and restarts at episode
    ends, so `num_envs` (of each member) is fixed at construction. `discount` is one for all
    members or one per member.
    """

    def __init__(self, num_envs, discount, clip=10.0, epsilon=1e-8, num_members=1, name=None):
        super().__init__(name=name)
        if not isinstance(num_envs, int) or num_envs < 1:
            raise ValueError(f'num_envs must be a positive integer, got {num_envs!r}.')
        discounts = tf.nest.flatten(discount)
        if not all(0.0 <= value <= 1.0 for value in discounts):
            raise ValueError(f'discount must lie in [0, 1], got {discount}.')
        if len(discounts) not in (1, num_members):
            raise ValueError(f'discount must be one number or one per member ({num_members}), '
                             f'got {discount}.')
        self._discount = tf.constant(discounts if len(discounts) > 1 else discounts[0],
                                     tf.float32)
        self.return_statistics = StreamingNormalizer(
            shape=(), center=False, scale=True, clip=clip, epsilon=epsilon,
            num_members=num_members)
        self.running_return = tf.Variable(
            tf.zeros([num_members, num_envs]), trainable=False, name='running_return')

    def update(self, reward, done):
        """Accumulates the discounted returns of each member's `reward`, `done` (`[K, T,
        num_envs]`)."""
        reward = tf.convert_to_tensor(reward, tf.float32)
        done = tf.convert_to_tensor(done, tf.bool)
        num_members, num_envs = self.running_return.shape
        expected = tf.TensorShape([num_members, None, num_envs])
        if not (reward.shape.is_compatible_with(expected) and
                done.shape.is_compatible_with(expected)):
            raise ValueError(f'{self.name}: reward {reward.shape} and done {done.shape} must both '
                             f'have shape [{num_members}, T, {num_envs}].')
        discount = self._discount[:, None] if self._discount.shape.rank else self._discount

        def accumulate(carry, inputs):
            _, running = carry
            reward_step, done_step = inputs
            discounted = running * discount + reward_step
            return discounted, tf.where(done_step, tf.zeros_like(discounted), discounted)

        initial = (self.running_return.value(), self.running_return.value())
        # tf.scan runs over the leading axis: time first while accumulating.
        returns, restarted = tf.scan(accumulate, (tf.transpose(reward, [1, 0, 2]),
                                                  tf.transpose(done, [1, 0, 2])), initial)
        self.return_statistics.update(tf.transpose(returns, [1, 0, 2]))
        self.running_return.assign(restarted[-1])

    def scale(self, reward):
        """Each member's `reward` [K, ...] scaled by its statistics."""
        return self.return_statistics.normalize(reward)
