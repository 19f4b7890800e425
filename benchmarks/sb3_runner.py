"""Trains Stable-Baselines3 PPO with the settings of a BatchPPO run, logging like BatchPPO does.

benchmarks/train_throughput.py runs this script with the peers' python (.venv-peers, built by
benchmarks/setup_peers.sh), so it imports only SB3, torch, Gymnasium and numpy. It gets the
shared settings table as JSON (`--config`, the keys of `SETTINGS`) and writes
`<logdir>/metrics.jsonl` with the fields of BatchPPO's trainer, so that both are read alike:
one line per evaluation of `eval_episodes` deterministic episodes on separate environments,
taken after the update in which `eval_every_steps` more steps were reached, and at the end.

Where SB3 and BatchPPO differ in how a setting is expressed, it is translated so that the same
algorithm runs (see `make_model`); the README of benchmarks/ lists what remains different.

The A2C and SAC runners (sb3_a2c_runner.py, sb3_sac_runner.py) use its environments
(`make_env`, `make_vec_env`), its evaluator and its training (`build`, `run`); what every
runner shares without SB3 is benchmarks/peer_runner.py's.
"""

import os
import sys
import time

import gymnasium as gym
import numpy as np
import peer_runner  # Beside this script, which only the peers' python runs.
import torch
from stable_baselines3 import PPO
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv, VecNormalize

SETTINGS = (
    'env_id', 'env_kwargs', 'total_steps', 'num_envs', 'rollout_length', 'eval_every_steps',
    'eval_episodes', 'anneal_learning_rate', 'discount', 'gae_lambda', 'num_epochs',
    'num_minibatches', 'learning_rate', 'adam_epsilon', 'max_grad_norm', 'clip_ratio',
    'value_clip', 'value_coef', 'entropy_coef', 'normalize_advantages', 'normalize_observ',
    'observ_clip', 'scale_reward', 'reward_clip', 'policy_hidden_sizes', 'value_hidden_sizes',
    'activation', 'init_std')
ACTIVATIONS = {'tanh': torch.nn.Tanh, 'relu': torch.nn.ReLU}


def check_settings(settings):
    """Raises peer_runner.UnsupportedSetting for missing or unknown keys and an activation SB3's
    PPO runner does not have."""
    peer_runner.check_keys(settings, SETTINGS)
    if settings['activation'] not in ACTIVATIONS:
        raise peer_runner.UnsupportedSetting(
            f'activation must be one of {sorted(ACTIVATIONS)}', 'activation')


def range_normalize(env):
    """BatchPPO's default wrappers ('range_normalize', 'ClipAction') with Gymnasium's classes:
    bounded Box components of observations and actions rescaled to [-1, 1].

    SB3 itself clips the policy's actions to the action space, which ClipAction would make
    unbounded (SB3 refuses that), so the clipping is left to SB3.
    """
    for space, wrapper in ((env.observation_space, gym.wrappers.RescaleObservation),
                           (env.action_space, gym.wrappers.RescaleAction)):
        if not isinstance(space, gym.spaces.Box):
            continue
        bounded = np.isfinite(space.low) & np.isfinite(space.high)
        if bounded.any():
            env = wrapper(env, np.where(bounded, -1, space.low).astype(space.dtype),
                          np.where(bounded, 1, space.high).astype(space.dtype))
    return env


def make_env(settings):
    """The environment with the run's wrappers: BatchPPO's default ones unless the settings say
    `wrappers` is empty (as for discrete CartPole)."""
    env = gym.make(settings['env_id'], **(settings['env_kwargs'] or {}))
    return range_normalize(env) if tuple(settings.get('wrappers', ('default',))) else env


def make_vec_env(settings, vec_env):
    """SB3's vector env ('dummy' or 'subproc') of settings['num_envs'] environments."""
    env_fns = [lambda: make_env(settings)] * settings['num_envs']
    return SubprocVecEnv(env_fns) if vec_env == 'subproc' else DummyVecEnv(env_fns)


def make_model(settings, seed, vec_env):
    """SB3 PPO plus its VecNormalize, configured as the BatchPPO run."""
    venv = VecNormalize(
        make_vec_env(settings, vec_env), norm_obs=settings['normalize_observ'],
        norm_reward=settings['scale_reward'], clip_obs=settings['observ_clip'] or np.inf,
        clip_reward=settings['reward_clip'] or np.inf, gamma=settings['discount'], epsilon=1e-8)
    steps_per_iteration = settings['num_envs'] * settings['rollout_length']
    num_iterations = -(-settings['total_steps'] // steps_per_iteration)
    learning_rate = settings['learning_rate']
    if settings['anneal_learning_rate']:
        # SB3 evaluates the schedule after the rollout that counts towards progress; BatchPPO
        # decays from the full rate at the first update to rate / iterations at the last one.
        def learning_rate(progress_remaining, rate=settings['learning_rate']):
            return rate * min(1.0, progress_remaining + 1.0 / num_iterations)
    model = PPO(
        'MlpPolicy', venv,
        learning_rate=learning_rate,
        n_steps=settings['rollout_length'],
        batch_size=steps_per_iteration // settings['num_minibatches'],
        n_epochs=settings['num_epochs'],
        gamma=settings['discount'],
        gae_lambda=settings['gae_lambda'],
        clip_range=settings['clip_ratio'],
        clip_range_vf=settings['value_clip'],
        normalize_advantage=settings['normalize_advantages'],
        ent_coef=settings['entropy_coef'],
        # BatchPPO's value loss is 0.5 * mean squared error, SB3's the mean squared error.
        vf_coef=0.5 * settings['value_coef'],
        max_grad_norm=settings['max_grad_norm'] or np.inf,
        policy_kwargs={
            'net_arch': {'pi': list(settings['policy_hidden_sizes']),
                         'vf': list(settings['value_hidden_sizes'])},
            'activation_fn': ACTIVATIONS[settings['activation']],
            'ortho_init': True,
            'log_std_init': float(np.log(settings['init_std'])),
            'optimizer_kwargs': {'eps': settings['adam_epsilon']},
        },
        seed=seed,
        device='cpu',
        verbose=0)
    return model, venv, num_iterations * steps_per_iteration


class Evaluator(BaseCallback):
    """Evaluates after each update that completes `eval_every_steps` more steps; appends
    BatchPPO-style lines to metrics.jsonl; keeps the time spent outside evaluation."""

    def __init__(self, settings, venv, logdir, seed):
        super().__init__()
        self._settings = settings
        self._venv = venv
        self._logdir = logdir
        self._envs = [make_env(settings) for _ in range(settings['eval_episodes'])]
        for index, env in enumerate(self._envs):
            env.reset(seed=seed + peer_runner.EVAL_SEED_OFFSET + index)
            env.action_space.seed(seed + peer_runner.EVAL_SEED_OFFSET + index)
        self._start = None
        self._eval_seconds = 0.0
        self._last_eval_step = 0

    def _on_training_start(self):
        self._start = time.time()

    def _on_step(self):
        return True

    def _on_rollout_start(self):
        # Called before each rollout, i.e. right after the previous update.
        if self.model.num_timesteps - self._last_eval_step >= self._settings['eval_every_steps']:
            self.evaluate()

    def finish(self):
        """The final evaluation, unless the last update was just evaluated."""
        if self.model.num_timesteps != self._last_eval_step:
            self.evaluate()

    def evaluate(self):
        began = time.time()
        returns, lengths = self._episodes()
        self._eval_seconds += time.time() - began
        self._last_eval_step = steps = self.model.num_timesteps
        train_seconds = time.time() - self._start - self._eval_seconds
        peer_runner.append_metrics(self._logdir, peer_runner.evaluation_record(
            steps, returns, lengths, steps / max(train_seconds, 1e-9),
            time.time() - self._start))

    def _episodes(self):
        """One episode of the deterministic policy per eval env, observations normalized by the
        training statistics (as BatchPPO's agent does)."""
        count = len(self._envs)
        observ = np.stack([env.reset()[0] for env in self._envs])
        returns, lengths = np.zeros(count), np.zeros(count, np.int64)
        running = np.ones(count, bool)
        while running.any():
            action, _ = self.model.predict(self._venv.normalize_obs(observ), deterministic=True)
            for index in np.flatnonzero(running):
                observ[index], reward, terminated, truncated, _ = self._envs[index].step(
                    action[index])
                returns[index] += reward
                lengths[index] += 1
                running[index] = not (terminated or truncated)
        return returns, lengths


def build(args, settings, make_model):
    """(model, venv, env steps to learn) of `make_model(settings, seed, vec_env)` as the
    command line `args` asks, torch's threads set and the log folder made."""
    torch.set_num_threads(args.torch_threads)
    os.makedirs(args.logdir, exist_ok=True)
    return make_model(settings, args.seed, args.vec_env)


def run(args, settings, make_model, observ_normalizer=None):
    """Trains `build`'s model to its end, evaluated by an Evaluator into metrics.jsonl (its
    observations normalized by `observ_normalizer`, by default the model's vector env); closes
    the vector env. Returns 0, the exit status."""
    model, venv, total_steps = build(args, settings, make_model)
    evaluator = Evaluator(settings, venv if observ_normalizer is None else observ_normalizer,
                          args.logdir, args.seed)
    model.learn(total_timesteps=total_steps, callback=evaluator)
    evaluator.finish()
    venv.close()
    return 0


def main(argv=None):
    args, settings = peer_runner.parse_config(peer_runner.argument_parser(__doc__), argv,
                                              check_settings)
    return run(args, settings, make_model)


if __name__ == '__main__':
    sys.exit(main())
