r"""PPO training speed on the EnvPool backend against our Gymnasium backend, one config (issue 41).

Trains `--gin_file` (default configs/cheetah.gin: HalfCheetah-v5, 8 envs x 64 steps, 20 epochs
of 8 minibatches, 256x256 networks; on the Gymnasium backend in its hybrid mode, as
configs/mujoco.gin sets) as it is, and the same with `train.env_backend = 'envpool'` (EnvPool's
HalfCheetah-v5 in its C++ threads, in sync mode, behind the same in-graph batch env and
wrappers). Runs go one at a time through the train binary, alternated: envpool, gymnasium,
envpool, gymnasium... (`--pairs` pairs), monitored as train_throughput's are. Each runs `--steps`
steps with no evaluation before its end; its steady speed is steps per second between the end of
the first iteration at or past `--warmup_steps` and the end of the last one before the final
evaluation, by the wall clock of its progress lines, and by its training clock (seconds inside
compiled calls; see progress_speed.py).

Printed: each pair's speeds and the ratio envpool / gymnasium, the medians and the ratio's
median with its spread over the pairs (min to max), and the load average at each run's start.

Example (3 pairs of 51,200 steps, about 6 minutes on 2 cores):

    PYTHONPATH=. .venv/bin/python -m benchmarks.envpool_training --pairs=3
"""

import json
import os
import tempfile

from absl import app, flags

from agents.runs import run_config
from benchmarks import progress_speed, train_throughput

# train_throughput's flags serve here too: --gin_bindings (added to both sides), --workdir,
# --output_json, --poll_secs. Its others are refused.
flags.adopt_module_key_flags(train_throughput)
flags.DEFINE_string('gin_file', 'configs/cheetah.gin', 'The config both sides train.')
flags.DEFINE_integer('pairs', 3, 'Pairs of runs (envpool, then gymnasium).')
flags.DEFINE_integer('steps', 51200, 'Environment steps of each run.')
flags.DEFINE_integer('warmup_steps', 10240, 'Iterations that end before this step are left out '
                     'of the steady speed.')
flags.DEFINE_integer('seed', 0, 'Seed of every run.')
FLAGS = flags.FLAGS

# The sides: their bindings on top of the config's.
SIDES = {'envpool': ("train.env_backend = 'envpool'",), 'gymnasium': ()}


def side_bindings(side, extra, steps):
    """The gin bindings of `side`'s runs: `extra`, the side's own, then the timing's."""
    return list(extra) + list(SIDES[side]) + progress_speed.ours_bindings(steps)


def format_report(runs):
    """The table of the pairs, the medians and the ratio envpool / gymnasium."""
    lines = ['pair  envpool steady/s (train clock)  gymnasium steady/s (train clock)  '
             'envpool/gymnasium (train clock)  loads']
    ratios, train_ratios = [], []
    for pair in sorted({run['pair'] for run in runs}):
        sides = {run['side']: run for run in runs if run['pair'] == pair}
        envpool, gymnasium = sides.get('envpool'), sides.get('gymnasium')
        ratio = _ratio(envpool, gymnasium, 'wall')
        train_ratio = _ratio(envpool, gymnasium, 'train')
        ratios.append(ratio)
        train_ratios.append(train_ratio)
        lines.append(f'{pair:4d}  {_speeds(envpool):>30}  {_speeds(gymnasium):>32}  '
                     f'{_number(ratio, 2):>15} ({_number(train_ratio, 2)})  '
                     + ', '.join(f'{run["load_before"]:.1f}' for run in sides.values()))
    for side in SIDES:
        lines.append(f'median {side}: '
                     f'{progress_speed.spread([r["wall"] for r in runs if r["side"] == side], 0)}'
                     ' steps/s (training clock '
                     f'{progress_speed.spread([r["train"] for r in runs if r["side"] == side], 0)}'
                     ')')
    lines.append(f'envpool/gymnasium: {progress_speed.spread(ratios)} by the wall clock, '
                 f'{progress_speed.spread(train_ratios)} by the training clock (median of the '
                 'pairs\' ratios, min to max)')
    return '\n'.join(lines)


def _ratio(numerator, denominator, key):
    if not numerator or not denominator or not numerator[key] or not denominator[key]:
        return None
    return numerator[key] / denominator[key]


def _speeds(run):
    return '-' if run is None else f'{_number(run["wall"])} ({_number(run["train"])})'


def _number(value, digits=0):
    return '-' if value is None else f'{value:,.{digits}f}'


def main(argv):
    progress_speed.check_flags(argv, FLAGS, progress_speed.TRAIN_THROUGHPUT_ONLY + (
        'peers_python',))
    if FLAGS.pairs < 1 or FLAGS.steps < 1 or FLAGS.warmup_steps < 0:
        raise app.UsageError('--pairs and --steps must be positive, --warmup_steps >= 0')
    gin_files = [run_config.find_gin_file(FLAGS.gin_file)]
    workdir = FLAGS.workdir or tempfile.mkdtemp(prefix='envpool_training-')
    env = dict(os.environ, PYTHONPATH=run_config.PACKAGE_ROOT)
    runs = []
    for pair in range(FLAGS.pairs):
        for side in SIDES:
            logdir = os.path.join(workdir, f'pair{pair}-{side}')
            command = train_throughput.ours_command(
                gin_files, side_bindings(side, FLAGS.gin_bindings, FLAGS.steps), logdir,
                FLAGS.seed)
            monitored = train_throughput.run_monitored(command, logdir, env, FLAGS.poll_secs,
                                                       cwd=run_config.PACKAGE_ROOT)
            monitored.pop('evals')
            with open(logdir + '.log', encoding='utf-8') as f:
                speeds = progress_speed.ours_speeds(f.read(), FLAGS.warmup_steps)
            run = dict(monitored, **speeds, side=side, pair=pair, logdir=logdir)
            runs.append(run)
            print(f'pair {pair} {side}: steady {_speeds(run)} steps/s, {run["wall_s"]:.0f} s '
                  f'launch to exit, peak PSS {run["peak_pss_mb"]:.0f} MB, CPU '
                  f'{run["cpu_s"]:.0f} s, load {run["load_before"]:.1f}', flush=True)
    print(format_report(runs))
    print(f'{progress_speed.now()}; load average (1 min) at the runs\' starts '
          f'{min(run["load_before"] for run in runs):.1f} to '
          f'{max(run["load_before"] for run in runs):.1f} on {os.cpu_count()} CPUs')
    if FLAGS.output_json:
        with open(FLAGS.output_json, 'w', encoding='utf-8') as f:
            json.dump({'runs': runs}, f, indent=1)


if __name__ == '__main__':
    app.run(main)
