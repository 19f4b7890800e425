"""Trains rejax PPO (the whole run one XLA program, via JAX) with the settings of a BatchPPO run.

benchmarks/train_throughput.py runs this script with the peers' python (.venv-peers, built by
benchmarks/setup_peers.sh), so it imports only rejax, gymnax, JAX, absl and numpy; the project
never imports it. It gets the shared settings table as JSON (`--config`, the keys of `SETTINGS`,
as benchmarks/sb3_runner.py does) and writes `<logdir>/metrics.jsonl` with the fields of
BatchPPO's trainer, so that all systems are read alike. The training is one compiled call, so
there is one line, after training:

  step, mean_return, std_return, episodes, mean_length: `eval_episodes` full episodes of the
      deterministic policy (the Gaussian's mean, clipped to the action space; observations
      normalized by the training statistics), as BatchPPO evaluates;
  env_steps_per_sec: steps / `train_s`, the steady speed;
  wall_time_s: `compile_s` + `train_s`, the training clock with compilation (BatchPPO's counts
      from its first iteration, compilation included);
  compile_s: tracing and compiling `algo.train` ahead of time (`jit(...).lower(...).compile()`);
  train_s: the one execution of that compiled program, to its results on the host.

rejax's own evaluation inside the program runs once, at the end (`eval_freq` = the budget), and
is not reported: it samples actions.

Where rejax 0.1.3 cannot express a setting, its own behaviour runs: actions in the environment's
units ([-2, 2] for Pendulum, not rescaled to [-1, 1]) with initial standard deviation 1 in those
units; gradients clipped elementwise at max_grad_norm (optax.clip), not by their global norm;
Adam's epsilon 1e-8 and one optimizer each for the policy and the value network; advantages
always normalized per minibatch; the value clipped by clip_ratio; observations and rewards
normalized but never clipped. `check` refuses what would change the problem or the networks.
"""

import json
import os
import time

import jax
import jax.numpy as jnp
import numpy as np
import peer_runner  # Beside this script, which only the peers' python runs.
from absl import app, flags
from rejax import PPO
from rejax import evaluate as rejax_evaluate

SETTINGS = (
    'env_id', 'env_kwargs', 'total_steps', 'num_envs', 'rollout_length', 'eval_every_steps',
    'eval_episodes', 'anneal_learning_rate', 'discount', 'gae_lambda', 'num_epochs',
    'num_minibatches', 'learning_rate', 'adam_epsilon', 'max_grad_norm', 'clip_ratio',
    'value_clip', 'value_coef', 'entropy_coef', 'normalize_advantages', 'normalize_observ',
    'observ_clip', 'scale_reward', 'reward_clip', 'policy_hidden_sizes', 'value_hidden_sizes',
    'activation', 'init_std')

flags.DEFINE_string('config', None, 'JSON object with the keys of SETTINGS.')
flags.DEFINE_string('logdir', None, 'Where metrics.jsonl is written.')
flags.DEFINE_integer('seed', 0, 'Seed of training (and, offset, of evaluation).')
flags.DEFINE_integer('num_seeds', 1, 'Seeds trained at once in one program (jax.vmap over the '
                     'training, as PureJaxRL does); metrics.jsonl then holds the aggregate '
                     'steps/s and each seed\'s final return.', lower_bound=1)
FLAGS = flags.FLAGS


def check(settings):
    """Refuses settings rejax cannot run as BatchPPO does; returns the list of problems."""
    missing = [key for key in SETTINGS if key not in settings]
    unknown = [key for key in settings if key not in SETTINGS]
    problems = [f'missing keys {missing}, unknown keys {unknown}'] if missing or unknown else []
    if problems:
        return problems
    if settings['env_kwargs']:
        problems.append('env_kwargs are not supported (gymnax takes env_params)')
    if settings['policy_hidden_sizes'] != settings['value_hidden_sizes']:
        problems.append('rejax gives the policy and the value network the same hidden sizes')
    if settings['activation'] not in ('tanh', 'relu'):
        problems.append('activation must be tanh or relu')
    steps = settings['num_envs'] * settings['rollout_length']
    if steps % settings['num_minibatches']:
        problems.append('num_envs * rollout_length must divide into num_minibatches')
    return problems


def num_iterations(settings):
    """Iterations of the run: the budget rounded up to whole iterations, as BatchPPO does."""
    return -(-settings['total_steps'] // (settings['num_envs'] * settings['rollout_length']))


def learning_rate(settings):
    """A constant rate, or BatchPPO's annealing as an optax schedule (counted in minibatch
    updates): the full rate at the first iteration down to rate / iterations at the last."""
    rate = settings['learning_rate']
    if not settings['anneal_learning_rate']:
        return rate
    iterations = num_iterations(settings)
    updates_per_iteration = settings['num_epochs'] * settings['num_minibatches']
    return lambda count: rate * (1.0 - (count // updates_per_iteration) / iterations)


def make_algo(settings):
    """rejax PPO configured as the BatchPPO run, its single evaluation at the end."""
    total = num_iterations(settings) * settings['num_envs'] * settings['rollout_length']
    algo = PPO.create(
        env=settings['env_id'],
        total_timesteps=total,
        eval_freq=total,
        skip_initial_evaluation=True,
        num_envs=settings['num_envs'],
        num_steps=settings['rollout_length'],
        num_epochs=settings['num_epochs'],
        num_minibatches=settings['num_minibatches'],
        learning_rate=learning_rate(settings),
        max_grad_norm=settings['max_grad_norm'] or np.inf,
        gamma=settings['discount'],
        gae_lambda=settings['gae_lambda'],
        clip_eps=settings['clip_ratio'],
        # Both losses are value_coef * 0.5 * mean squared error.
        vf_coef=settings['value_coef'],
        ent_coef=settings['entropy_coef'],
        normalize_observations=settings['normalize_observ'],
        normalize_rewards=settings['scale_reward'],
        reward_normalization_discount=settings['discount'],
        agent_kwargs={'activation': settings['activation'],
                      'hidden_layer_sizes': tuple(settings['policy_hidden_sizes'])})
    return algo, total


def evaluate(algo, train_state, rng, episodes):
    """Returns and lengths of `episodes` full episodes of the deterministic policy, run by
    rejax's own evaluation loop (rejax.evaluate) with the Gaussian's mean for an action."""
    env, params = algo.env, algo.env_params
    space = env.action_space(params)

    def act(observ, unused_rng):
        if algo.normalize_observations:
            observ = algo.normalize_obs(train_state.obs_rms_state, observ)
        mean = algo.actor.apply(train_state.actor_ts.params, observ[None],
                                method=lambda actor, x: actor._action_dist(x).mean())
        return jnp.clip(mean[0], space.low, space.high)

    lengths, returns = rejax_evaluate.evaluate(
        act, rng, env, params, num_seeds=episodes,
        max_steps_in_episode=params.max_steps_in_episode)
    return returns, lengths


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f'Unexpected arguments: {" ".join(argv[1:])}')
    if not FLAGS.config or not FLAGS.logdir:
        raise app.UsageError('--config and --logdir are required')
    settings = json.loads(FLAGS.config)
    problems = check(settings)
    if problems:
        raise app.UsageError(f'--config: {"; ".join(problems)}')
    os.makedirs(FLAGS.logdir, exist_ok=True)
    algo, total = make_algo(settings)
    rng = jax.random.PRNGKey(FLAGS.seed)
    population = FLAGS.num_seeds > 1
    if population:
        rng = jax.random.split(rng, FLAGS.num_seeds)
    began = time.monotonic()
    train = jax.jit(jax.vmap(algo.train) if population else algo.train).lower(rng).compile()
    compiled = time.monotonic()
    train_state, _ = jax.block_until_ready(train(rng))
    trained = time.monotonic()
    compile_s, train_s = compiled - began, trained - compiled
    steps = total * FLAGS.num_seeds
    print(f'rejax: {FLAGS.num_seeds} x {total} steps; compile {compile_s:.2f} s, train '
          f'{train_s:.2f} s ({steps / train_s:.0f} steps/s)', flush=True)
    states = ([jax.tree_util.tree_map(lambda leaf, k=k: leaf[k], train_state)
               for k in range(FLAGS.num_seeds)] if population else [train_state])
    results = [jax.device_get(evaluate(
        algo, state, jax.random.PRNGKey(FLAGS.seed + peer_runner.EVAL_SEED_OFFSET + k),
        settings['eval_episodes'])) for k, state in enumerate(states)]
    returns = np.concatenate([member_returns for member_returns, _ in results])
    lengths = np.concatenate([member_lengths for _, member_lengths in results])
    record = peer_runner.evaluation_record(
        total, returns, lengths, steps / train_s,  # Steps/s of all seeds together.
        compile_s + train_s, compile_s=compile_s, train_s=train_s)
    if population:
        record['member_returns'] = [float(np.mean(member_returns))
                                    for member_returns, _ in results]
    peer_runner.append_metrics(FLAGS.logdir, record)
    print(f'rejax: final evaluation {record["mean_return"]:.1f} over {len(returns)} episodes '
          f'of mean length {record["mean_length"]:.0f}', flush=True)


if __name__ == '__main__':
    app.run(main)
