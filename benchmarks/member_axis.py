r"""K members' gradient steps two ways: the member axis against `tf.vectorized_map`.

A population's math can be batched over its members in two ways (issue: "choose by
measurement"): the member axis written into the networks (agents/algorithms/members.py: every
variable `[K, ...]`, batched matmuls), or one member's program vectorized by TensorFlow's
`tf.vectorized_map` (pfor, as rejax vmaps with JAX). `vectorized_map` cannot convert reads and
writes of per-member variables, so its side is written as a pure function of each member's
weights (a functional MLP). Both sides compute the same minibatch gradient steps of a policy-
or value-sized MLP (two hidden layers) for K members, from the same weights. Calls alternate,
side by side, and the medians and their ratio are printed.

    bazel run //benchmarks:member_axis -- --members=8 --batch=64 --repeats=50
"""

import statistics
import time

import tensorflow as tf
from absl import app, flags

from agents.algorithms import members, networks

flags.DEFINE_integer('members', 8, 'K, the members stepped together.', lower_bound=1)
flags.DEFINE_integer('batch', 64, 'Minibatch rows per member.', lower_bound=1)
flags.DEFINE_integer('observ_size', 3, 'Inputs of the MLP.', lower_bound=1)
flags.DEFINE_integer('hidden', 64, 'Units of each of the two hidden layers.', lower_bound=1)
flags.DEFINE_integer('steps', 32, 'Gradient steps per timed call (one in-graph loop).',
                     lower_bound=1)
flags.DEFINE_integer('repeats', 30, 'Timed calls of each side, alternated.', lower_bound=1)
flags.DEFINE_bool('jit_compile', True, 'Compile both sides with XLA.')
FLAGS = flags.FLAGS

LEARNING_RATE = 1e-3


def member_axis_step(observ):
    """The member axis: an MLP of K members (networks.MLP and Linear) stepped by plain
    gradient descent. Returns (the compiled call of `steps` steps, the weights)."""
    seeds = list(range(FLAGS.members))
    torso = networks.MLP(FLAGS.observ_size, (FLAGS.hidden, FLAGS.hidden), seed=seeds)
    head = networks.Linear(FLAGS.hidden, 1, seed=seeds)
    # Kernel and bias of each layer, in order.
    weights = [variable for layer in (*torso.layers, head)
               for variable in (layer.kernel, layer.bias)]

    def body(step):
        with tf.GradientTape() as tape:
            losses = members.mean(tf.square(head(torso(observ))))
        for variable, gradient in zip(weights, tape.gradient(losses, weights), strict=True):
            variable.assign_sub(LEARNING_RATE * gradient)
        return (step + 1,)

    return _steps(body), weights


def vectorized_step(observ, initial_weights):
    """One member's MLP as a pure function of its weights, vectorized over the members by
    `tf.vectorized_map`; the weights ([K, ...] variables from `initial_weights`, kernels and
    biases in order) are read and written outside it. Returns (the call, the weights)."""
    weights = [tf.Variable(tf.convert_to_tensor(initial)) for initial in initial_weights]

    def member_gradient(arguments):
        member_observ, *member_weights = arguments
        with tf.GradientTape() as tape:
            tape.watch(member_weights)
            hidden = member_observ
            for index in range(0, len(member_weights) - 2, 2):
                hidden = tf.tanh(tf.matmul(hidden, member_weights[index]) +
                                 member_weights[index + 1])
            output = tf.matmul(hidden, member_weights[-2]) + member_weights[-1]
            loss = tf.reduce_mean(tf.square(output))
        return tape.gradient(loss, member_weights)

    def body(step):
        gradients = tf.vectorized_map(
            member_gradient, [observ, *[variable.read_value() for variable in weights]])
        for variable, gradient in zip(weights, gradients, strict=True):
            variable.assign_sub(LEARNING_RATE * gradient)
        return (step + 1,)

    return _steps(body), weights


def _steps(body):
    """The compiled call of `steps` iterations of `body` in one in-graph loop."""
    @tf.function(jit_compile=FLAGS.jit_compile, autograph=False)
    def call():
        return tf.while_loop(lambda step: step < FLAGS.steps, body, (0,))[0]

    return call


def build():
    """Both sides from the same weights and minibatch: {name: (call, weights)}."""
    observ = tf.random.stateless_normal(
        [FLAGS.members, FLAGS.batch, FLAGS.observ_size], seed=[0, 0])
    axis = member_axis_step(observ)
    return {'member_axis': axis,
            'vectorized_map': vectorized_step(observ, [weight.read_value()
                                                       for weight in axis[1]])}


def main(argv):
    del argv
    sides = {name: call for name, (call, _) in build().items()}
    for call in sides.values():
        call()  # Tracing and compiling.
    times = {name: [] for name in sides}
    for _ in range(FLAGS.repeats):
        for name, call in sides.items():
            start = time.perf_counter()
            call().numpy()
            times[name].append((time.perf_counter() - start) / FLAGS.steps)
    for name, values in times.items():
        print(f'{name}: median {statistics.median(values) * 1e6:.0f} us per step of '
              f'{FLAGS.members} members (min {min(values) * 1e6:.0f}, max '
              f'{max(values) * 1e6:.0f})')
    ratios = [vectorized / axis for vectorized, axis in
              zip(times['vectorized_map'], times['member_axis'], strict=True)]
    print(f'vectorized_map / member_axis: median {statistics.median(ratios):.2f} '
          f'[{min(ratios):.2f}, {max(ratios):.2f}] over {len(ratios)} alternated pairs')


if __name__ == '__main__':
    app.run(main)
