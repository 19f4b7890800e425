"""Streaming normalization of observations and rewards, kept in TF variables.

Gymnasium's NormalizeObservation / NormalizeReward wrappers do the same in numpy, but here the
statistics must live in the agent's checkpoint and update inside compiled TF programs.
"""

import tensorflow as tf


class StreamingNormalizer(tf.Module):
    """Running mean and (population) variance over a stream of batches.

    Merges each batch with Chan et al.'s parallel update, in float64 so that the count and the sums
    stay exact over long runs. Until two samples were seen, `normalize` only clips.
    """

    def __init__(self, shape=(), center=True, scale=True, clip=None, epsilon=1e-8, name=None):
        super().__init__(name=name)
        if clip is not None and clip <= 0:
            raise ValueError(f'clip must be positive or None, got {clip}.')
        self.shape = tf.TensorShape(shape)
        self._center = center
        self._scale = scale
        self._clip = clip
        self._epsilon = epsilon
        self.count = tf.Variable(0.0, dtype=tf.float64, trainable=False, name='count')
        self.mean = tf.Variable(tf.zeros(shape, tf.float64), trainable=False, name='mean')
        self.sum_squared_deviations = tf.Variable(
            tf.zeros(shape, tf.float64), trainable=False, name='sum_squared_deviations')

    @property
    def variance(self):
        return self.sum_squared_deviations / tf.maximum(self.count, 1.0)

    def _check(self, values):
        values = tf.convert_to_tensor(values)
        rank = self.shape.rank
        if values.shape.rank is not None and (
                values.shape.rank < rank or
                not values.shape[values.shape.rank - rank:].is_compatible_with(self.shape)):
            raise ValueError(f'{self.name}: values of shape {values.shape} do not end in the '
                             f'normalized shape {self.shape}.')
        return values

    def update(self, values):
        """Adds all entries of `values` (shape `[..., *shape]`) to the statistics."""
        values = tf.cast(self._check(values), tf.float64)
        values = tf.reshape(values, tf.concat([[-1], tf.shape(values)[
            tf.rank(values) - self.shape.rank:]], 0))
        batch_count = tf.cast(tf.shape(values)[0], tf.float64)
        batch_mean = tf.reduce_mean(values, 0)
        batch_sum_squared = tf.reduce_sum(tf.square(values - batch_mean), 0)
        total = self.count + batch_count
        fraction = batch_count / tf.maximum(total, 1.0)
        delta = batch_mean - self.mean
        # An empty batch would make batch_mean NaN: leave the statistics unchanged then.
        has_data = batch_count > 0
        self.sum_squared_deviations.assign(tf.where(
            has_data,
            self.sum_squared_deviations + batch_sum_squared + tf.square(delta) * self.count *
            fraction, self.sum_squared_deviations))
        self.mean.assign(tf.where(has_data, self.mean + delta * fraction, self.mean))
        self.count.assign(total)

    def normalize(self, values):
        """Returns float32 `(values - mean) / sqrt(variance + epsilon)`, then clipped."""
        values = tf.cast(self._check(values), tf.float32)
        ready = self.count > 1.0
        if self._center:
            values -= tf.cast(tf.where(ready, self.mean, tf.zeros_like(self.mean)), tf.float32)
        if self._scale:
            std = tf.sqrt(self.variance + self._epsilon)
            values /= tf.cast(tf.where(ready, std, tf.ones_like(std)), tf.float32)
        if self._clip is not None:
            values = tf.clip_by_value(values, -self._clip, self._clip)
        return values


class RewardScaler(tf.Module):
    """Divides rewards by the running std of the discounted return, then clips them.

    The same scheme as SB3's VecNormalize and gymnasium's NormalizeReward: it keeps the value
    targets in a stable range without shifting rewards (which would change the optimal policy).
    The per-environment discounted return carries over between batches and restarts at episode
    ends, so `num_envs` is fixed at construction.
    """

    def __init__(self, num_envs, discount, clip=10.0, epsilon=1e-8, name=None):
        super().__init__(name=name)
        if not isinstance(num_envs, int) or num_envs < 1:
            raise ValueError(f'num_envs must be a positive integer, got {num_envs!r}.')
        if not 0.0 <= discount <= 1.0:
            raise ValueError(f'discount must lie in [0, 1], got {discount}.')
        self._discount = discount
        self.return_statistics = StreamingNormalizer(
            shape=(), center=False, scale=True, clip=clip, epsilon=epsilon)
        self.running_return = tf.Variable(
            tf.zeros([num_envs]), trainable=False, name='running_return')

    def update(self, reward, done):
        """Accumulates the discounted returns of time-major `reward`, `done` (`[T, num_envs]`)."""
        reward = tf.convert_to_tensor(reward, tf.float32)
        done = tf.convert_to_tensor(done, tf.bool)
        expected = tf.TensorShape([None]).concatenate(self.running_return.shape)
        if not (reward.shape.is_compatible_with(expected) and
                done.shape.is_compatible_with(expected)):
            raise ValueError(f'{self.name}: reward {reward.shape} and done {done.shape} must both '
                             f'have shape [T, {self.running_return.shape[0]}].')

        def accumulate(carry, inputs):
            _, running = carry
            reward_step, done_step = inputs
            discounted = running * self._discount + reward_step
            return discounted, tf.where(done_step, tf.zeros_like(discounted), discounted)

        initial = (self.running_return.value(), self.running_return.value())
        returns, restarted = tf.scan(accumulate, (reward, done), initial)
        self.return_statistics.update(returns)
        self.running_return.assign(restarted[-1])

    def scale(self, reward):
        return self.return_statistics.normalize(reward)
