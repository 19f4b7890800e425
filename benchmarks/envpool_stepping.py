r"""Environment steps per second of our EnvPool backend against raw EnvPool (issue 41).

Every runner steps EnvPool's environments of one task, in sync mode (batch_size = num_envs),
with the same pre-sampled random actions (uniform in the action space; what the environments
receive is the same on every runner), from its own pool seeded alike:

  raw               `envpool.make(id, env_type='gymnasium', num_envs=N)` stepped from a Python
                    loop (EnvPool's own autoreset: the step after an episode's end resets);
  step              the training environments of a run on the EnvPool backend without
                    wrappers (`environments.make_envpool_env(id, N, wrappers=())`: the
                    EnvPoolBatchEnv in the run's failure recorder) stepped from a Python loop
                    that resets ended environments as the simulator does
                    (`reset(options={'reset_mask': done})`);
  step_wrapped      the same with the default wrappers of a run (`range_normalize`,
                    `ClipAction`: on a VectorEnv, agents/tools/wrappers.py's batched ones),
                    the actions rescaled to [-1, 1];
  in_graph          the run's path: those environments in an `InGraphBatchEnv` driven by one
                    compiled `simulate.Simulator.rollout` of all the steps, whose policy reads
                    the step's actions from a constant (`replay_actions`; a rollout of the
                    same length compiles it first, untimed);
  in_graph_wrapped  the same with the default wrappers.

Each runner is built once; then `--repeats` rounds time each runner in turn (raw, step, ...,
raw, step, ...), after `--warmup_steps` untimed steps of each. Printed per task: the median
env steps per second (batch steps x envs) with min and max, CPU microseconds per env step (this
process: EnvPool steps in its threads), and each runner's ratio to raw, median with its spread
over the rounds (each round's runner against that round's raw).

Example (Pendulum-v1 x 16 and HalfCheetah-v5 x 8, about 3 minutes on 2 cores):

    PYTHONPATH=. .venv/bin/python -m benchmarks.envpool_stepping
"""

import dataclasses
import json
import os
import statistics
import time

import numpy as np
from absl import app, flags

from benchmarks import progress_speed

flags.DEFINE_list('tasks', ['Pendulum-v1:16', 'HalfCheetah-v5:8'],
                  'EnvPool task ids with their numbers of envs, id:N.')
flags.DEFINE_list('runners', None, 'Runners to time (default: all; raw always runs).')
flags.DEFINE_integer('steps', 20000, 'Batch steps per timed run.')
flags.DEFINE_integer('warmup_steps', 200, 'Untimed batch steps before each timed run.')
flags.DEFINE_integer('repeats', 5, 'Rounds of timed runs (medians are reported).')
flags.DEFINE_integer('seed', 0, 'Seed of the pools and of the actions.')
flags.DEFINE_string('output_json', None, 'Writes every timing and the summary to this file.')
FLAGS = flags.FLAGS

RUNNERS = ('raw', 'step', 'step_wrapped', 'in_graph', 'in_graph_wrapped')


@dataclasses.dataclass
class Timing:
    wall: float
    cpu: float


def random_actions(space, num_steps, num_envs, seed):
    """[num_steps, num_envs, ...] actions uniform in the Box or Discrete `space`."""
    rng = np.random.default_rng(seed)
    if hasattr(space, 'n'):
        return rng.integers(0, space.n, (num_steps, num_envs)).astype(space.dtype)
    return rng.uniform(space.low, space.high, (num_steps, num_envs, *space.shape)).astype(
        space.dtype)


def to_unit_range(actions, space):
    """`actions` of the Box `space` rescaled to [-1, 1], as range_normalize's agent gives them."""
    return (2.0 * (actions - space.low) / (space.high - space.low) - 1.0).astype(np.float32)


def _stopwatch(function):
    wall, cpu = time.perf_counter(), time.process_time()
    function()
    return Timing(time.perf_counter() - wall, time.process_time() - cpu)


class RawRunner:
    """EnvPool itself, stepped from Python."""

    def __init__(self, env_id, num_envs, actions, seed):
        from agents.tools import envpool_env  # noqa: PLC0415

        self.env = envpool_env.import_envpool().make(
            env_id, env_type='gymnasium', num_envs=num_envs, batch_size=num_envs, seed=seed)
        self.env.reset()
        self.actions = actions.astype(self.env.action_space.dtype)

    def run(self, actions):
        step = self.env.step
        for action in actions:
            step(action)

    def close(self):
        self.env.close()


class StepRunner:
    """Our run's training environments (`make_envpool_env`), stepped and reset from Python."""

    def __init__(self, env_id, num_envs, actions, seed, wrapped):
        from agents.runs import environments  # noqa: PLC0415

        wrappers = environments.DEFAULT_WRAPPERS if wrapped else ()
        self.env = environments.make_envpool_env(env_id, num_envs, wrappers=wrappers, seed=seed)
        self.env.reset(seed=seed)
        self.actions = _actions_for(self.env, actions, wrapped)

    def run(self, actions):
        env = self.env
        for action in actions:
            _, _, terminated, truncated, _ = env.step(action)
            # count_nonzero: the fastest question "did any end?" of a small array (a third of
            # the time of any(), whose cost shows beside Pendulum's cheap steps).
            if np.count_nonzero(terminated) or np.count_nonzero(truncated):
                done = terminated | truncated
                env.reset(options=None if done.all() else {'reset_mask': done})

    def close(self):
        self.env.close()


class InGraphRunner:
    """Our run's path: the environments in an InGraphBatchEnv, a compiled Simulator rollout."""

    def __init__(self, env_id, num_envs, actions, seed, wrapped):
        from agents.runs import environments  # noqa: PLC0415
        from agents.tools import in_graph_batch_env, simulate  # noqa: PLC0415

        wrappers = environments.DEFAULT_WRAPPERS if wrapped else ()
        vector_env = environments.make_envpool_env(env_id, num_envs, wrappers=wrappers,
                                                   seed=seed)
        self.env = in_graph_batch_env.InGraphBatchEnv(vector_env, seed=seed)
        self.actions = _actions_for(vector_env, actions, wrapped)
        self.policy = replay_actions(self.actions)
        self.simulator = simulate.Simulator(self.env, self.policy)

    def run(self, actions):
        """A rollout of len(actions) steps replaying this runner's actions from the first (the
        first rows of `actions`, in the timed runs; a rollout of a new length compiles)."""
        self.policy.replay()
        self.simulator.rollout(len(actions)).reward.numpy()

    def close(self):
        self.env.close()


def replay_actions(actions):
    """A `simulate.Algorithm` whose action at each step is the next row of `actions` (a step
    counter and one gather: the cost of the cheapest policy); `replay()` starts again at the
    first row."""
    import tensorflow as tf  # noqa: PLC0415

    from agents.tools import simulate  # noqa: PLC0415

    class ReplayActions(simulate.Algorithm):
        def __init__(self):
            self._actions = tf.constant(actions)
            self._index = tf.Variable(0, trainable=False)

        def replay(self):
            self._index.assign(0)

        def perform(self, agent_indices, observ):
            del agent_indices, observ
            index = self._index.assign_add(1) - 1
            return tf.gather(self._actions, index % tf.shape(self._actions)[0]), ()

    return ReplayActions()


def _actions_for(env, actions, wrapped):
    """`actions` (raw EnvPool's) as the agent of env (ours, maybe wrapped) gives them."""
    space = env.unwrapped.single_action_space
    if wrapped and hasattr(space, 'low'):
        return to_unit_range(actions, space)
    return actions.astype(space.dtype)


def make_runner(name, env_id, num_envs, actions, seed):
    if name == 'raw':
        return RawRunner(env_id, num_envs, actions, seed)
    wrapped = name.endswith('_wrapped')
    if name.startswith('step'):
        return StepRunner(env_id, num_envs, actions, seed, wrapped)
    return InGraphRunner(env_id, num_envs, actions, seed, wrapped)


def time_task(env_id, num_envs, runner_names, steps, warmup_steps, repeats, seed):
    """{runner: [Timing per round]} of `env_id` x `num_envs`, the runners alternated."""
    from agents.tools import envpool_env  # noqa: PLC0415

    space = envpool_env.import_envpool().make_spec(env_id).gymnasium_action_space
    actions = random_actions(space, steps + warmup_steps, num_envs, seed)
    runners = {name: make_runner(name, env_id, num_envs, actions, seed) for name in runner_names}
    timings = {name: [] for name in runner_names}
    try:
        for runner in runners.values():  # Compiles the in-graph rollouts.
            runner.run(runner.actions[:steps])
        for _ in range(repeats):
            for name, runner in runners.items():
                runner.run(runner.actions[steps:])  # Warm-up.
                timings[name].append(_stopwatch(lambda runner=runner: runner.run(
                    runner.actions[:steps])))
    finally:
        for runner in runners.values():
            runner.close()
    return timings


def summarize(timings, steps, num_envs):
    """Per runner: median, min and max env steps/s, median CPU microseconds per env step, and
    the ratios to raw of each round (runner / raw), with their median."""
    summary = {}
    env_steps = steps * num_envs
    for name, runs in timings.items():
        speeds = [env_steps / timing.wall for timing in runs]
        ratios = [env_steps / timing.wall / (env_steps / raw.wall)
                  for timing, raw in zip(runs, timings['raw'], strict=True)]
        summary[name] = {
            'steps_per_sec': statistics.median(speeds), 'min': min(speeds), 'max': max(speeds),
            'cpu_us_per_step': statistics.median(t.cpu for t in runs) / env_steps * 1e6,
            'ratio': statistics.median(ratios), 'ratios': ratios}
    return summary


def format_table(env_id, num_envs, summary):
    lines = [f'{env_id} x {num_envs}:',
             '  runner            env steps/s (min to max)   CPU us/step  / raw (min to max)']
    for name, row in summary.items():
        lines.append(f'  {name:<16}  {row["steps_per_sec"]:>11,.0f} ({row["min"]:,.0f} to '
                     f'{row["max"]:,.0f})  {row["cpu_us_per_step"]:>9.1f}  '
                     f'{progress_speed.spread(row["ratios"])}')
    return '\n'.join(lines)


def parse_tasks(entries):
    """[(env id, num envs)] of the --tasks entries 'id:N'."""
    tasks = []
    for entry in entries:
        env_id, _, num = entry.rpartition(':')
        if not env_id or not num.isdigit() or int(num) < 1:
            raise app.UsageError(f"--tasks: expected 'id:N' with N >= 1, got {entry!r}")
        tasks.append((env_id, int(num)))
    return tasks


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f'Unexpected arguments: {" ".join(argv[1:])}')
    tasks = parse_tasks(FLAGS.tasks)
    names = list(FLAGS.runners or RUNNERS)
    unknown = [name for name in names if name not in RUNNERS]
    if unknown:
        raise app.UsageError(f'Unknown runners {unknown}; known: {", ".join(RUNNERS)}')
    names = ['raw'] + [name for name in names if name != 'raw']
    if FLAGS.steps < 1 or FLAGS.repeats < 1 or FLAGS.warmup_steps < 1:
        raise app.UsageError('--steps, --warmup_steps and --repeats must be positive')
    if any(name.startswith('in_graph') for name in names):
        import tensorflow as tf  # noqa: PLC0415 - only for the in-graph runners.

        tf.config.threading.set_inter_op_parallelism_threads(1)  # As training runs.
    results = {}
    for env_id, num_envs in tasks:
        load = os.getloadavg()[0]
        timings = time_task(env_id, num_envs, names, FLAGS.steps, FLAGS.warmup_steps,
                            FLAGS.repeats, FLAGS.seed)
        summary = summarize(timings, FLAGS.steps, num_envs)
        print(format_table(env_id, num_envs, summary))
        print(f'  ({progress_speed.now()}; load average (1 min) {load:.1f} before, '
              f'{os.getloadavg()[0]:.1f} after, on {os.cpu_count()} CPUs)', flush=True)
        results[f'{env_id}:{num_envs}'] = {
            'summary': summary,
            'timings': {name: [dataclasses.asdict(t) for t in runs]
                        for name, runs in timings.items()}}
    if FLAGS.output_json:
        with open(FLAGS.output_json, 'w', encoding='utf-8') as f:
            json.dump(results, f, indent=1)


if __name__ == '__main__':
    app.run(main)
