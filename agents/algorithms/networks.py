"""Policy and value networks for PPO, built from plain `tf.Module`s.

Every policy shares one interface so that PPO treats feed-forward and recurrent policies alike:

* `initial_state(batch_size)` -> nested tensors (`()` for feed-forward policies);
* `reset_state(state, reset_mask)` -> state with the rows of newly started episodes zeroed;
* `step(observ, state)` -> `(params, new_state)` for one time step, observ `[B, *observ_shape]`;
* `sequence(observ, state, reset_mask)` -> params for time-major chunks `[L, B, *observ_shape]`,
  starting from `state` `[B, ...]` and resetting it before step `t` where `reset_mask[t]`;
* `distribution(params)` -> the action distribution (distributions.py).

Policies return distribution *parameters* (a dict of tensors) rather than distributions so that the
rollout can store them and the update can rebuild the behaviour policy for an exact KL.

Layers use orthogonal initialization (gain sqrt(2) for hidden layers, 0.01 for the policy output
and 1 for the value output), as the implementation studies behind CleanRL and SB3 recommend.
"""

import math

import gin
import tensorflow as tf

from agents.algorithms import distributions

HIDDEN_GAIN = math.sqrt(2.0)


def _resolve_activation(activation):
    """Accepts a callable or the name of a `tf.nn` function (gin-friendly)."""
    if callable(activation):
        return activation
    function = getattr(tf.nn, str(activation), None)
    if not callable(function):
        raise ValueError(f'Unknown activation {activation!r}: expected a callable or the name of '
                         'a tf.nn function such as "tanh" or "relu".')
    return function


def _check_sizes(**sizes):
    for name, size in sizes.items():
        if not isinstance(size, int) or isinstance(size, bool) or size < 1:
            raise ValueError(f'{name} must be a positive integer, got {size!r}.')


class Linear(tf.Module):
    """Affine layer with an orthogonally initialized kernel and a zero bias."""

    def __init__(self, input_size, output_size, gain=1.0, seed=0, name=None):
        super().__init__(name=name)
        _check_sizes(input_size=input_size, output_size=output_size)
        initializer = tf.keras.initializers.Orthogonal(gain=gain, seed=seed)
        self.kernel = tf.Variable(initializer((input_size, output_size)), name='kernel')
        self.bias = tf.Variable(tf.zeros([output_size]), name='bias')

    def __call__(self, inputs):
        return tf.matmul(inputs, self.kernel) + self.bias


class MLP(tf.Module):
    """Hidden layers applied to a rank-2 batch; the identity when `hidden_sizes` is empty."""

    def __init__(self, input_size, hidden_sizes, activation='tanh', seed=0, name=None):
        super().__init__(name=name)
        self._activation = _resolve_activation(activation)
        self.layers = []
        for index, size in enumerate(hidden_sizes):
            self.layers.append(Linear(input_size, size, HIDDEN_GAIN, seed + index))
            input_size = size
        self.output_size = input_size

    def __call__(self, inputs):
        for layer in self.layers:
            inputs = self._activation(layer(inputs))
        return inputs


class GRUCell(tf.Module):
    """Gated recurrent unit (reset gate applied after the recurrent matmul, as in cuDNN)."""

    def __init__(self, input_size, units, seed=0, name=None):
        super().__init__(name=name)
        _check_sizes(input_size=input_size, units=units)
        self.units = units
        self.input_kernel = tf.Variable(
            tf.keras.initializers.Orthogonal(seed=seed)((input_size, 3 * units)),
            name='input_kernel')
        self.recurrent_kernel = tf.Variable(
            tf.concat([tf.keras.initializers.Orthogonal(seed=seed + 1 + gate)((units, units))
                       for gate in range(3)], axis=1), name='recurrent_kernel')
        self.bias = tf.Variable(tf.zeros([3 * units]), name='bias')

    def input_projection(self, inputs):
        """The input part of all gates; batched over time outside the recurrent loop."""
        return tf.matmul(inputs, self.input_kernel) + self.bias

    def __call__(self, projected_inputs, state):
        x_update, x_reset, x_candidate = tf.split(projected_inputs, 3, axis=-1)
        h_update, h_reset, h_candidate = tf.split(
            tf.matmul(state, self.recurrent_kernel), 3, axis=-1)
        update = tf.sigmoid(x_update + h_update)
        reset = tf.sigmoid(x_reset + h_reset)
        candidate = tf.tanh(x_candidate + reset * h_candidate)
        return update * state + (1.0 - update) * candidate


class _Network(tf.Module):
    """Shared handling of observation shapes: flattens `[*batch, *observ_shape]` to rank 2."""

    def __init__(self, observ_shape, name=None):
        super().__init__(name=name)
        self.observ_shape = tuple(int(size) for size in observ_shape)
        self.observ_size = math.prod(self.observ_shape)
        _check_sizes(observ_size=self.observ_size)

    def _flatten_observ(self, observ):
        observ = tf.convert_to_tensor(observ, tf.float32)
        rank = len(self.observ_shape)
        if observ.shape.rank is not None and (
                observ.shape.rank < rank or
                not observ.shape[observ.shape.rank - rank:].is_compatible_with(self.observ_shape)):
            raise ValueError(f'{self.name}: observations of shape {observ.shape} do not end in the '
                             f'observation shape {self.observ_shape}.')
        batch_shape = tf.shape(observ)[:tf.rank(observ) - rank]
        return tf.reshape(observ, [-1, self.observ_size]), batch_shape

    @staticmethod
    def _unflatten(values, batch_shape):
        return tf.reshape(values, tf.concat([batch_shape, tf.shape(values)[1:]], 0))


class _FeedForwardPolicy(_Network):
    """Stateless policy: the state is an empty tuple and sequences are plain batches."""

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


def _gaussian_distribution(params):
    return distributions.DiagonalGaussian(params['loc'], params['scale'])


@gin.configurable
class FeedForwardGaussianPolicy(_FeedForwardPolicy):
    """Diagonal Gaussian over continuous actions with a learned, state-independent log-std."""

    action_dtype = tf.float32

    def __init__(self, observ_shape, action_size, hidden_sizes=(64, 64), activation='tanh',
                 init_std=1.0, output_gain=0.01, seed=0, name=None):
        super().__init__(observ_shape, name=name)
        _check_sizes(action_size=action_size)
        if init_std <= 0:
            raise ValueError(f'init_std must be positive, got {init_std}.')
        self.action_shape = (action_size,)
        self.torso = MLP(self.observ_size, hidden_sizes, activation, seed)
        self.mean = Linear(self.torso.output_size, action_size, output_gain, seed + 100)
        self.log_std = tf.Variable(tf.fill([action_size], math.log(init_std)), name='log_std')

    def _params(self, observ):
        flat, batch_shape = self._flatten_observ(observ)
        loc = self._unflatten(self.mean(self.torso(flat)), batch_shape)
        return {'loc': loc, 'scale': tf.broadcast_to(tf.exp(self.log_std), tf.shape(loc))}

    def distribution(self, params):
        return _gaussian_distribution(params)


@gin.configurable
class FeedForwardCategoricalPolicy(_FeedForwardPolicy):
    """Categorical distribution over `action_size` discrete actions (int32 action indices)."""

    action_dtype = tf.int32
    action_shape = ()

    def __init__(self, observ_shape, action_size, hidden_sizes=(64, 64), activation='tanh',
                 output_gain=0.01, seed=0, name=None):
        super().__init__(observ_shape, name=name)
        _check_sizes(action_size=action_size)
        self.torso = MLP(self.observ_size, hidden_sizes, activation, seed)
        self.logits = Linear(self.torso.output_size, action_size, output_gain, seed + 100)

    def _params(self, observ):
        flat, batch_shape = self._flatten_observ(observ)
        return {'logits': self._unflatten(self.logits(self.torso(flat)), batch_shape)}

    def distribution(self, params):
        return distributions.Categorical(params['logits'], dtype=self.action_dtype)


@gin.configurable
class RecurrentGaussianPolicy(_Network):
    """Gaussian policy whose mean comes from a GRU over an MLP encoding of the observations.

    The log-std is state-independent, as for the feed-forward policy. The state is the GRU's hidden
    vector `[B, gru_units]`; it is zeroed where an episode starts.
    """

    recurrent = True
    action_dtype = tf.float32

    def __init__(self, observ_shape, action_size, hidden_sizes=(64,), gru_units=64,
                 activation='tanh', init_std=1.0, output_gain=0.01, seed=0, name=None):
        super().__init__(observ_shape, name=name)
        _check_sizes(action_size=action_size)
        if init_std <= 0:
            raise ValueError(f'init_std must be positive, got {init_std}.')
        self.action_shape = (action_size,)
        self.encoder = MLP(self.observ_size, hidden_sizes, activation, seed)
        self.cell = GRUCell(self.encoder.output_size, gru_units, seed + 50)
        self.mean = Linear(gru_units, action_size, output_gain, seed + 100)
        self.log_std = tf.Variable(tf.fill([action_size], math.log(init_std)), name='log_std')

    def initial_state(self, batch_size):
        return tf.zeros([batch_size, self.cell.units])

    def reset_state(self, state, reset_mask):
        return tf.where(tf.convert_to_tensor(reset_mask, tf.bool)[:, None],
                        tf.zeros_like(state), state)

    def step(self, observ, state):
        flat, _ = self._flatten_observ(observ)
        state = self.cell(self.cell.input_projection(self.encoder(flat)), state)
        return self._gaussian_params(self.mean(state)), state

    def sequence(self, observ, state, reset_mask):
        flat, batch_shape = self._flatten_observ(observ)  # batch_shape is [L, B].
        projected = self._unflatten(self.cell.input_projection(self.encoder(flat)), batch_shape)

        def recur(previous, inputs):
            projected_step, reset_step = inputs
            return self.cell(projected_step, self.reset_state(previous, reset_step))

        hidden = tf.scan(recur, (projected, tf.convert_to_tensor(reset_mask, tf.bool)), state)
        means = self.mean(tf.reshape(hidden, [-1, self.cell.units]))
        return self._gaussian_params(self._unflatten(means, batch_shape))

    def _gaussian_params(self, loc):
        return {'loc': loc, 'scale': tf.broadcast_to(tf.exp(self.log_std), tf.shape(loc))}

    def distribution(self, params):
        return _gaussian_distribution(params)


@gin.configurable
class FeedForwardValue(_Network):
    """State-value estimate `V(s)` from a separate MLP, returning `[*batch]`."""

    def __init__(self, observ_shape, hidden_sizes=(64, 64), activation='tanh', seed=0,
                 name=None):
        super().__init__(observ_shape, name=name)
        self.torso = MLP(self.observ_size, hidden_sizes, activation, seed)
        self.head = Linear(self.torso.output_size, 1, 1.0, seed + 100)

    def __call__(self, observ):
        flat, batch_shape = self._flatten_observ(observ)
        return tf.reshape(self.head(self.torso(flat)), batch_shape)
