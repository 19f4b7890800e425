"""Environment steps per second of BatchEnv's modes against Gymnasium's vector envs.

Every vector env runner steps the same envs with the same pre-sampled random actions (NEXT_STEP
autoreset, so episode ends are included) and reports env steps per second (batch steps x envs)
and the CPU time per env step of all processes involved; each setting is timed `--repeats` times
and the medians are shown, with each runner's speed relative to the baselines. Add a runner by
appending a `Runner` to RUNNERS. Parallel modes need idle cores: on a busy machine their rows
(not the CPU per step) mostly show the load; check `uptime` before and after a run.

The `in_graph_*` runners run the compiled rollout of `simulate.Simulator` with a trivial
(constant) policy on a BatchEnv in AutoresetMode.DISABLED, and the `raw_loop_*` runners step the
same BatchEnv with the same action from a Python loop that resets finished envs the same way:
their ratio is what simulating inside the TensorFlow graph keeps of the raw speed. These rows
import TensorFlow, with one inter-op thread as training uses it, and run `--simulation_steps`.

Example:

    python -m benchmarks.env_throughput --envs=1,8,32 --env_ids=Pendulum-v1,HalfCheetah-v5
"""

import contextlib
import dataclasses
import functools
import statistics
import time
from collections.abc import Callable

import gymnasium as gym
import numpy as np
import psutil
from absl import app, flags

from agents.tools import batch_env

flags.DEFINE_integer('steps', 20000, 'Env steps per timed run (split across the envs).')
flags.DEFINE_integer(
    'simulation_steps', 100000,
    'Env steps per timed run of the raw_loop_* and in_graph_* runners: their ratio needs runs of '
    'a second or more, since this VM\'s speed drifts by tens of percent within seconds.')
flags.DEFINE_list('envs', ['1', '8', '32'], 'Numbers of envs in the batch.')
flags.DEFINE_list('env_ids', ['Pendulum-v1', 'HalfCheetah-v5'], 'Gymnasium env ids.')
flags.DEFINE_list('runners', None, 'Names of the runners to time (default: all).')
flags.DEFINE_list('baselines', ['gym_sync', 'gym_async'], 'Runners the ratios refer to.')
flags.DEFINE_integer('repeats', 3, 'Timed runs per setting; the median is reported.')
flags.DEFINE_integer('warmup_steps', 50, 'Untimed batch steps before each timed run.')
FLAGS = flags.FLAGS


@dataclasses.dataclass
class Timing:
    """Wall-clock seconds, and CPU seconds of this process and its descendants (on a loaded
    machine, CPU per step shows efficiency better than wall time)."""

    wall: float = 0.0
    cpu: float = 0.0


@dataclasses.dataclass(frozen=True)
class Runner:
    """A named way to step envs: `run(env_id, actions)` returns the Timing of stepping through
    `actions` ([batch steps, num envs, *action shape]), excluding set-up and warm-up (which may
    reuse the first actions); `stopwatch` measures it. Batches of fewer than `min_envs` envs
    are skipped."""

    name: str
    run: Callable[[str, np.ndarray], Timing]
    min_envs: int = 1
    simulation: bool = False  # Imports TensorFlow; runs --simulation_steps.


def _cpu_seconds():
    """CPU time of this process and its live descendants."""
    seconds = time.process_time()
    for child in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.NoSuchProcess):  # It just ended.
            times = child.cpu_times()
            seconds += times.user + times.system
    return seconds


@contextlib.contextmanager
def stopwatch():
    """Yields a Timing that holds the block's wall and CPU time once the block ends."""
    timing = Timing()
    wall, cpu = time.perf_counter(), _cpu_seconds()
    yield timing
    timing.wall = time.perf_counter() - wall
    timing.cpu = _cpu_seconds() - cpu


def time_vector_env(make_vector_env, env_id, actions):
    """Timing of a VectorEnv from `make_vector_env(env_fns)` stepping through `actions`."""
    env_fns = [functools.partial(gym.make, env_id)] * actions.shape[1]
    env = make_vector_env(env_fns)
    try:
        env.reset(seed=0)
        for action in actions[:FLAGS.warmup_steps]:
            env.step(action)
        with stopwatch() as timing:
            for action in actions:
                env.step(action)
        return timing
    finally:
        env.close()


def vector_env_runner(name, make_vector_env, min_envs=1):
    return Runner(name, functools.partial(time_vector_env, make_vector_env), min_envs)


def _simulation_modules():
    """simulate, its testing seams and in_graph_batch_env, imported only when a runner needs
    TensorFlow."""
    from agents.tools import (  # noqa: PLC0415 - TF is slow to load.
        in_graph_batch_env,
        simulate,
        simulate_testing,
    )
    return simulate, simulate_testing, in_graph_batch_env


def time_on_training_batch_env(time_fn, mode, env_id, actions):
    """`time_fn(env, len(actions))` of a BatchEnv of `mode` as the in-graph simulation uses it:
    explicit resets (AutoresetMode.DISABLED), no infos."""
    num_steps, num_envs = actions.shape[:2]
    env = batch_env.BatchEnv(
        [functools.partial(gym.make, env_id)] * num_envs, mode=mode,
        autoreset_mode=gym.vector.AutoresetMode.DISABLED, collect_infos=False)
    try:
        return time_fn(env, num_steps)
    finally:
        env.close()


def raw_loop(vector_env, action, num_steps):
    """Steps `vector_env` (AutoresetMode.DISABLED) `num_steps` times with `action` in every env
    and resets finished envs like the simulator does."""
    actions = np.broadcast_to(action, (vector_env.num_envs, *action.shape)).copy()
    for _ in range(num_steps):
        _, _, terminated, truncated, _ = vector_env.step(actions)
        done = terminated | truncated
        if done.all():
            vector_env.reset()
        elif done.any():
            vector_env.reset(options={'reset_mask': done})


def time_raw_loop(vector_env, num_steps):
    """Timing of `raw_loop` with a neutral action for `num_steps` steps after --warmup_steps
    untimed ones: the reference of the in-graph rows."""
    _, simulate_testing, _ = _simulation_modules()
    action = simulate_testing.neutral_action(vector_env.single_action_space)
    vector_env.reset(seed=0)
    raw_loop(vector_env, action, FLAGS.warmup_steps)
    with stopwatch() as timing:
        raw_loop(vector_env, action, num_steps)
    return timing


def time_in_graph_rollout(vector_env, num_steps):
    """Timing of one compiled `Simulator.rollout` of `vector_env` (AutoresetMode.DISABLED) for
    `num_steps` steps with a constant, neutral policy.

    A first rollout of the same length compiles the graph and is not timed.
    """
    simulate, simulate_testing, in_graph_batch_env = _simulation_modules()
    graph_env = in_graph_batch_env.InGraphBatchEnv(vector_env, seed=0)
    simulator = simulate.Simulator(graph_env, simulate_testing.ConstantAlgorithm(
        simulate_testing.neutral_action(graph_env.action_space)))
    simulator.rollout(num_steps)
    with stopwatch() as timing:
        simulator.rollout(num_steps)
    return timing


def simulation_runners(mode, min_envs=1):
    return [
        Runner(name, functools.partial(time_on_training_batch_env, time_fn, mode), min_envs,
               simulation=True)
        for name, time_fn in ((f'raw_loop_{mode}', time_raw_loop),
                              (f'in_graph_{mode}', time_in_graph_rollout))]


RUNNERS = [
    vector_env_runner('gym_sync', gym.vector.SyncVectorEnv),
    vector_env_runner(
        'gym_async', functools.partial(gym.vector.AsyncVectorEnv, shared_memory=True)),
    vector_env_runner(
        'batch_in_process', functools.partial(batch_env.BatchEnv, mode='in_process')),
    vector_env_runner(
        'batch_external', functools.partial(batch_env.BatchEnv, mode='external')),
    vector_env_runner('batch_external_no_infos', functools.partial(
        batch_env.BatchEnv, mode='external', collect_infos=False)),
    vector_env_runner(
        'batch_hybrid', functools.partial(batch_env.BatchEnv, mode='hybrid'), min_envs=2),
    vector_env_runner('batch_hybrid_no_infos', functools.partial(
        batch_env.BatchEnv, mode='hybrid', collect_infos=False), min_envs=2),
    *simulation_runners('in_process'),
    *simulation_runners('external'),
    *simulation_runners('hybrid', min_envs=2),
]


def sample_actions(env_id, num_envs, num_steps, seed=0):
    """[num_steps, num_envs, *action shape] random actions of the env's action space."""
    env = gym.make(env_id)
    space = gym.vector.utils.batch_space(env.action_space, num_envs)
    env.close()
    space.seed(seed)
    return np.stack([space.sample() for _ in range(num_steps)])


def format_table(header, rows):
    """Right-aligned columns."""
    widths = [max(len(str(cell)) for cell in column) for column in zip(header, *rows, strict=True)]
    lines = [header, ['-' * width for width in widths], *rows]
    return '\n'.join('  '.join(str(cell).rjust(width) for cell, width in zip(
        line, widths, strict=True)) for line in lines)


def main(argv):
    del argv
    runners = [runner for runner in RUNNERS
               if FLAGS.runners is None or runner.name in FLAGS.runners]
    unknown = set(FLAGS.runners or ()) - {runner.name for runner in RUNNERS}
    if unknown:
        raise app.UsageError(f'unknown runners {sorted(unknown)}; choose among '
                             f'{[runner.name for runner in RUNNERS]}')
    if any(runner.simulation for runner in runners):
        import tensorflow as tf  # noqa: PLC0415 - only the in-graph rows need TensorFlow.

        # Envs step on TF's inter-op threads; one thread saves handing ops between threads.
        tf.config.threading.set_inter_op_parallelism_threads(1)
        tf.get_logger().setLevel('ERROR')  # Each runner traces its own Simulator.rollout.
    results = {}  # (env_id, num_envs) -> {runner name: (median steps/s, median CPU us/step)}
    for env_id in FLAGS.env_ids:
        for num_envs in map(int, FLAGS.envs):
            actions = sample_actions(env_id, num_envs, max(1, FLAGS.steps // num_envs))
            # The simulation runners step a constant action: only the length counts.
            simulation_actions = np.broadcast_to(
                actions[:1], (max(1, FLAGS.simulation_steps // num_envs), *actions.shape[1:]))
            fitting = [runner for runner in runners if num_envs >= runner.min_envs]
            timings = {runner.name: [] for runner in fitting}
            for _ in range(FLAGS.repeats):  # Interleaved, so load drifts hit all runners.
                for runner in fitting:
                    steps = simulation_actions if runner.simulation else actions
                    timings[runner.name].append(
                        (steps.shape[0] * num_envs, runner.run(env_id, steps)))
            results[env_id, num_envs] = {
                name: (statistics.median(steps / timing.wall for steps, timing in runs),
                       statistics.median(timing.cpu / steps * 1e6 for steps, timing in runs))
                for name, runs in timings.items()}
            print(f'{env_id} x{num_envs}: ' + ', '.join(
                f'{name} {rate:,.0f}' for name, (rate, _) in results[env_id, num_envs].items()),
                flush=True)

    names = [runner.name for runner in runners]
    baselines = [name for name in FLAGS.baselines if name in names]
    rows = [[env_id, num_envs, name, f'{rate:,.0f}', f'{cpu:.1f}',
             *(f'{rate / rates[base][0]:.2f}x' for base in baselines)]
            for (env_id, num_envs), rates in results.items()
            for name, (rate, cpu) in rates.items()]
    print(f'\nEnv steps per second and CPU microseconds per env step, medians of '
          f'{FLAGS.repeats} runs:\n')
    print(format_table(['env', 'envs', 'runner', 'steps/s', 'CPU us/step',
                        *(f'vs {base}' for base in baselines)], rows))
    simulation_rows = [
        [env_id, num_envs, mode, f'{rates[f"in_graph_{mode}"][0]:,.0f}',
         f'{rates[f"raw_loop_{mode}"][0]:,.0f}',
         f'{rates[f"in_graph_{mode}"][0] / rates[f"raw_loop_{mode}"][0]:.2f}']
        for (env_id, num_envs), rates in results.items() for mode in batch_env.MODES
        if f'in_graph_{mode}' in rates and f'raw_loop_{mode}' in rates]
    if simulation_rows:
        print('\nIn-graph rollout with a constant policy against the raw BatchEnv loop '
              '(DISABLED autoreset, no infos):\n')
        print(format_table(['env', 'envs', 'BatchEnv mode', 'in-graph steps/s', 'raw steps/s',
                            'in-graph/raw'], simulation_rows))


if __name__ == '__main__':
    app.run(main)
