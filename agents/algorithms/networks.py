"""Policy and value networks of K members (members.py), built from plain `tf.Module`s.

Every variable has a leading member axis, and so has every input and output: `seed` is one
integer (K = 1) or one per member, and member k's weights are those a lone network of its seed
starts from. Every policy shares one interface so that the algorithms treat feed-forward and
recurrent policies alike:

* `initial_state(batch_size)` -> nested tensors `[K, B, ...]` (`()` for feed-forward policies);
* `reset_state(state, reset_mask)` -> state with the rows of newly started episodes zeroed;
* `step(observ, state)` -> `(params, new_state)` for one time step, observ `[K, B, *observ_shape]`;
* `sequence(observ, state, reset_mask)` -> params for chunks `[K, L, B, *observ_shape]` (time
  on the second axis), starting from `state` `[K, B, ...]` and resetting it before step `t`
  where `reset_mask[:, t]`;
* `distribution(params)` -> the action distribution (distributions.py).

Two capabilities are declared on every network (class attributes, False here): `takes_frames`,
whose observations reach it as the environment gives them (uint8 frames it scales itself,
conv_torsos.py) rather than cast to float32 and perhaps normalized; and `has_value_head`, a
feed-forward policy that also estimates the state value on its own features (a shared torso,
shared_torso.py): it adds `value(observ)` -> `[K, *batch]` and `params_and_value(observ)`, both
from one pass through the torso, and the actor-critic then has no value network of its own.

Policies return distribution *parameters* (a dict of tensors) rather than distributions so that the
rollout can store them and the update can rebuild the behaviour policy for an exact KL.

Layers use orthogonal initialization (gain sqrt(2) for hidden layers, 0.01 for the policy output
and 1 for the value output), as the implementation studies behind CleanRL and SB3 recommend for
on-policy methods; `initializer='torch_default'` gives PyTorch's `nn.Linear` default instead
(kernel and bias uniform in +-1/sqrt(fan_in)), which SB3's and CleanRL's SAC keep.
"""

import math

import gin
import tensorflow as tf

from agents.algorithms import distributions, members

HIDDEN_GAIN = math.sqrt(2.0)
INITIALIZERS = ('orthogonal', 'torch_default')


def _resolve_activation(activation):
    """Accepts a callable or the name of a `tf.nn` function (gin-friendly)."""
    if callable(activation):
        return activation
    function = getattr(tf.nn, str(activation), None)
    if not callable(function):
        raise ValueError(f'Unknown activation {activation!r}: expected a callable or the name of '
                         'a tf.nn function such as "tanh" or "relu".')
    return function


def check_sizes(**sizes):
    for name, size in sizes.items():
        if not isinstance(size, int) or isinstance(size, bool) or size < 1:
            raise ValueError(f'{name} must be a positive integer, got {size!r}.')


def _matmul(inputs, kernel):
    """`inputs` [K, B, in] times `kernel` [K, in, out], member by member; one member's inputs
    may come without the member axis, [B, in] -> [B, out]. bfloat16 inputs multiply the kernel
    cast to bfloat16 (conv_torsos.py's mixed precision); others are taken as the kernel's dtype.

    One member's is a plain matmul, and the networks keep one member's activations without the
    axis (`_Network._flatten_observ`): on CPUs TensorFlow's batched matmul and its gradient take
    about twice as long at these sizes, and in graph mode every op of slicing costs
    (benchmarks/README.md, "The member axis").
    """
    inputs = tf.convert_to_tensor(inputs)
    if inputs.dtype == tf.bfloat16:  # Mixed precision: float32 weights, bfloat16 arithmetic.
        kernel = tf.cast(kernel, tf.bfloat16)
    else:
        inputs = tf.convert_to_tensor(inputs, kernel.dtype)
    if inputs.shape.rank == 2:
        if kernel.shape[0] != 1:
            raise ValueError(f'inputs of shape {inputs.shape} without the member axis, but '
                             f'{kernel.shape[0]} members.')
        return tf.matmul(inputs, tf.reshape(kernel, kernel.shape[1:]))
    if kernel.shape[0] == 1:
        return tf.matmul(inputs[0], kernel[0])[None]
    return tf.matmul(inputs, kernel)


def _add_bias(values, bias):
    """`values` of `_matmul` plus `bias` [K, 1, out] (without its axes for [B, out] values)."""
    return add_bias(values, tf.reshape(bias, bias.shape[2:]) if values.shape.rank == 2 else bias)


def add_bias(values, bias):
    """`values + bias`, broadcast, in the values' dtype. For bfloat16 values (mixed precision)
    the float32 bias's gradient is summed in float32: summed in bfloat16 over a batch's rows and
    pixels it keeps few of its bits (measured: cosine 0.97 with the float32 gradient for the
    Nature CNN's first layer at 8 frames)."""
    if values.dtype != tf.bfloat16:
        return values + tf.cast(bias, values.dtype)

    @tf.custom_gradient
    def add(values, bias):
        def gradient(upstream):
            _, axes = tf.raw_ops.BroadcastGradientArgs(s0=tf.shape(values), s1=tf.shape(bias))
            summed = tf.reduce_sum(tf.cast(upstream, tf.float32), axes)
            return upstream, tf.reshape(summed, tf.shape(bias))
        return values + tf.cast(bias, tf.bfloat16), gradient

    return add(values, bias)


def _orthogonal(shape, gain, seeds, offset=0):
    """[K, *shape]: each member's orthogonal matrix of its seed (plus `offset`)."""
    return tf.stack([tf.keras.initializers.Orthogonal(gain=gain, seed=seed + offset)(shape)
                     for seed in seeds])


def _torch_default(shape, seeds, offset):
    """[K, *shape]: each member's values uniform in +-1/sqrt(fan_in), the first of `shape`
    (PyTorch's `nn.Linear` default for kernel and bias alike)."""
    bound = 1.0 / math.sqrt(shape[0])
    return tf.stack([tf.random.stateless_uniform(shape, [seed, offset], -bound, bound)
                     for seed in seeds])


def initial_weights(input_size, output_size, gain=1.0, seed=0, initializer='orthogonal'):
    """(kernel `[K, input_size, output_size]`, bias `[K, 1, output_size]`) of K members, as an
    affine layer starts: orthogonal with `gain` and zero biases, or (`initializer=
    'torch_default'`, `gain` unused) as PyTorch's `nn.Linear`. Also of a convolution, whose
    kernel is its filter flattened over the fan-in (conv_torsos.py)."""
    check_sizes(input_size=input_size, output_size=output_size)
    if initializer not in INITIALIZERS:
        raise ValueError(f'initializer must be one of {", ".join(map(repr, INITIALIZERS))}, '
                         f'got {initializer!r}.')
    seeds = members.seeds_of(seed)
    if initializer == 'orthogonal':
        return (_orthogonal((input_size, output_size), gain, seeds),
                tf.zeros([len(seeds), 1, output_size]))
    return (_torch_default((input_size, output_size), seeds, 0),
            tf.reshape(_torch_default((input_size, output_size), seeds, 1)[:, 0],
                       [len(seeds), 1, output_size]))


class Linear(tf.Module):
    """Affine layer of K members: `[K, B, input_size]` -> `[K, B, output_size]`, initialized
    as `initial_weights` says."""

    def __init__(self, input_size, output_size, gain=1.0, seed=0, initializer='orthogonal',
                 name=None):
        super().__init__(name=name)
        kernel, bias = initial_weights(input_size, output_size, gain, seed, initializer)
        self.kernel = tf.Variable(kernel, name='kernel')
        self.bias = tf.Variable(bias, name='bias')

    def __call__(self, inputs):
        return _add_bias(_matmul(inputs, self.kernel), self.bias)


class MLP(tf.Module):
    """Hidden layers applied to a batch `[K, B, input_size]`; the identity when `hidden_sizes`
    is empty."""

    def __init__(self, input_size, hidden_sizes, activation='tanh', seed=0,
                 initializer='orthogonal', name=None):
        super().__init__(name=name)
        self._activation = _resolve_activation(activation)
        seeds = members.seeds_of(seed)
        self.layers = []
        for index, size in enumerate(hidden_sizes):
            self.layers.append(Linear(input_size, size, HIDDEN_GAIN,
                                      [seed + index for seed in seeds], initializer))
            input_size = size
        self.output_size = input_size

    def __call__(self, inputs):
        for layer in self.layers:
            inputs = self._activation(layer(inputs))
        return inputs


class GRUCell(tf.Module):
    """Gated recurrent unit of K members (reset gate applied after the recurrent matmul, as in
    cuDNN); the state is `[K, B, units]`."""

    def __init__(self, input_size, units, seed=0, name=None):
        super().__init__(name=name)
        check_sizes(input_size=input_size, units=units)
        seeds = members.seeds_of(seed)
        self.units = units
        self.input_kernel = tf.Variable(
            _orthogonal((input_size, 3 * units), 1.0, seeds), name='input_kernel')
        self.recurrent_kernel = tf.Variable(
            tf.concat([_orthogonal((units, units), 1.0, seeds, 1 + gate) for gate in range(3)],
                      axis=2), name='recurrent_kernel')
        self.bias = tf.Variable(tf.zeros([len(seeds), 1, 3 * units]), name='bias')

    def input_projection(self, inputs):
        """The input part of all gates of `[K, B, input_size]`; batched over time outside the
        recurrent loop."""
        return _add_bias(_matmul(inputs, self.input_kernel), self.bias)

    def __call__(self, projected_inputs, state):
        x_update, x_reset, x_candidate = tf.split(projected_inputs, 3, axis=-1)
        h_update, h_reset, h_candidate = tf.split(
            _matmul(state, self.recurrent_kernel), 3, axis=-1)
        update = tf.sigmoid(x_update + h_update)
        reset = tf.sigmoid(x_reset + h_reset)
        candidate = tf.tanh(x_candidate + reset * h_candidate)
        return update * state + (1.0 - update) * candidate


class _Network(tf.Module):
    """Shared handling of observation shapes: flattens `[K, *batch, *observ_shape]` to rank 3."""

    takes_frames = False
    has_value_head = False

    def __init__(self, observ_shape, seed, name=None):
        super().__init__(name=name)
        self.observ_shape = tuple(int(size) for size in observ_shape)
        self.observ_size = math.prod(self.observ_shape)
        check_sizes(observ_size=self.observ_size)
        self.seeds = members.seeds_of(seed)
        self.num_members = len(self.seeds)

    def _flatten_observ(self, observ, flatten_features=True):
        """`observ` as a flat batch of float32 vectors (`_flat_shape`) and the batch shape; with
        `flatten_features=False` a batch of observations of `observ_shape` in their own dtype,
        `[K, B, *observ_shape]` (`[B, ...]` for one member)."""
        observ = tf.convert_to_tensor(observ)
        if flatten_features:
            observ = tf.cast(observ, tf.float32)
        rank = len(self.observ_shape)
        if observ.shape.rank is not None and (
                observ.shape.rank < rank + 1 or
                not observ.shape[:1].is_compatible_with([self.num_members]) or
                not observ.shape[observ.shape.rank - rank:].is_compatible_with(self.observ_shape)):
            raise ValueError(f'{self.name}: observations of shape {observ.shape} are not '
                             f'[members ({self.num_members}), ..., *{self.observ_shape}].')
        # [K, *batch]: static where known, since in graph mode every op of a shape costs.
        if observ.shape.is_fully_defined():
            batch_shape = observ.shape[:observ.shape.rank - rank].as_list()
        else:
            batch_shape = tf.shape(observ)[:tf.rank(observ) - rank]
        if not flatten_features:
            return tf.reshape(observ, self._flat_shape(*self.observ_shape)), batch_shape
        return tf.reshape(observ, self._flat_shape(self.observ_size)), batch_shape

    def _flat_shape(self, *size):
        """A flat batch of `size` features: `[K, B, *size]`, or `[B, *size]` for one member
        (whose layers then compute without the member axis; see `_matmul`)."""
        return [-1, *size] if self.num_members == 1 else [self.num_members, -1, *size]

    def _unflatten(self, values, batch_shape, scalar=False):
        """Flat `values` (`_flat_shape`) -> `[K, *batch, ...]` of `_flatten_observ`'s
        `batch_shape` (`scalar`: of flat values of size 1 -> `[K, *batch]`)."""
        lead = 1 if self.num_members == 1 else 2
        trailing = tf.TensorShape([]) if scalar else values.shape[lead:]
        if isinstance(batch_shape, list) and trailing.is_fully_defined():
            return tf.reshape(values, batch_shape + trailing.as_list())
        values = tf.reshape(values, batch_shape if scalar else tf.concat(
            [batch_shape, tf.shape(values)[lead:]], 0))
        if values.shape.rank is not None:  # The member axis stays static.
            values.set_shape([self.num_members] + [None] * (values.shape.rank - 1))
        return values


class FeedForwardPolicy(_Network):
    """Stateless policy: the state is an empty tuple and sequences are plain batches. The base
    of a new feed-forward policy (e.g. SAC's squashed Gaussian): it defines `_params(observ)`
    and `distribution(params)`."""

    recurrent = False

    def initial_state(self, batch_size):
        del batch_size
        return ()

    def reset_state(self, state, reset_mask):
        del reset_mask
        return state

    def step(self, observ, state):
        return self._params(observ), state

    def sequence(self, observ, state, reset_mask):
        del state, reset_mask
        return self._params(observ)

    def _params(self, observ):
        raise NotImplementedError


def _gaussian_params(log_std, loc):
    """The Gaussian's parameters of means `loc` [K, ..., A] and state-independent `log_std`
    [K, A]."""
    scale = members.broadcast(tf.exp(log_std), loc)
    return {'loc': loc, 'scale': tf.broadcast_to(scale, tf.shape(loc))}


def _gaussian_distribution(params):
    return distributions.DiagonalGaussian(params['loc'], params['scale'])


@gin.configurable
class FeedForwardGaussianPolicy(FeedForwardPolicy):
    """Diagonal Gaussian over continuous actions with a learned, state-independent log-std."""

    action_dtype = tf.float32

    def __init__(self, observ_shape, action_size, hidden_sizes=(64, 64), activation='tanh',
                 init_std=1.0, output_gain=0.01, seed=0, name=None):
        super().__init__(observ_shape, seed, name=name)
        check_sizes(action_size=action_size)
        if init_std <= 0:
            raise ValueError(f'init_std must be positive, got {init_std}.')
        self.action_shape = (action_size,)
        self.torso = MLP(self.observ_size, hidden_sizes, activation, self.seeds)
        self.mean = Linear(self.torso.output_size, action_size, output_gain,
                           [seed + 100 for seed in self.seeds])
        self.log_std = tf.Variable(tf.fill([self.num_members, action_size], math.log(init_std)),
                                   name='log_std')

    def _params(self, observ):
        flat, batch_shape = self._flatten_observ(observ)
        return _gaussian_params(self.log_std,
                                self._unflatten(self.mean(self.torso(flat)), batch_shape))

    def distribution(self, params):
        return _gaussian_distribution(params)


@gin.configurable
class FeedForwardCategoricalPolicy(FeedForwardPolicy):
    """Categorical distribution over `action_size` discrete actions (int32 action indices)."""

    action_dtype = tf.int32
    action_shape = ()

    def __init__(self, observ_shape, action_size, hidden_sizes=(64, 64), activation='tanh',
                 output_gain=0.01, seed=0, name=None):
        super().__init__(observ_shape, seed, name=name)
        check_sizes(action_size=action_size)
        self.torso = MLP(self.observ_size, hidden_sizes, activation, self.seeds)
        self.logits = Linear(self.torso.output_size, action_size, output_gain,
                             [seed + 100 for seed in self.seeds])

    def _params(self, observ):
        flat, batch_shape = self._flatten_observ(observ)
        return {'logits': self._unflatten(self.logits(self.torso(flat)), batch_shape)}

    def distribution(self, params):
        return distributions.Categorical(params['logits'], dtype=self.action_dtype)


@gin.configurable
class RecurrentGaussianPolicy(_Network):
    """Gaussian policy whose mean comes from a GRU over an MLP encoding of the observations.

    The log-std is state-independent, as for the feed-forward policy. The state is the GRU's hidden
    vector `[K, B, gru_units]`; it is zeroed where an episode starts.
    """

    recurrent = True
    action_dtype = tf.float32

    def __init__(self, observ_shape, action_size, hidden_sizes=(64,), gru_units=64,
                 activation='tanh', init_std=1.0, output_gain=0.01, seed=0, name=None):
        super().__init__(observ_shape, seed, name=name)
        check_sizes(action_size=action_size)
        if init_std <= 0:
            raise ValueError(f'init_std must be positive, got {init_std}.')
        self.action_shape = (action_size,)
        self.encoder = MLP(self.observ_size, hidden_sizes, activation, self.seeds)
        self.cell = GRUCell(self.encoder.output_size, gru_units,
                            [seed + 50 for seed in self.seeds])
        self.mean = Linear(gru_units, action_size, output_gain,
                           [seed + 100 for seed in self.seeds])
        self.log_std = tf.Variable(tf.fill([self.num_members, action_size], math.log(init_std)),
                                   name='log_std')

    def initial_state(self, batch_size):
        return tf.zeros([self.num_members, batch_size, self.cell.units])

    def reset_state(self, state, reset_mask):
        return tf.where(tf.convert_to_tensor(reset_mask, tf.bool)[..., None],
                        tf.zeros_like(state), state)

    def step(self, observ, state):
        flat, _ = self._flatten_observ(observ)
        state = self.cell(self.cell.input_projection(self.encoder(flat)), state)
        return _gaussian_params(self.log_std, self.mean(state)), state

    def sequence(self, observ, state, reset_mask):
        flat, batch_shape = self._flatten_observ(observ)  # batch_shape is [K, L, B].
        projected = self._unflatten(self.cell.input_projection(self.encoder(flat)), batch_shape)

        def recur(previous, inputs):
            projected_step, reset_step = inputs
            return self.cell(projected_step, self.reset_state(previous, reset_step))

        # tf.scan runs over the leading axis: time first while recurring.
        hidden = tf.scan(recur, (tf.transpose(projected, [1, 0, 2, 3]), tf.transpose(
            tf.convert_to_tensor(reset_mask, tf.bool), [1, 0, 2])), state)
        hidden = tf.transpose(hidden, [1, 0, 2, 3])
        means = self.mean(tf.reshape(hidden, self._flat_shape(self.cell.units)))
        return _gaussian_params(self.log_std, self._unflatten(means, batch_shape))

    def distribution(self, params):
        return _gaussian_distribution(params)


@gin.configurable
class FeedForwardValue(_Network):
    """State-value estimate `V(s)` from a separate MLP, returning `[K, *batch]`."""

    def __init__(self, observ_shape, hidden_sizes=(64, 64), activation='tanh', seed=0,
                 initializer='orthogonal', name=None):
        super().__init__(observ_shape, seed, name=name)
        self.torso = MLP(self.observ_size, hidden_sizes, activation, self.seeds, initializer)
        self.head = Linear(self.torso.output_size, 1, 1.0, [seed + 100 for seed in self.seeds],
                           initializer)

    def __call__(self, observ):
        flat, batch_shape = self._flatten_observ(observ)
        return self._unflatten(self.head(self.torso(flat)), batch_shape, scalar=True)
