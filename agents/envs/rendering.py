"""Frames of native environments, drawn by Gymnasium's env of the same task.

A native env's state is the state of Gymnasium's env, so rendering puts it into
`env.unwrapped.state` of a Gymnasium env made with `render_mode='rgb_array'` and lets that env
draw it: the frames are exactly Gymnasium's, e.g. for evaluation videos.
"""

import gymnasium as gym
import numpy as np

from agents.tools import rendering as _headless  # noqa: F401 - headless pygame before drawing.


class GymRenderer:
    """Renders states of a `NativeEnv` through Gymnasium's env of its task."""

    def __init__(self, native):
        self._native = native
        self._env = gym.make(native.gym_id, render_mode='rgb_array')
        self._env.reset(seed=0)

    def render(self, state, action=None):
        """The [H, W, 3] uint8 frame of one env in `state` ([state_size]).

        `action` is the last action as the env received it (after any action wrappers), or
        None at the start of an episode; some tasks draw it (Pendulum's torque arrow).
        """
        state = np.asarray(state)
        if state.shape != (self._native.state_size,):
            raise ValueError(f'{self._native.gym_id} state must have shape '
                             f'({self._native.state_size},), got {state.shape}')
        unwrapped = self._env.unwrapped
        unwrapped.state = self._native.to_gym_state(state)
        for name, value in self._native.gym_render_attributes(action).items():
            setattr(unwrapped, name, value)
        return unwrapped.render()

    def close(self):
        self._env.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.close()


def render_batch_env(batch_env, index=0, renderer=None):
    """The frame of environment `index` of a `NativeBatchEnv` in its current state.

    Pass a `GymRenderer` of the same task to reuse it across frames; otherwise one is made and
    closed for this frame.
    """
    if not 0 <= index < len(batch_env):
        raise IndexError(f'env index {index} out of range for {len(batch_env)} envs')
    state = batch_env.state.numpy()[index]
    fresh = int(batch_env.elapsed.numpy()[index]) == 0
    action = None if fresh else batch_env.env_action(batch_env.action[index:index + 1])
    action = None if action is None else np.asarray(action)[0]
    if renderer is not None:
        return renderer.render(state, action)
    with GymRenderer(batch_env.env) as own:
        return own.render(state, action)
