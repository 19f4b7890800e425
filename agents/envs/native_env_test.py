"""Tests for native_env: the base class's sampling, rounding and checks."""

import numpy as np
import tensorflow as tf
from absl.testing import absltest, parameterized

from agents.envs import native_env


class _Minimal(native_env.NativeEnv):
    gym_id = 'Minimal-v0'
    state_size = 2


class NativeEnvTest(parameterized.TestCase):

    @parameterized.parameters(tf.float64, tf.float32)
    def test_uniform_is_numpys_uniform_of_the_random_bits(self, dtype):
        env = _Minimal(dtype)
        seed = tf.constant([7, 3], tf.int64)
        samples = env.uniform([1000, 2], seed, [-1.0, 2.0], [1.0, 2.5]).numpy()
        self.assertEqual(samples.dtype, dtype.as_numpy_dtype)
        bits = tf.random.stateless_uniform(
            [1000, 2], seed, minval=None, maxval=None, dtype=tf.uint64,
            alg=native_env.RNG_ALGORITHM).numpy()
        mantissa = 53 if dtype == tf.float64 else 24
        unit = (bits >> np.uint64(64 - mantissa)).astype(np.float64) * 2.0**-mantissa
        expected = np.array([-1.0, 2.0]) + np.array([2.0, 0.5]) * unit
        np.testing.assert_allclose(samples, expected, rtol=1e-15 if mantissa == 53 else 1e-7)
        self.assertTrue(((samples >= [-1, 2]) & (samples < [1, 2.5])).all())
        # Spread over the whole range.
        self.assertLess(samples[:, 0].min(), -0.9)
        self.assertGreater(samples[:, 0].max(), 0.9)

    def test_uniform_is_reproducible_and_the_same_under_xla(self):
        env = _Minimal()
        seed = tf.constant([1, 2], tf.int64)
        sample = tf.function(lambda: env.uniform([64, 2], seed, 0.0, 1.0))
        xla = tf.function(lambda: env.uniform([64, 2], seed, 0.0, 1.0), jit_compile=True)
        np.testing.assert_array_equal(sample(), sample())
        # XLA may fuse the scaling into one multiply-add: the last bit may differ.
        np.testing.assert_allclose(xla(), sample(), rtol=1e-15)
        other = env.uniform([64, 2], tf.constant([1, 3], tf.int64), 0.0, 1.0)
        self.assertFalse(np.array_equal(other, sample()))

    def test_round_to_float32(self):
        values = tf.constant([0.1, 1 / 3], tf.float64)
        np.testing.assert_array_equal(
            _Minimal().round_to_float32(values), np.float32([0.1, 1 / 3]).astype(np.float64))
        np.testing.assert_array_equal(
            _Minimal(tf.float32).round_to_float32(tf.cast(values, tf.float32)),
            np.float32([0.1, 1 / 3]))

    def test_rejects_other_dtypes(self):
        with self.assertRaisesRegex(ValueError, r"dtype must be one of \['float32', 'float64'\]"):
            _Minimal(tf.int32)

    def test_check_gym_state(self):
        np.testing.assert_array_equal(
            native_env.check_gym_state(_Minimal(), [1, 2], 2), [1.0, 2.0])
        with self.assertRaisesRegex(ValueError, r'Minimal-v0 state must have shape \(2,\)'):
            native_env.check_gym_state(_Minimal(), [1, 2, 3], 2)

    def test_the_physics_are_for_subclasses(self):
        env = _Minimal()
        with self.assertRaises(NotImplementedError):
            env.dynamics(tf.zeros([1, 2], tf.float64), tf.zeros([1, 1]))
        self.assertEqual(env.gym_render_attributes(None), {})
        self.assertEqual(repr(env), '_Minimal(Minimal-v0, dtype=float64)')


if __name__ == '__main__':
    absltest.main()
