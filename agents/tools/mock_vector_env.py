"""Deterministic VectorEnv for tests of code that drives vector environments.

Its observations encode (env index, episode count, step in episode), so a test can tell exactly
which environment was reset or stepped when, and it refuses to step a finished environment,
like a real VectorEnv in AutoresetMode.DISABLED.
"""

import gymnasium as gym
import numpy as np

AutoresetMode = gym.vector.AutoresetMode


class MockVectorEnv(gym.vector.VectorEnv):
    """Environment i ends its episodes after `durations[i]` steps.

    An episode ends as terminated where `terminates[i]` is true and as truncated otherwise. The
    reward of environment i is `i + 1` plus the sum of its action, so returns are predictable and
    show that actions arrive. Box observations are `[index, episodes, step, last action sum]`;
    Discrete observations are the step in the episode modulo n.
    """

    def __init__(self, durations, terminates=True, observation_space=None, action_space=None):
        durations = np.asarray(durations, np.int64)
        if durations.ndim != 1 or not len(durations) or (durations < 1).any():
            raise ValueError(f'durations must be a non-empty list of ints >= 1, got {durations}')
        self.num_envs = len(durations)
        self.durations = durations
        self.terminates = np.broadcast_to(np.asarray(terminates, bool), (self.num_envs,)).copy()
        self.metadata = {'autoreset_mode': AutoresetMode.DISABLED}
        self.single_observation_space = observation_space or gym.spaces.Box(
            -np.inf, np.inf, (4,), np.float32)
        self.single_action_space = action_space or gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
        if (isinstance(self.single_observation_space, gym.spaces.Box)
                and self.single_observation_space.shape != (4,)):
            raise ValueError('Box observation spaces of the mock must have shape (4,)')
        self.observation_space = gym.vector.utils.batch_space(
            self.single_observation_space, self.num_envs)
        self.action_space = gym.vector.utils.batch_space(self.single_action_space, self.num_envs)
        self.steps = np.zeros(self.num_envs, np.int64)
        self.episodes = np.zeros(self.num_envs, np.int64)
        self.needs_reset = np.ones(self.num_envs, bool)
        self.last_action_sum = np.zeros(self.num_envs, np.float64)
        self.actions = []  # Every batch of actions received, for tests to inspect.
        self.reset_masks = []  # The mask of every reset call.
        self.reset_seeds = []  # The seed of every reset call.
        self.closed = False

    def reset(self, *, seed=None, options=None):
        options = dict(options or {})
        mask = options.pop('reset_mask', np.ones(self.num_envs, bool))
        if not isinstance(mask, np.ndarray) or mask.dtype != np.bool_:
            raise TypeError(f'reset_mask must be a bool numpy array, got {mask!r}')
        if mask.shape != (self.num_envs,) or not mask.any():
            raise ValueError(f'reset_mask must have shape ({self.num_envs},) and a True value')
        self.reset_masks.append(mask.copy())
        self.reset_seeds.append(seed)
        self.steps[mask] = 0
        self.episodes[mask] += 1
        self.needs_reset[mask] = False
        self.last_action_sum[mask] = 0.0
        return self._observations(), {}

    def step(self, actions):
        if self.needs_reset.any():
            raise RuntimeError(
                f'stepped environments {np.flatnonzero(self.needs_reset)} that need a reset')
        actions = np.asarray(actions)
        self.actions.append(actions.copy())
        action_sum = actions.reshape(self.num_envs, -1).sum(axis=1).astype(np.float64)
        self.last_action_sum = action_sum
        self.steps += 1
        rewards = np.arange(1, self.num_envs + 1, dtype=np.float64) + action_sum
        ended = self.steps >= self.durations
        terminated = ended & self.terminates
        truncated = ended & ~self.terminates
        self.needs_reset = ended.copy()
        return self._observations(), rewards, terminated, truncated, {}

    def close_extras(self, **kwargs):
        self.closed = True

    def _observations(self):
        space = self.single_observation_space
        if isinstance(space, gym.spaces.Discrete):
            return (self.steps % space.n + space.start).astype(space.dtype)
        columns = [np.arange(self.num_envs), self.episodes, self.steps, self.last_action_sum]
        return np.stack(columns, axis=1).astype(space.dtype)
