"""Pendulum-v1 in TensorFlow: swing a pendulum up and hold it, with a limited torque.

The state is (angle, angular velocity). The arithmetic follows Gymnasium's `PendulumEnv.step`
operation by operation, including the float32 products of the action, so float64 states give
Gymnasium's trajectories to float32 rounding.
"""

import math

import gymnasium as gym
import numpy as np
import tensorflow as tf

from agents.envs import native_env

MAX_SPEED = 8.0
MAX_TORQUE = 2.0
DT = 0.05
GRAVITY = 10.0
MASS = 1.0
LENGTH = 1.0


def angle_normalize(angle):
    """`angle` wrapped to [-pi, pi), with Python's modulo like Gymnasium's `angle_normalize`."""
    return tf.math.floormod(angle + math.pi, 2 * math.pi) - math.pi


class Pendulum(native_env.NativeEnv):
    """Pendulum-v1: reward -(angle^2 + 0.1 speed^2 + 0.001 torque^2), never terminates."""

    gym_id = 'Pendulum-v1'
    max_episode_steps = 200
    state_size = 2
    observation_space = gym.spaces.Box(
        -np.array([1.0, 1.0, MAX_SPEED], np.float32), np.array([1.0, 1.0, MAX_SPEED], np.float32),
        dtype=np.float32)
    action_space = gym.spaces.Box(-MAX_TORQUE, MAX_TORQUE, shape=(1,), dtype=np.float32)

    def sample_initial_state(self, num_envs, seed):
        return self.uniform([num_envs, 2], seed, [-math.pi, -1.0], [math.pi, 1.0])

    def dynamics(self, state, action):
        angle, speed = tf.unstack(state, axis=1)
        # Gymnasium computes the action's terms in float32 (numpy keeps the action's dtype
        # when it meets Python floats), the rest in float64.
        torque = tf.clip_by_value(action[:, 0], -MAX_TORQUE, MAX_TORQUE)
        torque_cost = tf.cast(0.001 * tf.square(torque), self.dtype)
        torque_accel = tf.cast(3.0 / (MASS * LENGTH**2) * torque, self.dtype)
        costs = tf.square(angle_normalize(angle)) + 0.1 * tf.square(speed) + torque_cost
        new_speed = speed + (
            3 * GRAVITY / (2 * LENGTH) * tf.sin(angle) + torque_accel) * DT
        new_speed = tf.clip_by_value(new_speed, -MAX_SPEED, MAX_SPEED)
        new_angle = angle + new_speed * DT
        terminated = tf.zeros_like(angle, tf.bool)
        return tf.stack([new_angle, new_speed], axis=1), -costs, terminated

    def observe(self, state):
        angle, speed = tf.unstack(state, axis=1)
        return tf.cast(tf.stack([tf.cos(angle), tf.sin(angle), speed], axis=1), tf.float32)

    def to_gym_state(self, state):
        return np.asarray(state, np.float64).copy()

    def from_gym_state(self, gym_state):
        return native_env.check_gym_state(self, gym_state, self.state_size)

    def gym_render_attributes(self, action):
        # The arrow of the last torque.
        if action is None:
            return {'last_u': None}
        return {'last_u': np.float32(np.clip(np.asarray(action).reshape(-1)[0], -MAX_TORQUE,
                                             MAX_TORQUE))}
