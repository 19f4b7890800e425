"""Tests the streaming normalizer and the reward scaler against numpy references."""

import numpy as np
import tensorflow as tf
from absl.testing import absltest, parameterized

from agents.algorithms import normalize


class StreamingNormalizerTest(parameterized.TestCase):

    def test_statistics_match_numpy_over_several_batches(self):
        rng = np.random.default_rng(0)
        normalizer = normalize.StreamingNormalizer(shape=(3,))
        batches = [rng.normal(loc=[1.0, -50.0, 1e4], scale=[0.1, 5.0, 300.0], size=(size, 3))
                   for size in (1, 7, 100, 2, 1000)]
        for batch in batches:
            normalizer.update(batch.reshape(-1, 1, 3))  # Extra batch dims are flattened.
        data = np.concatenate(batches)
        self.assertEqual(normalizer.count.numpy(), len(data))
        np.testing.assert_allclose(normalizer.mean.numpy(), data.mean(0), rtol=1e-10)
        np.testing.assert_allclose(normalizer.variance.numpy(), data.var(0), rtol=1e-9)

    @parameterized.parameters((None,), (1.5,))
    def test_normalize_matches_numpy_and_clips(self, clip):
        rng = np.random.default_rng(1)
        data = rng.normal(loc=3.0, scale=2.0, size=(500, 2))
        normalizer = normalize.StreamingNormalizer(shape=(2,), clip=clip)
        normalizer.update(data)
        values = rng.normal(loc=3.0, scale=6.0, size=(4, 5, 2)).astype(np.float32)
        expected = (values - data.mean(0)) / np.sqrt(data.var(0) + 1e-8)
        if clip:
            expected = np.clip(expected, -clip, clip)
            self.assertTrue(np.any(np.abs(expected) == clip))
        result = normalizer.normalize(values)
        self.assertEqual(result.dtype, tf.float32)
        np.testing.assert_allclose(result.numpy(), expected, rtol=1e-5, atol=1e-5)

    def test_scale_only_does_not_center(self):
        normalizer = normalize.StreamingNormalizer(center=False, scale=True)
        normalizer.update([2.0, 4.0, 6.0])
        np.testing.assert_allclose(normalizer.normalize([6.0]).numpy(),
                                   [6.0 / np.sqrt(np.var([2, 4, 6]) + 1e-8)], rtol=1e-6)

    def test_passes_values_through_until_two_samples(self):
        normalizer = normalize.StreamingNormalizer(shape=(2,), clip=5.0)
        np.testing.assert_allclose(normalizer.normalize([[3.0, -7.0]]).numpy(), [[3.0, -5.0]])
        normalizer.update([[1.0, 1.0]])
        np.testing.assert_allclose(normalizer.normalize([[3.0, -7.0]]).numpy(), [[3.0, -5.0]])
        normalizer.update([[3.0, 3.0]])
        np.testing.assert_allclose(normalizer.normalize([[3.0, 1.0]]).numpy(), [[1.0, -1.0]],
                                   rtol=1e-6)

    def test_empty_batch_leaves_statistics_unchanged(self):
        normalizer = normalize.StreamingNormalizer(shape=(2,))
        normalizer.update([[1.0, 2.0], [3.0, 6.0]])
        normalizer.update(tf.zeros([0, 2]))
        self.assertEqual(normalizer.count.numpy(), 2)
        np.testing.assert_allclose(normalizer.mean.numpy(), [2.0, 4.0])
        np.testing.assert_allclose(normalizer.variance.numpy(), [1.0, 4.0])

    def test_update_inside_tf_function(self):
        normalizer = normalize.StreamingNormalizer(shape=(2,))
        update = tf.function(normalizer.update)
        data = np.arange(20, dtype=np.float32).reshape(10, 2)
        update(data[:4])
        update(data[4:])
        np.testing.assert_allclose(normalizer.mean.numpy(), data.mean(0))
        np.testing.assert_allclose(normalizer.variance.numpy(), data.var(0))

    def test_wrong_shape_raises(self):
        normalizer = normalize.StreamingNormalizer(shape=(3,), name='observ')
        with self.assertRaisesRegex(ValueError, r'observ: values of shape \(4, 2\) do not end'):
            normalizer.update(tf.zeros([4, 2]))
        with self.assertRaisesRegex(ValueError, 'do not end in the normalized shape'):
            normalizer.normalize(tf.zeros([4, 2]))
        self.assertEqual(normalizer.count.numpy(), 0)

    def test_bad_clip_raises(self):
        with self.assertRaisesRegex(ValueError, 'clip must be positive'):
            normalize.StreamingNormalizer(clip=0.0)


def reference_scaled_rewards(batches, discount, clip, epsilon=1e-8):
    """SB3 VecNormalize-style scaling, updating with whole batches like RewardScaler."""
    running = np.zeros(batches[0][0].shape[1])
    seen = []
    outputs = []
    for reward, done in batches:
        for step in range(len(reward)):
            running = running * discount + reward[step]
            seen.append(running.copy())
            running = np.where(done[step], 0.0, running)
        std = np.sqrt(np.var(np.concatenate(seen)) + epsilon)
        outputs.append(np.clip(reward / std, -clip, clip))
    return outputs, running


class RewardScalerTest(absltest.TestCase):

    def test_matches_reference_across_batches(self):
        rng = np.random.default_rng(3)
        batches = [(rng.normal(loc=5.0, size=(30, 4)).astype(np.float32),
                    rng.uniform(size=(30, 4)) < 0.1) for _ in range(3)]
        scaler = normalize.RewardScaler(num_envs=4, discount=0.9, clip=0.4)
        expected, running = reference_scaled_rewards(batches, 0.9, 0.4)
        for (reward, done), expected_scaled in zip(batches, expected, strict=True):
            scaler.update(reward, done)
            np.testing.assert_allclose(scaler.scale(reward).numpy(), expected_scaled,
                                       rtol=1e-4, atol=1e-5)
        self.assertTrue(np.any(np.abs(expected[-1]) == 0.4))  # Clipping took effect.
        np.testing.assert_allclose(scaler.running_return.numpy(), running, rtol=1e-5)

    def test_wrong_shape_raises(self):
        scaler = normalize.RewardScaler(num_envs=4, discount=0.9)
        with self.assertRaisesRegex(ValueError, r'must both have shape \[T, 4\]'):
            scaler.update(tf.zeros([10, 3]), tf.zeros([10, 3], tf.bool))
        np.testing.assert_array_equal(scaler.running_return.numpy(), np.zeros(4))

    def test_bad_arguments_raise(self):
        with self.assertRaisesRegex(ValueError, 'num_envs'):
            normalize.RewardScaler(num_envs=0, discount=0.9)
        with self.assertRaisesRegex(ValueError, 'discount'):
            normalize.RewardScaler(num_envs=2, discount=1.1)


if __name__ == '__main__':
    absltest.main()
