r"""A population of agents in one program against one agent alone and against JAX's vmap.

Runs, round by round (so that the machine's drift hits every system alike):

  population   BatchPPO with `train.population = K` on configs/pendulum_native.gin (XLA);
  lone         BatchPPO on configs/pendulum_native.gin, one seed (its defaults: no XLA);
  rejax        rejax PPO (PureJaxRL-style, on gymnax Pendulum), K seeds under `jax.vmap` in one
               program (benchmarks/rejax_runner.py --num_seeds=K), with the same settings;
  population_baseline, lone_baseline
               the first two with the trainer of another checkout (--baseline_tree), for a
               change that must not cost speed (or should gain it).

and prints, as medians over rounds: aggregate steady env steps/s (all members together; ours:
between the first and the last evaluation by the training clock, rejax: its one compiled call),
launch-to-exit seconds, how many members reached a return of -200 (ours: at any evaluation;
rejax: at its one, final evaluation) and the members' median final return; then the ratios
population / lone, population / rejax and each system / its baseline per round (median [min,
max]).

    bazel run //benchmarks:population_throughput -- --population=8 --rounds=3
"""

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from absl import app, flags

from benchmarks import train_throughput

flags.DEFINE_integer('population', 8, 'Members of the population (and seeds of rejax\'s vmap).',
                     lower_bound=2)
flags.DEFINE_integer('rounds', 3, 'Rounds of the systems, alternated; medians are reported.',
                     lower_bound=1)
flags.DEFINE_list('population_systems', ['population', 'lone', 'rejax'], 'Systems to run, in this '
                  'order each round: population, lone, rejax, population_baseline, '
                  'lone_baseline (train_throughput has --systems).')
# --output_json, --workdir, --peers_python and --baseline_tree are train_throughput's flags.
FLAGS = flags.FLAGS

CONFIG = 'configs/pendulum_native.gin'
BUDGET = 150_000
THRESHOLD = -200.0
SYSTEMS = ('population', 'lone', 'rejax', 'population_baseline', 'lone_baseline')
RATIOS = (('population', 'lone'), ('population', 'rejax'),
          ('population', 'population_baseline'), ('lone', 'lone_baseline'))


def read_evaluations(logdir):
    with open(os.path.join(logdir, 'metrics.jsonl'), encoding='utf-8') as f:
        return [json.loads(line) for line in f if line.strip()]


def run_summary(evaluations):
    """Steady steps/s by the training clock (first to last evaluation), the training seconds
    to THRESHOLD (None if never reached) and the final return of one run directory."""
    seconds = [record['step'] / record['env_steps_per_sec'] for record in evaluations]
    first, last = evaluations[0], evaluations[-1]
    reached = [time for time, record in zip(seconds, evaluations, strict=True)
               if record['mean_return'] is not None and record['mean_return'] >= THRESHOLD]
    return {'steady_sps': (last['step'] - first['step']) / (seconds[-1] - seconds[0]),
            'to_threshold_s': reached[0] if reached else None,
            'final_return': last['mean_return']}


def run_ours(workdir, name, seed, bindings, tree=train_throughput.run_config.PACKAGE_ROOT):
    logdir = os.path.join(workdir, name)
    command = train_throughput.ours_command(
        [os.path.join(train_throughput.run_config.PACKAGE_ROOT, CONFIG)],
        [f'train.total_steps = {BUDGET}', *bindings], logdir, seed, tree=tree)
    env = dict(os.environ, PYTHONPATH=tree)
    # `python -m` imports from its working directory first: each tree runs in its own.
    return logdir, timed(command, logdir, env, cwd=tree)


def timed(command, logdir, env, cwd=None):
    began = time.monotonic()
    with open(logdir + '.log', 'w', encoding='utf-8') as log:
        result = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, env=env,
                                check=False, cwd=cwd)
    wall = time.monotonic() - began
    if result.returncode:
        with open(logdir + '.log', encoding='utf-8') as f:
            tail = ''.join(f.readlines()[-15:])
        raise RuntimeError(f'{" ".join(command[:4])} ... failed ({result.returncode}):\n{tail}')
    return wall


def run_system(system, workdir, round_index, population, peers_python, settings):
    name = f'{system}-{round_index}'
    tree = train_throughput.run_config.PACKAGE_ROOT
    if system.endswith('_baseline'):
        system, tree = system[:-len('_baseline')], FLAGS.baseline_tree
    if system == 'population':
        logdir, wall = run_ours(workdir, name, round_index * population,
                                [f'train.population = {population}'], tree)
        members = [run_summary(read_evaluations(os.path.join(logdir, f'member-{index}')))
                   for index in range(population)]
        # The members share one program: each member's clock is the population's.
        return {'wall_s': wall, 'aggregate_sps': population * members[0]['steady_sps'],
                'finals': [member['final_return'] for member in members],
                'reached': sum(member['to_threshold_s'] is not None for member in members),
                'to_threshold_s': [member['to_threshold_s'] for member in members]}
    if system == 'lone':
        logdir, wall = run_ours(workdir, name, round_index, [], tree)
        summary = run_summary(read_evaluations(logdir))
        return {'wall_s': wall, 'aggregate_sps': summary['steady_sps'],
                'finals': [summary['final_return']],
                'reached': int(summary['to_threshold_s'] is not None),
                'to_threshold_s': [summary['to_threshold_s']]}
    logdir = os.path.join(workdir, name)
    command = train_throughput.rejax_command(peers_python, settings, logdir, round_index) + [
        f'--num_seeds={population}']
    os.makedirs(logdir)
    wall = timed(command, logdir, {key: value for key, value in os.environ.items()
                                   if key != 'PYTHONPATH'})
    (record,) = read_evaluations(logdir)
    finals = record['member_returns']
    return {'wall_s': wall, 'aggregate_sps': record['env_steps_per_sec'], 'finals': finals,
            'reached': sum(value >= THRESHOLD for value in finals),
            'compile_s': record['compile_s']}


def summarize(runs, systems, population):
    rows = {}
    for system in systems:
        mine = [run for run in runs if run['system'] == system]
        rows[system] = {
            'aggregate_sps': statistics.median(run['aggregate_sps'] for run in mine),
            'wall_s': statistics.median(run['wall_s'] for run in mine),
            'reached': [run['reached'] for run in mine],
            'members': 1 if system.startswith('lone') else population,
            'final_return': statistics.median(value for run in mine for value in run['finals']),
        }
    ratios = {}
    for numerator, denominator in RATIOS:
        if numerator in systems and denominator in systems:
            paired = [top['aggregate_sps'] / bottom['aggregate_sps'] for top, bottom in zip(
                [run for run in runs if run['system'] == numerator],
                [run for run in runs if run['system'] == denominator], strict=True)]
            ratios[f'{numerator}/{denominator}'] = {
                'median': statistics.median(paired), 'min': min(paired), 'max': max(paired)}
    return {'systems': rows, 'ratios': ratios}


def format_table(summary):
    lines = ['| system | members | aggregate steady env steps/s | launch to exit (s) | '
             f'members reaching {THRESHOLD:.0f}, per round | median final return |',
             '| --- | ---: | ---: | ---: | --- | ---: |']
    for system, row in summary['systems'].items():
        lines.append(f'| {system} | {row["members"]} | {row["aggregate_sps"]:,.0f} | '
                     f'{row["wall_s"]:.1f} | {row["reached"]} | {row["final_return"]:.1f} |')
    for name, ratio in summary['ratios'].items():
        lines.append(f'\n{name} (aggregate steady steps/s, paired by round): '
                     f'{ratio["median"]:.2f} [{ratio["min"]:.2f}, {ratio["max"]:.2f}]')
    return '\n'.join(lines)


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f'Unexpected arguments: {" ".join(argv[1:])}')
    unknown = sorted(set(FLAGS.population_systems) - set(SYSTEMS))
    if unknown:
        raise app.UsageError(f'Unknown systems: {", ".join(unknown)} (known: '
                             f'{", ".join(SYSTEMS)})')
    baselines = [system for system in FLAGS.population_systems if system.endswith('_baseline')]
    if baselines and not FLAGS.baseline_tree:
        raise app.UsageError(f'{", ".join(baselines)} need --baseline_tree')
    if FLAGS.baseline_tree and not os.path.isdir(
            os.path.join(FLAGS.baseline_tree, 'agents', 'scripts')):
        raise app.UsageError(f'--baseline_tree={FLAGS.baseline_tree} is not a checkout of this '
                             'project (no agents/scripts in it)')
    workdir = FLAGS.workdir or tempfile.mkdtemp(prefix='population-throughput-')
    os.makedirs(workdir, exist_ok=True)
    task = train_throughput.TASKS['pendulum_native']
    settings, _, _ = train_throughput.shared_settings(task, BUDGET)
    peers_python = train_throughput.peers_python() if 'rejax' in FLAGS.population_systems else None
    runs = []
    for round_index in range(FLAGS.rounds):
        for system in FLAGS.population_systems:
            print(f'round {round_index}: {system} ...', flush=True)
            run = run_system(system, workdir, round_index, FLAGS.population, peers_python,
                             settings)
            run.update(system=system, round=round_index)
            print(f'  {run["aggregate_sps"]:,.0f} steps/s, {run["wall_s"]:.1f} s, reached '
                  f'{run["reached"]}', flush=True)
            runs.append(run)
    summary = summarize(runs, FLAGS.population_systems, FLAGS.population)
    print(format_table(summary))
    if FLAGS.output_json:
        with open(FLAGS.output_json, 'w', encoding='utf-8') as f:
            json.dump({'runs': runs, 'summary': summary, 'workdir': workdir}, f, indent=1)


if __name__ == '__main__':
    sys.exit(app.run(main))
