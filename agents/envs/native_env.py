"""The interface of native environments: a task's physics as pure TensorFlow functions.

A `NativeEnv` describes one task (its Gymnasium id, spaces and time limit) and its physics as
functions of tensors over a batch dimension: sampling start states, one step of the dynamics,
the observation. They hold no variables and run no Python per step, so they compile into any
TF program, a `tf.while_loop` or XLA alike. `native_batch_env.NativeBatchEnv` keeps a batch of
states in variables behind the interface of `InGraphBatchEnv`, for `simulate.Simulator`.

States are [N, state_size] tensors of `dtype`. float64, the default, is what Gymnasium's numpy
code computes in, so trajectories match Gymnasium's within float32 rounding over whole episodes;
float32 is faster but drifts apart on the chaotic tasks (see each task's module).
"""

import gymnasium as gym
import numpy as np
import tensorflow as tf

# Counter-based and the same with and without XLA, so a seed gives the same start states
# whichever way the program is compiled.
RNG_ALGORITHM = tf.random.Algorithm.PHILOX

_DTYPES = (tf.float32, tf.float64)


class NativeEnv:
    """One task: its Gymnasium spaces and time limit, and its physics as pure functions.

    Subclasses set the class attributes and implement `sample_initial_state`, `dynamics`,
    `observe`, `to_gym_state` and `from_gym_state`.

    Attributes:
      gym_id: the Gymnasium id of the task this env reproduces.
      max_episode_steps: Gymnasium's time limit: episodes are truncated after this many steps.
      state_size: columns of a state tensor.
      observation_space, action_space: the spaces of one environment, equal to Gymnasium's.
      dtype: tf.float64 or tf.float32, the dtype of states and of the physics.
    """

    gym_id: str
    max_episode_steps: int
    state_size: int
    observation_space: gym.Space
    action_space: gym.Space

    def __init__(self, dtype=tf.float64):
        dtype = tf.as_dtype(dtype)
        if dtype not in _DTYPES:
            raise ValueError(
                f'{type(self).__name__} dtype must be one of {[d.name for d in _DTYPES]}, '
                f'got {dtype.name}')
        self.dtype = dtype

    def __repr__(self):
        return f'{type(self).__name__}({self.gym_id}, dtype={self.dtype.name})'

    def sample_initial_state(self, num_envs, seed):
        """[num_envs, state_size] start states drawn with the stateless RNG from `seed` ([2])."""
        raise NotImplementedError

    def dynamics(self, state, action):
        """One step: (next state, reward [N] of `dtype`, bool terminated [N]).

        `action` is [N, *action_space.shape] of the action space's dtype; out-of-range values
        are treated as Gymnasium treats them (continuous actions are clipped).
        """
        raise NotImplementedError

    def observe(self, state):
        """[N, *observation_space.shape] float32 observations of `state`."""
        raise NotImplementedError

    def to_gym_state(self, state):
        """The `env.unwrapped.state` of the Gymnasium env in the state `state` ([state_size])."""
        raise NotImplementedError

    def from_gym_state(self, gym_state):
        """[state_size] numpy state equal to the Gymnasium env's `env.unwrapped.state`."""
        raise NotImplementedError

    def gym_render_attributes(self, action):
        """Other attributes of the unwrapped Gymnasium env that its rendering reads, given the
        last action (None after a reset), e.g. Pendulum's torque arrow."""
        del action
        return {}

    def uniform(self, shape, seed, low, high):
        """Uniform samples in [low, high) of `dtype`, like numpy's `Generator.uniform`.

        TF's float samples differ with and without XLA; its random bits do not, so the floats
        are made from the bits here, as numpy makes them: the top 53 (or 24) bits times 2^-53.
        """
        bits = tf.random.stateless_uniform(
            shape, seed, minval=None, maxval=None, dtype=tf.uint64, alg=RNG_ALGORITHM)
        mantissa = 53 if self.dtype == tf.float64 else 24
        unit = tf.cast(tf.bitwise.right_shift(bits, tf.constant(64 - mantissa, tf.uint64)),
                       self.dtype) * (2.0 ** -mantissa)
        low = tf.cast(low, self.dtype)
        return low + (tf.cast(high, self.dtype) - low) * unit

    def round_to_float32(self, values):
        """`values` rounded to float32 (and back to `dtype`), as Gymnasium stores some states."""
        if self.dtype == tf.float32:
            return values
        return tf.cast(tf.cast(values, tf.float32), self.dtype)


def check_gym_state(env, gym_state, size):
    """`gym_state` as a float64 numpy vector of `size` entries, or a clear error."""
    state = np.asarray(gym_state, np.float64)
    if state.shape != (size,):
        raise ValueError(
            f'{env.gym_id} state must have shape ({size},), got {np.shape(gym_state)}')
    return state
