"""Convolutional torsos of K members (members.py) that turn uint8 frames into features.

As networks.py's layers: every variable has a leading member axis, `seed` is one integer (K = 1)
or one per member, and member k's weights are those a lone torso of its seed starts from.

Frames come as the environment gives them, uint8 `[K, B, C, H, W]` (EnvPool's channels-first
layout; `channels_last=True` for `[K, B, H, W, C]`), and are cast to float32 and scaled by 1/255
here, so that the rollout stores them as bytes, a quarter of the floats' memory. The output is
`[K, B, output_size]`; one member's frames may come without the member axis, `[B, ...]`, and then
give `[B, output_size]`, as `networks.Linear` keeps the axis iff its inputs have it (one member's
activations go without it: see networks.py's `_matmul` for why).
"""

import math
import os

import gin
import tensorflow as tf
from absl import logging

from agents.algorithms import members, networks

# What the torsos compute in: float32, bfloat16 with the weights kept float32 (mixed
# precision: CPUs with AVX512-BF16 or AMX run the convolutions about twice as fast; the
# features come out float32 either way), or 'auto': bfloat16 where `native_bfloat16()`, else
# float32. The weights are float32 whichever runs, so checkpoints move between machines.
COMPUTE_DTYPES = ('float32', 'bfloat16', 'auto')
# /proc/cpuinfo's flags of the instructions oneDNN (TensorFlow's CPU kernels) computes
# bfloat16 convolutions and matmuls with; without them bfloat16 is emulated, slower than float32.
BFLOAT16_CPU_FLAGS = ('amx_bf16', 'avx512_bf16')


def native_bfloat16(cpuinfo_path='/proc/cpuinfo'):
    """Whether TensorFlow computes bfloat16 natively here: on the CPU (no GPU visible), with
    oneDNN (not turned off by TF_ENABLE_ONEDNN_OPTS) and a CPU with one of BFLOAT16_CPU_FLAGS
    (Linux's `cpuinfo_path`; elsewhere False)."""
    if os.environ.get('TF_ENABLE_ONEDNN_OPTS', '1').strip().lower() in ('0', 'false'):
        return False
    if tf.config.list_physical_devices('GPU'):
        return False
    try:
        with open(cpuinfo_path) as cpuinfo:
            lines = cpuinfo.read().splitlines()
    except OSError:
        return False
    flags = {flag for line in lines if line.startswith('flags')
             for flag in line.partition(':')[2].split()}
    return any(flag in flags for flag in BFLOAT16_CPU_FLAGS)


def resolve_compute_dtype(compute_dtype):
    """The tf.DType a torso computes in for one of COMPUTE_DTYPES ('auto' resolved here)."""
    if compute_dtype not in COMPUTE_DTYPES:
        raise ValueError(f'compute_dtype must be one of {COMPUTE_DTYPES}, got '
                         f'{compute_dtype!r}.')
    if compute_dtype == 'auto':
        compute_dtype = 'bfloat16' if native_bfloat16() else 'float32'
        logging.info("compute_dtype 'auto': the convolutional torso computes in %s.",
                     compute_dtype)
    return tf.as_dtype(compute_dtype)


def _check_frame_shape(frame_shape):
    shape = tuple(frame_shape) if isinstance(frame_shape, (tuple, list)) else ()
    if len(shape) != 3 or any(not isinstance(size, int) or isinstance(size, bool) or size < 1
                              for size in shape):
        raise ValueError(f'frame_shape must be three positive integers (channels, height, width; '
                         f'height, width, channels with channels_last), got {frame_shape!r}.')
    return shape


class Conv2D(tf.Module):
    """Convolution of K members: an affine layer over `size` x `size` patches.

    The kernel is `[K, size * size * in_channels, out_channels]`, each member's `tf.nn.conv2d`
    filter `[size, size, in_channels, out_channels]` flattened, so that it is initialized as
    networks.py's layers are (`networks.initial_weights`): orthogonal columns over the fan-in
    times `gain` (PyTorch's
    `orthogonal_` on a conv weight, CleanRL's `layer_init`) and zero biases, or with
    `initializer='torch_default'` PyTorch's `nn.Conv2d` default (uniform in +-1/sqrt(fan_in)).

    Called on a list of the K members' activations `[B, H, W, in_channels]` (NHWC, the only
    layout of TensorFlow's CPU convolutions), it returns their K convolutions: one
    `tf.nn.conv2d` per member. A grouped convolution (members folded into the channels) would
    be one op, but with a transposition of the activations in and out and of the filters at
    every call; the loop costs K ops of the same arithmetic, keeps K = 1 a plain convolution,
    and computes member k exactly as its lone torso does.
    """

    def __init__(self, in_channels, out_channels, size, stride=1, padding='VALID',
                 gain=networks.HIDDEN_GAIN, seed=0, initializer='orthogonal', name=None):
        super().__init__(name=name)
        kernel, bias = networks.initial_weights(size * size * in_channels, out_channels, gain,
                                                seed, initializer)
        self.kernel = tf.Variable(kernel, name='kernel')
        self.bias = tf.Variable(bias, name='bias')
        self.filter_shape = (size, size, in_channels, out_channels)
        self.stride = stride
        self.padding = padding

    def __call__(self, inputs):
        num_members = self.kernel.shape[0]
        if len(inputs) != num_members:
            raise ValueError(f'{len(inputs)} members\' inputs for {num_members} members.')
        # In the inputs' dtype: bfloat16 under mixed precision, the weights staying float32.
        kernel = tf.cast(self.kernel, inputs[0].dtype)
        if num_members == 1:  # One reshape each, no slicing.
            filters = [tf.reshape(kernel, self.filter_shape)]
            biases = [tf.reshape(self.bias, [-1])]
        else:
            filters = tf.unstack(tf.reshape(kernel, (num_members, *self.filter_shape)))
            biases = tf.unstack(tf.reshape(self.bias, [num_members, -1]))
        # BiasAdd in float32, which TensorFlow's graph optimizer fuses with the convolution.
        add_bias = tf.nn.bias_add if kernel.dtype == tf.float32 else networks.add_bias
        return [add_bias(tf.nn.conv2d(values, kernel, self.stride, self.padding), bias)
                for values, kernel, bias in zip(inputs, filters, biases, strict=True)]


class _Torso(tf.Module):
    """Checks and scales the frames, runs the subclass's convolutions member by member
    (`_convolve`) and its dense layer on their flattened output."""

    def __init__(self, frame_shape, channels_last, seed, compute_dtype, name):
        super().__init__(name=name)
        self.compute_dtype = resolve_compute_dtype(compute_dtype)
        self.frame_shape = _check_frame_shape(frame_shape)
        self.channels_last = bool(channels_last)
        if self.channels_last:
            self._height, self._width, self._channels = self.frame_shape
        else:
            self._channels, self._height, self._width = self.frame_shape
        self.seeds = members.seeds_of(seed)
        self.num_members = len(self.seeds)

    def _layer_seeds(self, index):
        """Layer `index`'s seeds: each member's plus the index, as `networks.MLP`'s layers."""
        return [seed + index for seed in self.seeds]

    @property
    def output_size(self):
        return self.dense.kernel.shape[2]

    def __call__(self, frames):
        frames = tf.convert_to_tensor(frames)
        if frames.dtype != tf.uint8:
            raise TypeError(f'{self.name}: frames of dtype {frames.dtype.name}, expected uint8 as '
                            'the environment gives them (the torso scales them by 1/255 itself, '
                            'so that they are stored as bytes).')
        rank = frames.shape.rank
        allowed = (5, 4) if self.num_members == 1 else (5,)
        if (rank not in allowed or
                not frames.shape[rank - 3:].is_compatible_with(self.frame_shape) or
                (rank == 5 and not frames.shape[:1].is_compatible_with([self.num_members]))):
            raise ValueError(
                f'{self.name}: frames of shape {frames.shape} are not [members '
                f'({self.num_members}), batch, *{self.frame_shape}]'
                + (f' or [batch, *{self.frame_shape}]' if self.num_members == 1 else '') + '.')
        member_axis = rank == 5
        if self.num_members == 1 and member_axis:
            frames = frames[0]
        if not self.channels_last:  # Transposed as bytes, a quarter of the floats' traffic.
            frames = tf.transpose(frames, [0, 2, 3, 1] if rank == 4 or self.num_members == 1
                                  else [0, 1, 3, 4, 2])
        frames = tf.cast(frames, self.compute_dtype) / 255.0
        inputs = [frames] if self.num_members == 1 else tf.unstack(frames, self.num_members)
        flat = [tf.reshape(values, [-1, self.dense.kernel.shape[1]])
                for values in self._convolve(inputs)]
        if self.num_members == 1:
            features = tf.cast(tf.nn.relu(self.dense(flat[0])), tf.float32)
            return features[None] if member_axis else features
        return tf.cast(tf.nn.relu(self.dense(tf.stack(flat))), tf.float32)

    def _convolve(self, inputs):
        """The K members' NHWC frames in [0, 1] -> their last feature maps (a list of K)."""
        raise NotImplementedError


@gin.configurable
class NatureCNN(_Torso):
    """The DQN torso of Mnih et al. (2015), as CleanRL's `ppo_atari_envpool.py` has it: conv 32
    8x8 stride 4, conv 64 4x4 stride 2, conv 64 3x3 stride 1 (ReLU, no padding), flatten, dense
    `features` (512) ReLU; 84x84 frames give 64 x 7 x 7 = 3136 features to the dense layer.

    Orthogonal initialization with gain sqrt(2) and zero biases, as CleanRL's `layer_init`.
    The flattening is in NHWC order, not PyTorch's NCHW: a permutation of the dense layer's
    rows, the same function class and initialization distribution.
    """

    LAYERS = ((32, 8, 4), (64, 4, 2), (64, 3, 1))  # Channels, kernel size, stride.

    def __init__(self, frame_shape=(4, 84, 84), features=512, channels_last=False, seed=0,
                 initializer='orthogonal', compute_dtype='float32', name=None):
        super().__init__(frame_shape, channels_last, seed, compute_dtype, name)
        channels, height, width = self._channels, self._height, self._width
        self.convs = []
        for index, (out_channels, size, stride) in enumerate(self.LAYERS):
            height, width = (height - size) // stride + 1, (width - size) // stride + 1
            if height < 1 or width < 1:
                raise ValueError(f'{self.name}: frames of {self._height}x{self._width} are too '
                                 'small for the Nature CNN (at least 36x36).')
            self.convs.append(Conv2D(channels, out_channels, size, stride, seed=self._layer_seeds(
                index), initializer=initializer))
            channels = out_channels
        self.dense = networks.Linear(height * width * channels, features, networks.HIDDEN_GAIN,
                                     self._layer_seeds(len(self.convs)), initializer)

    def _convolve(self, inputs):
        for conv in self.convs:
            inputs = [tf.nn.relu(values) for values in conv(inputs)]
        return inputs


@gin.configurable
class ImpalaCNN(_Torso):
    """The deep residual torso of Espeholt et al. (2018, IMPALA), as CleanRL's `ppo_procgen.py`
    has it: per entry of `channels` (16, 32, 32) a conv 3x3, a max-pool 3x3 stride 2 and two
    residual blocks x + conv(relu(conv(relu(x)))); then ReLU, flatten, dense `features` (256)
    ReLU.

    Convolutions and pooling pad 'SAME', as the IMPALA authors' TensorFlow code (PyTorch's
    `padding=1` gives the same sizes but, on even sizes, pooling windows shifted by one pixel).
    Orthogonal initialization with gain sqrt(2) as the Nature CNN's, which issue 41 asks of
    both torsos; CleanRL's procgen agent keeps PyTorch's default, `initializer='torch_default'`.
    """

    def __init__(self, frame_shape=(4, 84, 84), channels=(16, 32, 32), features=256,
                 channels_last=False, seed=0, initializer='orthogonal', compute_dtype='float32',
                 name=None):
        super().__init__(frame_shape, channels_last, seed, compute_dtype, name)
        if not channels:
            raise ValueError(f'{self.name}: channels must name at least one stack, got '
                             f'{channels!r}.')
        in_channels, height, width = self._channels, self._height, self._width
        self.convs = []  # Five per stack: the first conv, then the blocks' two each.
        for out_channels in channels:
            for size_in in (in_channels, out_channels, out_channels, out_channels, out_channels):
                self.convs.append(Conv2D(size_in, out_channels, 3, padding='SAME',
                                         seed=self._layer_seeds(len(self.convs)),
                                         initializer=initializer))
            in_channels = out_channels
            height, width = math.ceil(height / 2), math.ceil(width / 2)  # The pooling's.
        self.dense = networks.Linear(height * width * in_channels, features, networks.HIDDEN_GAIN,
                                     self._layer_seeds(len(self.convs)), initializer)

    def _convolve(self, inputs):
        for start in range(0, len(self.convs), 5):
            first, *blocks = self.convs[start:start + 5]
            inputs = [tf.nn.max_pool2d(values, 3, 2, 'SAME') for values in first(inputs)]
            for conv0, conv1 in (blocks[:2], blocks[2:]):
                hidden = conv1([tf.nn.relu(values) for values in conv0(
                    [tf.nn.relu(values) for values in inputs])])
                inputs = [values + skip for values, skip in zip(hidden, inputs, strict=True)]
        return [tf.nn.relu(values) for values in inputs]
