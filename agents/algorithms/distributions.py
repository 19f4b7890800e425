"""The policies' action distributions: a diagonal Gaussian and a categorical.

PPO and A2C need five things of them: a sample drawn with a stateless seed, the mode, the
log-probability of an action, the entropy and the KL divergence to another distribution of the
same kind. These classes compute them with the formulas (and the random streams) of TensorFlow
Probability's `Independent(Normal)` and `Categorical`, which they replace: they give the same
values for the same seeds, and a launch of the trainer no longer loads TFP, whose import was
a sizeable part of its start-up (benchmarks/README.md, "Start-up"). distributions_test.py checks
them against TFP.
"""

import math

import tensorflow as tf

_HALF_LOG_TWO_PI = 0.5 * math.log(2.0 * math.pi)


class DiagonalGaussian:
    """Independent normal distributions over the last axis of `loc` and `scale` (the action's
    components); every statistic sums over that axis."""

    def __init__(self, loc, scale):
        self.loc = tf.convert_to_tensor(loc)
        self.scale = tf.convert_to_tensor(scale, dtype=self.loc.dtype)
        if not (self.loc.shape.is_fully_defined() and self.loc.shape == self.scale.shape):
            shape = tf.broadcast_dynamic_shape(tf.shape(self.loc), tf.shape(self.scale))
            self.loc = tf.broadcast_to(self.loc, shape)
            self.scale = tf.broadcast_to(self.scale, shape)

    @property
    def dtype(self):
        return self.loc.dtype

    def sample(self, seed):
        """A sample for the `int32[2]` stateless `seed`."""
        noise = tf.random.stateless_normal(tf.shape(self.loc), seed=seed, dtype=self.dtype)
        return noise * self.scale + self.loc

    def mode(self):
        return self.loc

    def log_prob(self, action):
        log_unnormalized = -0.5 * tf.math.squared_difference(
            action / self.scale, self.loc / self.scale)
        return tf.reduce_sum(log_unnormalized - self._log_normalization(), axis=-1)

    def entropy(self):
        return tf.reduce_sum(0.5 + self._log_normalization(), axis=-1)

    def _log_normalization(self):
        """Per component, log(sqrt(2 pi) scale)."""
        return tf.constant(_HALF_LOG_TWO_PI, self.dtype) + tf.math.log(self.scale)

    def kl_divergence(self, other):
        """KL(self || other)."""
        _check_kind(self, other)
        diff_log_scale = tf.math.log(self.scale) - tf.math.log(other.scale)
        return tf.reduce_sum(
            0.5 * tf.math.squared_difference(self.loc / other.scale, other.loc / other.scale)
            + 0.5 * tf.math.expm1(2.0 * diff_log_scale) - diff_log_scale, axis=-1)


class Categorical:
    """A categorical distribution over the last axis of `logits`; actions are integers of
    `dtype`."""

    def __init__(self, logits, dtype=tf.int32):
        self.logits = tf.convert_to_tensor(logits)
        self.dtype = tf.as_dtype(dtype)
        if not self.dtype.is_integer:
            raise TypeError(f'Categorical actions are integers, not {self.dtype.name}.')

    def sample(self, seed):
        """A sample for the `int32[2]` stateless `seed`."""
        num_categories = tf.shape(self.logits)[-1]
        draws = tf.random.stateless_categorical(
            tf.reshape(self.logits, [-1, num_categories]), 1, seed=seed,
            dtype=tf.int64 if self.dtype.size > 4 else tf.int32)
        return tf.reshape(tf.cast(draws, self.dtype), tf.shape(self.logits)[:-1])

    def probs(self):
        return tf.math.softmax(self.logits)

    def mode(self):
        return tf.cast(tf.argmax(self.logits, axis=-1), self.dtype)

    def log_prob(self, action):
        action = tf.convert_to_tensor(action)
        if not action.dtype.is_integer:
            action = tf.cast(action, tf.int32)
        logits = self.logits
        if not (logits.shape[:-1].is_fully_defined() and action.shape.is_fully_defined()
                and logits.shape[:-1] == action.shape):
            logits = logits * tf.ones_like(action[..., None], logits.dtype)
            action = action * tf.ones(tf.shape(logits)[:-1], action.dtype)
        return -tf.nn.sparse_softmax_cross_entropy_with_logits(labels=action, logits=logits)

    def entropy(self):
        log_probs = tf.math.log_softmax(self.logits)
        return -tf.reduce_sum(_times_probability(log_probs, log_probs), axis=-1)

    def kl_divergence(self, other):
        """KL(self || other)."""
        _check_kind(self, other)
        log_probs = tf.math.log_softmax(self.logits)
        return tf.reduce_sum(_times_probability(
            log_probs - tf.math.log_softmax(other.logits), log_probs), axis=-1)


def _times_probability(values, log_probs):
    """`values * exp(log_probs)`, zero where the probability is zero even if `values` is not
    finite there (a category with no mass contributes nothing)."""
    probs = tf.math.exp(log_probs)
    return tf.where(tf.math.equal(probs, 0), tf.zeros_like(values), values) * probs


def _check_kind(first, second):
    if type(first) is not type(second):
        raise TypeError(f'No KL divergence between a {type(first).__name__} and a '
                        f'{type(second).__name__}.')
