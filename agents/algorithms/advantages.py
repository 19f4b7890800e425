"""Generalized advantage estimation on time-major rollouts with terminations and truncations."""

import tensorflow as tf


def generalized_advantage_estimation(reward, value, next_value, terminated, truncated,
                                     discount, gae_lambda):
    """Returns `(advantage, return_)`, both shaped like `reward` (`[T, ...]`, time-major).

    Args:
      reward: reward of step t.
      value: V(s_t) of the observation acted upon at step t.
      next_value: V(s_{t+1}) of the observation *after* step t. Where the episode ended at step t,
        this must be the value of the episode's final observation (not of the first observation of
        the next episode): a truncated episode (time limit) bootstraps from it, a terminated one
        multiplies it by zero. For the last step of the rollout it bootstraps the unfinished
        episodes.
      terminated: bool, the episode reached a terminal state at step t (no future reward).
      truncated: bool, the episode was cut at step t (e.g. time limit) although it could go on.
      discount: gamma.
      gae_lambda: lambda, trading bias (0: one-step TD) for variance (1: Monte-Carlo).
        Both may be tensors that broadcast against one step (e.g. `[K, 1]` for the K members
        of a population, rewards `[T, K, N]`); only Python numbers are range-checked here.

    The recursion `A_t = delta_t + gamma * lambda * (1 - done_t) * A_{t+1}` with
    `delta_t = r_t + gamma * (1 - terminated_t) * next_value_t - value_t` stops at every episode
    end, so advantages never leak across episodes. `return_ = advantage + value` is the value
    target.
    """
    for name, factor in (('discount', discount), ('gae_lambda', gae_lambda)):
        if isinstance(factor, int | float) and not 0.0 <= factor <= 1.0:
            raise ValueError(f'{name} must lie in [0, 1], got {factor}.')
    reward = tf.convert_to_tensor(reward, tf.float32)
    tensors = {
        'value': tf.convert_to_tensor(value, tf.float32),
        'next_value': tf.convert_to_tensor(next_value, tf.float32),
        'terminated': tf.convert_to_tensor(terminated, tf.bool),
        'truncated': tf.convert_to_tensor(truncated, tf.bool),
    }
    if reward.shape.rank is not None and reward.shape.rank < 1:
        raise ValueError('reward must be time-major with rank >= 1, got a scalar.')
    for name, tensor in tensors.items():
        if not tensor.shape.is_compatible_with(reward.shape):
            raise ValueError(f'{name} has shape {tensor.shape} but reward has shape '
                             f'{reward.shape}; all inputs must share the [T, ...] shape.')
    not_terminated = 1.0 - tf.cast(tensors['terminated'], tf.float32)
    not_done = 1.0 - tf.cast(tensors['terminated'] | tensors['truncated'], tf.float32)
    delta = reward + discount * not_terminated * tensors['next_value'] - tensors['value']

    def backward(next_advantage, inputs):
        delta_step, not_done_step = inputs
        return delta_step + discount * gae_lambda * not_done_step * next_advantage

    advantage = tf.scan(backward, (delta, not_done), tf.zeros_like(delta[0]), reverse=True)
    return advantage, advantage + tensors['value']
