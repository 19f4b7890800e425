"""Episodes of a policy in one environment, seeded per episode so every tool reports the same.

The videos of `visualize` and the metrics of `evaluate` come from this one loop: episode `i`
starts from `env.reset(seed=seed + i)`, so the same policy, environment and seed give the same
returns whichever tool ran them, and an episode can be replayed alone.

A policy here is any object with
  `initial_state(batch_size)` -> its recurrent state (`()` if it has none), and
  `__call__(observ [B, ...], state, reset [B] bool)` -> `(action [B, ...], new_state)`,
where `reset` marks the first step of an episode (see `policy_export.SavedPolicy` and
`restore.AgentPolicy`).
"""

from typing import NamedTuple

import gymnasium as gym
import numpy as np


class Episode(NamedTuple):
    """One finished episode: its index, the seed of its reset, its return and length."""
    index: int
    seed: int
    episode_return: float
    length: int


def run_episodes(env, policy, num_episodes, seed=0, on_step=None, max_steps=None):
    """Runs `num_episodes` episodes of `policy` in `env`; returns a list of `Episode`s.

    Args:
      env: a single (not vector) Gymnasium environment.
      policy: see the module docstring; called with a batch of one observation.
      num_episodes: episodes to run.
      seed: episode `i` resets the environment with seed `seed + i`.
      on_step: optional `on_step(episode_index, step)`, called after the reset (step 0) and
        after every step, e.g. to render a frame.
      max_steps: end an episode after this many steps even if the environment does not.
    """
    return list(iterate_episodes(env, policy, num_episodes, seed, on_step, max_steps))


def iterate_episodes(env, policy, num_episodes, seed=0, on_step=None, max_steps=None):
    """Like `run_episodes`, but yields each `Episode` as soon as it ends."""
    if not isinstance(num_episodes, int) or num_episodes < 1:
        raise ValueError(f'num_episodes must be a positive integer, got {num_episodes!r}')
    for index in range(num_episodes):
        episode_seed = seed + index
        observ, _ = env.reset(seed=episode_seed)
        state = policy.initial_state(1)
        reset = np.ones([1], bool)
        total, length = 0.0, 0
        if on_step is not None:
            on_step(index, 0)
        while True:
            action, state = policy(np.asarray(observ)[None], state, reset)
            reset = np.zeros([1], bool)
            observ, reward, terminated, truncated, _ = env.step(np.asarray(action)[0])
            total += float(reward)
            length += 1
            if on_step is not None:
                on_step(index, length)
            if terminated or truncated or (max_steps is not None and length >= max_steps):
                break
        yield Episode(index, episode_seed, total, length)


def summarize(episodes):
    """Statistics of returns and lengths, as plain Python numbers (JSON-ready)."""
    if not episodes:
        raise ValueError('no episodes to summarize')
    returns = np.array([episode.episode_return for episode in episodes], np.float64)
    lengths = np.array([episode.length for episode in episodes], np.int64)
    return {
        'num_episodes': len(episodes),
        'mean_return': float(returns.mean()),
        'std_return': float(returns.std()),
        'min_return': float(returns.min()),
        'max_return': float(returns.max()),
        'mean_length': float(lengths.mean()),
        'min_length': int(lengths.min()),
        'max_length': int(lengths.max()),
        'returns': returns.tolist(),
        'lengths': lengths.tolist(),
    }


def check_spaces(env, observation_space, action_space, env_name=None):
    """Raises ValueError unless `env`'s spaces are those a policy for these spaces expects.

    Observations must have the same shape; actions the same kind, shape and bounds (a policy's
    actions mean nothing in another range).
    """
    name = env_name or getattr(env.spec, 'id', None) or type(env.unwrapped).__name__
    env_observ, env_action = env.observation_space, env.action_space
    if (not isinstance(env_observ, gym.spaces.Box) or
            tuple(env_observ.shape) != tuple(observation_space.shape)):
        raise ValueError(f'environment {name} has observation space {env_observ}, but the policy '
                         f'takes observations of shape {tuple(observation_space.shape)}')
    if isinstance(action_space, gym.spaces.Discrete):
        matches = (isinstance(env_action, gym.spaces.Discrete) and env_action.n == action_space.n
                   and env_action.start == action_space.start)
    elif isinstance(action_space, gym.spaces.Box):
        matches = (isinstance(env_action, gym.spaces.Box) and
                   env_action.shape == action_space.shape and
                   np.array_equal(env_action.low, action_space.low) and
                   np.array_equal(env_action.high, action_space.high))
    else:
        raise ValueError(f'unsupported policy action space {action_space}')
    if not matches:
        raise ValueError(f'environment {name} has action space {env_action}, but the policy '
                         f'acts in {action_space}')
