"""The PPO training loop: alternating training and evaluation phases, with everything logged.

Each training iteration is one compiled call: the simulator's T-step rollout of the batch of
environments followed by the PPO update. Every `eval_every_steps` environment steps the mean
(deterministic) policy runs `eval_episodes` episodes on separate environment instances; the run
then writes a checkpoint, exports the policy as a SavedModel to `policy/<step>/`, and writes a
line of `metrics.jsonl` and TensorBoard summaries. A rerun in the same logdir restores the latest
checkpoint (step count, weights, optimizer and normalizer statistics) and goes on; episodes in
flight restart.
"""

import contextlib
import functools
import json
import os
import time
import types

import gin
import gymnasium as gym
import numpy as np
import tensorflow as tf
from absl import logging

from agents.algorithms.ppo import policy_export, ppo, simulated_agent
from agents.scripts import run_config
from agents.tools import batch_env, in_graph_batch_env, simulate
from agents.tools import wrappers as wrappers_lib

METRICS_FILE = 'metrics.jsonl'
CHECKPOINT_DIR = 'checkpoints'


def train(logdir, **overrides):
    """Trains PPO as configured by gin (`train.*`, `PPO.*`...); returns the last evaluation.

    `overrides` replace gin's values for the arguments of `training_run`.
    """
    with training_run(logdir, **overrides) as run:
        return run.run()


@contextlib.contextmanager
@gin.configurable('train', denylist=['logdir'])
def training_run(logdir,
          env_id=gin.REQUIRED,
          total_steps=gin.REQUIRED,
          num_envs=16,
          rollout_length=128,
          env_mode='external',
          num_workers=None,
          env_kwargs=None,
          wrappers=('range_normalize', 'ClipAction'),
          anneal_learning_rate=True,
          eval_every_steps=20_000,
          eval_episodes=10,
          checkpoints_to_keep=3,
          log_every_secs=10.0,
          seed=0):
    """Builds the environments, the agent and the `TrainingRun` of PPO on `env_id`.

    The environments are closed when the context exits.

    Args:
      logdir: where summaries, checkpoints, `metrics.jsonl` and `operative_config.gin` go.
      env_id: a Gymnasium environment id.
      total_steps: training budget in environment steps (rounded up to whole iterations).
      num_envs: environments stepped together for training.
      rollout_length: steps per environment between updates (T).
      env_mode: 'external' (worker processes, shared memory) or 'in_process'.
      num_workers: worker processes in external mode (default: the number of cores).
      env_kwargs: keyword arguments of `gymnasium.make`.
      wrappers: wrapper specs applied to each environment (see `wrappers.apply_wrappers`);
        by default bounded observations and actions are rescaled to [-1, 1] and the policy's
        actions clipped to the action space.
      anneal_learning_rate: decay the learning rate linearly to zero over the budget.
      eval_every_steps: environment steps between evaluations (and checkpoints).
      eval_episodes: episodes of the deterministic policy per evaluation.
      checkpoints_to_keep: how many checkpoints to keep.
      log_every_secs: seconds between progress lines.
      seed: seeds environments, network initialization and sampling.
    """
    _check_env_id(env_id)
    for name, value in (('total_steps', total_steps), ('num_envs', num_envs),
                        ('rollout_length', rollout_length), ('eval_every_steps', eval_every_steps),
                        ('eval_episodes', eval_episodes)):
        if not isinstance(value, int) or value < 1:
            raise run_config.ConfigError(f'train.{name} must be a positive integer, got {value!r}')
    steps_per_iteration = num_envs * rollout_length
    num_iterations = -(-total_steps // steps_per_iteration)
    env_fn = env_factory(env_id, env_kwargs, wrappers)
    with contextlib.ExitStack() as stack:
        train_env = make_in_graph_env(env_fn, num_envs, env_mode, num_workers, seed)
        stack.callback(train_env.close)
        eval_env = make_in_graph_env(env_fn, eval_episodes, 'in_process', None, seed + 1_000_000)
        stack.callback(eval_env.close)
        agent = build_agent(
            train_env.observation_space, train_env.action_space, num_envs, seed,
            **({'lr_anneal_updates': num_iterations} if anneal_learning_rate else {}))
        yield TrainingRun(logdir, agent, train_env, eval_env, rollout_length, total_steps,
                          eval_every_steps, checkpoints_to_keep, log_every_secs)


@gin.configurable
def configure_threads(inter_op_threads=1, intra_op_threads=0):
    """Sets TensorFlow's thread pools; must run before TensorFlow executes anything.

    One inter-op thread measured fastest for the rollout (each step is a chain of small ops
    around the environment call, where more threads only add hand-offs); 0 lets TF choose.
    """
    tf.config.threading.set_inter_op_parallelism_threads(inter_op_threads)
    tf.config.threading.set_intra_op_parallelism_threads(intra_op_threads)


def check_config():
    """Checks what can be checked of the parsed gin config before a logdir is created."""
    try:
        env_id = gin.query_parameter('train.env_id')
    except ValueError:
        raise run_config.ConfigError('no environment: bind train.env_id in the config') from None
    _check_env_id(env_id)


def _check_env_id(env_id):
    try:
        gym.spec(env_id)
    except gym.error.Error as error:
        raise run_config.ConfigError(f'unknown env id {env_id!r}: {error}') from error


def env_factory(env_id, env_kwargs=None, wrappers=(), **make_kwargs):
    """A picklable function that makes one wrapped environment, as training sees it.

    `make_kwargs` (e.g. render_mode='rgb_array') go to `gymnasium.make` as well.
    """
    return functools.partial(
        batch_env.make_env, env_id, {**dict(env_kwargs or {}), **make_kwargs},
        (functools.partial(wrappers_lib.apply_wrappers, wrappers=tuple(wrappers)),))


def make_in_graph_env(env_fn, num_envs, mode, num_workers, seed):
    """`num_envs` environments from `env_fn` as an InGraphBatchEnv (explicit resets)."""
    # The in-graph env ignores infos and copies observations itself: skip both per step.
    vector_env = batch_env.BatchEnv(
        [env_fn] * num_envs, mode=mode, num_workers=num_workers,
        autoreset_mode=gym.vector.AutoresetMode.DISABLED, collect_infos=False, copy=False)
    return in_graph_batch_env.InGraphBatchEnv(vector_env, seed=seed)


def build_agent(observation_space, action_space, num_envs, seed, **ppo_kwargs):
    """The PPO agent (configured by gin's `PPO.*`) for these spaces."""
    return ppo.PPO(observ_shape=observation_space.shape, action_size=_action_size(action_space),
                   num_envs=num_envs, seed=seed, **ppo_kwargs)


def _action_size(space):
    if isinstance(space, gym.spaces.Discrete):
        return int(space.n)
    if isinstance(space, gym.spaces.Box) and len(space.shape) == 1:
        return int(space.shape[0])
    raise run_config.ConfigError(
        f'PPO supports Discrete and one-dimensional Box action spaces, got {space}')


class TrainingRun:
    """One training run in its logdir: state, checkpoints, logs."""

    def __init__(self, logdir, agent, train_env, eval_env, rollout_length, total_steps,
                 eval_every_steps, checkpoints_to_keep, log_every_secs):
        self._logdir = logdir
        self._agent = agent
        self._train_env = train_env
        self._eval_env = eval_env
        self._rollout_length = rollout_length
        self._total_steps = total_steps
        self._eval_every_steps = eval_every_steps
        self._log_every_secs = log_every_secs
        self._train_sim = simulate.Simulator(
            train_env, simulated_agent.SimulatedAgent(agent, len(train_env)))
        self._eval_sim = simulate.Simulator(
            eval_env, simulated_agent.SimulatedAgent(agent, len(eval_env), greedy=True))
        self.env_steps = tf.Variable(0, dtype=tf.int64, trainable=False, name='env_steps')
        self.wall_time = tf.Variable(0.0, dtype=tf.float64, trainable=False, name='wall_time')
        self.checkpoint = tf.train.Checkpoint(
            agent=agent, env_steps=self.env_steps, wall_time=self.wall_time)
        self._manager = tf.train.CheckpointManager(
            self.checkpoint, os.path.join(logdir, CHECKPOINT_DIR), max_to_keep=checkpoints_to_keep)
        self._writer = tf.summary.create_file_writer(logdir)
        self._restored = False

    def restore(self):
        """Restores the latest checkpoint, if any; returns its path or None."""
        if self._restored:
            return self._manager.latest_checkpoint
        self._restored = True
        path = self._manager.restore_or_initialize()
        if path:
            logging.info('Resumed from %s at step %d.', path, int(self.env_steps))
        return path

    def run(self):
        """Trains from the latest checkpoint to the budget; returns the last evaluation."""
        self.restore()
        start_steps = int(self.env_steps)
        start_time = time.time()
        start_wall = float(self.wall_time)
        train_seconds = 0.0
        last_log = time.time()
        last_eval_step = (start_steps // self._eval_every_steps) * self._eval_every_steps
        latest = None
        first_iteration = True
        episode_returns = []
        while int(self.env_steps) < self._total_steps:
            began = time.time()
            transitions, metrics = self._iteration(first_iteration)
            train_seconds += time.time() - began
            steps = int(self.env_steps)
            done = transitions.terminated | transitions.truncated
            returns = transitions.episode_return[done]
            lengths = transitions.episode_length[done]
            episode_returns = (episode_returns + list(returns))[-100:]
            steps_per_sec = (steps - start_steps) / max(train_seconds, 1e-9)
            with self._writer.as_default(step=steps):
                for name, value in metrics.items():
                    tf.summary.scalar(f'train/{name}', value)
                if len(returns):
                    tf.summary.scalar('train/episode_return', np.mean(returns))
                    tf.summary.scalar('train/episode_length', np.mean(lengths))
                tf.summary.scalar('train/env_steps_per_sec', steps_per_sec)
            if first_iteration:
                run_config.write_atomic(
                    os.path.join(self._logdir, run_config.OPERATIVE_CONFIG_FILE),
                    gin.operative_config_str())
                first_iteration = False
            self.wall_time.assign(start_wall + time.time() - start_time)
            finished = steps >= self._total_steps
            if finished or steps - last_eval_step >= self._eval_every_steps:
                last_eval_step = steps
                latest = self._evaluate_and_save(steps, steps_per_sec)
            if finished or time.time() - last_log >= self._log_every_secs:
                last_log = time.time()
                self._log_progress(steps, steps_per_sec, episode_returns, latest)
        if latest is None:
            logging.info('Nothing to do: the run already reached %d steps.', self._total_steps)
        else:
            logging.info('Done: %d steps in %.1f s, %.0f env steps/s, eval return %.1f.',
                         latest['step'], latest['wall_time_s'], latest['env_steps_per_sec'],
                         latest['mean_return'])
        self._writer.flush()
        return latest

    # No AutoGraph here and in the simulator: the code has no tensor-dependent Python control
    # flow, and converting it took 1 to 2 s (CPU) of tracing the first iteration.
    @tf.function(autograph=False)
    def _compiled_iteration(self, reset):
        transitions = self._train_sim.rollout(self._rollout_length, reset=reset)
        batch = {
            'observ': transitions.observ,
            'action': transitions.action,
            'reward': transitions.reward,
            'terminated': transitions.terminated,
            'truncated': transitions.truncated,
            'next_observ': transitions.next_observ,
            'extras': transitions.extras,
        }
        metrics = self._agent.update(batch)
        self.env_steps.assign_add(tf.cast(tf.size(transitions.reward), tf.int64))
        summary = {
            'terminated': transitions.terminated, 'truncated': transitions.truncated,
            'episode_return': transitions.episode_return,
            'episode_length': transitions.episode_length}
        return summary, metrics

    def _iteration(self, reset):
        summary, metrics = self._compiled_iteration(tf.constant(reset))
        summary = {name: value.numpy() for name, value in summary.items()}
        metrics = {name: float(value) for name, value in metrics.items()}
        for name, value in metrics.items():
            if not np.isfinite(value):
                raise FloatingPointError(f'PPO update produced a non-finite {name}: {value}')
        return types.SimpleNamespace(**summary), metrics

    def _evaluate_and_save(self, steps, steps_per_sec):
        returns, lengths = self._evaluate()
        self._manager.save(checkpoint_number=steps)
        # The policy of each kept checkpoint, as a SavedModel in <logdir>/policy/<step>/.
        if getattr(self, '_policy_exporter', None) is None:
            self._policy_exporter = policy_export.PolicyExporter(
                self._agent, self._eval_env.observation_space, self._eval_env.action_space)
        policy_dir = os.path.join(self._logdir, policy_export.POLICY_DIR)
        self._policy_exporter.export(os.path.join(policy_dir, str(steps)), step=steps,
                                     config=gin.operative_config_str())
        policy_export.prune_exports(policy_dir, [
            int(path.rsplit('-', 1)[-1]) for path in self._manager.checkpoints])
        record = {
            'step': steps,
            'mean_return': float(np.mean(returns)),
            'std_return': float(np.std(returns)),
            'episodes': len(returns),
            'mean_length': float(np.mean(lengths)),
            'env_steps_per_sec': float(steps_per_sec),
            'wall_time_s': float(self.wall_time),
        }
        with open(os.path.join(self._logdir, METRICS_FILE), 'a', encoding='utf-8') as f:
            f.write(json.dumps(record) + '\n')
        with self._writer.as_default(step=steps):
            tf.summary.scalar('eval/mean_return', record['mean_return'])
            tf.summary.scalar('eval/std_return', record['std_return'])
            tf.summary.scalar('eval/mean_length', record['mean_length'])
        self._writer.flush()
        return record

    def _evaluate(self):
        """One episode of the deterministic policy in each evaluation environment."""
        num_envs = len(self._eval_env)
        returns = np.zeros(num_envs)
        lengths = np.zeros(num_envs, np.int64)
        finished = np.zeros(num_envs, bool)
        reset = True
        while not finished.all():
            summary = self._eval_rollout(tf.constant(reset))
            reset = False
            done = (summary['terminated'] | summary['truncated']).numpy()
            episode_return = summary['episode_return'].numpy()
            episode_length = summary['episode_length'].numpy()
            for step in range(done.shape[0]):
                new = done[step] & ~finished
                returns[new] = episode_return[step][new]
                lengths[new] = episode_length[step][new]
                finished |= new
        return returns, lengths

    @tf.function(autograph=False)
    def _eval_rollout(self, reset):
        transitions = self._eval_sim.rollout(100, reset=reset)
        return {'terminated': transitions.terminated, 'truncated': transitions.truncated,
                'episode_return': transitions.episode_return,
                'episode_length': transitions.episode_length}

    def _log_progress(self, steps, steps_per_sec, episode_returns, latest):
        remaining = max(self._total_steps - steps, 0)
        eta = remaining / steps_per_sec if steps_per_sec > 0 else float('inf')
        train_return = f'{np.mean(episode_returns):.1f}' if episode_returns else 'n/a'
        eval_return = f'{latest["mean_return"]:.1f}' if latest else 'n/a'
        logging.info('step %d/%d | %.0f env steps/s | ETA %s | train return %s | eval return %s',
                     steps, self._total_steps, steps_per_sec, _format_seconds(eta), train_return,
                     eval_return)


def _format_seconds(seconds):
    if not np.isfinite(seconds):
        return '?'
    minutes, seconds = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f'{hours}:{minutes:02d}:{seconds:02d}'
