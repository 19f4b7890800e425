"""Tests the streaming normalizer and the reward scaler against numpy references, per member of
the leading member axis."""

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
            normalizer.update(batch.reshape(1, -1, 1, 3))  # Extra batch dims are flattened.
        data = np.concatenate(batches)
        np.testing.assert_array_equal(normalizer.count.numpy(), [len(data)])
        np.testing.assert_allclose(normalizer.mean.numpy(), data.mean(0)[None], rtol=1e-10)
        np.testing.assert_allclose(normalizer.variance.numpy(), data.var(0)[None], rtol=1e-9)

    @parameterized.parameters((None,), (1.5,))
    def test_normalize_matches_numpy_and_clips(self, clip):
        rng = np.random.default_rng(1)
        data = rng.normal(loc=3.0, scale=2.0, size=(500, 2))
        normalizer = normalize.StreamingNormalizer(shape=(2,), clip=clip)
        normalizer.update(data[None])
        values = rng.normal(loc=3.0, scale=6.0, size=(1, 4, 5, 2)).astype(np.float32)
        expected = (values - data.mean(0)) / np.sqrt(data.var(0) + 1e-8)
        if clip:
            expected = np.clip(expected, -clip, clip)
            self.assertTrue(np.any(np.abs(expected) == clip))
        result = normalizer.normalize(values)
        self.assertEqual(result.dtype, tf.float32)
        np.testing.assert_allclose(result.numpy(), expected, rtol=1e-5, atol=1e-5)

    def test_scale_only_does_not_center(self):
        normalizer = normalize.StreamingNormalizer(center=False, scale=True)
        normalizer.update([[2.0, 4.0, 6.0]])
        np.testing.assert_allclose(normalizer.normalize([[6.0]]).numpy(),
                                   [[6.0 / np.sqrt(np.var([2, 4, 6]) + 1e-8)]], rtol=1e-6)

    def test_passes_values_through_until_two_samples(self):
        normalizer = normalize.StreamingNormalizer(shape=(2,), clip=5.0)
        np.testing.assert_allclose(normalizer.normalize([[[3.0, -7.0]]]).numpy(),
                                   [[[3.0, -5.0]]])
        normalizer.update([[[1.0, 1.0]]])
        np.testing.assert_allclose(normalizer.normalize([[[3.0, -7.0]]]).numpy(),
                                   [[[3.0, -5.0]]])
        normalizer.update([[[3.0, 3.0]]])
        np.testing.assert_allclose(normalizer.normalize([[[3.0, 1.0]]]).numpy(),
                                   [[[1.0, -1.0]]], rtol=1e-6)

    def test_empty_batch_leaves_statistics_unchanged(self):
        normalizer = normalize.StreamingNormalizer(shape=(2,))
        normalizer.update([[[1.0, 2.0], [3.0, 6.0]]])
        normalizer.update(tf.zeros([1, 0, 2]))
        np.testing.assert_array_equal(normalizer.count.numpy(), [2])
        np.testing.assert_allclose(normalizer.mean.numpy(), [[2.0, 4.0]])
        np.testing.assert_allclose(normalizer.variance.numpy(), [[1.0, 4.0]])

    def test_update_inside_tf_function(self):
        normalizer = normalize.StreamingNormalizer(shape=(2,))
        update = tf.function(normalizer.update)
        data = np.arange(20, dtype=np.float32).reshape(1, 10, 2)
        update(data[:, :4])
        update(data[:, 4:])
        np.testing.assert_allclose(normalizer.mean.numpy(), data.mean(1))
        np.testing.assert_allclose(normalizer.variance.numpy(), data.var(1))

    def test_wrong_shape_raises(self):
        normalizer = normalize.StreamingNormalizer(shape=(3,), num_members=2, name='observ')
        with self.assertRaisesRegex(ValueError, r'observ: values of shape \(2, 4, 2\) are not '
                                    r'\[members \(2\), \.\.\., \*\(3,\)\]'):
            normalizer.update(tf.zeros([2, 4, 2]))
        for shape in ((2, 4, 2),  # Wrong normalized shape.
                      (3, 4, 3),  # Three members, not two.
                      (3,)):  # No member axis.
            with self.subTest(shape=shape):
                with self.assertRaisesRegex(ValueError, r'are not \[members \(2\)'):
                    normalizer.update(tf.zeros(shape))
                with self.assertRaisesRegex(ValueError, r'are not \[members \(2\)'):
                    normalizer.normalize(tf.zeros(shape))
        np.testing.assert_array_equal(normalizer.count.numpy(), [0, 0])

    def test_bad_clip_raises(self):
        with self.assertRaisesRegex(ValueError, 'clip must be positive'):
            normalize.StreamingNormalizer(clip=0.0)


class MemberAxisTest(parameterized.TestCase):
    """A normalizer of K = 2 members keeps, for member k, the statistics a lone normalizer of
    member k's values keeps, and its members never mix."""

    def _batches(self, seed):
        rng = np.random.default_rng(seed)
        return [rng.normal(loc=[[1.0, -5.0], [100.0, 3.0]], scale=[[0.5, 2.0], [30.0, 0.1]],
                           size=(size, 2, 2)).transpose(1, 0, 2)[:, :, None]
                for size in (1, 9, 40)]  # [K = 2, size, 1, 2] each.

    @parameterized.parameters((None,), (0.5,))
    def test_members_equal_lone_normalizers(self, clip):
        population = normalize.StreamingNormalizer(shape=(2,), clip=clip, num_members=2)
        lone = [normalize.StreamingNormalizer(shape=(2,), clip=clip) for _ in range(2)]
        values = np.random.default_rng(1).normal(loc=3.0, scale=40.0, size=(2, 6, 2))
        for batch in self._batches(0):
            population.update(batch)
            for k, normalizer in enumerate(lone):
                normalizer.update(batch[k:k + 1])
            normalized = population.normalize(values).numpy()
            for k, normalizer in enumerate(lone):
                np.testing.assert_allclose(population.count.numpy()[k:k + 1],
                                           normalizer.count.numpy())
                np.testing.assert_allclose(population.mean.numpy()[k:k + 1],
                                           normalizer.mean.numpy(), rtol=1e-12)
                np.testing.assert_allclose(population.variance.numpy()[k:k + 1],
                                           normalizer.variance.numpy(), rtol=1e-12)
                np.testing.assert_allclose(normalized[k:k + 1],
                                           normalizer.normalize(values[k:k + 1]).numpy(),
                                           rtol=0, atol=1e-6)
        # The members' statistics differ: member 1's values are 100 times larger.
        self.assertGreater(population.variance.numpy()[1, 0], population.variance.numpy()[0, 0])

    def test_members_never_mix(self):
        first = normalize.StreamingNormalizer(shape=(2,), num_members=2)
        second = normalize.StreamingNormalizer(shape=(2,), num_members=2)
        for batch, other in zip(self._batches(0), self._batches(1), strict=True):
            first.update(batch)
            second.update(np.stack([batch[0], other[1]]))
        values = np.random.default_rng(2).normal(size=(2, 5, 2))
        changed = values.copy()
        changed[1] *= 7.0
        for statistic in ('count', 'mean', 'sum_squared_deviations'):
            np.testing.assert_array_equal(getattr(first, statistic).numpy()[0],
                                          getattr(second, statistic).numpy()[0])
        np.testing.assert_array_equal(first.normalize(values).numpy()[0],
                                      second.normalize(changed).numpy()[0])
        self.assertFalse(np.array_equal(first.mean.numpy()[1], second.mean.numpy()[1]))

    def test_each_member_is_ready_on_its_own(self):
        """A member with fewer than two samples (e.g. restored from a fresh agent) only
        clips while the other normalizes."""
        normalizer = normalize.StreamingNormalizer(clip=5.0, num_members=2)
        normalizer.count.assign([4.0, 1.0])
        normalizer.mean.assign([2.0, 2.0])
        normalizer.sum_squared_deviations.assign([16.0, 0.0])
        np.testing.assert_allclose(normalizer.normalize([[4.0, -9.0], [4.0, -9.0]]).numpy(),
                                   [[1.0, -5.0], [4.0, -5.0]], rtol=1e-6)


def reference_scaled_rewards(batches, discount, clip, epsilon=1e-8):
    """SB3 VecNormalize-style scaling of one member's `batches` ([(reward [T, N], done [T, N])]),
    updating with whole batches like RewardScaler."""
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
            scaler.update(reward[None], done[None])
            np.testing.assert_allclose(scaler.scale(reward[None]).numpy(), expected_scaled[None],
                                       rtol=1e-4, atol=1e-5)
        self.assertTrue(np.any(np.abs(expected[-1]) == 0.4))  # Clipping took effect.
        np.testing.assert_allclose(scaler.running_return.numpy(), running[None], rtol=1e-5)

    def test_members_match_reference_with_their_own_discounts(self):
        """Two members of discounts 0.9 and 0.5 each scale as a lone scaler of its discount and
        rewards, and member 1's rewards leave member 0's scale unchanged."""
        rng = np.random.default_rng(4)
        batches = [(rng.normal(loc=[[[5.0]], [[-1.0]]], size=(2, 20, 3)).astype(np.float32),
                    rng.uniform(size=(2, 20, 3)) < 0.15) for _ in range(3)]
        scaler = normalize.RewardScaler(num_envs=3, discount=(0.9, 0.5), clip=2.0,
                                        num_members=2)
        other = normalize.RewardScaler(num_envs=3, discount=(0.9, 0.5), clip=2.0, num_members=2)
        references = [reference_scaled_rewards([(reward[k], done[k]) for reward, done in batches],
                                               discount, 2.0)
                      for k, discount in enumerate((0.9, 0.5))]
        for index, (reward, done) in enumerate(batches):
            scaler.update(reward, done)
            other.update(np.stack([reward[0], reward[1] * 10.0]), done)
            scaled = scaler.scale(reward).numpy()
            for k, (expected, _) in enumerate(references):
                np.testing.assert_allclose(scaled[k], expected[index], rtol=1e-4, atol=1e-5)
            np.testing.assert_array_equal(other.scale(reward).numpy()[0], scaled[0])
        for k, (_, running) in enumerate(references):
            np.testing.assert_allclose(scaler.running_return.numpy()[k], running, rtol=1e-5)

    def test_wrong_shape_raises(self):
        scaler = normalize.RewardScaler(num_envs=4, discount=0.9, num_members=2)
        with self.assertRaisesRegex(ValueError, r'must both have shape \[2, T, 4\]'):
            scaler.update(tf.zeros([2, 10, 3]), tf.zeros([2, 10, 3], tf.bool))
        with self.assertRaisesRegex(ValueError, r'must both have shape \[2, T, 4\]'):
            scaler.update(tf.zeros([1, 10, 4]), tf.zeros([1, 10, 4], tf.bool))  # One member.
        with self.assertRaisesRegex(ValueError, r'must both have shape \[2, T, 4\]'):
            scaler.update(tf.zeros([10, 4]), tf.zeros([10, 4], tf.bool))  # No member axis.
        np.testing.assert_array_equal(scaler.running_return.numpy(), np.zeros((2, 4)))

    def test_bad_arguments_raise(self):
        with self.assertRaisesRegex(ValueError, 'num_envs'):
            normalize.RewardScaler(num_envs=0, discount=0.9)
        with self.assertRaisesRegex(ValueError, 'discount'):
            normalize.RewardScaler(num_envs=2, discount=1.1)
        with self.assertRaisesRegex(ValueError, 'discount'):
            normalize.RewardScaler(num_envs=2, discount=(0.9, 1.1), num_members=2)
        with self.assertRaisesRegex(ValueError, r'one number or one per member \(3\)'):
            normalize.RewardScaler(num_envs=2, discount=(0.9, 0.99), num_members=3)


if __name__ == '__main__':
    absltest.main()
