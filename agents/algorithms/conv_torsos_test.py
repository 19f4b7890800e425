"""Tests the convolutional torsos: shapes, the uint8 frames scaled inside, the arithmetic
against NumPy, initialization, parameter counts and the member axis (K members computed as one
batch, each as a lone torso of its seed)."""

import math
import os
from unittest import mock

import gin
import numpy as np
import tensorflow as tf
from absl.testing import absltest, parameterized

from agents.algorithms import conv_torsos

_TORSOS = {'nature': conv_torsos.NatureCNN, 'impala': conv_torsos.ImpalaCNN}


def _frames(shape, seed=0):
    return np.random.default_rng(seed).integers(0, 256, size=shape, dtype=np.uint8)


def _conv(values, kernel, bias, stride, padding):
    """NumPy's convolution of NHWC `values` with a flat kernel [size * size * in, out]
    (tf.nn.conv2d's filter layout, rows in (row, column, channel) order)."""
    size = math.isqrt(kernel.shape[0] // values.shape[3])
    if padding == 'SAME':  # Stride 1 here: (size - 1) // 2 before, the rest after.
        before = (size - 1) // 2
        values = np.pad(values, [(0, 0), (before, size - 1 - before),
                                 (before, size - 1 - before), (0, 0)])
    windows = np.lib.stride_tricks.sliding_window_view(values, (size, size), axis=(1, 2))
    windows = windows[:, ::stride, ::stride].transpose(0, 1, 2, 4, 5, 3)  # [B, H, W, r, c, in]
    return windows.reshape(*windows.shape[:3], -1) @ kernel + bias.reshape(-1)


def _max_pool(values):
    """NumPy's 3x3 max-pool of stride 2 with TensorFlow's 'SAME' padding."""
    pads = []
    for size in values.shape[1:3]:
        total = max((math.ceil(size / 2) - 1) * 2 + 3 - size, 0)
        pads.append((total // 2, total - total // 2))
    values = np.pad(values, [(0, 0), *pads, (0, 0)], constant_values=-np.inf)
    windows = np.lib.stride_tricks.sliding_window_view(values, (3, 3), axis=(1, 2))
    return windows[:, ::2, ::2].max(axis=(4, 5))


def _assert_close(actual, expected):
    """Equal up to float32's rounding at the scale of `expected` (sums of hundreds of terms)."""
    np.testing.assert_allclose(actual, expected, rtol=1e-4,
                               atol=1e-5 * max(np.abs(expected).max(), 1e-3))


def _relu(values):
    return np.maximum(values, 0)


def _numpy_nature(torso, floats, k=0):
    """Member k of a Nature CNN on NCHW `floats` (already in [0, 1]), in float64."""
    values = floats.transpose(0, 2, 3, 1).astype(np.float64)
    for conv in torso.convs:
        values = _relu(_conv(values, conv.kernel.numpy()[k], conv.bias.numpy()[k], conv.stride,
                             'VALID'))
    dense = torso.dense
    return _relu(values.reshape(len(values), -1) @ dense.kernel.numpy()[k] + dense.bias.numpy()[k])


def _numpy_impala(torso, floats, k=0):
    """Member k of an IMPALA CNN on NHWC `floats` (already in [0, 1]), in float64."""
    def conv(index, values):
        layer = torso.convs[index]
        return _conv(values, layer.kernel.numpy()[k], layer.bias.numpy()[k], 1, 'SAME')

    values = floats.astype(np.float64)
    for start in range(0, len(torso.convs), 5):
        values = _max_pool(conv(start, values))
        for block in (start + 1, start + 3):
            values = values + conv(block + 1, _relu(conv(block, _relu(values))))
    values = _relu(values).reshape(len(values), -1)
    return _relu(values @ torso.dense.kernel.numpy()[k] + torso.dense.bias.numpy()[k])


def _perturb(torso, seed=1):
    """Random biases and perturbed kernels: every unit active or not by its input, not by the
    zero biases of the initialization."""
    rng = np.random.default_rng(seed)
    for variable in torso.trainable_variables:
        variable.assign_add(rng.normal(scale=0.05, size=variable.shape).astype(np.float32))


class ShapesTest(parameterized.TestCase):

    @parameterized.parameters(
        ('nature', 1, 3136, 512), ('nature', 3, 3136, 512),
        ('impala', 1, 32 * 11 * 11, 256), ('impala', 3, 32 * 11 * 11, 256))
    def test_output_shapes(self, name, num_members, flat_size, features):
        torso = _TORSOS[name](seed=list(range(num_members)) if num_members > 1 else 0)
        self.assertEqual(torso.output_size, features)
        self.assertEqual(torso.dense.kernel.shape, (num_members, flat_size, features))
        frames = _frames((num_members, 2, 4, 84, 84))
        self.assertEqual(torso(frames).shape, (num_members, 2, features))
        if num_members == 1:  # One member's frames without the axis: features without it.
            self.assertEqual(torso(frames[0]).shape, (2, features))
            np.testing.assert_array_equal(torso(frames[0]), torso(frames)[0])

    @parameterized.parameters(('nature',), ('impala',))
    def test_channels_last_equals_channels_first(self, name):
        first = _TORSOS[name]((4, 40, 44), seed=(2, 3))
        last = _TORSOS[name]((40, 44, 4), channels_last=True, seed=(2, 3))
        frames = _frames((2, 3, 4, 40, 44))
        np.testing.assert_array_equal(first(frames), last(frames.transpose(0, 1, 3, 4, 2)))

    def test_unknown_batch_in_a_function(self):
        torso = conv_torsos.NatureCNN(seed=(0, 1))
        function = tf.function(torso, input_signature=[
            tf.TensorSpec([None, None, 4, 84, 84], tf.uint8)])
        frames = _frames((2, 3, 4, 84, 84))
        # A graph may fuse the convolutions with their biases and ReLUs (Grappler's remapper),
        # which sums in another order: equal up to float32's rounding.
        _assert_close(function(frames).numpy(), torso(frames).numpy())

    @parameterized.parameters(('nature',), ('impala',))
    def test_float_frames_are_refused(self, name):
        torso = _TORSOS[name]()
        for dtype in (tf.float32, tf.int32):
            with self.subTest(dtype=dtype), self.assertRaisesRegex(
                    TypeError, f'frames of dtype {dtype.name}, expected uint8 as the environment '
                    'gives them'):
                torso(tf.zeros([1, 2, 4, 84, 84], dtype))

    @parameterized.parameters(('nature',), ('impala',))
    def test_wrong_shapes_are_refused(self, name):
        torso = _TORSOS[name](seed=(0, 1))
        for shape in ((2, 4, 84, 84),  # No member axis, with two members.
                      (3, 1, 4, 84, 84),  # Three members, not two.
                      (2, 1, 84, 84, 4),  # Channels last.
                      (2, 1, 1, 4, 84, 84),  # A second batch axis.
                      (84, 84)):
            with self.subTest(shape=shape), self.assertRaisesRegex(
                    ValueError, rf'frames of shape \({", ".join(map(str, shape))},?\) are not '
                    r'\[members \(2\), batch, \*\(4, 84, 84\)\]\.$'):
                torso(np.zeros(shape, np.uint8))
        with self.assertRaisesRegex(ValueError, r'or \[batch, \*\(4, 84, 84\)\]\.$'):
            _TORSOS[name]()(np.zeros((4, 84, 84), np.uint8))

    def test_bad_constructor_arguments_are_refused(self):
        for frame_shape in ((84, 84), (4, 84, 0), (4, 84.0, 84), 84):
            with self.subTest(frame_shape=frame_shape), self.assertRaisesRegex(
                    ValueError, 'frame_shape must be three positive integers'):
                conv_torsos.NatureCNN(frame_shape)
        with self.assertRaisesRegex(ValueError, 'frames of 35x84 are too small for the Nature '
                                    r'CNN \(at least 36x36\)'):
            conv_torsos.NatureCNN((4, 35, 84))
        self.assertEqual(conv_torsos.NatureCNN((4, 36, 36)).dense.kernel.shape[1], 64)
        with self.assertRaisesRegex(ValueError, 'seed must be an integer or a non-empty'):
            conv_torsos.ImpalaCNN(seed=1.5)
        with self.assertRaisesRegex(ValueError, 'channels must name at least one stack'):
            conv_torsos.ImpalaCNN(channels=())


class ArithmeticTest(parameterized.TestCase):

    def test_nature_matches_numpy_on_frames_scaled_inside(self):
        """uint8 frames go in; the torso computes on frames / 255 (NCHW, as EnvPool's)."""
        torso = conv_torsos.NatureCNN(seed=(4, 9))
        _perturb(torso)
        frames = _frames((2, 3, 4, 84, 84))
        result = torso(frames).numpy()
        self.assertGreater((result > 0).mean(), 0.2)  # Enough units active to compare.
        for k in range(2):
            _assert_close(result[k], _numpy_nature(torso, frames[k] / 255, k))

    @parameterized.parameters(('nature',), ('impala',))
    def test_white_frames_are_ones_inside(self, name):
        """255 everywhere computes as a float frame of ones: the 1/255 scaling is the torso's."""
        torso = _TORSOS[name]((36, 36, 3), channels_last=True, seed=5)
        _perturb(torso)
        white = np.full((1, 2, 36, 36, 3), 255, np.uint8)
        reference = _numpy_nature if name == 'nature' else _numpy_impala
        ones = np.ones((2, 36, 36, 3))
        if name == 'nature':
            ones = ones.transpose(0, 3, 1, 2)  # _numpy_nature takes NCHW.
        expected = reference(torso, ones)
        self.assertGreater(np.abs(expected).max(), 0.1)
        _assert_close(torso(white)[0], expected)

    def test_first_convolution_sees_frames_over_255(self):
        """The first layer's pre-activations, read off the graph, are the convolution of the
        scaled frames (one member, without the member axis)."""
        torso = conv_torsos.NatureCNN(seed=2)
        frames = _frames((2, 4, 84, 84), seed=3)
        convolve = torso._convolve
        seen = []
        torso._convolve = lambda inputs: (seen.extend(inputs), convolve(inputs))[1]
        torso(frames)
        self.assertEqual(len(seen), 1)
        self.assertEqual(seen[0].dtype, tf.float32)
        np.testing.assert_allclose(seen[0], frames.transpose(0, 2, 3, 1) / 255, rtol=1e-6)
        conv = torso.convs[0]
        _assert_close(conv([seen[0]])[0], _conv(frames.transpose(0, 2, 3, 1) / 255,
                                                conv.kernel.numpy()[0], conv.bias.numpy()[0], 4,
                                                'VALID'))

    def test_impala_matches_numpy(self):
        torso = conv_torsos.ImpalaCNN((21, 20, 3), channels_last=True, seed=(1, 6))
        _perturb(torso)
        frames = _frames((2, 3, 21, 20, 3))
        result = torso(frames).numpy()
        self.assertEqual(torso.dense.kernel.shape[1], 32 * 3 * 3)  # 21x20 -> 11x10 -> 6x5 -> 3x3.
        for k in range(2):
            _assert_close(result[k], _numpy_impala(torso, frames[k] / 255, k))


class InitializationTest(parameterized.TestCase):

    @parameterized.parameters(('nature',), ('impala',))
    def test_orthogonal_with_gain_root_two_and_zero_biases(self, name):
        torso = _TORSOS[name](seed=(3, 4))
        for layer in (*torso.convs, torso.dense):
            kernel = layer.kernel.numpy()
            self.assertEqual(kernel.shape[0], 2)
            self.assertGreaterEqual(kernel.shape[1], kernel.shape[2])  # fan_in >= outputs.
            for k in range(2):
                np.testing.assert_allclose(kernel[k].T @ kernel[k], 2 * np.eye(kernel.shape[2]),
                                           atol=1e-4)
            np.testing.assert_array_equal(layer.bias.numpy(), 0)

    def test_conv_kernel_is_the_flattened_conv2d_filter(self):
        conv = conv_torsos.Conv2D(4, 32, 8, 4, seed=1)
        self.assertEqual(conv.kernel.shape, (1, 8 * 8 * 4, 32))
        self.assertEqual(conv.filter_shape, (8, 8, 4, 32))
        self.assertEqual(conv.bias.shape, (1, 1, 32))

    def test_torch_default(self):
        """PyTorch's nn.Conv2d default: kernel and bias uniform in +-1/sqrt(fan_in)."""
        torso = conv_torsos.NatureCNN(seed=0, initializer='torch_default')
        for layer, fan_in in zip((*torso.convs, torso.dense), (256, 512, 576, 3136),
                                 strict=True):
            bound = 1 / math.sqrt(fan_in)
            for values in (layer.kernel.numpy(), layer.bias.numpy()):
                self.assertLessEqual(np.abs(values).max(), bound)
                self.assertGreater(np.abs(values).max(), 0.9 * bound)

    @parameterized.parameters(('nature',), ('impala',))
    def test_seed_makes_initialization_deterministic(self, name):
        first, second, other = _TORSOS[name](seed=7), _TORSOS[name](seed=7), _TORSOS[name](seed=8)
        for a, b, c in zip(first.trainable_variables, second.trainable_variables,
                           other.trainable_variables, strict=True):
            np.testing.assert_array_equal(a.numpy(), b.numpy())
            if a.name.startswith('kernel'):
                self.assertFalse(np.allclose(a.numpy(), c.numpy()))
        frames = _frames((1, 2, 4, 84, 84))
        np.testing.assert_array_equal(first(frames), second(frames))

    def test_nature_parameter_count_is_cleanrls(self):
        """CleanRL's `ppo_atari_envpool.py` network through the dense 512 on 4x84x84 frames."""
        torso = conv_torsos.NatureCNN((4, 84, 84))
        expected = ((4 * 8 * 8 * 32 + 32) + (32 * 4 * 4 * 64 + 64) + (64 * 3 * 3 * 64 + 64)
                    + (64 * 7 * 7 * 512 + 512))
        self.assertEqual(expected, 1_684_128)
        self.assertEqual(sum(v.shape.num_elements() for v in torso.trainable_variables),
                         expected)
        self.assertLen(torso.trainable_variables, 8)

    def test_impala_parameter_count(self):
        torso = conv_torsos.ImpalaCNN((4, 84, 84))
        convs = (4 * 9 * 16 + 16) + 4 * (16 * 9 * 16 + 16) + (16 * 9 * 32 + 32) + 9 * (
            32 * 9 * 32 + 32)
        dense = 32 * 11 * 11 * 256 + 256  # 84 -> 42 -> 21 -> 11.
        self.assertEqual(sum(v.shape.num_elements() for v in torso.trainable_variables),
                         convs + dense)


class MembersTest(parameterized.TestCase):
    """A torso of K = 3 members of seeds (a, b, c) computes, for member k, what a lone torso of
    seed k computes, and its members never mix."""

    @parameterized.parameters(('nature',), ('impala',))
    def test_members_equal_lone_torsos_of_their_seeds(self, name):
        seeds = (11, 4, 30)
        population = _TORSOS[name]((4, 44, 40), seed=seeds)
        lone = [_TORSOS[name]((4, 44, 40), seed=seed) for seed in seeds]
        variables = population.trainable_variables
        for k, torso in enumerate(lone):
            for stacked, single in zip(variables, torso.trainable_variables, strict=True):
                self.assertEqual(stacked.shape, (3, *single.shape[1:]))
                np.testing.assert_array_equal(stacked.numpy()[k:k + 1], single.numpy(),
                                              stacked.name)
        _perturb(population)  # Different weights per member are computed apart too.
        for k, torso in enumerate(lone):
            for stacked, single in zip(variables, torso.trainable_variables, strict=True):
                single.assign(stacked[k:k + 1])
        frames = _frames((3, 5, 4, 44, 40))
        result = population(frames).numpy()
        for k, torso in enumerate(lone):
            _assert_close(result[k:k + 1], torso(frames[k:k + 1]).numpy())
        frames[1] = 255 - frames[1]
        changed = population(frames).numpy()
        np.testing.assert_array_equal(changed[[0, 2]], result[[0, 2]])
        self.assertFalse(np.array_equal(changed[1], result[1]))

    @parameterized.parameters(('nature', 1), ('nature', 3), ('impala', 1), ('impala', 3))
    def test_gradients_reach_every_variable_and_stay_in_their_member(self, name, num_members):
        population = _TORSOS[name]((4, 44, 40), seed=list(range(num_members)))
        frames = _frames((num_members, 4, 4, 44, 40))
        weights = tf.random.stateless_normal([num_members, 4, population.output_size], [0, 1])
        with tf.GradientTape(persistent=True) as tape:
            features = population(frames)
            losses = [tf.reduce_sum(features[k] * weights[k]) for k in range(num_members)]
        for k in range(num_members):
            gradients = tape.gradient(losses[k], population.trainable_variables)
            for gradient, variable in zip(gradients, population.trainable_variables,
                                          strict=True):
                self.assertIsNotNone(gradient, variable.name)
                gradient = tf.convert_to_tensor(gradient).numpy()
                self.assertGreater(np.abs(gradient[k]).sum(), 0, variable.name)
                others = np.delete(gradient, k, axis=0)
                np.testing.assert_array_equal(others, np.zeros_like(others), variable.name)


class MixedPrecisionTest(parameterized.TestCase):

    @parameterized.parameters(('nature', 1), ('impala', 1), ('nature', 2))
    def test_bfloat16_computes_the_float32_torso_with_float32_weights(self, name, num_members):
        seeds = list(range(num_members))
        exact = _TORSOS[name](seed=seeds)
        mixed = _TORSOS[name](seed=seeds, compute_dtype='bfloat16')
        frames = _frames((num_members, 8, 4, 84, 84))
        with tf.GradientTape(persistent=True) as tape:
            outputs = {'exact': exact(frames), 'mixed': mixed(frames)}
            losses = {key: tf.reduce_sum(tf.square(value)) for key, value in outputs.items()}
        # The weights stay float32 (what the optimizer steps); the features come out float32.
        self.assertEqual({variable.dtype for variable in mixed.variables}, {tf.float32})
        self.assertEqual(outputs['mixed'].dtype, tf.float32)
        # Equal up to bfloat16's rounding (8 bits of mantissa) through four layers.
        expected = outputs['exact'].numpy()
        np.testing.assert_allclose(outputs['mixed'].numpy(), expected,
                                   atol=0.05 * np.abs(expected).max())
        for want, got in zip(tape.gradient(losses['exact'], exact.trainable_variables),
                             tape.gradient(losses['mixed'], mixed.trainable_variables),
                             strict=True):
            self.assertEqual(got.dtype, tf.float32)
            cosine = np.sum(want * got) / (np.linalg.norm(want) * np.linalg.norm(got))
            self.assertGreater(cosine, 0.999)  # Bias gradients summed in float32.

    def test_auto_computes_in_bfloat16_where_the_cpu_has_it(self):
        expected = tf.bfloat16 if conv_torsos.native_bfloat16() else tf.float32
        self.assertEqual(conv_torsos.NatureCNN(compute_dtype='auto').compute_dtype, expected)
        self.assertEqual(conv_torsos.ImpalaCNN(compute_dtype='auto').compute_dtype, expected)

    def test_unknown_compute_dtype_is_refused(self):
        with self.assertRaisesRegex(ValueError, "compute_dtype must be one of .*'float16'"):
            conv_torsos.NatureCNN(compute_dtype='float16')


class NativeBfloat16Test(absltest.TestCase):

    def _cpuinfo(self, flags):
        path = self.create_tempfile(content=(
            'processor\t: 0\nmodel name\t: test\n'
            f'flags\t\t: fpu sse2 avx2 {flags}\n\n'
            'processor\t: 1\n'
            f'flags\t\t: fpu sse2 avx2 {flags}\n')).full_path
        return path

    def test_cpu_flags_decide(self):
        for flags, expected in (('avx512f amx_tile amx_bf16', True), ('avx512f avx512_bf16', True),
                                ('avx512f avx512_vnni', False), ('', False)):
            with self.subTest(flags=flags):
                self.assertEqual(conv_torsos.native_bfloat16(self._cpuinfo(flags)), expected)

    def test_no_cpuinfo_means_float32(self):
        self.assertFalse(conv_torsos.native_bfloat16(
            f'{self.create_tempdir().full_path}/no-cpuinfo'))

    def test_onednn_turned_off_means_float32(self):
        path = self._cpuinfo('amx_bf16 avx512_bf16')
        for value in ('0', 'false', 'False'):
            with self.subTest(value=value), mock.patch.dict(
                    os.environ, {'TF_ENABLE_ONEDNN_OPTS': value}):
                self.assertFalse(conv_torsos.native_bfloat16(path))
        with mock.patch.dict(os.environ, {'TF_ENABLE_ONEDNN_OPTS': '1'}):
            self.assertTrue(conv_torsos.native_bfloat16(path))

    def test_a_visible_gpu_means_float32(self):
        path = self._cpuinfo('amx_bf16')
        with mock.patch.object(tf.config, 'list_physical_devices',
                               lambda kind=None: ['gpu:0'] if kind == 'GPU' else []):
            self.assertFalse(conv_torsos.native_bfloat16(path))


class GinTest(absltest.TestCase):

    def tearDown(self):
        gin.clear_config()
        super().tearDown()

    def test_hyperparameters_from_gin(self):
        gin.parse_config("""
            NatureCNN.features = 256
            ImpalaCNN.channels = (8, 16)
            ImpalaCNN.features = 64
        """)
        self.assertEqual(conv_torsos.NatureCNN().output_size, 256)
        impala = conv_torsos.ImpalaCNN((3, 64, 64))
        self.assertEqual(impala.output_size, 64)
        self.assertEqual([conv.filter_shape[3] for conv in impala.convs], [8] * 5 + [16] * 5)
        self.assertEqual(impala.dense.kernel.shape[1], 16 * 16 * 16)


if __name__ == '__main__':
    absltest.main()
