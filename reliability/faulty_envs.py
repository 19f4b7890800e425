"""Environments that fail on cue, for the fault-injection tests.

`FaultyPendulum-v0` is Pendulum-v1 that, at its `at_step`-th step (counted over the life of the
environment instance, across episodes), does one of:

    'exit'             the process exits at once (os._exit), as a crashing worker would;
    'kill'             the process kills itself with SIGKILL, as the OOM killer would;
    'raise'            the step raises RuntimeError;
    'nan_reward'       the step returns a NaN reward;
    'nan_observation'  the step returns a NaN observation;
    'hang'             the step never returns.

With `hang_on_make` (a file path) making the environment hangs instead (after creating that
file). With `once_marker` (a file path) the fault strikes once over all processes: the instance that
creates the marker file. With `workers_only` it strikes only in a BatchEnv worker process, never
in the trainer's own process (which also hosts the in-process evaluation environments). The
trainer reaches it by the id `ENV_ID` (gymnasium imports this module for it, also in worker
processes) with these arguments as `train.env_kwargs`.
"""

import multiprocessing
import os
import signal
import threading

import gymnasium as gym
import numpy as np
from gymnasium.envs.classic_control import pendulum

NAME = 'FaultyPendulum-v0'
ENV_ID = f'{__name__}:{NAME}'
FAULTS = ('exit', 'kill', 'raise', 'nan_reward', 'nan_observation', 'hang')
EXIT_CODE = 3


class FaultyEnv(gym.Wrapper):
    """Injects `fault` at the `at_step`-th step of the wrapped environment."""

    def __init__(self, env, fault=None, at_step=1, once_marker=None, workers_only=False):
        super().__init__(env)
        if fault is not None and fault not in FAULTS:
            raise ValueError(f'fault must be one of {FAULTS}, got {fault!r}')
        self._fault = fault
        self._at_step = int(at_step)
        self._once_marker = once_marker
        self._workers_only = bool(workers_only)
        self._steps = 0

    def step(self, action):
        observ, reward, terminated, truncated, info = self.env.step(action)
        self._steps += 1
        if self._steps == self._at_step and self._strikes():
            if self._fault == 'exit':
                os._exit(EXIT_CODE)
            elif self._fault == 'kill':
                os.kill(os.getpid(), signal.SIGKILL)
            elif self._fault == 'raise':
                raise RuntimeError(f'injected failure at step {self._steps}')
            elif self._fault == 'nan_reward':
                reward = float('nan')
            elif self._fault == 'nan_observation':
                observ = np.full_like(observ, np.nan)
            elif self._fault == 'hang':
                threading.Event().wait()
        return observ, reward, terminated, truncated, info

    def _strikes(self):
        if self._fault is None:
            return False
        if self._workers_only and multiprocessing.parent_process() is None:
            return False
        if self._once_marker is None:
            return True
        try:
            os.close(os.open(self._once_marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            return False
        return True


def make_faulty_pendulum(render_mode=None, hang_on_make=None, **fault_kwargs):
    """The faulty env; with `hang_on_make` (a file path), creates that file and never returns,
    as an environment stuck loading its assets would."""
    if hang_on_make is not None:
        with open(hang_on_make, 'w', encoding='utf-8'):
            pass
        threading.Event().wait()
    return FaultyEnv(pendulum.PendulumEnv(render_mode=render_mode), **fault_kwargs)


if NAME not in gym.registry:
    gym.register(NAME, entry_point=make_faulty_pendulum, max_episode_steps=200)
