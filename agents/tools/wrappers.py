"""Environment wrappers, chosen by name in gin configs.

Gymnasium provides the wrappers the original batch-ppo wrote itself (TimeLimit, ClipAction,
RescaleAction, RescaleObservation, DtypeObservation, NormalizeObservation, NormalizeReward,
FrameStackObservation, Autoreset...), for single and vector environments. This module only
applies them by name and adds `range_normalize`, which derives the bounds that Gymnasium's
rescaling wrappers need from the spaces.
"""

import gin
import gymnasium as gym
import numpy as np
from gymnasium.wrappers import vector as vector_wrappers

# The range `range_normalize` rescales bounded components to.
UNIT_RANGE = (-1.0, 1.0)


@gin.configurable
def range_normalize(env, observ=None, action=None):
    """Rescales the bounded components of Box observations and actions to [-1, 1].

    Inputs and outputs of unit scale suit neural network policies regardless of the units of
    the environment. Components with an infinite bound are left unchanged. Works on single and
    vector environments (using the single spaces of the latter).

    Args:
      env: a `gymnasium.Env` or `gymnasium.vector.VectorEnv`.
      observ: None rescales the observations if they are a Box with a bounded component; True
        requires a Box with only bounded components; False leaves them alone.
      action: the same for actions.

    Returns:
      `env` wrapped in Gymnasium's RescaleObservation and RescaleAction where they apply.
    """
    is_vector = isinstance(env, gym.vector.VectorEnv)
    module = vector_wrappers if is_vector else gym.wrappers
    observation_space = env.single_observation_space if is_vector else env.observation_space
    action_space = env.single_action_space if is_vector else env.action_space
    bounds = _unit_bounds(observation_space, observ, 'observation')
    if bounds:
        env = module.RescaleObservation(env, *bounds)
    bounds = _unit_bounds(action_space, action, 'action')
    if bounds:
        env = module.RescaleAction(env, *bounds)
    return env


def _unit_bounds(space, required, what):
    """Bounds that map the bounded components of `space` to [-1, 1], or None to skip."""
    if required is False:
        return None
    if required not in (None, True):
        raise ValueError(f'{what} must be None, True or False, got {required!r}')
    is_box = isinstance(space, gym.spaces.Box)
    bounded = (np.isfinite(space.low) & np.isfinite(space.high)) if is_box else None
    if required and not (is_box and bounded.all()):
        raise ValueError(
            f'cannot normalize the {what} range to [-1, 1]: {space!r} is not a Box with finite '
            'bounds')
    if not is_box or not bounded.any():
        return None
    low = np.where(bounded, UNIT_RANGE[0], space.low).astype(space.dtype)
    high = np.where(bounded, UNIT_RANGE[1], space.high).astype(space.dtype)
    return low, high


# Wrappers of this module that `apply_wrappers` finds by name, before Gymnasium's.
_OWN_WRAPPERS = {'range_normalize': range_normalize}


@gin.configurable
def apply_wrappers(env, wrappers=()):
    """Wraps `env` in `wrappers`, innermost first.

    Each entry is a callable taking the environment (e.g. a gin reference `@range_normalize`),
    a wrapper name, or a pair (name, kwargs dict). Names are this module's wrappers or
    Gymnasium's, from `gymnasium.wrappers.vector` for a VectorEnv and `gymnasium.wrappers`
    otherwise. In gin:

        apply_wrappers.wrappers = [
            ('TimeLimit', {'max_episode_steps': 1000}), 'range_normalize', 'ClipAction',
            ('DtypeObservation', {'dtype': 'float32'})]
    """
    if isinstance(wrappers, (str, tuple)) and _is_spec(wrappers):
        raise TypeError(f'wrappers must be a list of wrappers, got the single wrapper {wrappers!r}')
    for spec in wrappers:
        env = _make_wrapper(spec, env)
    return env


def _is_spec(value):
    return isinstance(value, str) or (
        isinstance(value, tuple) and len(value) == 2 and isinstance(value[0], str)
        and isinstance(value[1], dict))


def _make_wrapper(spec, env):
    if callable(spec):
        return spec(env)
    if isinstance(spec, str):
        name, kwargs = spec, {}
    elif isinstance(spec, (tuple, list)) and len(spec) == 2 and isinstance(spec[1], dict):
        name, kwargs = spec
    else:
        raise TypeError(
            f'a wrapper must be a callable, a name or a (name, kwargs dict) pair, got {spec!r}')
    return _find_wrapper(name, env)(env, **kwargs)


def _find_wrapper(name, env):
    if not isinstance(name, str):
        raise TypeError(f'wrapper name must be a string, got {name!r}')
    if name in _OWN_WRAPPERS:
        return _OWN_WRAPPERS[name]
    is_vector = isinstance(env, gym.vector.VectorEnv)
    module = vector_wrappers if is_vector else gym.wrappers
    names = [known for known in module.__all__ if known != 'vector']  # Not a wrapper.
    if name in names:
        return getattr(module, name)
    kind = 'vector ' if is_vector else ''
    raise ValueError(
        f'unknown {kind}wrapper {name!r}; known: {sorted(_OWN_WRAPPERS) + sorted(names)}')
