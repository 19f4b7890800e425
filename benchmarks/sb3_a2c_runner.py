"""Trains Stable-Baselines3 A2C with the settings of a BatchPPO A2C run, logging like BatchPPO.

benchmarks/a2c_learning.py runs this script with the peers' python (.venv-peers, built by
benchmarks/setup_peers.sh). It gets the settings table as JSON (`--config`, the keys of
`SETTINGS`, read by a2c_learning.py from the task's gin configuration) and writes
`<logdir>/metrics.jsonl` as sb3_runner.py does for PPO, with its evaluation: `eval_episodes`
deterministic episodes on separate environments after the update in which `eval_every_steps`
more steps were reached, and at the end.

The translation of the settings into A2C's arguments, `sb3_a2c_kwargs`, and the checks that
refuse what SB3 cannot express, import only the standard library (and peer_runner.py, the
runners' shared part), so that the benchmark and its test (in the main venv, without torch) use
them too; torch, SB3 and sb3_runner.py are imported only to train.
"""

import math
import sys

if __package__:  # benchmarks.sb3_a2c_runner, imported by the benchmark and its test.
    from benchmarks import peer_runner
else:  # A script of the peers' python, which finds peer_runner.py beside it.
    import peer_runner

SETTINGS = (
    'env_id', 'env_kwargs', 'wrappers', 'total_steps', 'num_envs', 'rollout_length',
    'eval_every_steps', 'eval_episodes', 'anneal_learning_rate', 'discount', 'gae_lambda',
    'learning_rate', 'optimizer', 'rmsprop_alpha', 'optimizer_epsilon', 'max_grad_norm',
    'value_coef', 'entropy_coef', 'normalize_advantages', 'normalize_observ', 'observ_clip',
    'scale_reward', 'reward_clip', 'policy_network', 'policy_hidden_sizes', 'value_hidden_sizes',
    'activation', 'init_std')
# train.wrappers SB3 can run: BatchPPO's default (bounded observations and actions rescaled to
# [-1, 1], actions clipped: sb3_runner.range_normalize, SB3 clipping itself), or none.
WRAPPERS = (('range_normalize', 'ClipAction'), ())
# Policies SB3's MlpPolicy matches (a Gaussian with a state-independent log-std, or a
# categorical); it picks one from the action space.
POLICIES = ('FeedForwardGaussianPolicy', 'FeedForwardCategoricalPolicy')
ACTIVATIONS = ('tanh', 'relu')  # Resolved to torch.nn.Tanh, torch.nn.ReLU.
OPTIMIZERS = ('rmsprop', 'adam')  # Resolved to torch.optim.RMSprop, torch.optim.Adam.


def check_settings(settings):
    """Raises peer_runner.UnsupportedSetting for missing or unknown keys and values SB3 cannot
    express."""
    peer_runner.check_keys(settings, SETTINGS)
    choices = {'wrappers': WRAPPERS, 'policy_network': POLICIES, 'activation': ACTIVATIONS,
               'optimizer': OPTIMIZERS}
    for key, allowed in choices.items():
        value = tuple(settings[key]) if key == 'wrappers' else settings[key]
        if value not in allowed:
            raise peer_runner.UnsupportedSetting(
                f'{key} = {settings[key]!r}: the SB3 A2C comparison supports only '
                f'{" or ".join(map(repr, allowed))}', key)
    if settings['policy_network'] == 'FeedForwardGaussianPolicy' and not settings['init_std']:
        raise peer_runner.UnsupportedSetting(
            f'init_std = {settings["init_std"]!r}: a Gaussian policy needs a positive initial '
            'std', 'init_std')


def iterations(settings):
    """(updates, env steps) of the run: the budget rounded up to whole iterations, as the
    loop does."""
    steps_per_iteration = settings['num_envs'] * settings['rollout_length']
    updates = -(-settings['total_steps'] // steps_per_iteration)
    return updates, updates * steps_per_iteration


def linear_schedule(rate, updates):
    """BatchPPO's annealing as an SB3 schedule of `progress_remaining`.

    SB3 sets the rate at each update from the progress after that update's rollout (1 - 1/n at
    the first of n updates, 0 at the last); BatchPPO's update k of n uses rate * (1 - k/n):
    the full rate first, rate / n last. Shifting the progress by 1/n gives the same sequence.
    """
    def schedule(progress_remaining):
        return rate * min(1.0, progress_remaining + 1.0 / updates)
    return schedule


def sb3_a2c_kwargs(settings):
    """Keyword arguments of SB3's `A2C(policy, env, **kwargs)` for the run `settings`.

    Classes are named by strings (policy_kwargs' activation_fn: 'tanh' or 'relu';
    optimizer_class: 'rmsprop' or 'adam') that `resolve` turns into torch's, so that this runs
    without torch. The translation:

      n_steps = rollout_length (n_envs = num_envs is the vector env's), gamma = discount,
      gae_lambda, ent_coef = entropy_coef, normalize_advantage = normalize_advantages;
      vf_coef = value_coef: both value losses are the plain mean squared error (SB3's
        F.mse_loss, BatchPPO's A2C likewise; its PPO has a factor 0.5);
      max_grad_norm (None: no clip, inf);
      learning_rate, or with anneal_learning_rate the linear decay to zero (linear_schedule);
      use_rms_prop = (optimizer == 'rmsprop'), rms_prop_eps = optimizer_epsilon, and the
        optimizer explicitly: SB3's A2C sets policy_kwargs' optimizer_class to
        torch.optim.RMSprop and optimizer_kwargs to dict(alpha=0.99, eps=rms_prop_eps,
        weight_decay=0) only when optimizer_class is absent (its alpha fixed at 0.99), so giving
        both is what passes rmsprop_alpha. Adam gets optimizer_kwargs dict(eps=...) (SB3's
        ActorCriticPolicy default for Adam is eps 1e-5; torch's betas are BatchPPO's);
      policy_kwargs net_arch = dict(pi=policy_hidden_sizes, vf=value_hidden_sizes) (separate
        networks, as BatchPPO's), activation_fn, ortho_init=True (hidden gains sqrt 2, policy
        output 0.01, value output 1, as BatchPPO's), log_std_init = log(init_std) for a
        Gaussian policy.
    """
    check_settings(settings)
    updates, _ = iterations(settings)
    learning_rate = settings['learning_rate']
    if settings['anneal_learning_rate']:
        learning_rate = linear_schedule(learning_rate, updates)
    epsilon = settings['optimizer_epsilon']
    rmsprop = settings['optimizer'] == 'rmsprop'
    policy_kwargs = {
        'net_arch': {'pi': list(settings['policy_hidden_sizes']),
                     'vf': list(settings['value_hidden_sizes'])},
        'activation_fn': settings['activation'],
        'ortho_init': True,
        'optimizer_class': settings['optimizer'],
        'optimizer_kwargs': ({'alpha': settings['rmsprop_alpha'], 'eps': epsilon,
                              'weight_decay': 0} if rmsprop else {'eps': epsilon}),
    }
    if settings['policy_network'] == 'FeedForwardGaussianPolicy':
        policy_kwargs['log_std_init'] = math.log(settings['init_std'])
    max_grad_norm = settings['max_grad_norm']
    return {
        'learning_rate': learning_rate,
        'n_steps': settings['rollout_length'],
        'gamma': settings['discount'],
        'gae_lambda': settings['gae_lambda'],
        'ent_coef': settings['entropy_coef'],
        'vf_coef': settings['value_coef'],
        'max_grad_norm': math.inf if max_grad_norm is None else max_grad_norm,
        'rms_prop_eps': epsilon,
        'use_rms_prop': rmsprop,
        'normalize_advantage': settings['normalize_advantages'],
        'policy_kwargs': policy_kwargs,
    }


def vec_normalize_kwargs(settings):
    """VecNormalize's arguments: BatchPPO's observation normalizer and reward scaler (a clip of
    None is no clip)."""
    return {
        'norm_obs': settings['normalize_observ'],
        'norm_reward': settings['scale_reward'],
        'clip_obs': math.inf if settings['observ_clip'] is None else settings['observ_clip'],
        'clip_reward': math.inf if settings['reward_clip'] is None else settings['reward_clip'],
        'gamma': settings['discount'],
        'epsilon': 1e-8,
    }


def resolve(kwargs):
    """`sb3_a2c_kwargs` with its class names replaced by torch's classes."""
    import torch

    classes = {'tanh': torch.nn.Tanh, 'relu': torch.nn.ReLU, 'rmsprop': torch.optim.RMSprop,
               'adam': torch.optim.Adam}
    policy_kwargs = dict(kwargs['policy_kwargs'])
    for key in ('activation_fn', 'optimizer_class'):
        policy_kwargs[key] = classes[policy_kwargs[key]]
    return dict(kwargs, policy_kwargs=policy_kwargs)


def make_model(settings, seed, vec_env='dummy'):
    """(SB3 A2C, its VecNormalize, env steps to learn), configured as the BatchPPO run."""
    import sb3_runner
    from stable_baselines3 import A2C
    from stable_baselines3.common.vec_env import VecNormalize

    kwargs = resolve(sb3_a2c_kwargs(settings))
    venv = VecNormalize(sb3_runner.make_vec_env(settings, vec_env),
                        **vec_normalize_kwargs(settings))
    model = A2C('MlpPolicy', venv, seed=seed, device='cpu', verbose=0, **kwargs)
    return model, venv, iterations(settings)[1]


def main(argv=None):
    args, settings = peer_runner.parse_config(peer_runner.argument_parser(__doc__), argv,
                                              check_settings)
    import sb3_runner

    return sb3_runner.run(args, settings, make_model)


if __name__ == '__main__':
    sys.exit(main())
