"""MountainCarContinuous-v0 in TensorFlow: drive an underpowered car up a hill.

Gymnasium's `Continuous_MountainCarEnv` mixes float32 and float64 arithmetic: its start state is
float64, every later state float32, and numpy computes a term in float32 whenever a float32
scalar meets Python floats. The state here keeps a third column, 0 after a reset and 1 after a
step, so that float64 states round where Gymnasium's do and follow its trajectories exactly.
"""

import gymnasium as gym
import numpy as np
import tensorflow as tf

from agents.envs import native_env

MIN_ACTION = -1.0
MAX_ACTION = 1.0
MIN_POSITION = -1.2
MAX_POSITION = 0.6
MAX_SPEED = 0.07
GOAL_POSITION = 0.45
GOAL_VELOCITY = 0.0
POWER = 0.0015


class MountainCarContinuous(native_env.NativeEnv):
    """MountainCarContinuous-v0: reward 100 at the goal minus 0.1 action^2 per step."""

    gym_id = 'MountainCarContinuous-v0'
    max_episode_steps = 999
    state_size = 3  # Position, velocity, stepped since the reset (0 or 1).
    observation_space = gym.spaces.Box(
        np.array([MIN_POSITION, -MAX_SPEED], np.float32),
        np.array([MAX_POSITION, MAX_SPEED], np.float32), dtype=np.float32)
    action_space = gym.spaces.Box(MIN_ACTION, MAX_ACTION, shape=(1,), dtype=np.float32)

    def sample_initial_state(self, num_envs, seed):
        position = self.uniform([num_envs, 1], seed, -0.6, -0.4)
        return tf.concat([position, tf.zeros([num_envs, 2], self.dtype)], axis=1)

    def dynamics(self, state, action):
        position, velocity, stepped = tf.unstack(state, axis=1)
        stepped = stepped > 0
        rounded = self.round_to_float32
        action = action[:, 0]
        # Python's min/max keep the float32 action when it is in range, else a Python float.
        in_range = (action >= MIN_ACTION) & (action <= MAX_ACTION)
        force = tf.clip_by_value(action, MIN_ACTION, MAX_ACTION)
        # A float32 position makes 3 * position a float32 product.
        hill = 0.0025 * tf.cos(tf.where(stepped, rounded(3 * position), 3 * position))
        hill = tf.cast(hill, self.dtype)
        # In range, force * power - hill is float32 arithmetic.
        push_float32 = tf.cast(force * POWER - tf.cast(hill, tf.float32), self.dtype)
        push_float64 = tf.cast(force, self.dtype) * POWER - hill
        push = tf.where(in_range, push_float32, push_float64)
        # A float32 velocity adds a float32 push (Python floats become float32).
        velocity = tf.where(stepped, rounded(velocity + rounded(push)), velocity + push)
        velocity = tf.clip_by_value(velocity, -MAX_SPEED, MAX_SPEED)
        position = tf.where(
            stepped, rounded(position + rounded(velocity)), position + velocity)
        position = tf.clip_by_value(position, MIN_POSITION, MAX_POSITION)
        velocity = tf.where(
            tf.equal(position, MIN_POSITION) & (velocity < 0), tf.zeros_like(velocity), velocity)
        terminated = (position >= GOAL_POSITION) & (velocity >= GOAL_VELOCITY)
        # The reward charges the action as given, not the clipped force.
        reward = (100.0 * tf.cast(terminated, tf.float64)
                  - tf.square(tf.cast(action, tf.float64)) * 0.1)
        next_state = tf.stack(
            [rounded(position), rounded(velocity), tf.ones_like(position)], axis=1)
        return next_state, tf.cast(reward, self.dtype), terminated

    def observe(self, state):
        return tf.cast(state[:, :2], tf.float32)

    def to_gym_state(self, state):
        state = np.asarray(state, np.float64)
        # After a step Gymnasium's state is float32.
        return state[:2].astype(np.float32 if state[2] > 0 else np.float64)

    def from_gym_state(self, gym_state):
        position, velocity = native_env.check_gym_state(self, gym_state, 2)
        stepped = float(np.asarray(gym_state).dtype == np.float32)
        return np.array([position, velocity, stepped])
