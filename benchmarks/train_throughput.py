r"""Training speed of BatchPPO against Stable-Baselines3 PPO (CPU torch) and rejax PPO (JAX)
with matched settings.

Each run is a subprocess started alone (never two at once): BatchPPO through its CLI
(agents/scripts/train.py), SB3 through benchmarks/sb3_runner.py and rejax (PureJaxRL-style: the
whole training one XLA program, on gymnax's Pendulum) through benchmarks/rejax_runner.py, both
under the peers' python (.venv-peers, built by benchmarks/setup_peers.sh, which this binary runs
first unless --peers_python is given). All get the same settings table: it is read from the
task's gin configuration, so BatchPPO runs its own config and the peers the translation of it; a
setting SB3 cannot express is refused (rejax_runner.py lists what rejax runs its own way).
While a run goes, this process polls its metrics.jsonl (stamping each evaluation with the time
since launch) and /proc for the whole process tree (env workers included): summed RSS and PSS
(proportional set size: shared pages counted once) and CPU time.

Reported per task and system (medians over seeds):
  overall     env steps / wall time from launch to exit (imports, compilation and evaluations
              included);
  steady      env steps / training seconds after the first evaluation (no compile, no evals),
              from the runs' own logs; for rejax, whose only evaluation follows its one
              compiled call, env steps / the execution time of that call, compiled ahead of
              time (compilation excluded);
  +evals      the same window by the wall clock (evaluations, checkpoints, logging included);
  w/ compile  env steps / the run's own training clock at its last evaluation (ours: from the
              first iteration on, compilation and evaluations included; rejax: compilation
              and the compiled call);
  launch-exit wall time from launch to exit;
  compile     rejax's tracing and compilation of its training program;
  to <thr>    wall time from launch until an evaluation's mean return reached the threshold;
  train <thr> the same by the run's own training clock (`wall_time_s` of that evaluation: from
              the first iteration on, compilation and evaluations included; imports, building
              the environments and the agent excluded);
  final       mean return of the last evaluation (rejax's only one: its times to the threshold
              are those of the end of its run);
  peak PSS / RSS of the process tree, and its CPU seconds;
and the ratios ours / SB3 and ours / rejax. The native tasks (configs/pendulum_native.gin, the
environment in TensorFlow, with 16, 64, 256 and 4096 environments; and pendulum.gin's settings
on the native environment) run ours and rejax (never SB3) and are compared with their baseline
task's rows: native / SB3 and native / ours on Gymnasium.

Example (about 10 minutes on 2 cores):

    bazel run //benchmarks:train_throughput -- --seeds=1 --output_json=/tmp/train.json

Ours against rejax on the native Pendulum tasks (16 x 128 and 4096 x 8), seeds alternated:

    bazel run //benchmarks:train_throughput -- --systems=ours,rejax \
        --tasks=pendulum_native,pendulum_native4096 --seeds=3
"""

import dataclasses
import inspect
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time

import gin
import psutil
from absl import app, flags

from agents.algorithms import networks
from agents.algorithms.ppo import ppo
from agents.runs import run_config, run_dir, run_settings

flags.DEFINE_list('tasks', ['pendulum', 'pendulum_native', 'pendulum_native64',
                            'pendulum_native256', 'pendulum_native4096',
                            'pendulum_gym_settings_native', 'cheetah', 'cheetah_shared'],
                  'Tasks to run (keys of TASKS).')
flags.DEFINE_list('systems', ['ours', 'sb3'], 'Systems to run: ours, sb3, rejax (native tasks '
                  'only), baseline (ours from --baseline_tree).')
flags.DEFINE_string('baseline_tree', None, 'Another checkout of this project, e.g. of main '
                    '(`git worktree add /tmp/main main`): runs it as the system `baseline` '
                    'right after `ours` on every task and seed, with its own configs, and '
                    'prints ours/baseline. For a change that must not cost speed.')
flags.DEFINE_integer('seeds', 1, 'Seeds per task and system (0, 1, ...); medians are reported.')
flags.DEFINE_multi_string('budget', [], "Training budget override 'task=steps', e.g. "
                          "'pendulum=50000'.")
flags.DEFINE_multi_string('gin_bindings', [], "Gin bindings added to every task's configuration, "
                          "e.g. \"train.env_mode = 'in_process'\"; SB3 gets the resulting "
                          'settings too.')
flags.DEFINE_string('output_json', None, 'Writes every run and the summary to this file.')
flags.DEFINE_string('workdir', None, 'Where the runs log (default: a new temporary directory).')
flags.DEFINE_string('peers_python', None, 'Python of the peers venv (default: run '
                    'benchmarks/setup_peers.sh, which builds .venv-peers if needed).')
flags.DEFINE_integer('sb3_torch_threads', 1, 'torch.set_num_threads for SB3 (1 measured '
                     'fastest on 2 cores; see README.md).')
flags.DEFINE_enum('sb3_vec_env', 'dummy', ['dummy', 'subproc'], "SB3's vector env (dummy "
                  'measured fastest on 2 cores; see README.md).')
flags.DEFINE_float('poll_secs', 0.25, 'Interval of polling metrics and /proc.')
FLAGS = flags.FLAGS

HERE = os.path.dirname(os.path.abspath(__file__))


@dataclasses.dataclass(frozen=True)
class Task:
    """A benchmark task: BatchPPO's gin configuration of it, its budget and return threshold.

    A task with a `baseline` (a native-environment task) runs ours and rejax, not SB3, and is
    compared with the baseline task's SB3 and ours rows.
    """

    gin_files: tuple
    gin_bindings: tuple
    budget: int
    threshold: float | None = None
    baseline: str | None = None


# 4096 environments: 32 minibatches of 1024 (8 of 4096 reached -200 in 1 of 3 seeds by 600k),
# the policy and the value network trained side by side, one on each core (benchmarks/README.md,
# "Policy and value side by side").
NATIVE_4096_BINDINGS = ('train.num_envs = 4096', 'train.rollout_length = 8',
                        'train.eval_every_steps = 32768', 'train.jit_compile = True',
                        'PPO.num_minibatches = 32', 'PPO.jit_compile = True',
                        'PPO.concurrent_networks = True',
                        'configure_threads.inter_op_threads = 2')

TASKS = {
    'pendulum': Task(('configs/pendulum.gin',), (), 100_000, threshold=-200.0),
    # configs/cheetah.gin (rl-zoo's tuned HalfCheetah settings) on a throughput budget.
    'cheetah': Task(('configs/cheetah.gin',), ('train.eval_every_steps = 25000',), 50_000),
    # HalfCheetah on the MuJoCo tasks' shared settings (configs/mujoco.gin: CleanRL's
    # defaults, 8 x 256 steps, 64x64 networks), where the rollout costs more than the update.
    'cheetah_shared': Task(('configs/mujoco.gin',), ("train.env_id = 'HalfCheetah-v5'",
                           'train.eval_every_steps = 25000'), 50_000),
    # configs/pendulum_native.gin (16 environments x 128 steps) and its variants with 64, 256
    # and 4096 environments (XLA over the whole iteration pays at 4096); pendulum.gin's own
    # settings on the native environment (the same problem: returns must match 'pendulum').
    'pendulum_native': Task(('configs/pendulum_native.gin',), (), 150_000, threshold=-200.0,
                            baseline='pendulum'),
    'pendulum_native64': Task(
        ('configs/pendulum_native.gin',), ('train.num_envs = 64', 'train.rollout_length = 32'),
        150_000, threshold=-200.0, baseline='pendulum'),
    'pendulum_native256': Task(
        ('configs/pendulum_native.gin',), ('train.num_envs = 256', 'train.rollout_length = 8'),
        150_000, threshold=-200.0, baseline='pendulum'),
    'pendulum_native4096': Task(
        ('configs/pendulum_native.gin',), NATIVE_4096_BINDINGS, 600_000, threshold=-200.0,
        baseline='pendulum'),
    'pendulum_gym_settings_native': Task(
        ('configs/pendulum.gin',), ("train.env_backend = 'native'",), 100_000, threshold=-200.0,
        baseline='pendulum'),
}

# Settings SB3 can only run as BatchPPO does at these values.
REQUIRED = {
    'train.wrappers': ('range_normalize', 'ClipAction'),
    'PPO.objective': 'clipped',
    'PPO.policy_network': 'FeedForwardGaussianPolicy',
    'PPO.value_network': 'FeedForwardValue',
    'PPO.chunk_length': None,
    'PPO.early_stop_kl': None,
}


def _parameter(name, function):
    """The value gin binds to `name` ('Configurable.parameter'), else `function`'s default."""
    try:
        value = gin.query_parameter(name)
    except ValueError:
        value = inspect.signature(function).parameters[name.split('.')[1]].default
    if isinstance(value, gin.config.ConfigurableReference):
        return value.selector
    if inspect.isclass(value) or inspect.isfunction(value):
        return value.__name__
    return value


def gin_reader(configurable, function):
    """`read(parameter)`: the value of `configurable.parameter` in the loaded gin configuration,
    else `function`'s default (a reference or a class by its name). Public: the benchmarks that
    compare another algorithm of ours with its peer (a2c_learning, sac_learning) read their
    settings tables with it, as `shared_settings` does."""
    return lambda parameter: _parameter(f'{configurable}.{parameter}', function)


def shared_settings(task, budget, extra_bindings=()):
    """The settings table both systems run with, read from the task's gin configuration."""
    gin_files = [run_config.find_gin_file(path) for path in task.gin_files]
    bindings = list(task.gin_bindings) + list(extra_bindings) + [f'train.total_steps = {budget}']
    run_config.load(gin_files, bindings)
    try:
        train = gin_reader('train', run_settings.RunSettings)
        agent = gin_reader('PPO', ppo.PPO.__init__)
        policy = gin_reader('FeedForwardGaussianPolicy',
                            networks.FeedForwardGaussianPolicy.__init__)
        value = gin_reader('FeedForwardValue', networks.FeedForwardValue.__init__)
        for name, expected in REQUIRED.items():
            found = _parameter(name, run_settings.RunSettings if name.startswith('train.')
                               else ppo.PPO.__init__)
            found = tuple(found) if isinstance(found, list) else found
            if found != expected:
                raise run_config.ConfigError(
                    f'{name} = {found!r}: the SB3 comparison supports only {expected!r}')
        if policy('activation') != value('activation'):
            raise run_config.ConfigError('policy and value networks must share the activation')
        settings = {
            'env_id': train('env_id'),
            'env_kwargs': train('env_kwargs'),
            'total_steps': train('total_steps'),
            'num_envs': train('num_envs'),
            'rollout_length': train('rollout_length'),
            'eval_every_steps': train('eval_every_steps'),
            'eval_episodes': train('eval_episodes'),
            'anneal_learning_rate': train('anneal_learning_rate'),
            'discount': agent('discount'),
            'gae_lambda': agent('gae_lambda'),
            'num_epochs': agent('num_epochs'),
            'num_minibatches': agent('num_minibatches'),
            'learning_rate': agent('learning_rate'),
            'adam_epsilon': agent('adam_epsilon'),
            'max_grad_norm': agent('max_grad_norm'),
            'clip_ratio': agent('clip_ratio'),
            'value_clip': agent('value_clip'),
            'value_coef': agent('value_coef'),
            'entropy_coef': agent('entropy_coef'),
            'normalize_advantages': agent('normalize_advantages'),
            'normalize_observ': agent('normalize_observ'),
            'observ_clip': agent('observ_clip'),
            'scale_reward': agent('scale_reward'),
            'reward_clip': agent('reward_clip'),
            'policy_hidden_sizes': list(policy('hidden_sizes')),
            'value_hidden_sizes': list(value('hidden_sizes')),
            'activation': policy('activation'),
            'init_std': policy('init_std'),
        }
    finally:
        gin.clear_config()
    return settings, gin_files, bindings


def _process_tree(root_pid, known):
    """Pids of `root_pid`'s descendants (and itself), plus pids seen before that still exist
    (which may have been re-parented when their parent ended); zombies included, for their CPU
    time."""
    try:
        tree = {child.pid for child in psutil.Process(root_pid).children(recursive=True)}
    except psutil.NoSuchProcess:
        tree = set()
    return tree | {root_pid} | {pid for pid in known if psutil.pid_exists(pid)}


def _sample(pid):
    """(rss_mb, pss_mb, cpu_seconds) of one process; None if it is gone. A zombie (ended, not
    yet reaped) still shows its final CPU time, with no memory."""
    try:
        process = psutil.Process(pid)
        times, memory = process.cpu_times(), process.memory_full_info()
    except psutil.Error:
        return None
    return memory.rss / 2**20, memory.pss / 2**20, times.user + times.system


def run_monitored(command, logdir, env, poll_secs, cwd=None):
    """Runs `command` (in `cwd`) to its end while polling `logdir`/metrics.jsonl and /proc."""
    if os.path.exists(logdir):
        # BatchPPO would resume the run found there.
        raise FileExistsError(f'{logdir} exists; give an empty --workdir')
    os.makedirs(os.path.dirname(logdir), exist_ok=True)
    metrics_path = os.path.join(logdir, run_dir.METRICS_FILE)
    load_before = os.getloadavg()[0]
    evals, offset, pending = [], 0, ''
    peak_rss = peak_pss = 0.0
    cpu = {}
    known = set()
    with open(logdir + '.log', 'w') as log:
        start = time.monotonic()
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env,
                                   cwd=cwd)
        while True:
            # WNOWAIT leaves the ended process a zombie, whose final CPU time /proc still shows.
            ended = os.waitid(os.P_PID, process.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            now = time.monotonic() - start
            known = _process_tree(process.pid, known)
            rss = pss = 0.0
            for pid in known:
                sample = _sample(pid)
                if sample:
                    rss, pss = rss + sample[0], pss + sample[1]
                    cpu[pid] = max(cpu.get(pid, 0.0), sample[2])
            peak_rss, peak_pss = max(peak_rss, rss), max(peak_pss, pss)
            if os.path.exists(metrics_path):
                with open(metrics_path, encoding='utf-8') as f:
                    f.seek(offset)
                    pending += f.read()
                    offset = f.tell()
                *lines, pending = pending.split('\n')
                evals += [dict(json.loads(line), seen_s=now) for line in lines if line.strip()]
            if ended is not None:
                break
            time.sleep(poll_secs)
        returncode = process.wait()
        wall = time.monotonic() - start
    if returncode != 0:
        with open(logdir + '.log') as f:
            tail = ''.join(f.readlines()[-15:])
        raise RuntimeError(f'{" ".join(command[:4])} ... failed ({returncode}):\n{tail}')
    return {'wall_s': wall, 'evals': evals, 'peak_rss_mb': peak_rss, 'peak_pss_mb': peak_pss,
            'cpu_s': sum(cpu.values()), 'load_before': load_before,
            'load_after': os.getloadavg()[0]}


def summarize_run(run, threshold):
    """Adds throughput, time to threshold and final return to a `run_monitored` result."""
    evals = run['evals']
    if not evals:
        raise RuntimeError('the run wrote no evaluation')
    last = evals[-1]
    run['steps'] = last['step']
    run['overall_sps'] = last['step'] / run['wall_s']
    # Training seconds up to each evaluation, from the runs' own steps / env_steps_per_sec.
    train_seconds = [record['step'] / record['env_steps_per_sec'] for record in evals]
    run['steady_sps'] = (
        (last['step'] - evals[0]['step']) / (train_seconds[-1] - train_seconds[0])
        if len(evals) > 1 else None)
    # The same window by this process's clock: evaluations, checkpoints and logging included.
    run['steady_wall_sps'] = (
        (last['step'] - evals[0]['step']) / (last['seen_s'] - evals[0]['seen_s'])
        if len(evals) > 1 and last['seen_s'] > evals[0]['seen_s'] else None)
    if run['steady_sps'] is None and 'train_s' in last:
        # rejax: one evaluation, after one compiled call whose execution time it reports.
        run['steady_sps'] = last['env_steps_per_sec']
    run['train_clock_sps'] = (last['step'] / last['wall_time_s']
                              if last.get('wall_time_s') else None)
    run['compile_s'] = last.get('compile_s')
    run['final_return'] = last['mean_return']
    reached = [record for record in evals
               if threshold is not None and record['mean_return'] >= threshold]
    run['threshold_step'] = reached[0]['step'] if reached else None
    run['to_threshold_s'] = reached[0]['seen_s'] if reached else None
    run['train_to_threshold_s'] = reached[0].get('wall_time_s') if reached else None
    return run


def ours_command(gin_files, bindings, logdir, seed, tree=run_config.PACKAGE_ROOT):
    """The train binary of the checkout `tree` (this one by default), on that checkout's copies
    of the gin files."""
    gin_files = [os.path.join(tree, os.path.relpath(path, run_config.PACKAGE_ROOT))
                 for path in gin_files]
    return ([sys.executable, '-m', 'agents.scripts.train', f'--logdir={logdir}',
             f'--seed={seed}'] + [f'--gin_file={path}' for path in gin_files] +
            [f'--gin_bindings={binding}' for binding in bindings])


def sb3_command(python, settings, logdir, seed, runner='sb3_runner.py'):
    """The peers' `python` running `runner` (beside this file: sb3_runner.py for PPO, or
    sb3_a2c_runner.py, sb3_sac_runner.py) on the settings, with the --sb3_* flags."""
    return [python, os.path.join(HERE, runner), f'--config={json.dumps(settings)}',
            f'--logdir={logdir}', f'--seed={seed}',
            f'--torch_threads={FLAGS.sb3_torch_threads}', f'--vec_env={FLAGS.sb3_vec_env}']


def rejax_command(python, settings, logdir, seed):
    return [python, os.path.join(HERE, 'rejax_runner.py'), f'--config={json.dumps(settings)}',
            f'--logdir={logdir}', f'--seed={seed}']


def peers_python():
    if FLAGS.peers_python:
        return FLAGS.peers_python
    setup = os.path.join(HERE, 'setup_peers.sh')
    result = subprocess.run(['bash', setup], stdout=subprocess.PIPE, text=True, check=False)
    if result.returncode != 0:
        sys.exit(f'train_throughput: error: {setup} failed (see its messages above)')
    return result.stdout.strip().splitlines()[-1]


RATIO_KEYS = ('overall_sps', 'steady_sps', 'steady_wall_sps', 'train_clock_sps', 'wall_s',
              'to_threshold_s', 'train_to_threshold_s', 'peak_pss_mb', 'peak_rss_mb', 'cpu_s')
SUMMARY_KEYS = RATIO_KEYS + ('final_return', 'steps', 'compile_s')
SYSTEMS = ('ours', 'sb3', 'rejax', 'baseline')


def _value_at(evals, step, tolerance):
    """The mean return of the evaluation nearest to `step` (None if none lies within
    `tolerance` steps)."""
    nearest = min(evals, key=lambda record: abs(record['step'] - step), default=None)
    if nearest is None or abs(nearest['step'] - step) > tolerance:
        return None
    return nearest['mean_return']


def curves(runs, systems, eval_every_steps):
    """Per system, the median, min and max over seeds of the evaluations' mean returns, at the
    evaluation steps of the first system with runs.

    The loop evaluates at the first update past each multiple of eval_every_steps and SB3's
    evaluator after each update with eval_every_steps more steps: the two may drift apart by
    less than an iteration per evaluation, so each run contributes the evaluation nearest to
    each step, within half of eval_every_steps.
    """
    present = [system for system in systems if any(run['system'] == system for run in runs)]
    if not present:
        return {'steps': []}
    reference = [run for run in runs if run['system'] == present[0]]
    steps = sorted({record['step'] for run in reference for record in run['evals']})
    result = {'steps': steps}
    for system in present:
        selected = [run for run in runs if run['system'] == system]
        columns = {'median': [], 'min': [], 'max': []}
        for step in steps:
            values = [_value_at(run['evals'], step, eval_every_steps / 2) for run in selected]
            values = [value for value in values if value is not None]
            columns['median'].append(median(values))
            columns['min'].append(min(values) if values else None)
            columns['max'].append(max(values) if values else None)
        result[system] = columns
    return result


def median(values):
    """The median of `values` without the Nones (runs that lack the figure); None if nothing is
    left. Public: the other benchmarks' summaries (a2c_learning, sac_learning) take it too."""
    values = [value for value in values if value is not None]
    return statistics.median(values) if values else None


def task_systems(task, systems):
    """The systems `task` runs with: SB3 only on Gymnasium, rejax only on a native task (its
    gymnax Pendulum stands in for our native one)."""
    native = TASKS[task].baseline is not None
    return [system for system in systems
            if system in ('ours', 'baseline') or (system == 'rejax') == native]


def _ratios(numerator, denominator):
    return {key: numerator[key] / denominator[key] if numerator[key] and denominator[key]
            else None for key in RATIO_KEYS}


def summarize(runs, tasks, systems):
    """Medians over seeds per task and system, and the ratios ours / SB3 and ours / rejax (for a
    native task also native / SB3 and native / ours of its baseline task)."""
    summary = {}
    for task in tasks:
        summary[task] = {}
        for system in task_systems(task, systems):
            selected = [run for run in runs if run['task'] == task and run['system'] == system]
            if not selected:
                continue
            medians = {key: median([run.get(key) for run in selected]) for key in SUMMARY_KEYS}
            # A seed that never reached the threshold counts as slower than every other one.
            for key in ('to_threshold_s', 'train_to_threshold_s'):
                middle = median([math.inf if run.get(key) is None else run[key]
                                 for run in selected])
                medians[key] = None if middle == math.inf else middle
            medians['reached'] = sum(run['to_threshold_s'] is not None for run in selected)
            medians['seeds'] = len(selected)
            summary[task][system] = medians
        if {'ours', 'sb3'} <= set(summary[task]):
            summary[task]['ratio'] = _ratios(summary[task]['ours'], summary[task]['sb3'])
        if {'ours', 'rejax'} <= set(summary[task]):
            summary[task]['ours/rejax'] = _ratios(summary[task]['ours'], summary[task]['rejax'])
        if {'ours', 'baseline'} <= set(summary[task]):
            summary[task]['ours/baseline'] = _ratios(summary[task]['ours'],
                                                     summary[task]['baseline'])
    for task in tasks:
        baseline = summary.get(TASKS[task].baseline, {})
        if 'ours' in summary[task]:
            if 'sb3' in baseline:
                summary[task]['native/SB3'] = _ratios(summary[task]['ours'], baseline['sb3'])
            if 'ours' in baseline:
                summary[task]['native/gym'] = _ratios(summary[task]['ours'], baseline['ours'])
    return summary


def paired_ratios(runs, tasks, keys=('overall_sps', 'steady_sps', 'steady_wall_sps')):
    """ours/baseline of each seed's pair of runs (run one after the other), per task: the
    spread behind the median ratio."""
    lines = ['ours/baseline per seed (paired runs):']
    for task in tasks:
        pairs = {}
        for run in runs:
            if run['task'] == task and run['system'] in ('ours', 'baseline'):
                pairs.setdefault(run['seed'], {})[run['system']] = run
        parts = []
        for key in keys:
            ratios = [pair['ours'][key] / pair['baseline'][key] for pair in pairs.values()
                      if len(pair) == 2 and pair['ours'].get(key) and pair['baseline'].get(key)]
            if ratios:
                parts.append(f'{key} {", ".join(f"{ratio:.3f}" for ratio in ratios)}')
        if parts:
            lines.append(f'  {task}: {"; ".join(parts)}')
    return '\n'.join(lines)


def format_table(summary, tasks, loads=()):
    def number(value, digits=0):
        return '-' if value is None else f'{value:,.{digits}f}'

    header = ('task', 'system', 'steps', 'overall/s', 'steady/s', '+evals/s', 'w/ compile/s',
              'launch-exit (s)', 'compile (s)', 'to thr (s)', 'train thr (s)', 'final', 'PSS MB',
              'RSS MB', 'CPU s')
    ratio_labels = {'ratio': 'ours/SB3', 'ours/rejax': 'ours/rejax', 'native/SB3': 'native/SB3',
                    'native/gym': 'native/gym', 'ours/baseline': 'ours/baseline'}
    rows = [header]
    for task in tasks:
        threshold = TASKS[task].threshold
        for system, values in summary[task].items():
            if system in ratio_labels:
                rows.append((task, ratio_labels[system], '', number(values['overall_sps'], 2),
                             number(values['steady_sps'], 2),
                             number(values['steady_wall_sps'], 2),
                             number(values['train_clock_sps'], 2), number(values['wall_s'], 2),
                             '', number(values['to_threshold_s'], 2),
                             number(values['train_to_threshold_s'], 2), '',
                             number(values['peak_pss_mb'], 2), number(values['peak_rss_mb'], 2),
                             number(values['cpu_s'], 2)))
                continue
            to_threshold = '' if threshold is None else (
                f'{number(values["to_threshold_s"], 1)} '
                f'({values["reached"]}/{values["seeds"]})')
            train_to_threshold = '' if threshold is None else number(
                values['train_to_threshold_s'], 1)
            rows.append((task, system, number(values['steps']), number(values['overall_sps']),
                         number(values['steady_sps']), number(values['steady_wall_sps']),
                         number(values['train_clock_sps']), number(values['wall_s'], 1),
                         number(values['compile_s'], 1), to_threshold, train_to_threshold,
                         number(values['final_return'], 1),
                         number(values['peak_pss_mb']),
                         number(values['peak_rss_mb']), number(values['cpu_s'], 1)))
    widths = [max(len(str(row[column])) for row in rows) for column in range(len(header))]
    lines = ['  '.join(str(cell).rjust(width) for cell, width in zip(row, widths, strict=True))
             for row in rows]
    thresholds = ', '.join(f'{task} {TASKS[task].threshold:g}' for task in tasks
                           if TASKS[task].threshold is not None)
    if thresholds:
        lines.append(f'to thr: wall time from launch to an eval mean return >= threshold '
                     f'({thresholds}); (reached/seeds); a seed that never reached it counts as '
                     'slowest, - when that is the median; train thr: the same by the run\'s own '
                     'training clock (no imports or setup). native/*: a native task against its '
                     'baseline task\'s SB3 and ours (Gymnasium) rows. rejax evaluates once, at '
                     'the end; its steady/s is the execution of its compiled program, '
                     'compilation excluded.')
    if loads:
        lines.append(f'Load average (1 min) at the runs\' starts: {min(loads):.1f} to '
                     f'{max(loads):.1f} on {os.cpu_count()} CPUs.')
    return '\n'.join(lines)


def parse_budgets(entries, tasks=(), known=TASKS):
    """{task: steps}: each of `tasks`' own budget (`known[task].budget`), and those of the
    --budget entries 'task=steps', whose tasks must be in `known` (a2c_learning gives its own
    TASKS and no `tasks`: the overrides alone)."""
    budgets = {task: known[task].budget for task in tasks}
    for entry in entries:
        task, _, steps = entry.partition('=')
        if task not in known or not steps.isdigit() or int(steps) < 1:
            raise app.UsageError(f"--budget={entry!r}: expected 'task=steps' with a task in "
                                 f'{sorted(known)} and a positive number of steps')
        budgets[task] = int(steps)
    return budgets


def check_learning_flags(argv, tasks, systems, one_task=False, budget_instead=None):
    """The checks of these flags in a benchmark that adopts them to run ours against one peer
    on its own `tasks` (a2c_learning, sac_learning); returns --systems, a list.

    Raises app.UsageError for arguments besides the flags, --tasks not in `tasks` (with
    `one_task`: not exactly one of them), --systems not in `systems`, --baseline_tree (no such
    system there), --budget when `budget_instead` names the flag to use instead, and --seeds
    below 1.
    """
    if len(argv) > 1:
        raise app.UsageError(f'Unexpected arguments: {" ".join(argv[1:])}')
    if one_task:
        if len(FLAGS.tasks) != 1 or FLAGS.tasks[0] not in tasks:
            raise app.UsageError(f'--tasks: one of {", ".join(sorted(tasks))}, got {FLAGS.tasks}')
    else:
        unknown = [task for task in FLAGS.tasks if task not in tasks]
        if unknown:
            raise app.UsageError(f'Unknown tasks {unknown}; known: {sorted(tasks)}')
    chosen = list(FLAGS.systems)
    unknown = [system for system in chosen if system not in systems]
    if unknown:
        raise app.UsageError(f'Unknown systems {unknown}; known: {", ".join(systems)}')
    if FLAGS.baseline_tree:
        raise app.UsageError('--baseline_tree: not supported by this benchmark')
    if budget_instead and FLAGS.budget:
        raise app.UsageError(f'--budget: use {budget_instead}')
    if FLAGS.seeds < 1:
        raise app.UsageError('--seeds must be positive')
    return chosen


def write_output(path, runs, summary, settings_by_task):
    """Every run, the summary and the settings, as JSON (--output_json)."""
    with open(path, 'w', encoding='utf-8') as f:
        json.dump({'runs': runs, 'summary': summary, 'settings': settings_by_task,
                   'sb3_torch_threads': FLAGS.sb3_torch_threads,
                   'sb3_vec_env': FLAGS.sb3_vec_env, 'cpus': os.cpu_count()}, f, indent=1)


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f'Unexpected arguments: {" ".join(argv[1:])}')
    unknown = [task for task in FLAGS.tasks if task not in TASKS]
    if unknown:
        raise app.UsageError(f'Unknown tasks {unknown}; known: {sorted(TASKS)}')
    systems = list(FLAGS.systems)
    if FLAGS.baseline_tree:
        if not os.path.isfile(os.path.join(FLAGS.baseline_tree, 'agents', 'scripts', 'train.py')):
            raise app.UsageError(f'--baseline_tree={FLAGS.baseline_tree}: not a checkout of this '
                                 'project (no agents/scripts/train.py)')
        if 'baseline' not in systems:
            systems.insert(systems.index('ours') + 1 if 'ours' in systems else 0, 'baseline')
    elif 'baseline' in systems:
        raise app.UsageError('the system baseline needs --baseline_tree')
    unknown = [system for system in systems if system not in SYSTEMS]
    if unknown:
        raise app.UsageError(f'Unknown systems {unknown}; known: {", ".join(SYSTEMS)}')
    if FLAGS.seeds < 1:
        raise app.UsageError('--seeds must be positive')
    budgets = parse_budgets(FLAGS.budget, FLAGS.tasks)
    python = peers_python() if {'sb3', 'rejax'} & set(systems) else None
    workdir = FLAGS.workdir or tempfile.mkdtemp(prefix='train_throughput-')
    ours_env = dict(os.environ, PYTHONPATH=run_config.PACKAGE_ROOT)
    baseline_env = dict(os.environ, PYTHONPATH=os.path.abspath(FLAGS.baseline_tree or '.'))
    peers_env = {key: value for key, value in os.environ.items() if key != 'PYTHONPATH'}
    runs, settings_by_task = [], {}
    for task in FLAGS.tasks:
        settings, gin_files, bindings = shared_settings(
            TASKS[task], budgets[task], FLAGS.gin_bindings)
        settings_by_task[task] = settings
        print(f'{task}: {json.dumps(settings)}', flush=True)
        for seed in range(FLAGS.seeds):
            for system in task_systems(task, systems):
                logdir = os.path.join(workdir, f'{task}-{system}-seed{seed}')
                # `python -m` imports from its working directory first: each tree runs in its own.
                cwd = None
                if system == 'ours':
                    command, env = ours_command(gin_files, bindings, logdir, seed), ours_env
                    cwd = run_config.PACKAGE_ROOT
                elif system == 'baseline':
                    cwd = os.path.abspath(FLAGS.baseline_tree)
                    command = ours_command(gin_files, bindings, logdir, seed, tree=cwd)
                    env = baseline_env
                elif system == 'rejax':
                    command, env = rejax_command(python, settings, logdir, seed), peers_env
                else:
                    command, env = sb3_command(python, settings, logdir, seed), peers_env
                run = summarize_run(run_monitored(command, logdir, env, FLAGS.poll_secs, cwd),
                                    TASKS[task].threshold)
                run.update(task=task, system=system, seed=seed, logdir=logdir)
                runs.append(run)
                to_threshold = run['to_threshold_s']
                print(f'{task} {system} seed {seed}: {run["overall_sps"]:.0f} steps/s overall, '
                      f'final return {run["final_return"]:.1f}, threshold reached after '
                      f'{"-" if to_threshold is None else f"{to_threshold:.1f}"} s, peak PSS '
                      f'{run["peak_pss_mb"]:.0f} MB, load {run["load_before"]:.1f}', flush=True)
    summary = summarize(runs, FLAGS.tasks, systems)
    print(format_table(summary, FLAGS.tasks, [run['load_before'] for run in runs]))
    if 'baseline' in systems:
        print(paired_ratios(runs, FLAGS.tasks))
    if FLAGS.output_json:
        write_output(FLAGS.output_json, runs, summary, settings_by_task)


if __name__ == '__main__':
    app.run(main)
