r"""SAC's speed and learning: BatchPPO's SAC against Stable-Baselines3's SAC with the same settings.

The task (`--tasks`, one) is configs/sac_pendulum.gin (`pendulum`: rl-baselines3-zoo's
Pendulum-v1 SAC settings: one environment, learning rate 1e-3, SB3's SAC defaults otherwise,
20,480 steps, an evaluation of 10 deterministic episodes every 2,048 steps) or
configs/sac_cheetah.gin (`cheetah`: rl-zoo's HalfCheetah-v5 settings, 1M steps, 10k random steps
first; e.g. `--total_steps=300000`). The settings are read from the gin configuration
(`SAC.*` with the defaults of SAC's signature, `train.*`), so BatchPPO runs its own config and
SB3 (benchmarks/sb3_sac_runner.py, under the peers' python) the translation of it; a setting
SB3 cannot express is refused, naming it. Runs go one at a time, the systems alternating within
each seed (ours seed 0, sb3 seed 0, ours seed 1, ...), monitored as train_throughput's are.

`--num_envs=N` trains on N environments: it binds `train.num_envs = N` and
`SAC.gradient_steps = N x` the config's (one gradient step per environment step, as the config
has at one environment), so that each iteration is `train_freq` steps of N environments
followed by N gradient steps; SB3 runs the same (n_envs = N, train_freq = (1, 'step'),
gradient_steps = N). `--total_steps` overrides the config's budget.

Printed per run: training steps per second (steady: between the first and the last evaluation
by the run's own training clock, as train_throughput defines it), the final evaluation's mean
return and the first step at which an evaluation reached the task's threshold (-200 on
Pendulum). Then, per system, the steady steps/s per seed and their median, ms per environment
step, the overall steps/s (launch to exit), the steps to the threshold per seed, and the ratio
ours / SB3 of each seed's pair of runs (run one after the other); and the median over seeds of
each evaluation's mean return at the same environment steps (step | ours | sb3).

`--time_gradient_steps=K` then times K gradient steps alone on each side (replay buffer filled,
no environment, no evaluation; see `time_our_gradient_steps` and sb3_sac_runner.py), K calls
of one step and one call of K steps: the bound that the training speed meets.

Example (2 seeds x 2 systems x 20,480 steps, 3 to 6 minutes a run on 2 cores):

    PYTHONPATH=. .venv/bin/python -m benchmarks.sac_learning --seeds=2 --num_envs=1
    PYTHONPATH=. .venv/bin/python -m benchmarks.sac_learning --seeds=2 --num_envs=8 \
        --gin_bindings="train.env_backend = 'native'"   # Ours on the TF Pendulum.
    bazel run //benchmarks:sac_learning -- --seeds=1 --num_envs=8 --time_gradient_steps=500
"""

import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time

import gin
from absl import app, flags

from agents.algorithms.sac import sac
from agents.runs import run_config, run_settings
from benchmarks import peer_runner, sb3_sac_runner, train_throughput

# train_throughput's flags (--tasks, --systems, --seeds, --gin_bindings, --output_json,
# --workdir, --peers_python, --sb3_torch_threads, --sb3_vec_env, --poll_secs) serve here too,
# with this benchmark's defaults; --budget and --baseline_tree are refused (--total_steps).
flags.adopt_module_key_flags(train_throughput)
flags.DEFINE_integer('num_envs', None, 'Environments of both systems (default: the config\'s, '
                     '1); SAC.gradient_steps is scaled with it: one gradient step per '
                     'environment step, as the config has.')
flags.DEFINE_integer('total_steps', None, 'Training budget in environment steps (default: '
                     'the config\'s train.total_steps).')
flags.DEFINE_integer('time_gradient_steps', 0, 'After the runs, times this many gradient '
                     'steps alone on each side (0: none).')
FLAGS = flags.FLAGS
FLAGS.set_default('tasks', ['pendulum'])
FLAGS.set_default('seeds', 2)

SYSTEMS = ('ours', 'sb3')


@dataclasses.dataclass(frozen=True)
class Task:
    """A gin config of BatchPPO's SAC and the return its evaluations should reach."""

    gin_file: str
    threshold: float


# HalfCheetah's threshold only marks progress in the steps-to column; rl-zoo's 1M result is
# 9,535.
TASKS = {'pendulum': Task('configs/sac_pendulum.gin', -200.0),
         'cheetah': Task('configs/sac_cheetah.gin', 5000.0)}

# Settings keys read from `train.*` and from `SAC.*` (the rest).
TRAIN_KEYS = ('env_id', 'env_kwargs', 'wrappers', 'total_steps', 'num_envs', 'eval_every_steps',
              'eval_episodes')


def _read_settings():
    """The settings table of the loaded gin configuration."""
    train = train_throughput.gin_reader('train', run_settings.RunSettings)
    agent = train_throughput.gin_reader('SAC', sac.SAC.__init__)
    algorithm = train('algorithm')
    if algorithm != 'SAC':
        raise run_config.ConfigError(f'train.algorithm = @{algorithm}: not SAC')
    settings = {key: train(key) for key in TRAIN_KEYS}
    settings['wrappers'] = list(settings['wrappers'])
    for key in sb3_sac_runner.SETTINGS:
        if key not in settings:
            settings[key] = agent(key)
    for key in ('actor_hidden_sizes', 'critic_hidden_sizes'):
        settings[key] = list(settings[key])
    return settings


def sac_settings(task, num_envs=None, total_steps=None, extra_bindings=()):
    """(settings, gin files, bindings): the settings table both systems run with, read from
    the task's gin configuration plus `extra_bindings`, `total_steps` and, for `num_envs`,
    `train.num_envs = num_envs` and `SAC.gradient_steps` scaled by num_envs / the config's
    num_envs (keeping the gradient steps per environment step).

    Raises run_config.ConfigError naming a setting that SB3 cannot express.
    """
    gin_files = [run_config.find_gin_file(task.gin_file)]
    bindings = list(extra_bindings)
    if total_steps is not None:
        bindings.append(f'train.total_steps = {total_steps}')
    try:
        run_config.load(gin_files, bindings)
        settings = _read_settings()
        if num_envs is not None and num_envs != settings['num_envs']:
            scaled = settings['gradient_steps'] * num_envs
            if scaled % settings['num_envs']:
                raise run_config.ConfigError(
                    f'--num_envs={num_envs}: SAC.gradient_steps = {settings["gradient_steps"]} '
                    f'at train.num_envs = {settings["num_envs"]} does not scale to a whole '
                    'number of gradient steps')
            bindings += [f'train.num_envs = {num_envs}',
                         f'SAC.gradient_steps = {scaled // settings["num_envs"]}']
            gin.clear_config()
            run_config.load(gin_files, bindings)
            settings = _read_settings()
    finally:
        gin.clear_config()
    try:
        sb3_sac_runner.check_settings(settings)
    except peer_runner.UnsupportedSetting as error:
        # Named as the gin parameter it came from.
        prefix = 'train' if error.key in TRAIN_KEYS else 'SAC'
        raise run_config.ConfigError(f'{prefix}.{error}' if error.key else str(error)) from None
    return settings, gin_files, bindings


def our_backend(gin_files, bindings):
    """`train.env_backend` of our side's configuration (SB3 steps Gymnasium's environments)."""
    run_config.load(gin_files, bindings)
    try:
        return train_throughput.gin_reader('train', run_settings.RunSettings)('env_backend')
    finally:
        gin.clear_config()


def sb3_command(python, settings, logdir, seed, time_gradient_steps=0):
    command = train_throughput.sb3_command(python, settings, logdir, seed, 'sb3_sac_runner.py')
    if time_gradient_steps:
        command.append(f'--time_gradient_steps={time_gradient_steps}')
    return command


def time_our_gradient_steps(gin_files, bindings, count, warmup=20):
    """Seconds of our SAC's gradient steps as the train binary builds it (its gin
    configuration, its thread settings), the replay buffer filled with max(batch_size,
    learning_starts) random transitions: {'per_call': `count` calls of one step, 'one_call':
    one call of `count` steps}, each after `warmup` steps (compilation). Run in a fresh
    process: the thread settings must come before TensorFlow executes anything."""
    import gymnasium as gym
    import tensorflow as tf

    run_settings.configure_threads()
    run_config.load(gin_files, bindings)
    try:
        settings = run_settings.RunSettings()
        env = gym.make(settings.env_id, **(settings.env_kwargs or {}))
        observ_shape = env.observation_space.shape
        action_size = int(env.action_space.shape[0])
        agent = sac.SAC(observ_shape, action_size, settings.num_envs)
    finally:
        gin.clear_config()
    fill = max(agent.batch_size, agent.cadence.learning_starts) + 1
    random = tf.random.Generator.from_seed(0)
    agent.buffer.add({
        'observ': random.uniform([fill, *observ_shape], -1.0, 1.0),
        'action': random.uniform([fill, action_size], -1.0, 1.0),
        'reward': random.normal([fill]),
        'next_observ': random.uniform([fill, *observ_shape], -1.0, 1.0),
        'terminated': tf.zeros([fill], tf.bool)})
    seconds = {}
    agent.train(warmup)
    began = time.perf_counter()
    for _ in range(count):
        metrics, _ = agent.train(1)
    metrics['critic_loss'].numpy()
    seconds['per_call'] = time.perf_counter() - began
    began = time.perf_counter()
    metrics, _ = agent.train(count)
    metrics['critic_loss'].numpy()
    seconds['one_call'] = time.perf_counter() - began
    return seconds


def time_gradient_steps(systems, settings, gin_files, bindings, count, python, workdir):
    """{system: {'per_call': ms, 'one_call': ms}} per gradient step, each timed in its own
    process, alone."""
    timings = {}
    if 'ours' in systems:
        code = ('import json, sys; from benchmarks import sac_learning; print(json.dumps('
                'sac_learning.time_our_gradient_steps(*json.loads(sys.argv[1]))))')
        output = subprocess.run(
            [sys.executable, '-c', code, json.dumps([gin_files, bindings, count])],
            capture_output=True, text=True, check=True, cwd=run_config.PACKAGE_ROOT,
            env=dict(os.environ, PYTHONPATH=run_config.PACKAGE_ROOT)).stdout
        seconds = json.loads(output.strip().splitlines()[-1])
        timings['ours'] = {key: 1000 * value / count for key, value in seconds.items()}
    if 'sb3' in systems:
        env = {key: value for key, value in os.environ.items() if key != 'PYTHONPATH'}
        command = sb3_command(python, settings, os.path.join(workdir, 'timing-sb3'), 0, count)
        output = subprocess.run(command, capture_output=True, text=True, check=True,
                                env=env).stdout
        seconds = json.loads(output.strip().splitlines()[-1])
        timings['sb3'] = {key: 1000 * value / count for key, value in seconds.items()}
    return timings


def summarize(runs, systems, settings, threshold):
    """The curves; per system the steady and overall steps/s per seed and their medians, the
    steps to the threshold per seed, the final returns; and the ratios ours / SB3 of each
    seed's pair of runs."""
    summary = {'threshold': threshold,
               'curves': train_throughput.curves(runs, systems, settings['eval_every_steps'])}
    by_seed = {}
    for system in systems:
        selected = sorted((run for run in runs if run['system'] == system),
                          key=lambda run: run['seed'])
        if not selected:
            continue
        steady = [run['steady_sps'] for run in selected]
        summary[system] = {
            'seeds': [run['seed'] for run in selected],
            'steady_sps': steady,
            'median_steady_sps': train_throughput.median(steady),
            'steady_wall_sps': train_throughput.median(
                [run['steady_wall_sps'] for run in selected]),
            'overall_sps': train_throughput.median([run['overall_sps'] for run in selected]),
            'threshold_steps': [run['threshold_step'] for run in selected],
            'final_returns': [run['final_return'] for run in selected],
            'wall_s': train_throughput.median([run['wall_s'] for run in selected]),
        }
        for run in selected:
            by_seed.setdefault(run['seed'], {})[system] = run
    ratios = [pair['ours']['steady_sps'] / pair['sb3']['steady_sps']
              for _, pair in sorted(by_seed.items())
              if {'ours', 'sb3'} <= set(pair) and pair['ours']['steady_sps']
              and pair['sb3']['steady_sps']]
    if ratios:
        summary['ratio'] = {'per_seed': ratios, 'median': train_throughput.median(ratios),
                            'min': min(ratios), 'max': max(ratios)}
    return summary


def _number(value, digits=0):
    return '-' if value is None else f'{value:,.{digits}f}'


def _table(rows):
    widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]))]
    return ['  ' + ' | '.join(cell.rjust(width) for cell, width in zip(row, widths, strict=True))
            for row in rows]


def format_run(run, threshold):
    return (f'{run["system"]} seed {run["seed"]}: steady {_number(run["steady_sps"], 1)} '
            f'steps/s, overall {_number(run["overall_sps"], 1)}, final return '
            f'{run["final_return"]:.1f} at step {run["steps"]:,}, first reached {threshold:g} '
            f'at step {_number(run["threshold_step"])}, wall {run["wall_s"]:.1f} s (load '
            f'{run["load_before"]:.1f})')


def format_report(summary, systems, settings, task, timings=None, loads=(), backend=None):
    """The report; `backend`, if given, is our side's `train.env_backend`."""
    threshold = summary['threshold']
    present = [system for system in systems if system in summary]
    lines = [f'{task} ({settings["env_id"]}, {TASKS[task].gin_file}): {settings["num_envs"]} '
             f'env(s), {settings["gradient_steps"]} gradient step(s) per iteration of '
             f'{settings["train_freq"]} step(s) per env, {settings["total_steps"]:,} steps'
             + (f'; ours on the {backend} backend, SB3 on Gymnasium' if backend else '')]
    rows = [('system', 'steady steps/s per seed', 'median', 'ms/step', '+evals/s', 'overall/s',
             f'steps to {threshold:g} per seed', 'final return per seed')]
    for system in present:
        values = summary[system]
        median = values['median_steady_sps']
        rows.append((
            system, ', '.join(_number(value, 1) for value in values['steady_sps']),
            _number(median, 1), _number(1000 / median if median else None, 2),
            _number(values['steady_wall_sps'], 1), _number(values['overall_sps'], 1),
            ', '.join(_number(step) for step in values['threshold_steps']),
            ', '.join(_number(value, 1) for value in values['final_returns'])))
    ratio = summary.get('ratio')
    if ratio:
        rows.append(('ours/sb3', ', '.join(f'{value:.2f}' for value in ratio['per_seed']),
                     f'{ratio["median"]:.2f}', '', '', '', '', ''))
    lines += _table(rows)
    curve = summary['curves']
    columns = [system for system in present if system in curve]
    lines.append('Evaluation mean return at equal env steps, median over seeds (min to max):')
    rows = [('step', *columns)]
    for index, step in enumerate(curve['steps']):
        cells = []
        for system in columns:
            median, low, high = (curve[system][key][index] for key in ('median', 'min', 'max'))
            cells.append(_number(median, 1) if low == high else
                         f'{_number(median, 1)} ({_number(low, 0)} to {_number(high, 0)})')
        rows.append((f'{step:,}', *cells))
    lines += _table(rows)
    if timings:
        lines.append('One gradient step alone, ms (replay buffer filled; no env, no evaluation):')
        rows = [('system', 'per call of 1', 'in one call of K')]
        rows += [(system, _number(timings[system]['per_call'], 2),
                  _number(timings[system]['one_call'], 2))
                 for system in systems if system in timings]
        lines += _table(rows)
    lines.append('steady: env steps / training seconds between the first and the last '
                 'evaluation, by the run\'s own clock (no start-up, compilation or evaluation); '
                 'ms/step: 1000 / median steady; +evals: the same window by the wall clock '
                 '(evaluations, checkpoints, logging included); overall: launch to exit; '
                 'ours/sb3: each '
                 'seed\'s pair of runs, one after the other. Steps to the threshold: the '
                 'first evaluation whose mean return reached it (- never).')
    if loads:
        lines.append(f'Load average (1 min) at the runs\' starts: {min(loads):.1f} to '
                     f'{max(loads):.1f} on {os.cpu_count()} CPUs.')
    return '\n'.join(lines)


def main(argv):
    systems = train_throughput.check_learning_flags(argv, TASKS, SYSTEMS, one_task=True,
                                                    budget_instead='--total_steps')
    for name in ('num_envs', 'total_steps'):
        if FLAGS[name].value is not None and FLAGS[name].value < 1:
            raise app.UsageError(f'--{name} must be positive')
    task = FLAGS.tasks[0]
    try:
        settings, gin_files, bindings = sac_settings(
            TASKS[task], FLAGS.num_envs, FLAGS.total_steps, FLAGS.gin_bindings)
    except run_config.ConfigError as error:
        sys.exit(f'sac_learning: error: {error}')
    print(f'{task}: {json.dumps(settings)}', flush=True)
    print(f'ours: --gin_file={gin_files[0]} {" ".join(map(repr, bindings))}', flush=True)
    python = train_throughput.peers_python() if 'sb3' in systems else None
    if python:
        print(f'sb3: SAC(MlpPolicy, DummyVecEnv x {settings["num_envs"]}, '
              f'{sb3_sac_runner.sb3_sac_kwargs(settings)})', flush=True)
    workdir = FLAGS.workdir or tempfile.mkdtemp(prefix='sac_learning-')
    ours_env = dict(os.environ, PYTHONPATH=run_config.PACKAGE_ROOT)
    sb3_env = {key: value for key, value in os.environ.items() if key != 'PYTHONPATH'}
    threshold = TASKS[task].threshold
    runs = []
    for seed in range(FLAGS.seeds):
        for system in systems:
            logdir = os.path.join(workdir, f'{task}-{system}-seed{seed}')
            cwd = None
            if system == 'ours':
                command = train_throughput.ours_command(gin_files, bindings, logdir, seed)
                env, cwd = ours_env, run_config.PACKAGE_ROOT
            else:
                command, env = sb3_command(python, settings, logdir, seed), sb3_env
            run = train_throughput.summarize_run(
                train_throughput.run_monitored(command, logdir, env, FLAGS.poll_secs, cwd),
                threshold)
            run.update(task=task, system=system, seed=seed, logdir=logdir)
            runs.append(run)
            print(format_run(run, threshold), flush=True)
    timings = None
    if FLAGS.time_gradient_steps:
        timings = time_gradient_steps(systems, settings, gin_files, bindings,
                                      FLAGS.time_gradient_steps, python, workdir)
    summary = summarize(runs, systems, settings, threshold)
    print(format_report(summary, systems, settings, task, timings,
                        [run['load_before'] for run in runs], our_backend(gin_files, bindings)))
    if FLAGS.output_json:
        train_throughput.write_output(FLAGS.output_json, runs, dict(summary, timings=timings),
                                      {task: settings})


if __name__ == '__main__':
    app.run(main)
