"""Environment wrappers, chosen by name in gin configs.

Gymnasium provides the wrappers the original batch-ppo wrote itself (TimeLimit, ClipAction,
RescaleAction, RescaleObservation, DtypeObservation, NormalizeObservation, NormalizeReward,
FrameStackObservation, Autoreset...), for single and vector environments. This module only
applies them by name and adds `range_normalize`, which derives the bounds that Gymnasium's
rescaling wrappers need from the spaces.

On a VectorEnv (the EnvPool backend wraps the whole batch), `range_normalize` and `ClipAction`
are this module's batched equivalents of Gymnasium's vector RescaleObservation, RescaleAction
and ClipAction: those apply the single-environment function to each environment in a Python
loop, these one numpy expression to the batch, with the same spaces and values.
"""

import gin
import gymnasium as gym
import numpy as np
from gymnasium.vector.utils import batch_space
from gymnasium.wrappers import vector as vector_wrappers
from gymnasium.wrappers.utils import rescale_box

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
      `env` wrapped in Gymnasium's RescaleObservation and RescaleAction where they apply, or for
      a VectorEnv in their batched equivalents BatchRescaleObservation and BatchRescaleAction.
    """
    if isinstance(env, gym.vector.VectorEnv):
        spaces = env.single_observation_space, env.single_action_space
        wrappers = BatchRescaleObservation, BatchRescaleAction
    else:
        spaces = env.observation_space, env.action_space
        wrappers = gym.wrappers.RescaleObservation, gym.wrappers.RescaleAction
    bounds = _unit_bounds(spaces[0], observ, 'observation')
    if bounds:
        env = wrappers[0](env, *bounds)
    bounds = _unit_bounds(spaces[1], action, 'action')
    if bounds:
        env = wrappers[1](env, *bounds)
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


class BatchRescaleObservation(vector_wrappers.TransformObservation):
    """Gymnasium's vector RescaleObservation as one numpy expression over the batch.

    The same space and function (`rescale_box`), observations in the same dtype: the space's, or
    the input's where the space is unchanged (Gymnasium's wrapper then writes into the input).
    """

    def __init__(self, env, min_obs, max_obs):
        _check_box(env.single_observation_space, 'RescaleObservation', 'observation')
        space, forward, _ = rescale_box(env.single_observation_space, min_obs, max_obs)
        super().__init__(env, _cast(forward, env.observation_space, space, env.num_envs),
                         single_observation_space=space)


class BatchRescaleAction(vector_wrappers.TransformAction):
    """Gymnasium's vector RescaleAction as one numpy expression over the batch.

    The same space and function (`rescale_box`), actions in the same dtype: the inner space's,
    or the input's where the space is unchanged (Gymnasium's wrapper then writes into the input).
    """

    def __init__(self, env, min_action, max_action):
        _check_box(env.single_action_space, 'RescaleAction', 'action')
        space, _, backward = rescale_box(env.single_action_space, min_action, max_action)
        if np.any(space.low == space.high):  # As Gymnasium's: the rescaling has no inverse.
            raise gym.error.InvalidBound(
                f'Min action ({min_action}) must be strictly smaller than max action '
                f'({max_action}), the rescaling has no inverse where they are equal')
        super().__init__(env, _cast(backward, env.action_space, space, env.num_envs),
                         single_action_space=space)


class BatchClipAction(vector_wrappers.TransformAction):
    """Gymnasium's vector ClipAction as one numpy expression over the batch: actions clipped
    to the inner Box's bounds, in the same dtype; the action space is unbounded."""

    def __init__(self, env):
        inner = env.single_action_space
        _check_box(inner, 'ClipAction', 'action')
        space = gym.spaces.Box(-np.inf, np.inf, inner.shape, inner.dtype)

        def clip(actions):
            return np.clip(actions, inner.low, inner.high)

        super().__init__(env, _cast(clip, env.action_space, space, env.num_envs),
                         single_action_space=space)


def _check_box(space, wrapper, what):
    if not isinstance(space, gym.spaces.Box):
        raise TypeError(f'{wrapper} requires a Box {what} space, got {type(space)}')


def _cast(function, inner_space, single_space, num_envs):
    """`function` with its output in the dtype Gymnasium's vectorized wrappers give: the Box's
    (they concatenate into an array of it), or the input's where the batched `single_space`
    equals `inner_space` (they concatenate into the input)."""
    if batch_space(single_space, num_envs) == inner_space:
        return function
    dtype = inner_space.dtype
    return lambda values: function(values).astype(dtype, copy=False)


# Wrappers of this module that `apply_wrappers` finds by name, before Gymnasium's.
_OWN_WRAPPERS = {'range_normalize': range_normalize}
# The same for VectorEnvs, also before `_OWN_WRAPPERS`.
_OWN_VECTOR_WRAPPERS = {'ClipAction': BatchClipAction}


@gin.configurable
def apply_wrappers(env, wrappers=()):
    """Wraps `env` in `wrappers`, innermost first.

    Each entry is a callable taking the environment (e.g. a gin reference `@range_normalize`),
    a wrapper name, or a pair (name, kwargs dict). Names are this module's wrappers or
    Gymnasium's, from `gymnasium.wrappers.vector` for a VectorEnv and `gymnasium.wrappers`
    otherwise; on a VectorEnv, 'ClipAction' is `BatchClipAction`. In gin:

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
    is_vector = isinstance(env, gym.vector.VectorEnv)
    if is_vector and name in _OWN_VECTOR_WRAPPERS:
        return _OWN_VECTOR_WRAPPERS[name]
    if name in _OWN_WRAPPERS:
        return _OWN_WRAPPERS[name]
    module = vector_wrappers if is_vector else gym.wrappers
    names = [known for known in module.__all__ if known != 'vector']  # Not a wrapper.
    if name in names:
        return getattr(module, name)
    kind = 'vector ' if is_vector else ''
    raise ValueError(
        f'unknown {kind}wrapper {name!r}; known: {sorted(_OWN_WRAPPERS) + sorted(names)}')
