"""Trains Stable-Baselines3 SAC with the settings of a BatchPPO SAC run, logging like BatchPPO.

benchmarks/sac_learning.py runs this script with the peers' python (.venv-peers, built by
benchmarks/setup_peers.sh). It gets the settings table as JSON (`--config`, the keys of
`SETTINGS`, read by sac_learning.py from the gin configuration) and writes
`<logdir>/metrics.jsonl` as sb3_runner.py does for PPO, with its evaluator: `eval_episodes`
deterministic episodes on separate environments (the same wrappers: sb3_runner.range_normalize)
after the training phase in which `eval_every_steps` more steps were reached, and at the end.

`--time_gradient_steps=K` trains nothing: it fills the replay buffer with random transitions of
the environment and prints, as one JSON line, the seconds of K calls of one gradient step and of
one call of K (`time_gradient_steps`): the cost of a gradient step alone.

The translation of the settings into SAC's arguments, `sb3_sac_kwargs`, and the checks that
refuse what SB3 cannot express, import only the standard library (and peer_runner.py, the
runners' shared part), so that the benchmark and its test (in the main venv, without torch) use
them too; torch, SB3 and sb3_runner.py are imported only to train.
"""

import json
import sys
import time

if __package__:  # benchmarks.sb3_sac_runner, imported by the benchmark and its test.
    from benchmarks import peer_runner
else:  # A script of the peers' python, which finds peer_runner.py beside it.
    import peer_runner

SETTINGS = (
    'env_id', 'env_kwargs', 'wrappers', 'total_steps', 'num_envs', 'eval_every_steps',
    'eval_episodes', 'buffer_size', 'learning_starts', 'batch_size', 'tau', 'discount',
    'train_freq', 'gradient_steps', 'target_update_interval', 'learning_rate',
    'actor_learning_rate', 'critic_learning_rate', 'ent_coef_learning_rate', 'adam_epsilon',
    'actor_hidden_sizes', 'critic_hidden_sizes', 'activation', 'learn_ent_coef',
    'ent_coef_init', 'target_entropy')
# train.wrappers SB3 can run as BatchPPO's SAC does: the default ones (bounded observations and
# actions rescaled to [-1, 1], actions clipped: sb3_runner.range_normalize, SB3 clipping
# itself). Without them our SAC would act in [-1, 1] on the raw action space, while SB3
# rescales its squashed actions to that space.
WRAPPERS = (('range_normalize', 'ClipAction'),)
ACTIVATIONS = ('relu', 'tanh')  # Resolved to torch.nn.ReLU, torch.nn.Tanh.
# torch's Adam epsilon, which SB3's temperature optimizer always uses (it takes no
# optimizer_kwargs).
TORCH_ADAM_EPSILON = 1e-8


def _positive_int(value):
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def check_settings(settings):
    """Raises peer_runner.UnsupportedSetting for missing or unknown keys and values SB3 cannot
    express."""
    peer_runner.check_keys(settings, SETTINGS)
    if tuple(settings['wrappers']) not in WRAPPERS:
        raise peer_runner.UnsupportedSetting(
            f'wrappers = {settings["wrappers"]!r}: the SB3 SAC comparison supports only '
            f'{" or ".join(repr(list(wrappers)) for wrappers in WRAPPERS)}', 'wrappers')
    if settings['activation'] not in ACTIVATIONS:
        raise peer_runner.UnsupportedSetting(
            f'activation = {settings["activation"]!r}: the SB3 SAC comparison supports only '
            f'{" or ".join(map(repr, ACTIVATIONS))}', 'activation')
    for key in ('num_envs', 'train_freq', 'gradient_steps', 'batch_size', 'buffer_size'):
        if not _positive_int(settings[key]):
            raise peer_runner.UnsupportedSetting(
                f'{key} = {settings[key]!r}: must be a positive integer', key)
    if settings['target_update_interval'] != 1:
        # SB3 counts gradient steps within each training phase (the targets follow at its
        # steps 0, k, 2k, ...), BatchPPO over the whole run: the same only for 1.
        raise peer_runner.UnsupportedSetting(
            f'target_update_interval = {settings["target_update_interval"]!r}: SB3 counts it '
            'within each training phase, BatchPPO over the run; the comparison supports only '
            '1', 'target_update_interval')
    for key in ('actor_learning_rate', 'critic_learning_rate', 'ent_coef_learning_rate'):
        if settings[key] is not None and settings[key] != settings['learning_rate']:
            raise peer_runner.UnsupportedSetting(
                f'{key} = {settings[key]!r}: SB3 has one learning rate for actor, critics and '
                f'temperature (learning_rate = {settings["learning_rate"]!r})', key)
    if settings['learn_ent_coef'] and settings['adam_epsilon'] != TORCH_ADAM_EPSILON:
        raise peer_runner.UnsupportedSetting(
            f'adam_epsilon = {settings["adam_epsilon"]!r}: SB3\'s temperature optimizer is '
            f'torch\'s Adam with epsilon {TORCH_ADAM_EPSILON:g}, which it does not let one '
            'change', 'adam_epsilon')
    target = settings['target_entropy']
    if target != 'auto' and (isinstance(target, bool) or not isinstance(target, int | float)):
        raise peer_runner.UnsupportedSetting(
            f"target_entropy = {target!r}: must be 'auto' or a number", 'target_entropy')
    if not settings['ent_coef_init'] > 0:
        raise peer_runner.UnsupportedSetting(
            f'ent_coef_init = {settings["ent_coef_init"]!r}: must be positive', 'ent_coef_init')


def iterations(settings):
    """(iterations, env steps) of the run: the budget rounded up to whole iterations of
    num_envs x train_freq steps, as BatchPPO's loop does (SB3 then stops at the same step)."""
    steps_per_iteration = settings['num_envs'] * settings['train_freq']
    count = -(-settings['total_steps'] // steps_per_iteration)
    return count, count * steps_per_iteration


def sb3_sac_kwargs(settings):
    """Keyword arguments of SB3's `SAC('MlpPolicy', env, **kwargs)` for the run `settings`.

    The activation is named by a string ('relu' or 'tanh') that `resolve` turns into torch's
    class, so that this runs without torch. The translation:

      buffer_size, learning_starts, batch_size, tau, gamma = discount, gradient_steps;
      train_freq = (train_freq, 'step'): with n_envs = num_envs (the vector env's) one
        iteration is train_freq steps of every environment on both sides;
      target_update_interval (1, see check_settings);
      learning_rate: SB3's one rate for actor, critics and temperature (per-part rates are
        refused unless equal to it);
      ent_coef = 'auto_<ent_coef_init>' (learned from that value) if learn_ent_coef, else the
        fixed float ent_coef_init; target_entropy ('auto': -action dimensions, as ours);
      policy_kwargs net_arch = dict(pi=actor_hidden_sizes, qf=critic_hidden_sizes) (two
        critics, SB3's n_critics default), activation_fn, optimizer_kwargs dict(eps=
        adam_epsilon) for the actor's and the critics' Adam.
    """
    check_settings(settings)
    init = float(settings['ent_coef_init'])
    target = settings['target_entropy']
    return {
        'learning_rate': settings['learning_rate'],
        'buffer_size': settings['buffer_size'],
        'learning_starts': settings['learning_starts'],
        'batch_size': settings['batch_size'],
        'tau': settings['tau'],
        'gamma': settings['discount'],
        'train_freq': (settings['train_freq'], 'step'),
        'gradient_steps': settings['gradient_steps'],
        'target_update_interval': settings['target_update_interval'],
        'ent_coef': f'auto_{init!r}' if settings['learn_ent_coef'] else init,
        'target_entropy': target if target == 'auto' else float(target),
        'policy_kwargs': {
            'net_arch': {'pi': list(settings['actor_hidden_sizes']),
                         'qf': list(settings['critic_hidden_sizes'])},
            'activation_fn': settings['activation'],
            'optimizer_kwargs': {'eps': settings['adam_epsilon']},
        },
    }


def resolve(kwargs):
    """`sb3_sac_kwargs` with the activation's name replaced by torch's class."""
    import torch

    classes = {'relu': torch.nn.ReLU, 'tanh': torch.nn.Tanh}
    policy_kwargs = dict(kwargs['policy_kwargs'])
    policy_kwargs['activation_fn'] = classes[policy_kwargs['activation_fn']]
    return dict(kwargs, policy_kwargs=policy_kwargs)


class _Unnormalized:
    """What sb3_runner.Evaluator asks of the training VecNormalize, for SAC, which normalizes
    nothing: the observations as they are."""

    @staticmethod
    def normalize_obs(observ):
        return observ


def make_model(settings, seed, vec_env='dummy'):
    """(SB3 SAC, its vector env, env steps to learn), configured as the BatchPPO run."""
    import sb3_runner
    from stable_baselines3 import SAC

    kwargs = resolve(sb3_sac_kwargs(settings))
    venv = sb3_runner.make_vec_env(settings, vec_env)
    model = SAC('MlpPolicy', venv, seed=seed, device='cpu', verbose=0, **kwargs)
    return model, venv, iterations(settings)[1]


def time_gradient_steps(model, venv, count, warmup=20):
    """Seconds of `model`'s gradient steps (SB3's `train`, the minibatch sampling included),
    the replay buffer first filled with max(batch_size, learning_starts) random transitions:
    {'per_call': `count` calls of one step, as `learn` makes them at gradient_steps = 1,
    'one_call': one call of `count` steps}, after `warmup` steps."""
    import numpy as np
    from stable_baselines3.common.logger import Logger

    observ = venv.reset()
    fill = max(model.batch_size, model.learning_starts) // venv.num_envs + 1
    for _ in range(fill):
        action = np.stack([venv.action_space.sample() for _ in range(venv.num_envs)])
        next_observ, reward, done, infos = venv.step(action)
        model.replay_buffer.add(observ, next_observ, action, reward, done, infos)
        observ = next_observ
    model.set_logger(Logger(folder=None, output_formats=[]))  # What train() records into.
    model.train(gradient_steps=warmup, batch_size=model.batch_size)
    seconds = {}
    began = time.perf_counter()
    for _ in range(count):
        model.train(gradient_steps=1, batch_size=model.batch_size)
    seconds['per_call'] = time.perf_counter() - began
    began = time.perf_counter()
    model.train(gradient_steps=count, batch_size=model.batch_size)
    seconds['one_call'] = time.perf_counter() - began
    return seconds


def main(argv=None):
    parser = peer_runner.argument_parser(__doc__)
    parser.add_argument('--time_gradient_steps', type=int, default=0,
                        help='Time this many gradient steps instead of training.')
    args, settings = peer_runner.parse_config(parser, argv, check_settings)
    import sb3_runner

    if args.time_gradient_steps:
        model, venv, _ = sb3_runner.build(args, settings, make_model)
        print(json.dumps(time_gradient_steps(model, venv, args.time_gradient_steps)))
        venv.close()
        return 0
    return sb3_runner.run(args, settings, make_model, _Unnormalized())


if __name__ == '__main__':
    sys.exit(main())
