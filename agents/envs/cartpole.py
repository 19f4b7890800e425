"""CartPole-v1 in TensorFlow: balance a pole on a cart pushed left or right.

The state is (cart position, cart velocity, pole angle, pole angular velocity), integrated with
Gymnasium's explicit Euler steps. The constants are computed from the same Python expressions
as in Gymnasium's `CartPoleEnv`, so float64 states follow its trajectories to the last bit or so.
"""

import math

import gymnasium as gym
import numpy as np
import tensorflow as tf

from agents.envs import native_env

GRAVITY = 9.8
MASS_CART = 1.0
MASS_POLE = 0.1
TOTAL_MASS = MASS_POLE + MASS_CART
LENGTH = 0.5  # Half the pole's length.
POLE_MASS_LENGTH = MASS_POLE * LENGTH
FORCE_MAG = 10.0
TAU = 0.02  # Seconds per step.
THETA_THRESHOLD = 12 * 2 * math.pi / 360
X_THRESHOLD = 2.4


class CartPole(native_env.NativeEnv):
    """CartPole-v1: reward 1 per step, terminates when the pole falls or the cart leaves."""

    gym_id = 'CartPole-v1'
    max_episode_steps = 500
    state_size = 4
    observation_space = gym.spaces.Box(
        -np.array([X_THRESHOLD * 2, np.inf, THETA_THRESHOLD * 2, np.inf], np.float32),
        np.array([X_THRESHOLD * 2, np.inf, THETA_THRESHOLD * 2, np.inf], np.float32),
        dtype=np.float32)
    action_space = gym.spaces.Discrete(2)

    def sample_initial_state(self, num_envs, seed):
        return self.uniform([num_envs, 4], seed, -0.05, 0.05)

    def dynamics(self, state, action):
        x, x_dot, theta, theta_dot = tf.unstack(state, axis=1)
        force = tf.where(tf.equal(action, 1), FORCE_MAG, -FORCE_MAG)
        force = tf.cast(force, self.dtype)
        costheta, sintheta = tf.cos(theta), tf.sin(theta)
        temp = (force + POLE_MASS_LENGTH * tf.square(theta_dot) * sintheta) / TOTAL_MASS
        thetaacc = (GRAVITY * sintheta - costheta * temp) / (
            LENGTH * (4.0 / 3.0 - MASS_POLE * tf.square(costheta) / TOTAL_MASS))
        xacc = temp - POLE_MASS_LENGTH * thetaacc * costheta / TOTAL_MASS
        x = x + TAU * x_dot
        x_dot = x_dot + TAU * xacc
        theta = theta + TAU * theta_dot
        theta_dot = theta_dot + TAU * thetaacc
        terminated = ((x < -X_THRESHOLD) | (x > X_THRESHOLD)
                      | (theta < -THETA_THRESHOLD) | (theta > THETA_THRESHOLD))
        reward = tf.ones_like(x)  # Also on the step that ends the episode.
        return tf.stack([x, x_dot, theta, theta_dot], axis=1), reward, terminated

    def observe(self, state):
        return tf.cast(state, tf.float32)

    def to_gym_state(self, state):
        return np.asarray(state, np.float64).copy()

    def from_gym_state(self, gym_state):
        return native_env.check_gym_state(self, gym_state, self.state_size)
