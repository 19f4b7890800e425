"""Times `PPO.update` on a synthetic rollout, with and without XLA compilation.

Example (SB3's MuJoCo setting: 2048 steps, 10 epochs x 32 minibatches of 64, 64x64 MLPs):

    bazel run //benchmarks:ppo_update -- --num_steps=2048 --num_envs=1
"""

import statistics
import time

import numpy as np
import tensorflow as tf
from absl import app, flags

from agents.algorithms import networks
from agents.algorithms.ppo import ppo

flags.DEFINE_integer('num_steps', 2048, 'Rollout length T.')
flags.DEFINE_integer('num_envs', 1, 'Environments N.')
flags.DEFINE_integer('observ_size', 17, 'Observation size (HalfCheetah: 17).')
flags.DEFINE_integer('action_size', 6, 'Action size (HalfCheetah: 6).')
flags.DEFINE_integer('num_epochs', 10, 'Epochs per update.')
flags.DEFINE_integer('num_minibatches', 32, 'Minibatches per epoch.')
flags.DEFINE_integer('repeats', 7, 'Timed updates per setting (the median is reported).')
flags.DEFINE_enum('policy', 'gaussian', ['gaussian', 'categorical', 'recurrent'], 'Policy.')
flags.DEFINE_integer('chunk_length', None, 'Chunk length for the recurrent policy.')
flags.DEFINE_list('jit_compile', ['false', 'true'], 'Settings of PPO.jit_compile to time.')
FLAGS = flags.FLAGS

POLICIES = {
    'gaussian': networks.FeedForwardGaussianPolicy,
    'categorical': networks.FeedForwardCategoricalPolicy,
    'recurrent': networks.RecurrentGaussianPolicy,
}


def synthetic_batch(agent, num_steps, num_envs, observ_size):
    """A rollout with the policy's own extras, as `act` would record it."""
    rng = np.random.default_rng(0)
    observ = tf.constant(rng.normal(size=(num_steps, num_envs, observ_size)), tf.float32)
    state = agent.initial_state(num_envs)
    actions, extras = [], []
    no_reset = tf.zeros([num_envs], tf.bool)
    for step in range(num_steps):
        action, extra, state = agent.act(observ[step], state, no_reset)
        actions.append(action)
        extras.append(extra)
    done = rng.uniform(size=(num_steps, num_envs)) < 0.002
    return {
        'observ': observ,
        'action': tf.stack(actions),
        'reward': tf.constant(rng.normal(size=(num_steps, num_envs)), tf.float32),
        'terminated': tf.constant(done),
        'truncated': tf.zeros([num_steps, num_envs], tf.bool),
        'next_observ': tf.roll(observ, -1, axis=0),
        'extras': tf.nest.map_structure(lambda *steps: tf.stack(steps), *extras),
    }


def time_updates(jit_compile):
    agent = ppo.PPO(
        (FLAGS.observ_size,), FLAGS.action_size, FLAGS.num_envs,
        policy_network=POLICIES[FLAGS.policy], num_epochs=FLAGS.num_epochs,
        num_minibatches=FLAGS.num_minibatches, chunk_length=FLAGS.chunk_length,
        jit_compile=jit_compile)
    batch = synthetic_batch(agent, FLAGS.num_steps, FLAGS.num_envs, FLAGS.observ_size)
    start = time.perf_counter()
    agent.update(batch)['loss'].numpy()
    first = time.perf_counter() - start
    durations, cpu_durations = [], []
    for _ in range(FLAGS.repeats):
        start, cpu_start = time.perf_counter(), time.process_time()
        agent.update(batch)['loss'].numpy()
        durations.append(time.perf_counter() - start)
        cpu_durations.append(time.process_time() - cpu_start)
    return first, durations, cpu_durations


def main(argv):
    del argv
    for setting in FLAGS.jit_compile:
        first, durations, cpu_durations = time_updates(setting.lower() == 'true')
        steps = FLAGS.num_epochs * FLAGS.num_minibatches
        median = statistics.median(durations)
        print(f'jit_compile={setting}: first call (tracing + compiling) {first:.2f} s; '
              f'median update {median * 1000:.0f} ms over {len(durations)} '
              f'(min {min(durations) * 1000:.0f}, max {max(durations) * 1000:.0f}); '
              f'{median / steps * 1e6:.0f} us per gradient step; median CPU time '
              f'{statistics.median(cpu_durations) * 1000:.0f} ms')


if __name__ == '__main__':
    app.run(main)
