"""Native environments by Gymnasium id: the factory a config switches backends with.

`make('Pendulum-v1', num_envs, seed)` gives a `NativeBatchEnv` of the native task reproducing
that Gymnasium id, so a config that names a Gymnasium id can ask for its native twin.
"""

import gin
import tensorflow as tf

from agents.envs import acrobot, cartpole, mountain_car_continuous, native_batch_env, pendulum

# Gymnasium id -> NativeEnv class reproducing it.
ENVS = {env.gym_id: env for env in (
    pendulum.Pendulum, cartpole.CartPole, mountain_car_continuous.MountainCarContinuous,
    acrobot.Acrobot)}


def get_env(env_id, dtype=tf.float64):
    """The `NativeEnv` of Gymnasium id `env_id`, or a ValueError listing the known ids."""
    if env_id not in ENVS:
        raise ValueError(
            f'no native environment for {env_id!r}; known ids: {sorted(ENVS)}')
    return ENVS[env_id](dtype)


def has_native_env(env_id):
    """Whether `make` knows `env_id`."""
    return env_id in ENVS


@gin.configurable(module='agents.envs')
def make(env_id, num_envs, seed=0, wrappers=(), dtype=tf.float64, check_inputs=True):
    """`num_envs` native environments of Gymnasium id `env_id` as a `NativeBatchEnv`.

    Args:
      env_id: one of `ENVS` ('Pendulum-v1', 'CartPole-v1', 'MountainCarContinuous-v0',
        'Acrobot-v1').
      num_envs: positive number of environments.
      seed: seeds the start states (see `NativeBatchEnv`).
      wrappers: names among `native_batch_env.WRAPPERS`, as the trainer's `train.wrappers`.
      dtype: 'float64' (matches Gymnasium's trajectories) or 'float32' (faster, drifts apart
        on Pendulum and Acrobot).
      check_inputs: see `NativeBatchEnv`.
    """
    return native_batch_env.NativeBatchEnv(
        get_env(env_id, dtype), num_envs, seed=seed, wrappers=wrappers,
        check_inputs=check_inputs)
