"""Acrobot-v1 in TensorFlow: swing the tip of a two-link chain above a line, torquing the joint.

The state is (theta1, theta2, dtheta1, dtheta2), advanced by one fourth-order Runge-Kutta step of
0.2 s of the book's equations of motion, exactly as Gymnasium's `AcrobotEnv` with its defaults
(no torque noise). The motion is chaotic: float32 states part from Gymnasium's trajectories
within tens of steps, float64 states (the default) stay within float32 rounding of them.
"""

import math

import gymnasium as gym
import numpy as np
import tensorflow as tf

from agents.envs import native_env

DT = 0.2
LINK_LENGTH_1 = 1.0
LINK_MASS_1 = 1.0
LINK_MASS_2 = 1.0
LINK_COM_POS_1 = 0.5
LINK_COM_POS_2 = 0.5
LINK_MOI = 1.0
MAX_VEL_1 = 4 * math.pi
MAX_VEL_2 = 9 * math.pi
AVAIL_TORQUE = (-1.0, 0.0, 1.0)
GRAVITY = 9.8


def wrap(x, low, high):
    """`x` shifted by whole periods into [low, high], like Gymnasium's `wrap` loops do."""
    period = high - low
    above = tf.math.ceil((x - high) / period)
    below = tf.math.ceil((low - x) / period)
    return tf.where(x > high, x - above * period, tf.where(x < low, x + below * period, x))


def _derivatives(theta1, theta2, dtheta1, dtheta2, torque):
    """Time derivatives of the state, `AcrobotEnv._dsdt` ("book" dynamics) term by term."""
    m1, m2 = LINK_MASS_1, LINK_MASS_2
    l1 = LINK_LENGTH_1
    lc1, lc2 = LINK_COM_POS_1, LINK_COM_POS_2
    i1 = i2 = LINK_MOI
    g = GRAVITY
    pi = math.pi
    cos, sin = tf.cos, tf.sin
    d1 = m1 * lc1**2 + m2 * (l1**2 + lc2**2 + 2 * l1 * lc2 * cos(theta2)) + i1 + i2
    d2 = m2 * (lc2**2 + l1 * lc2 * cos(theta2)) + i2
    phi2 = m2 * lc2 * g * cos(theta1 + theta2 - pi / 2.0)
    phi1 = (
        -m2 * l1 * lc2 * tf.square(dtheta2) * sin(theta2)
        - 2 * m2 * l1 * lc2 * dtheta2 * dtheta1 * sin(theta2)
        + (m1 * lc1 + m2 * l1) * g * cos(theta1 - pi / 2)
        + phi2
    )
    ddtheta2 = (
        torque + d2 / d1 * phi1 - m2 * l1 * lc2 * tf.square(dtheta1) * sin(theta2) - phi2
    ) / (m2 * lc2**2 + i2 - tf.square(d2) / d1)
    ddtheta1 = -(d2 * ddtheta2 + phi1) / d1
    return dtheta1, dtheta2, ddtheta1, ddtheta2


class Acrobot(native_env.NativeEnv):
    """Acrobot-v1: reward -1 per step until the tip rises a link's length above the pivot."""

    gym_id = 'Acrobot-v1'
    max_episode_steps = 500
    state_size = 4
    observation_space = gym.spaces.Box(
        -np.array([1.0, 1.0, 1.0, 1.0, MAX_VEL_1, MAX_VEL_2], np.float32),
        np.array([1.0, 1.0, 1.0, 1.0, MAX_VEL_1, MAX_VEL_2], np.float32), dtype=np.float32)
    action_space = gym.spaces.Discrete(3)

    def sample_initial_state(self, num_envs, seed):
        # Gymnasium stores its start states as float32.
        return self.round_to_float32(self.uniform([num_envs, 4], seed, -0.1, 0.1))

    def dynamics(self, state, action):
        torque = tf.gather(tf.constant(AVAIL_TORQUE, self.dtype), action)
        y0 = tf.unstack(state, axis=1)
        # rk4(self._dsdt, s_augmented, [0, self.dt]): one step; the torque stays constant.
        dt = DT - 0
        dt2 = dt / 2.0
        k1 = _derivatives(*y0, torque)
        k2 = _derivatives(*[y + dt2 * k for y, k in zip(y0, k1, strict=True)], torque)
        k3 = _derivatives(*[y + dt2 * k for y, k in zip(y0, k2, strict=True)], torque)
        k4 = _derivatives(*[y + dt * k for y, k in zip(y0, k3, strict=True)], torque)
        theta1, theta2, dtheta1, dtheta2 = [
            y + dt / 6.0 * (a + 2 * b + 2 * c + d)
            for y, a, b, c, d in zip(y0, k1, k2, k3, k4, strict=True)]
        theta1 = wrap(theta1, -math.pi, math.pi)
        theta2 = wrap(theta2, -math.pi, math.pi)
        dtheta1 = tf.clip_by_value(dtheta1, -MAX_VEL_1, MAX_VEL_1)
        dtheta2 = tf.clip_by_value(dtheta2, -MAX_VEL_2, MAX_VEL_2)
        terminated = -tf.cos(theta1) - tf.cos(theta2 + theta1) > 1.0
        reward = tf.where(terminated, tf.zeros_like(theta1), -tf.ones_like(theta1))
        return tf.stack([theta1, theta2, dtheta1, dtheta2], axis=1), reward, terminated

    def observe(self, state):
        theta1, theta2, dtheta1, dtheta2 = tf.unstack(state, axis=1)
        return tf.cast(tf.stack([tf.cos(theta1), tf.sin(theta1), tf.cos(theta2),
                                 tf.sin(theta2), dtheta1, dtheta2], axis=1), tf.float32)

    def to_gym_state(self, state):
        return np.asarray(state, np.float64).copy()

    def from_gym_state(self, gym_state):
        return native_env.check_gym_state(self, gym_state, self.state_size)
