"""CleanRL's PPO on Atari with EnvPool (`cleanrl/ppo_atari_envpool.py`), timed for
benchmarks/atari_throughput.py.

This is CleanRL's script (https://github.com/vwxyzjn/cleanrl, file cleanrl/ppo_atari_envpool.py,
read at commit 6220645d06db0c3dfa0fb7cf6f1d0d864ccb5d3e; MIT License, Copyright (c) 2019 CleanRL
developers) with its algorithm unchanged: the Agent (Nature CNN shared by actor and critic),
the rollout, GAE, the minibatch loop and its losses, the learning-rate annealing and Adam are
CleanRL's lines. What was changed, and only so that it runs in .venv-peers (EnvPool 1.2.5,
Gymnasium 1.x, no gym, tensorboard, wandb or tyro) and reports its speed:

- EnvPool is made with `env_type="gymnasium"` (CleanRL: "gym", for which EnvPool 1.2.5 makes
  the same Gymnasium pool): `reset` returns (observations, infos) and `step` five values, whose
  `terminations | truncations` is the `done` of the old gym API that CleanRL's lines read, so
  `next_done` is the same; RecordEpisodeStatistics (a gymnasium.Wrapper now) passes the five
  values on;
- `envs.num_envs = args.num_envs` and `envs.single_action_space = envs.action_space` (and
  the same of the observation space) are left out: EnvPool 1.2.5's Gymnasium pool has them, as
  read-only properties of those values; RecordEpisodeStatistics copies the single spaces onto
  itself (Gymnasium 1.x's wrappers do not forward attributes);
- tyro's command line is argparse over the same `Args` fields (`--env-id`, `--num-envs`, ...,
  `--anneal-lr False`); `--track` (wandb) is refused; the TensorBoard SummaryWriter is a stand-in
  that drops the scalars (their `.item()` calls stay), and `run_name`, which named its
  directory, is gone (`exp_name` defaults to 'ppo_atari_envpool', CleanRL's file name); the
  per-episode prints go only with `--print-episodes` (the benchmark's runs print per iteration
  only);
- `--stop-at-step N` ends the run after N steps with the learning rate still annealed over
  `--total-timesteps` (a 2M-step slice of the 10M schedule, as our `--stop_at_step`);
- `--torch-threads` (default 2, the machine's cores: `torch.set_num_threads`), and timers: the
  time of every iteration's end, and per iteration the seconds of its rollout, of the policy's
  steps in it (`get_action_and_value` and storing its outputs), of `envs.step` in it, and of the
  update (bootstrap, GAE and the epochs). `--metrics-file` gets them as JSON
  ({"iteration_ends": [[global_step, seconds since start_time], ...], "phases": [[rollout,
  act, env, update], ...], ...}), and the last line printed is the steady speed after
  `--warmup-steps` steps (the first iterations, in which torch and EnvPool warm up, left
  out).
"""

import argparse
import dataclasses
import json
import os
import random
import time
from collections import deque
from dataclasses import dataclass

import envpool
import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import torch.optim as optim
from torch.distributions.categorical import Categorical


@dataclass
class Args:
    exp_name: str = 'ppo_atari_envpool'
    """the name of this experiment"""
    seed: int = 1
    """seed of the experiment"""
    torch_deterministic: bool = True
    """if toggled, `torch.backends.cudnn.deterministic=False`"""
    cuda: bool = True
    """if toggled, cuda will be enabled by default"""
    track: bool = False
    """if toggled, this experiment will be tracked with Weights and Biases"""
    wandb_project_name: str = 'cleanRL'
    """the wandb's project name"""
    wandb_entity: str = None
    """the entity (team) of wandb's project"""
    capture_video: bool = False
    """whether to capture videos of the agent performances (check out `videos` folder)"""

    # Algorithm specific arguments
    env_id: str = 'Breakout-v5'
    """the id of the environment"""
    total_timesteps: int = 10000000
    """total timesteps of the experiments"""
    learning_rate: float = 2.5e-4
    """the learning rate of the optimizer"""
    num_envs: int = 8
    """the number of parallel game environments"""
    num_steps: int = 128
    """the number of steps to run in each environment per policy rollout"""
    anneal_lr: bool = True
    """Toggle learning rate annealing for policy and value networks"""
    gamma: float = 0.99
    """the discount factor gamma"""
    gae_lambda: float = 0.95
    """the lambda for the general advantage estimation"""
    num_minibatches: int = 4
    """the number of mini-batches"""
    update_epochs: int = 4
    """the K epochs to update the policy"""
    norm_adv: bool = True
    """Toggles advantages normalization"""
    clip_coef: float = 0.1
    """the surrogate clipping coefficient"""
    clip_vloss: bool = True
    """Toggles whether or not to use a clipped loss for the value function, as per the paper."""
    ent_coef: float = 0.01
    """coefficient of the entropy"""
    vf_coef: float = 0.5
    """coefficient of the value function"""
    max_grad_norm: float = 0.5
    """the maximum norm for the gradient clipping"""
    target_kl: float = None
    """the target KL divergence threshold"""

    # to be filled in runtime
    batch_size: int = 0
    """the batch size (computed in runtime)"""
    minibatch_size: int = 0
    """the mini-batch size (computed in runtime)"""
    num_iterations: int = 0
    """the number of iterations (computed in runtime)"""

    # The benchmark's additions.
    torch_threads: int = 2
    """torch.set_num_threads (the machine's 2 cores)"""
    warmup_steps: int = 0
    """steps left out of the steady speed printed last"""
    metrics_file: str = None
    """where to write the iteration ends as JSON (None: nowhere)"""
    print_episodes: bool = False
    """print each finished game's return, as CleanRL does"""
    stop_at_step: int = 0
    """stop after this many steps, the schedule still that of --total-timesteps (0: never)"""


def _bool(text):
    if text.lower() in ('1', 'true', 'yes', 'on'):
        return True
    if text.lower() in ('0', 'false', 'no', 'off'):
        return False
    raise argparse.ArgumentTypeError(f'expected a boolean, got {text!r}')


def parse_args(argv=None):
    """Args from `argv` as tyro reads them: `--field-name value` (a bare bool flag is True)."""
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    types = {'int': int, 'float': float, 'str': str, 'bool': _bool}
    for field in dataclasses.fields(Args):
        flag = '--' + field.name.replace('_', '-')
        kind = types[field.type if isinstance(field.type, str) else field.type.__name__]
        if kind is _bool:
            parser.add_argument(flag, type=_bool, nargs='?', const=True, default=field.default)
        else:
            parser.add_argument(flag, type=kind, default=field.default)
    return Args(**vars(parser.parse_args(argv)))


class _NoWriter:
    """Stands in for torch.utils.tensorboard.SummaryWriter (no tensorboard in .venv-peers)."""

    def add_scalar(self, *args, **kwargs):
        pass

    def add_text(self, *args, **kwargs):
        pass

    def close(self):
        pass


class RecordEpisodeStatistics(gym.Wrapper):
    def __init__(self, env, deque_size=100):
        super().__init__(env)
        self.num_envs = getattr(env, 'num_envs', 1)
        self.single_action_space = env.single_action_space
        self.single_observation_space = env.single_observation_space
        self.episode_returns = None
        self.episode_lengths = None

    def reset(self, **kwargs):
        observations = super().reset(**kwargs)
        self.episode_returns = np.zeros(self.num_envs, dtype=np.float32)
        self.episode_lengths = np.zeros(self.num_envs, dtype=np.int32)
        self.lives = np.zeros(self.num_envs, dtype=np.int32)
        self.returned_episode_returns = np.zeros(self.num_envs, dtype=np.float32)
        self.returned_episode_lengths = np.zeros(self.num_envs, dtype=np.int32)
        return observations

    def step(self, action):
        observations, rewards, terminations, truncations, infos = super().step(action)
        self.episode_returns += infos['reward']
        self.episode_lengths += 1
        self.returned_episode_returns[:] = self.episode_returns
        self.returned_episode_lengths[:] = self.episode_lengths
        self.episode_returns *= 1 - infos['terminated']
        self.episode_lengths *= 1 - infos['terminated']
        infos['r'] = self.returned_episode_returns
        infos['l'] = self.returned_episode_lengths
        return (
            observations,
            rewards,
            terminations,
            truncations,
            infos,
        )


def layer_init(layer, std=np.sqrt(2), bias_const=0.0):  # noqa: B008
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


class Agent(nn.Module):
    def __init__(self, envs):
        super().__init__()
        self.network = nn.Sequential(
            layer_init(nn.Conv2d(4, 32, 8, stride=4)),
            nn.ReLU(),
            layer_init(nn.Conv2d(32, 64, 4, stride=2)),
            nn.ReLU(),
            layer_init(nn.Conv2d(64, 64, 3, stride=1)),
            nn.ReLU(),
            nn.Flatten(),
            layer_init(nn.Linear(64 * 7 * 7, 512)),
            nn.ReLU(),
        )
        self.actor = layer_init(nn.Linear(512, envs.single_action_space.n), std=0.01)
        self.critic = layer_init(nn.Linear(512, 1), std=1)

    def get_value(self, x):
        return self.critic(self.network(x / 255.0))

    def get_action_and_value(self, x, action=None):
        hidden = self.network(x / 255.0)
        logits = self.actor(hidden)
        probs = Categorical(logits=logits)
        if action is None:
            action = probs.sample()
        return action, probs.log_prob(action), probs.entropy(), self.critic(hidden)


def steady_speed(iteration_ends, warmup_steps):
    """(steps/s, first step, last step) over the iterations that end after `warmup_steps`
    (from the end of the last one before them); None if fewer than two iteration ends are
    left."""
    window = [end for end in iteration_ends if end[0] >= warmup_steps]
    if len(window) < 2:
        return None
    (first_step, first_s), (last_step, last_s) = window[0], window[-1]
    return (last_step - first_step) / (last_s - first_s), first_step, last_step


def main(argv=None):
    args = parse_args(argv)
    args.batch_size = int(args.num_envs * args.num_steps)
    args.minibatch_size = int(args.batch_size // args.num_minibatches)
    args.num_iterations = args.total_timesteps // args.batch_size
    if args.track:
        raise SystemExit('--track: wandb is not installed in .venv-peers')
    torch.set_num_threads(args.torch_threads)
    writer = _NoWriter()
    writer.add_text(
        'hyperparameters',
        '|param|value|\n|-|-|\n%s' % ('\n'.join([f'|{key}|{value}|' for key, value in vars(args).items()])),  # noqa: E501, UP031
    )

    # TRY NOT TO MODIFY: seeding
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.backends.cudnn.deterministic = args.torch_deterministic

    device = torch.device('cuda' if torch.cuda.is_available() and args.cuda else 'cpu')

    # env setup
    envs = envpool.make(
        args.env_id,
        env_type='gymnasium',
        num_envs=args.num_envs,
        episodic_life=True,
        reward_clip=True,
        seed=args.seed,
    )
    envs = RecordEpisodeStatistics(envs)
    assert isinstance(envs.action_space, gym.spaces.Discrete), 'only discrete action space is supported'  # noqa: E501

    agent = Agent(envs).to(device)
    optimizer = optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5)

    # ALGO Logic: Storage setup
    obs = torch.zeros((args.num_steps, args.num_envs) + envs.single_observation_space.shape).to(device)  # noqa: E501
    actions = torch.zeros((args.num_steps, args.num_envs) + envs.single_action_space.shape).to(device)  # noqa: E501
    logprobs = torch.zeros((args.num_steps, args.num_envs)).to(device)
    rewards = torch.zeros((args.num_steps, args.num_envs)).to(device)
    dones = torch.zeros((args.num_steps, args.num_envs)).to(device)
    values = torch.zeros((args.num_steps, args.num_envs)).to(device)
    avg_returns = deque(maxlen=20)

    # TRY NOT TO MODIFY: start the game
    global_step = 0
    start_time = time.time()
    next_obs = torch.Tensor(envs.reset()[0]).to(device)
    next_done = torch.zeros(args.num_envs).to(device)
    iteration_ends, phases = [], []

    for iteration in range(1, args.num_iterations + 1):
        if args.stop_at_step and global_step >= args.stop_at_step:  # The benchmark's addition.
            break
        # Annealing the rate if instructed to do so.
        if args.anneal_lr:
            frac = 1.0 - (iteration - 1.0) / args.num_iterations
            lrnow = frac * args.learning_rate
            optimizer.param_groups[0]['lr'] = lrnow

        rollout_start, act_s, env_s = time.perf_counter(), 0.0, 0.0  # The benchmark's timers.
        for step in range(0, args.num_steps):
            global_step += args.num_envs
            obs[step] = next_obs
            dones[step] = next_done

            # ALGO LOGIC: action logic
            acting = time.perf_counter()
            with torch.no_grad():
                action, logprob, _, value = agent.get_action_and_value(next_obs)
                values[step] = value.flatten()
            actions[step] = action
            logprobs[step] = logprob

            # TRY NOT TO MODIFY: execute the game and log data.
            stepping = time.perf_counter()
            next_obs, reward, terminations, truncations, info = envs.step(action.cpu().numpy())
            act_s, env_s = act_s + stepping - acting, env_s + time.perf_counter() - stepping
            next_done = np.logical_or(terminations, truncations)
            rewards[step] = torch.tensor(reward).to(device).view(-1)
            next_obs, next_done = torch.Tensor(next_obs).to(device), torch.Tensor(next_done).to(device)  # noqa: E501

            for idx, d in enumerate(next_done):
                if d and info['lives'][idx] == 0:
                    if args.print_episodes:
                        print(f"global_step={global_step}, episodic_return={info['r'][idx]}")
                    avg_returns.append(info['r'][idx])
                    writer.add_scalar('charts/avg_episodic_return', np.average(avg_returns), global_step)  # noqa: E501
                    writer.add_scalar('charts/episodic_return', info['r'][idx], global_step)
                    writer.add_scalar('charts/episodic_length', info['l'][idx], global_step)

        # bootstrap value if not done
        update_start = time.perf_counter()
        with torch.no_grad():
            next_value = agent.get_value(next_obs).reshape(1, -1)
            advantages = torch.zeros_like(rewards).to(device)
            lastgaelam = 0
            for t in reversed(range(args.num_steps)):
                if t == args.num_steps - 1:
                    nextnonterminal = 1.0 - next_done
                    nextvalues = next_value
                else:
                    nextnonterminal = 1.0 - dones[t + 1]
                    nextvalues = values[t + 1]
                delta = rewards[t] + args.gamma * nextvalues * nextnonterminal - values[t]
                advantages[t] = lastgaelam = delta + args.gamma * args.gae_lambda * nextnonterminal * lastgaelam  # noqa: E501
            returns = advantages + values

        # flatten the batch
        b_obs = obs.reshape((-1,) + envs.single_observation_space.shape)
        b_logprobs = logprobs.reshape(-1)
        b_actions = actions.reshape((-1,) + envs.single_action_space.shape)
        b_advantages = advantages.reshape(-1)
        b_returns = returns.reshape(-1)
        b_values = values.reshape(-1)

        # Optimizing the policy and value network
        b_inds = np.arange(args.batch_size)
        clipfracs = []
        for _epoch in range(args.update_epochs):
            np.random.shuffle(b_inds)
            for start in range(0, args.batch_size, args.minibatch_size):
                end = start + args.minibatch_size
                mb_inds = b_inds[start:end]

                _, newlogprob, entropy, newvalue = agent.get_action_and_value(b_obs[mb_inds], b_actions.long()[mb_inds])  # noqa: E501
                logratio = newlogprob - b_logprobs[mb_inds]
                ratio = logratio.exp()

                with torch.no_grad():
                    # calculate approx_kl http://joschu.net/blog/kl-approx.html
                    old_approx_kl = (-logratio).mean()
                    approx_kl = ((ratio - 1) - logratio).mean()
                    clipfracs += [((ratio - 1.0).abs() > args.clip_coef).float().mean().item()]

                mb_advantages = b_advantages[mb_inds]
                if args.norm_adv:
                    mb_advantages = (mb_advantages - mb_advantages.mean()) / (mb_advantages.std() + 1e-8)  # noqa: E501

                # Policy loss
                pg_loss1 = -mb_advantages * ratio
                pg_loss2 = -mb_advantages * torch.clamp(ratio, 1 - args.clip_coef, 1 + args.clip_coef)  # noqa: E501
                pg_loss = torch.max(pg_loss1, pg_loss2).mean()

                # Value loss
                newvalue = newvalue.view(-1)
                if args.clip_vloss:
                    v_loss_unclipped = (newvalue - b_returns[mb_inds]) ** 2
                    v_clipped = b_values[mb_inds] + torch.clamp(
                        newvalue - b_values[mb_inds],
                        -args.clip_coef,
                        args.clip_coef,
                    )
                    v_loss_clipped = (v_clipped - b_returns[mb_inds]) ** 2
                    v_loss_max = torch.max(v_loss_unclipped, v_loss_clipped)
                    v_loss = 0.5 * v_loss_max.mean()
                else:
                    v_loss = 0.5 * ((newvalue - b_returns[mb_inds]) ** 2).mean()

                entropy_loss = entropy.mean()
                loss = pg_loss - args.ent_coef * entropy_loss + v_loss * args.vf_coef

                optimizer.zero_grad()
                loss.backward()
                nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
                optimizer.step()

            if args.target_kl is not None and approx_kl > args.target_kl:
                break

        phases.append((update_start - rollout_start, act_s, env_s,
                       time.perf_counter() - update_start))
        y_pred, y_true = b_values.cpu().numpy(), b_returns.cpu().numpy()
        var_y = np.var(y_true)
        explained_var = np.nan if var_y == 0 else 1 - np.var(y_true - y_pred) / var_y

        # TRY NOT TO MODIFY: record rewards for plotting purposes
        writer.add_scalar('charts/learning_rate', optimizer.param_groups[0]['lr'], global_step)
        writer.add_scalar('losses/value_loss', v_loss.item(), global_step)
        writer.add_scalar('losses/policy_loss', pg_loss.item(), global_step)
        writer.add_scalar('losses/entropy', entropy_loss.item(), global_step)
        writer.add_scalar('losses/old_approx_kl', old_approx_kl.item(), global_step)
        writer.add_scalar('losses/approx_kl', approx_kl.item(), global_step)
        writer.add_scalar('losses/clipfrac', np.mean(clipfracs), global_step)
        writer.add_scalar('losses/explained_variance', explained_var, global_step)
        print('SPS:', int(global_step / (time.time() - start_time)), flush=True)
        writer.add_scalar('charts/SPS', int(global_step / (time.time() - start_time)), global_step)
        iteration_ends.append((global_step, time.time() - start_time))

    envs.close()
    writer.close()
    steady = steady_speed(iteration_ends, args.warmup_steps)
    if args.metrics_file:
        with open(args.metrics_file, 'w', encoding='utf-8') as f:
            json.dump({'iteration_ends': iteration_ends, 'phases': phases,
                       'torch_threads': torch.get_num_threads(), 'args': vars(args)}, f)
    if steady:
        print(f'steady SPS: {steady[0]:.1f} (steps {steady[1]} to {steady[2]}, '
              f'torch threads {torch.get_num_threads()}, pid {os.getpid()})', flush=True)


if __name__ == '__main__':
    main()
