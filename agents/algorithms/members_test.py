"""Tests the member axis helpers against numpy and against TF's ops applied member by member."""

import numpy as np
import tensorflow as tf
from absl.testing import absltest, parameterized

from agents.algorithms import members


class SeedsTest(parameterized.TestCase):

    def test_seeds_of(self):
        self.assertEqual(members.seeds_of(5), (5,))
        self.assertEqual(members.seeds_of([3, 1, 2]), (3, 1, 2))
        self.assertEqual(members.seeds_of((0,)), (0,))

    @parameterized.parameters(([],), ((),), ('12',), (1.5,), (True,), (None,), ((1, 2.0),),
                              ((1, False),))
    def test_bad_seeds_raise(self, seed):
        with self.assertRaisesRegex(ValueError, 'seed must be an integer or a non-empty sequence'):
            members.seeds_of(seed)


class ShapesTest(parameterized.TestCase):

    @parameterized.parameters((0,), (1,), (2,))
    def test_split_merge_round_trip_and_block_order(self, axis):
        """Member k's block of `split` is the k-th block of N entries along `axis`, and `merge`
        undoes `split`."""
        shape = [4, 5, 3]
        shape[axis] = 6
        tensor = np.arange(np.prod(shape), dtype=np.float32).reshape(shape)
        parts = members.split(tf.constant(tensor), 3, axis)
        self.assertEqual(parts.shape, (*shape[:axis], 3, 2, *shape[axis + 1:]))
        for k in range(3):
            np.testing.assert_array_equal(np.take(parts.numpy(), k, axis=axis),
                                          np.take(tensor, range(2 * k, 2 * k + 2), axis=axis))
        np.testing.assert_array_equal(members.merge(parts, axis).numpy(), tensor)

    @parameterized.parameters(((2,), (2, 3, 4)), ((2, 4), (2, 3, 4)), ((2, 4), (2, 5, 3, 4)),
                              ((2, 3), (2, 3)))
    def test_broadcast(self, shape, like_shape):
        """`broadcast(values, like)` adds ones after the member axis, so member k's values meet
        member k's entries of `like`."""
        rng = np.random.default_rng(0)
        values = rng.normal(size=shape)
        like = rng.normal(size=like_shape)
        result = members.broadcast(values, tf.constant(like))
        extra = len(like_shape) - len(shape)
        self.assertEqual(result.shape, (shape[0], *[1] * extra, *shape[1:]))
        for k in range(shape[0]):
            np.testing.assert_array_equal((result * like).numpy()[k], values[k] * like[k])

    def test_mean(self):
        tensor = np.random.default_rng(1).normal(size=(3, 4, 5))
        np.testing.assert_allclose(members.mean(tf.constant(tensor)).numpy(),
                                   tensor.mean(axis=(1, 2)), rtol=1e-12)
        np.testing.assert_allclose(members.mean(tf.constant([1.0, 2.0])).numpy(), [1.0, 2.0])


class NormsTest(parameterized.TestCase):

    def _tensors(self):
        """Three members' gradients: norms of about 5, about 0.1 and exactly 0."""
        rng = np.random.default_rng(2)
        tensors = [rng.normal(size=(3, 4, 2)), rng.normal(size=(3, 1, 5)), rng.normal(size=(3,))]
        norms = np.sqrt(sum(np.sum(np.square(t).reshape(3, -1), 1) for t in tensors))
        scales = np.array([5.0, 0.1, 0.0]) / norms
        return [tf.constant((t * scales.reshape(3, *[1] * (t.ndim - 1))).astype(np.float32))
                for t in tensors]

    def test_global_norm_matches_tf_per_member(self):
        tensors = self._tensors()
        expected = [tf.linalg.global_norm([t[k] for t in tensors]).numpy() for k in range(3)]
        np.testing.assert_allclose(members.global_norm(tensors).numpy(), expected, rtol=1e-6)
        np.testing.assert_allclose(expected, [5.0, 0.1, 0.0], rtol=1e-5)

    @parameterized.parameters((1.0,), (0.5,), (10.0,))
    def test_clip_by_global_norm_matches_tf_per_member(self, clip_norm):
        """Member by member as `tf.clip_by_global_norm`: the member of norm 5 is clipped (unless
        the clip is 10), the one of norm 0.1 and the zero one are left as they are."""
        tensors = self._tensors()
        clipped, norms = members.clip_by_global_norm(tensors, clip_norm)
        for k in range(3):
            expected, expected_norm = tf.clip_by_global_norm([t[k] for t in tensors], clip_norm)
            self.assertAlmostEqual(norms.numpy()[k], expected_norm.numpy(), places=5)
            for result, reference in zip(clipped, expected, strict=True):
                np.testing.assert_allclose(result.numpy()[k], reference.numpy(), rtol=1e-6,
                                           atol=1e-7)
        np.testing.assert_allclose(members.global_norm(clipped).numpy(),
                                   [min(5.0, clip_norm), 0.1, 0.0], rtol=1e-5)
        for result, tensor in zip(clipped, tensors, strict=True):
            np.testing.assert_array_equal(result.numpy()[1:], tensor.numpy()[1:])
            self.assertTrue(np.all(np.isfinite(result.numpy())))


class SeedStreamTest(absltest.TestCase):

    def test_member_k_draws_seed_k_then_t(self):
        stream = members.SeedStream((7, 3))
        for t in range(3):
            np.testing.assert_array_equal(stream.draws.numpy(), [t, t])
            seeds = stream.next()
            self.assertEqual(seeds.dtype, tf.int32)
            np.testing.assert_array_equal(seeds.numpy(), [[7, t], [3, t]])
        np.testing.assert_array_equal(stream.draws.numpy(), [3, 3])

    def test_same_seeds_same_stream_in_tf_function(self):
        """Two streams of the same seeds give the same seeds, eagerly or compiled, and each
        call of the compiled `next` advances the stream."""
        eager, compiled = members.SeedStream((1, 2)), members.SeedStream((1, 2))
        draw = tf.function(compiled.next)
        for _ in range(3):
            np.testing.assert_array_equal(draw().numpy(), eager.next().numpy())
        np.testing.assert_array_equal(compiled.draws.numpy(), [3, 3])

    def test_member_draws_as_a_lone_stream_of_its_seed(self):
        population, lone = members.SeedStream((4, 9)), members.SeedStream((9,))
        for _ in range(2):
            np.testing.assert_array_equal(population.next().numpy()[1:], lone.next().numpy())


class CopyTest(absltest.TestCase):

    def test_copy_to_and_from_members_round_trip(self):
        rng = np.random.default_rng(3)
        shapes = [(2, 3), (1, 4), (5,)]
        stacked = [tf.Variable(rng.normal(size=(3, *shape)).astype(np.float32))
                   for shape in shapes]
        original = [variable.numpy() for variable in stacked]
        lone = [[tf.Variable(tf.zeros((1, *shape))) for shape in shapes] for _ in range(3)]
        members.copy_to_members(stacked, lone)
        for k, variables in enumerate(lone):
            for variable, values in zip(variables, original, strict=True):
                np.testing.assert_array_equal(variable.numpy(), values[k:k + 1])
        for variable in stacked:
            variable.assign(tf.zeros_like(variable))
        lone[1][0].assign_add(tf.ones((1, 2, 3)))  # A member that moved on by itself.
        members.copy_from_members(stacked, lone)
        original[0][1] += 1.0
        for variable, values in zip(stacked, original, strict=True):
            np.testing.assert_array_equal(variable.numpy(), values)


if __name__ == '__main__':
    absltest.main()
