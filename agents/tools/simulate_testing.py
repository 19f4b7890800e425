"""Seams of tests and benchmarks for `simulate`: a constant policy and a neutral action."""

import gymnasium as gym
import numpy as np
import tensorflow as tf

from agents.tools import simulate


class ConstantAlgorithm(simulate.Algorithm):
    """Performs the same action everywhere: the trivial policy of tests and benchmarks."""

    def __init__(self, action):
        self._action = tf.constant(action)

    def perform(self, agent_indices, observ):
        del observ
        shape = tf.concat([tf.shape(agent_indices), tf.shape(self._action)], 0)
        return tf.broadcast_to(self._action, shape), ()


def neutral_action(space):
    """An action in `space` that is valid and unremarkable: the middle of a Box, else the start."""
    if isinstance(space, gym.spaces.Box):
        finite = np.isfinite(space.low) & np.isfinite(space.high)
        action = np.clip(np.zeros(space.shape), space.low, space.high)
        action[finite] = (space.low[finite] + space.high[finite]) / 2
        return action.astype(space.dtype)
    if isinstance(space, (gym.spaces.Discrete, gym.spaces.MultiDiscrete)):
        return np.asarray(space.start, space.dtype)
    if isinstance(space, gym.spaces.MultiBinary):
        return np.zeros(space.shape, space.dtype)
    raise TypeError(f'no neutral action for space {space!r}')
