"""The action distributions against TensorFlow Probability's, which they replace."""

import numpy as np
import tensorflow as tf
import tensorflow_probability as tfp
from absl.testing import absltest, parameterized

from agents.algorithms import distributions

tfd = tfp.distributions


def gaussians(shape, seed):
    """Ours and TFP's Gaussian over the last axis of `shape`, and a second pair for the KL."""
    generator = np.random.default_rng(seed)
    loc, other_loc = generator.normal(size=(2, *shape)).astype(np.float32)
    scale, other_scale = np.exp(generator.normal(size=(2, *shape))).astype(np.float32)
    ours = (distributions.DiagonalGaussian(loc, scale),
            distributions.DiagonalGaussian(other_loc, other_scale))
    theirs = tuple(tfd.Independent(tfd.Normal(loc, scale), reinterpreted_batch_ndims=1)
                   for loc, scale in ((loc, scale), (other_loc, other_scale)))
    return ours, theirs


def categoricals(shape, seed):
    generator = np.random.default_rng(seed)
    logits, other_logits = (2 * generator.normal(size=(2, *shape))).astype(np.float32)
    logits[..., 0] = -np.inf  # A category without mass counts for nothing.
    ours = (distributions.Categorical(logits), distributions.Categorical(other_logits))
    theirs = (tfd.Categorical(logits=logits, dtype=tf.int32),
              tfd.Categorical(logits=other_logits, dtype=tf.int32))
    return ours, theirs


class DistributionsTest(parameterized.TestCase):

    def assert_same(self, ours, theirs, action, seed=(7, 11)):
        """Every statistic equal to TFP's, bit for bit, eagerly and in a graph."""
        (mine, my_other), (tfp_one, tfp_other) = ours, theirs

        def statistics(one, other):
            return {'sample': one.sample(seed=tf.constant(seed, tf.int32)),
                    'mode': one.mode(),
                    'log_prob': one.log_prob(action),
                    'entropy': one.entropy(),
                    'kl': one.kl_divergence(other)}

        expected = statistics(tfp_one, tfp_other)
        for got in (statistics(mine, my_other),
                    tf.function(statistics, autograph=False)(mine, my_other)):
            for name, value in expected.items():
                self.assertEqual(got[name].dtype, value.dtype, name)
                np.testing.assert_array_equal(got[name].numpy(), value.numpy(), err_msg=name)
        self.assertTrue(np.all(np.isfinite(expected['entropy'].numpy())))
        self.assertTrue(np.all(np.isfinite(expected['kl'].numpy())))

    @parameterized.parameters([(5, 2)], [(3, 4, 1)], [(6,)])
    def test_gaussian_matches_tfp(self, shape):
        ours, theirs = gaussians(shape, seed=len(shape))
        action = np.random.default_rng(1).normal(size=shape).astype(np.float32)
        self.assert_same(ours, theirs, action)

    def test_gaussian_broadcasts_a_shared_scale(self):
        loc = np.random.default_rng(2).normal(size=(5, 2)).astype(np.float32)
        scale = np.float32([0.5, 2.0])
        mine = distributions.DiagonalGaussian(loc, scale)
        theirs = tfd.Independent(tfd.Normal(loc, scale), reinterpreted_batch_ndims=1)
        seed = tf.constant([3, 4])
        np.testing.assert_array_equal(mine.sample(seed).numpy(), theirs.sample(seed=seed).numpy())
        np.testing.assert_array_equal(mine.entropy().numpy(), theirs.entropy().numpy())
        self.assertEqual(mine.entropy().shape, (5,))

    def test_gaussian_samples_follow_the_distribution(self):
        mine = distributions.DiagonalGaussian(tf.fill([20000, 2], 1.0), [0.5, 2.0])
        samples = mine.sample(seed=[5, 6]).numpy()
        np.testing.assert_allclose(samples.mean(0), [1.0, 1.0], atol=0.05)
        np.testing.assert_allclose(samples.std(0), [0.5, 2.0], rtol=0.03)
        self.assertFalse(np.array_equal(samples, mine.sample(seed=[5, 7]).numpy()))
        np.testing.assert_array_equal(samples, mine.sample(seed=[5, 6]).numpy())

    @parameterized.parameters([(5, 4)], [(3, 2, 6)])
    def test_categorical_matches_tfp(self, shape):
        ours, theirs = categoricals(shape, seed=len(shape))
        action = np.random.default_rng(3).integers(1, shape[-1], size=shape[:-1], dtype=np.int32)
        self.assert_same(ours, theirs, action)

    def test_categorical_log_prob_of_float_and_broadcast_actions(self):
        (mine, _), (theirs, _) = categoricals((4, 3), seed=5)
        for action in (np.float32([1, 2, 1, 2]), np.int32(2), np.int32([[1], [2]])):
            np.testing.assert_array_equal(mine.log_prob(action).numpy(),
                                          theirs.log_prob(action).numpy(), err_msg=str(action))
        np.testing.assert_allclose(mine.probs().numpy(), theirs.probs_parameter().numpy())

    def test_categorical_samples_follow_the_distribution(self):
        probs = np.float32([0.1, 0.2, 0.7])
        mine = distributions.Categorical(tf.math.log(tf.tile(probs[None], [30000, 1])))
        samples = mine.sample(seed=[1, 2]).numpy()
        self.assertEqual(samples.dtype, np.int32)
        np.testing.assert_allclose(np.bincount(samples, minlength=3) / len(samples), probs,
                                   atol=0.01)

    def test_int64_actions(self):
        mine = distributions.Categorical([[0.0, 1.0]], dtype=tf.int64)
        self.assertEqual(mine.sample([1, 2]).dtype, tf.int64)
        self.assertEqual(mine.mode().numpy().tolist(), [1])

    def test_bad_arguments(self):
        with self.assertRaisesRegex(TypeError, 'Categorical actions are integers, not float32'):
            distributions.Categorical([0.0, 1.0], dtype=tf.float32)
        gaussian = distributions.DiagonalGaussian([0.0], [1.0])
        categorical = distributions.Categorical([0.0, 1.0])
        with self.assertRaisesRegex(TypeError, 'No KL divergence between a DiagonalGaussian and '
                                    'a Categorical'):
            gaussian.kl_divergence(categorical)


if __name__ == '__main__':
    absltest.main()
