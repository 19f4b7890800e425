"""Times `PPO.update` on a synthetic rollout, with and without XLA compilation.

Example (SB3's MuJoCo setting: 2048 steps, 10 epochs x 32 minibatches of 64, 64x64 MLPs):

    bazel run //benchmarks:ppo_update -- --num_steps=2048 --num_envs=1

`--floor` also times, alternated with the update, what no PPO update can do without: the same
networks' forward and backward passes on the same epochs x minibatches, applied as a plain
gradient step (no objective, clipping or Adam). The ratio update / floor bounds what any
rewriting of the objective or the optimizer could still gain.
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
flags.DEFINE_bool('concurrent_networks', False, 'Time PPO.concurrent_networks (the policy and '
                  'the value network as two XLA programs side by side) with jit_compile=true.')
flags.DEFINE_bool('floor', False, 'Also time the networks\' forward and backward passes alone '
                  '(feed-forward policies), alternated with the update.')
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


def make_agent(jit_compile):
    return ppo.PPO(
        (FLAGS.observ_size,), FLAGS.action_size, FLAGS.num_envs,
        policy_network=POLICIES[FLAGS.policy], num_epochs=FLAGS.num_epochs,
        num_minibatches=FLAGS.num_minibatches, chunk_length=FLAGS.chunk_length,
        jit_compile=jit_compile, concurrent_networks=FLAGS.concurrent_networks and jit_compile)


def network_floor(agent, batch, jit_compile):
    """A program with the update's network work alone: for as many minibatches of the same
    size as the update trains on (drawn the same way, from a fixed seed), the policy's and the
    value's forward pass, the gradient of a sum of their outputs' mean squares and a plain
    gradient step on `agent`'s weights (so `agent` should not be the one whose update is
    timed)."""
    if agent.policy.recurrent:
        raise app.UsageError('--floor times feed-forward policies only.')
    # The networks' leading member axis: one member.
    observ = tf.reshape(agent.normalize(batch['observ'][None]), [-1, FLAGS.observ_size])
    num_units = observ.shape[0]
    size = num_units // FLAGS.num_minibatches

    def loss(minibatch):
        params, _ = agent.policy.step(minibatch[None], ())
        outputs = [*tf.nest.flatten(params), agent.value(minibatch[None])]
        return tf.add_n([tf.reduce_mean(tf.square(output)) for output in outputs])

    @tf.function(jit_compile=jit_compile, autograph=False)
    def floor():
        order = tf.argsort(tf.random.stateless_uniform(
            [FLAGS.num_epochs, num_units], seed=[0, 0]), axis=1)
        indices = tf.reshape(order[:, :size * FLAGS.num_minibatches], [-1, size])

        weights = agent.policy.trainable_variables + agent.value.trainable_variables

        def body(step):
            with tf.GradientTape() as tape:
                value = loss(tf.gather(observ, indices[step]))
            for variable, gradient in zip(
                    weights, tape.gradient(value, weights), strict=True):
                variable.assign_sub(1e-3 * gradient)
            return (step + 1,)

        return tf.while_loop(lambda step: step < tf.shape(indices)[0], body, (0,))[0]

    return floor


def once(call):
    """(wall seconds, CPU seconds) of one call."""
    start, cpu_start = time.perf_counter(), time.process_time()
    call()
    return time.perf_counter() - start, time.process_time() - cpu_start


def timed(call, repeats):
    """(seconds of the first call, per-call wall seconds, per-call CPU seconds) over `repeats`."""
    first = once(call)[0]
    durations, cpu_durations = zip(*(once(call) for _ in range(repeats)), strict=True)
    return first, durations, cpu_durations


def describe(name, first, durations, cpu_durations):
    steps = FLAGS.num_epochs * FLAGS.num_minibatches
    median = statistics.median(durations)
    return (f'{name}: first call (tracing + compiling) {first:.2f} s; median '
            f'{median * 1000:.0f} ms over {len(durations)} (min {min(durations) * 1000:.0f}, '
            f'max {max(durations) * 1000:.0f}); {median / steps * 1e6:.0f} us per gradient step; '
            f'median CPU time {statistics.median(cpu_durations) * 1000:.0f} ms')


def time_setting(setting):
    """Prints the timings of one setting of `PPO.jit_compile` ('true' or 'false')."""
    jit_compile = setting.lower() == 'true'
    agent = make_agent(jit_compile)
    batch = synthetic_batch(agent, FLAGS.num_steps, FLAGS.num_envs, FLAGS.observ_size)

    def update():
        agent.update(batch)['loss'].numpy()

    if not FLAGS.floor:
        print(describe(f'jit_compile={setting}: update', *timed(update, FLAGS.repeats)))
        return
    floor = network_floor(make_agent(jit_compile), batch, jit_compile)
    calls = (update, lambda: floor().numpy())
    firsts = [once(call)[0] for call in calls]
    # Alternated, one call each: [repeats][update, floor][wall, CPU].
    pairs = [[once(call) for call in calls] for _ in range(FLAGS.repeats)]
    for index, name in enumerate(('update', 'network floor')):
        print(describe(f'jit_compile={setting}: {name}', firsts[index],
                       [pair[index][0] for pair in pairs], [pair[index][1] for pair in pairs]))
    ratios = [update_times[0] / floor_times[0] for update_times, floor_times in pairs]
    print(f'jit_compile={setting}: update / floor, median of the pairs '
          f'{statistics.median(ratios):.2f} (from {min(ratios):.2f} to {max(ratios):.2f})')


def main(argv):
    del argv
    for setting in FLAGS.jit_compile:
        time_setting(setting)


if __name__ == '__main__':
    app.run(main)
