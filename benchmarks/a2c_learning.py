r"""A2C's learning: BatchPPO's A2C against Stable-Baselines3's A2C with the same settings.

Each task is one of BatchPPO's A2C configs: `cartpole` (configs/a2c_cartpole.gin, CartPole-v1
with SB3's A2C defaults) and `pendulum` (configs/a2c_pendulum.gin, rl-zoo's A2C settings for
Pendulum-v1 without gSDE). The settings are read from the gin configuration (`A2C.*` with the
defaults of A2C's signature, `train.*`, the networks'), so BatchPPO runs its own config and SB3
(benchmarks/sb3_a2c_runner.py, under the peers' python) the translation of it; a setting SB3
cannot express is refused, naming it. Runs go one at a time, the systems alternating within
each seed (ours seed 0, sb3 seed 0, ours seed 1, ...), monitored as train_throughput's are.

Printed per run: the final evaluation's mean return, the first step at which an evaluation's
mean return reached the task's threshold (CartPole 500, Pendulum -200) and the wall time. Per
task: the median over seeds of each evaluation's mean return (step | ours | sb3), steps to the
threshold per seed and their median (a seed that never reached it counts as slowest), and for
CartPole whether every seed of ours reached 500 within 250,000 steps. `--plot` draws the
curves: median and min-max band per system.

Example (the full benchmark: 3 seeds x 2 systems x (250k + 1M) steps, run one at a time):

    bazel run //benchmarks:a2c_learning -- --seeds=3 --output_json=/tmp/a2c.json \
        --plot=/tmp/a2c.png
"""

import dataclasses
import json
import math
import os
import sys
import tempfile

import gin
from absl import app, flags

from agents.algorithms import networks
from agents.algorithms.a2c import a2c
from agents.runs import run_config, run_settings
from benchmarks import peer_runner, sb3_a2c_runner, train_throughput

# train_throughput's flags (--tasks, --systems, --seeds, --budget, --gin_bindings,
# --output_json, --workdir, --peers_python, --sb3_torch_threads, --sb3_vec_env, --poll_secs)
# serve here too, with this benchmark's defaults; --baseline_tree is refused.
flags.adopt_module_key_flags(train_throughput)
flags.DEFINE_string('plot', None, 'Draws the learning curves (median and min-max band over '
                    'seeds per system, one panel per task) into this image file.')
FLAGS = flags.FLAGS
FLAGS.set_default('tasks', ['cartpole', 'pendulum'])
FLAGS.set_default('seeds', 3)

SYSTEMS = ('ours', 'sb3')


@dataclasses.dataclass(frozen=True)
class Task:
    """A gin config of BatchPPO's A2C, the return its evaluations should reach and, for a
    claim, the budget within which every seed of ours should reach it. The training budget
    is the config's own (train.total_steps) unless --budget overrides it."""

    gin_file: str
    threshold: float
    claim_steps: int | None = None


TASKS = {
    'cartpole': Task('configs/a2c_cartpole.gin', 500.0, claim_steps=250_000),
    'pendulum': Task('configs/a2c_pendulum.gin', -200.0),
}

POLICY_NETWORKS = {
    'FeedForwardGaussianPolicy': networks.FeedForwardGaussianPolicy,
    'FeedForwardCategoricalPolicy': networks.FeedForwardCategoricalPolicy,
}
SB3_OUTPUT_GAIN = 0.01  # ortho_init's gain of SB3's action_net.


def a2c_settings(task, budget=None, extra_bindings=()):
    """(settings, gin files, bindings): the settings table both systems run with, read from
    the task's gin configuration plus `extra_bindings` (and `budget` steps, if given).

    Raises run_config.ConfigError naming a setting that SB3 cannot express.
    """
    gin_files = [run_config.find_gin_file(task.gin_file)]
    bindings = list(extra_bindings)
    if budget is not None:
        bindings.append(f'train.total_steps = {budget}')
    run_config.load(gin_files, bindings)
    try:
        train = train_throughput.gin_reader('train', run_settings.RunSettings)
        agent = train_throughput.gin_reader('A2C', a2c.A2C.__init__)
        policy_name, value_name = agent('policy_network'), agent('value_network')
        if policy_name not in POLICY_NETWORKS:
            raise run_config.ConfigError(
                f'A2C.policy_network = @{policy_name}: the SB3 comparison supports only '
                f'{" or ".join("@" + name for name in POLICY_NETWORKS)}')
        if value_name != 'FeedForwardValue':
            raise run_config.ConfigError(f'A2C.value_network = @{value_name}: the SB3 '
                                         'comparison supports only @FeedForwardValue')
        policy = train_throughput.gin_reader(policy_name, POLICY_NETWORKS[policy_name].__init__)
        value = train_throughput.gin_reader(value_name, networks.FeedForwardValue.__init__)
        if policy('output_gain') != SB3_OUTPUT_GAIN:
            raise run_config.ConfigError(
                f'{policy_name}.output_gain = {policy("output_gain")!r}: SB3 initializes the '
                f'policy output with gain {SB3_OUTPUT_GAIN}')
        if policy('activation') != value('activation'):
            raise run_config.ConfigError('policy and value networks must share the activation '
                                         '(SB3 has one activation_fn)')
        settings = {
            'env_id': train('env_id'),
            'env_kwargs': train('env_kwargs'),
            'wrappers': list(train('wrappers')),
            'total_steps': train('total_steps'),
            'num_envs': train('num_envs'),
            'rollout_length': train('rollout_length'),
            'eval_every_steps': train('eval_every_steps'),
            'eval_episodes': train('eval_episodes'),
            'anneal_learning_rate': train('anneal_learning_rate'),
            'discount': agent('discount'),
            'gae_lambda': agent('gae_lambda'),
            'learning_rate': agent('learning_rate'),
            'optimizer': agent('optimizer'),
            'rmsprop_alpha': agent('rmsprop_alpha'),
            'optimizer_epsilon': agent('optimizer_epsilon'),
            'max_grad_norm': agent('max_grad_norm'),
            'value_coef': agent('value_coef'),
            'entropy_coef': agent('entropy_coef'),
            'normalize_advantages': agent('normalize_advantages'),
            'normalize_observ': agent('normalize_observ'),
            'observ_clip': agent('observ_clip'),
            'scale_reward': agent('scale_reward'),
            'reward_clip': agent('reward_clip'),
            'policy_network': policy_name,
            'policy_hidden_sizes': list(policy('hidden_sizes')),
            'value_hidden_sizes': list(value('hidden_sizes')),
            'activation': policy('activation'),
            'init_std': (policy('init_std') if policy_name == 'FeedForwardGaussianPolicy'
                         else None),
        }
    finally:
        gin.clear_config()
    try:
        sb3_a2c_runner.check_settings(settings)
    except peer_runner.UnsupportedSetting as error:
        # Named as the gin parameter it came from.
        name = {'wrappers': 'train.wrappers', 'activation': f'{policy_name}.activation',
                'init_std': f'{policy_name}.init_std'}.get(error.key, f'A2C.{error.key}')
        raise run_config.ConfigError(f'{name}{str(error)[len(error.key):]}' if error.key
                                     else str(error)) from None
    return settings, gin_files, bindings


def summarize(runs, tasks, systems, settings_by_task):
    """Per task: the curves, and per system the steps to the threshold per seed and their
    median (unreached counting as slowest), the median final return and, for a claim,
    how many seeds reached the threshold within its budget."""
    summary = {}
    for task in tasks:
        settings = settings_by_task[task]
        task_runs = [run for run in runs if run['task'] == task]
        entry = {'threshold': TASKS[task].threshold, 'curves': train_throughput.curves(
            task_runs, systems, settings['eval_every_steps'])}
        for system in systems:
            selected = sorted((run for run in task_runs if run['system'] == system),
                              key=lambda run: run['seed'])
            if not selected:
                continue
            steps = [run['threshold_step'] for run in selected]
            median = train_throughput.median(
                [math.inf if step is None else step for step in steps])
            entry[system] = {
                'threshold_steps': steps,
                'median_threshold_step': None if median == math.inf else median,
                'reached': sum(step is not None for step in steps),
                'seeds': len(selected),
                'final_return': train_throughput.median(
                    [run['final_return'] for run in selected]),
                'wall_s': train_throughput.median([run['wall_s'] for run in selected]),
            }
        claim_steps = TASKS[task].claim_steps
        if claim_steps is not None and 'ours' in entry:
            steps = entry['ours']['threshold_steps']
            within = sum(step is not None and step <= claim_steps for step in steps)
            entry['claim'] = {'steps': claim_steps, 'within': within, 'seeds': len(steps),
                              'holds': within == len(steps),
                              'budget': settings['total_steps']}
        summary[task] = entry
    return summary


def _number(value, digits=0):
    return '-' if value is None else f'{value:,.{digits}f}'


def format_run(run):
    return (f'{run["task"]} {run["system"]} seed {run["seed"]}: final return '
            f'{run["final_return"]:.1f} at step {run["steps"]:,}, first reached '
            f'{TASKS[run["task"]].threshold:g} at step {_number(run["threshold_step"])}, wall '
            f'{run["wall_s"]:.1f} s (load {run["load_before"]:.1f})')


def format_report(summary, tasks, systems, settings_by_task):
    lines = []
    for task in tasks:
        entry, settings = summary[task], settings_by_task[task]
        threshold = entry['threshold']
        curve = entry['curves']
        present = [system for system in systems if system in curve]
        seeds = max((entry[system]['seeds'] for system in present), default=0)
        lines.append(f'{task} ({settings["env_id"]}, {TASKS[task].gin_file}): median over '
                     f'{seeds} seed(s) of the evaluations\' mean return')
        rows = [('step', *present)] + [
            (f'{step:,}', *(_number(curve[system]['median'][index], 1) for system in present))
            for index, step in enumerate(curve['steps'])]
        widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]))]
        lines += ['  ' + ' | '.join(cell.rjust(width) for cell, width in
                                    zip(row, widths, strict=True)) for row in rows]
        for system in present:
            values = entry[system]
            per_seed = ', '.join(_number(step) for step in values['threshold_steps'])
            lines.append(
                f'  {system}: steps to {threshold:g} per seed {per_seed}; median '
                f'{_number(values["median_threshold_step"])} ({values["reached"]}/'
                f'{values["seeds"]} reached); final return {_number(values["final_return"], 1)}'
                f' (median); wall {_number(values["wall_s"], 1)} s (median)')
        claim = entry.get('claim')
        if claim:
            verdict = 'yes' if claim['holds'] else 'no'
            note = (f'; the budget was {claim["budget"]:,} steps: not a test of the claim'
                    if claim['budget'] < claim['steps'] else '')
            lines.append(f'  every seed of ours reached {threshold:g} within '
                         f'{claim["steps"]:,} steps: {verdict} ({claim["within"]}/'
                         f'{claim["seeds"]}){note}')
    lines.append('Steps to the threshold: the first evaluation whose mean return reached it '
                 '(- never); a seed that never reached it counts as the slowest. Curve rows are '
                 'the first system\'s evaluation steps; the other\'s nearest evaluation fills '
                 'its column.')
    return '\n'.join(lines)


def plot(summary, tasks, systems, path):
    import matplotlib

    matplotlib.use('Agg')
    from matplotlib import pyplot

    figure, axes = pyplot.subplots(1, len(tasks), figsize=(6 * len(tasks), 4), squeeze=False)
    for axis, task in zip(axes[0], tasks, strict=True):
        curve = summary[task]['curves']
        for system in systems:
            if system not in curve:
                continue
            points = [(step, median, low, high) for step, median, low, high in zip(
                curve['steps'], curve[system]['median'], curve[system]['min'],
                curve[system]['max'], strict=True) if median is not None]
            if not points:
                continue
            steps, medians, lows, highs = zip(*points, strict=True)
            (line,) = axis.plot(steps, medians, label=f'{system} (median)')
            axis.fill_between(steps, lows, highs, color=line.get_color(), alpha=0.2)
        axis.axhline(summary[task]['threshold'], color='gray', linestyle='--', linewidth=1)
        axis.set_title(f'{task}: A2C, evaluation mean return')
        axis.set_xlabel('environment steps')
        axis.set_ylabel('mean return')
        axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    pyplot.close(figure)


def main(argv):
    systems = train_throughput.check_learning_flags(argv, TASKS, SYSTEMS)
    budgets = train_throughput.parse_budgets(FLAGS.budget, known=TASKS)
    settings_by_task, configs = {}, {}
    for task in FLAGS.tasks:
        try:
            settings, gin_files, bindings = a2c_settings(
                TASKS[task], budgets.get(task), FLAGS.gin_bindings)
        except run_config.ConfigError as error:
            sys.exit(f'a2c_learning: error: {task}: {error}')
        settings_by_task[task], configs[task] = settings, (gin_files, bindings)
        print(f'{task}: {json.dumps(settings)}', flush=True)
    python = train_throughput.peers_python() if 'sb3' in systems else None
    workdir = FLAGS.workdir or tempfile.mkdtemp(prefix='a2c_learning-')
    ours_env = dict(os.environ, PYTHONPATH=run_config.PACKAGE_ROOT)
    sb3_env = {key: value for key, value in os.environ.items() if key != 'PYTHONPATH'}
    runs = []
    for task in FLAGS.tasks:
        gin_files, bindings = configs[task]
        for seed in range(FLAGS.seeds):
            for system in systems:
                logdir = os.path.join(workdir, f'{task}-{system}-seed{seed}')
                if system == 'ours':
                    command = train_throughput.ours_command(gin_files, bindings, logdir, seed)
                    env = ours_env
                else:
                    command = train_throughput.sb3_command(
                        python, settings_by_task[task], logdir, seed, 'sb3_a2c_runner.py')
                    env = sb3_env
                run = train_throughput.summarize_run(
                    train_throughput.run_monitored(command, logdir, env, FLAGS.poll_secs),
                    TASKS[task].threshold)
                run.update(task=task, system=system, seed=seed, logdir=logdir)
                runs.append(run)
                print(format_run(run), flush=True)
    summary = summarize(runs, FLAGS.tasks, systems, settings_by_task)
    print(format_report(summary, FLAGS.tasks, systems, settings_by_task))
    if FLAGS.plot:
        plot(summary, FLAGS.tasks, systems, FLAGS.plot)
        print(f'Curves drawn into {FLAGS.plot}')
    if FLAGS.output_json:
        train_throughput.write_output(FLAGS.output_json, runs, summary, settings_by_task)


if __name__ == '__main__':
    app.run(main)
