"""The agent of a run: its algorithm built for the run's spaces, or a population of it."""

import gymnasium as gym
import numpy as np

from agents.algorithms import algorithm as algorithm_lib
from agents.runs import environments, run_config
from agents.tools import wrappers


def build_agent(settings, train_env, members=None):
    """The algorithm of `settings` for `train_env`: a lone agent, or the population of
    `members` (run_settings.RunSettings.member_overrides)."""
    cls = settings.algorithm_class
    on_policy = not issubclass(cls, algorithm_lib.OffPolicyAlgorithm)
    # An off-policy algorithm's schedules, if any, are its own: it knows its cadence.
    updates = (settings.num_iterations(algorithm_lib.OnPolicy())
               if settings.anneal_learning_rate and on_policy else None)

    def make_agent(seed, **hyperparameters):
        return build_algorithm(settings.algorithm, train_env.observation_space,
                               train_env.action_space, settings.num_envs, seed=seed,
                               lr_anneal_updates=updates, **hyperparameters)

    if not members:
        return make_agent(seed=settings.seed)
    lone = [make_agent(**member) for member in members]
    try:
        return make_agent(seed=settings.seed, population=lone)
    except run_config.ConfigError as error:
        raise run_config.ConfigError(
            f'train.population = {settings.population}: {error}') from error


def build_algorithm(algorithm, observation_space, action_space, num_envs, seed,
                    lr_anneal_updates=None, **hyperparameters):
    """The algorithm (configured by its own gin bindings, but for `hyperparameters`, e.g. a
    population member's) for these spaces."""
    try:
        agent = algorithm(
            observ_shape=observation_space.shape,
            action_size=environments.action_size(action_space), num_envs=num_envs, seed=seed,
            lr_anneal_updates=lr_anneal_updates, **hyperparameters)
    except (ValueError, TypeError) as error:
        name = getattr(algorithm, '__name__', 'the algorithm')
        raise run_config.ConfigError(f'cannot build the {name} agent: {error}') from error
    discrete = isinstance(action_space, gym.spaces.Discrete)
    if agent.action_dtype.is_integer != discrete:
        kind = 'discrete' if discrete else 'continuous'
        name = type(agent).__name__
        policy = type(agent.exported_policy()[0]).__name__
        argument = agent.POLICY_NETWORK_ARGUMENT
        remedy = (f'set {name}.{argument} to {"a categorical" if discrete else "a Gaussian"} '
                  'policy' if argument else
                  f'{name} trains only on {"continuous" if discrete else "discrete"} actions')
        raise run_config.ConfigError(
            f'the policy network {policy} acts with {agent.action_dtype.name} actions but the '
            f'environment\'s action space {action_space} is {kind}; {remedy}')
    _check_action_bounds(agent, action_space)
    return agent


def _check_action_bounds(agent, action_space):
    """Refuses a bounded Box action space whose bounds are not the algorithm's action range
    (its actions would cover part of the space, or exceed it)."""
    if agent.ACTION_BOUNDS is None or not isinstance(action_space, gym.spaces.Box):
        return
    low, high = agent.ACTION_BOUNDS
    mismatched = ((np.isfinite(action_space.low) & (action_space.low != low))
                  | (np.isfinite(action_space.high) & (action_space.high != high)))
    if mismatched.any():
        name = type(agent).__name__
        if (low, high) == wrappers.UNIT_RANGE:
            remedy = ('add \'range_normalize\' to train.wrappers, which rescales the actions\' '
                      'bounds to [-1, 1]')
        else:
            remedy = (f'add (\'RescaleAction\', {{\'min_action\': {low:g}, \'max_action\': '
                      f'{high:g}}}) to train.wrappers')
        raise run_config.ConfigError(
            f'{name} acts in [{low:g}, {high:g}] but the environment\'s action space '
            f'{action_space} has other bounds; {remedy}')
