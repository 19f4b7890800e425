"""Env steps per second of random-policy rollouts: native TF envs against Gymnasium's numpy envs.

For each number of envs, every runner steps the task with uniformly random actions, resetting
finished episodes, and reports env steps per second (batch steps x envs), the median of
`--repeats` timed runs, with its ratio to each baseline. Runners:

  native_simulator      `simulate.Simulator.rollout` of a `NativeBatchEnv` (what training runs),
                        a random `Algorithm`, one compiled call per `--rollout_length` steps.
  native_simulator_xla  the same rollout inside `tf.function(jit_compile=True)`.
  native_loop           a dedicated `tf.while_loop` over the pure functions of the `NativeEnv`:
                        states in loop variables, episodes restarted inside the loop.
  native_loop_xla       the same loop compiled by XLA.
  gym_sync              Gymnasium's `SyncVectorEnv` of the numpy env (NEXT_STEP autoreset).
  batch_in_process      our `BatchEnv` stepping the numpy envs in this process.

Compilation happens in an untimed first call. TensorFlow runs with one inter-op thread, as the
trainer configures it. Check `uptime` around a run: other load shows in every row.

Example:

    python -m benchmarks.native_rollout --envs=16,256,4096 --env_id=Pendulum-v1
"""

import functools
import statistics
import time

import gymnasium as gym
import tensorflow as tf
from absl import app, flags

from agents import envs
from agents.envs import native_env as native_env_lib
from agents.tools import batch_env, simulate

flags.DEFINE_list('envs', ['16', '256', '4096'], 'Numbers of envs in the batch.')
flags.DEFINE_string('env_id', 'Pendulum-v1', f'Gymnasium id, one of {sorted(envs.ENVS)}.')
flags.DEFINE_list('runners', None, 'Names of the runners to time (default: all).')
flags.DEFINE_list('baselines', ['gym_sync'], 'Runners the ratios refer to.')
flags.DEFINE_float('min_seconds', 1.0, 'Length of each timed run, about.')
flags.DEFINE_integer('rollout_length', 256, 'Steps per compiled call of the native rows.')
flags.DEFINE_string('dtype', 'float64', 'float64 or float32: the native physics dtype.')
flags.DEFINE_integer('repeats', 3, 'Timed runs per setting; the median is reported.')
FLAGS = flags.FLAGS


class RandomAlgorithm(simulate.Algorithm):
    """Uniformly random actions from a seeded counter-based generator."""

    def __init__(self, action_space, seed=0):
        self._space = action_space
        self._generator = tf.random.Generator.from_seed(seed, alg='philox')

    def perform(self, agent_indices, observ):
        del observ
        return random_actions(self._space, tf.size(agent_indices), self._generator.uniform), ()


def random_actions(space, num_envs, uniform):
    """[num_envs, ...] uniform actions of `space`; `uniform(shape, minval, maxval, dtype)`."""
    if isinstance(space, gym.spaces.Discrete):
        return uniform([num_envs], space.start, space.start + space.n, tf.int64)
    shape = tf.concat([[num_envs], space.shape], 0)
    return uniform(shape, space.low, space.high, tf.float32)


def native_simulator(env_id, num_envs, jit_compile):
    """Simulator rollouts of a NativeBatchEnv; compiles on the first call."""
    env = envs.make(env_id, num_envs, seed=0, dtype=FLAGS.dtype)
    simulator = simulate.Simulator(env, RandomAlgorithm(env.action_space))
    length = FLAGS.rollout_length

    # The rollout stays in TF as in training; every field is used (summed), so that none is
    # pruned away, and only the sum leaves the call.
    @tf.function(jit_compile=jit_compile, autograph=False)
    def rollout():
        return tf.add_n([tf.reduce_sum(tf.cast(field, tf.float32))
                         for field in tf.nest.flatten(simulator.rollout(length))])

    def run(batch_steps):
        calls = max(1, -(-batch_steps // length))
        start = time.perf_counter()
        for _ in range(calls):
            total = rollout()
        total.numpy()
        return time.perf_counter() - start, calls * length

    return run


def make_native_loop(native, num_envs, jit_compile):
    """A compiled function running `num_steps` random steps of `num_envs` envs of `native`
    from start states, restarting finished episodes in the loop; returns the sum of rewards."""
    space = native.action_space
    seed_algorithm = native_env_lib.RNG_ALGORITHM

    def restart(done, state, elapsed, seed):
        starts = native.sample_initial_state(num_envs, seed)
        return (tf.where(done[:, None], starts, state),
                tf.where(done, tf.zeros_like(elapsed), elapsed))

    @tf.function(jit_compile=jit_compile, autograph=False)
    def run(seed, num_steps):
        def body(step, state, elapsed, total):
            step_seed = tf.stack([seed, tf.cast(step, tf.int64)])
            uniform = functools.partial(_stateless_uniform, seed=step_seed, alg=seed_algorithm)
            state, reward, terminated = native.dynamics(
                state, random_actions(space, num_envs, uniform))
            elapsed = elapsed + 1
            done = terminated | (elapsed >= native.max_episode_steps)
            state, elapsed = tf.cond(
                tf.reduce_any(done),
                lambda: restart(done, state, elapsed, step_seed + [1, 0]),
                lambda: (state, elapsed))
            # The observation an agent would get; summed so that it is computed.
            observ = native.observe(state)
            total += tf.reduce_sum(tf.cast(reward, tf.float32)) + tf.reduce_sum(observ[:, 0])
            return step + 1, state, elapsed, total

        state = native.sample_initial_state(num_envs, tf.stack([seed, -1]))
        _, _, _, total = tf.while_loop(
            lambda step, *_: step < num_steps, body,
            (tf.constant(0), state, tf.zeros([num_envs], tf.int32), tf.constant(0.0)))
        return total

    return run


def _stateless_uniform(shape, minval, maxval, dtype, seed, alg):
    return tf.random.stateless_uniform(shape, seed, minval, maxval, dtype=dtype, alg=alg)


def native_loop(env_id, num_envs, jit_compile):
    """The dedicated compiled loop; compiles on the first call."""
    loop = make_native_loop(envs.get_env(env_id, FLAGS.dtype), num_envs, jit_compile)
    seeds = iter(range(1 << 62))

    def run(batch_steps):
        seed = tf.constant(next(seeds), tf.int64)
        start = time.perf_counter()
        loop(seed, tf.constant(batch_steps)).numpy()
        return time.perf_counter() - start, batch_steps

    return run


def vector_env(make_vector_env, env_id, num_envs):
    """A VectorEnv of the numpy env stepped from Python with pre-sampled random actions."""
    env = make_vector_env([functools.partial(gym.make, env_id)] * num_envs)
    env.action_space.seed(0)
    actions = [env.action_space.sample() for _ in range(64)]
    env.reset(seed=0)

    def run(batch_steps):
        start = time.perf_counter()
        for step in range(batch_steps):
            env.step(actions[step % len(actions)])
        return time.perf_counter() - start, batch_steps

    run.close = env.close
    return run


# name -> setup(env_id, num_envs) -> run(batch_steps) -> (seconds, batch steps taken).
RUNNERS = {
    'native_simulator': functools.partial(native_simulator, jit_compile=False),
    'native_simulator_xla': functools.partial(native_simulator, jit_compile=True),
    'native_loop': functools.partial(native_loop, jit_compile=False),
    'native_loop_xla': functools.partial(native_loop, jit_compile=True),
    'gym_sync': functools.partial(vector_env, gym.vector.SyncVectorEnv),
    'batch_in_process': functools.partial(
        vector_env, functools.partial(batch_env.BatchEnv, mode='in_process')),
}


def measure(run, min_seconds, repeats):
    """Env-batch steps/s of `repeats` runs of at least about `min_seconds` each.

    A first untimed run compiles and warms up; then the batch steps per run grow until a run
    lasts long enough.
    """
    run(1)
    batch_steps, seconds = 1, 0.0
    while seconds < min_seconds / 4:
        batch_steps *= 4
        seconds, batch_steps = run(batch_steps)
    batch_steps = max(1, int(batch_steps * min_seconds / seconds))
    rates = []
    for _ in range(repeats):
        seconds, taken = run(batch_steps)
        rates.append(taken / seconds)
    return rates


def format_table(header, rows):
    """Right-aligned columns."""
    widths = [max(len(str(cell)) for cell in column) for column in zip(header, *rows, strict=True)]
    lines = [header, ['-' * width for width in widths], *rows]
    return '\n'.join('  '.join(str(cell).rjust(width) for cell, width in zip(
        line, widths, strict=True)) for line in lines)


def main(argv):
    del argv
    names = FLAGS.runners or list(RUNNERS)
    unknown = sorted(set(names) - set(RUNNERS))
    if unknown:
        raise app.UsageError(f'unknown runners {unknown}; choose among {list(RUNNERS)}')
    if FLAGS.env_id not in envs.ENVS:
        raise app.UsageError(
            f'no native env for --env_id={FLAGS.env_id!r}; choose among {sorted(envs.ENVS)}')
    try:
        sizes = [int(size) for size in FLAGS.envs]
    except ValueError:
        raise app.UsageError(f'--envs must be integers, got {FLAGS.envs}') from None
    if any(size < 1 for size in sizes):
        raise app.UsageError(f'--envs must be positive, got {sizes}')
    tf.config.threading.set_inter_op_parallelism_threads(1)
    tf.get_logger().setLevel('ERROR')
    results = {}  # num_envs -> {runner: median env steps/s}
    for num_envs in sizes:
        results[num_envs] = {}
        for name in names:
            run = RUNNERS[name](FLAGS.env_id, num_envs)
            try:
                rates = measure(run, FLAGS.min_seconds, FLAGS.repeats)
            finally:
                getattr(run, 'close', lambda: None)()
            results[num_envs][name] = statistics.median(rates) * num_envs
        print(f'{FLAGS.env_id} x{num_envs}: ' + ', '.join(
            f'{name} {rate:,.0f}' for name, rate in results[num_envs].items()), flush=True)
    baselines = [name for name in FLAGS.baselines if name in names]
    rows = [[FLAGS.env_id, num_envs, name, f'{rate:,.0f}',
             *(f'{rate / rates[base]:.1f}x' for base in baselines)]
            for num_envs, rates in results.items() for name, rate in rates.items()]
    print(f'\nRandom-policy env steps per second ({FLAGS.dtype} native physics), medians of '
          f'{FLAGS.repeats} runs:\n')
    print(format_table(['env', 'envs', 'runner', 'steps/s', *(f'vs {b}' for b in baselines)],
                       rows))


if __name__ == '__main__':
    app.run(main)
