r"""What a sweep's search strategy costs and what it finds: full search, halving, TPE + halving.

One search space (a spec with `random` and a successive-halving `scheduler`, by default
configs/sweeps/pendulum_halving.yaml) is searched three ways with the sweep binary, each in its
own output directory:
  full         every configuration of the spec's random draw, every seed, the full budget
               (the spec without its scheduler);
  halving      the spec as it is: the same configurations, successive halving;
  tpe_halving  Optuna's TPE proposing as many configurations from the same distributions,
               `--parallel` at a time, each batch halved by the same scheduler before the
               next is asked; TPE proposes at random in the first batch and models the
               outcomes told from the second on (search.startup_trials = --parallel). With
               --parallel η**K (9 for the spec's three rungs), the batches together cost what
               halving the same number of configurations at once does.
For each: the env steps trained (the sum over trials of the step each reached: a continued
trial counts its steps once), the wall time, and the configuration it picked (its summary.csv's
first row: the best of those that reached the full budget). Each pick is then retrained to the
full budget on fresh seeds (`--retrain_seeds`, the same for every pick), and its mean return
there is compared with the 95% Student-t interval of the full search's pick on those seeds.

    PYTHONPATH=. .venv/bin/python -m benchmarks.sweep_efficiency --workdir=/tmp/sweep_efficiency

Rerunning with the same --workdir resumes every sweep where it stopped.
"""

import csv
import json
import math
import os
import statistics

import yaml
from absl import app, flags

from agents.runs import run_config
from benchmarks import sweep_runs
from pipelines.sweep import sweep_spec

flags.DEFINE_string('spec', 'configs/sweeps/pendulum_halving.yaml',
                    'A sweep spec with `random` and a `scheduler`.')
flags.DEFINE_string('workdir', '/tmp/sweep_efficiency', 'Where the sweeps go; reused (resumed).')
flags.DEFINE_integer('workers', 2, 'DirectRunner workers of each sweep.')
flags.DEFINE_integer('parallel', 9, 'Configurations TPE proposes at a time (a bracket).')
flags.DEFINE_list('retrain_seeds', ['1000', '1001', '1002', '1003', '1004'],
                  'Fresh seeds every picked configuration is retrained with.')
flags.DEFINE_list('methods', ['full', 'halving', 'tpe_halving'], 'Which searches to run.')

FLAGS = flags.FLAGS

METHODS = ('full', 'halving', 'tpe_halving')
# Two-sided 95% quantiles of Student's t distribution by degrees of freedom.
T_975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306,
         9: 2.262, 10: 2.228, 15: 2.131, 20: 2.086, 30: 2.042}


def method_spec(document, method, parallel):
    """The spec document of `method` from the base spec's document (random + scheduler)."""
    document = json.loads(json.dumps(document))  # A deep copy.
    if 'random' not in document or 'scheduler' not in document:
        raise ValueError('the spec needs `random` (the configurations) and a `scheduler`')
    if method == 'full':
        del document['scheduler']
    elif method == 'tpe_halving':
        draw = document.pop('random')
        document['search'] = {
            'sampler': 'tpe', 'num_trials': draw['num_samples'], 'parallel': parallel,
            'seed': draw.get('seed', 0), 'startup_trials': parallel,
            'parameters': draw['parameters'],
            'metric': document['scheduler'].get('metric', sweep_spec.DEFAULT_METRIC),
            'mode': document['scheduler'].get('mode', sweep_spec.DEFAULT_MODE)}
    elif method != 'halving':
        raise ValueError(f'unknown method {method!r}; expected one of {", ".join(METHODS)}')
    return document


def retrain_spec(document, bindings, seeds):
    """The spec document that trains `bindings` to the full budget with `seeds`."""
    return {'gin_files': document['gin_files'],
            'bindings': {**(document.get('bindings') or {}), **bindings},
            'budget': document['budget'], 'seeds': [int(seed) for seed in seeds]}


def env_steps_spent(records):
    """Env steps a sweep trained: each trial's last step (a continued trial counts once)."""
    return sum(record.get('env_steps') or 0 for record in records)


def pick(output_dir):
    """(config id, bindings) of the first row of a sweep's summary.csv."""
    with open(os.path.join(output_dir, 'summary.csv')) as f:
        first = next(csv.DictReader(f))
    records = read_trials(output_dir)
    bindings = next(r['bindings'] for r in records if r['config_id'] == first['config_id'])
    return first['config_id'], bindings


def read_trials(output_dir):
    with open(os.path.join(output_dir, 'trials.jsonl')) as f:
        return [json.loads(line) for line in f if line.strip()]


def t_interval(values):
    """(mean, low, high): the 95% Student-t interval of the mean of `values`."""
    mean = statistics.mean(values)
    if len(values) < 2:
        return mean, -math.inf, math.inf
    df = len(values) - 1
    t = T_975[max(key for key in T_975 if key <= df)]
    half = t * statistics.stdev(values) / math.sqrt(len(values))
    return mean, mean - half, mean + half


def run_sweep(document, directory, workers):
    """Runs the sweep binary on `document` in `directory`; returns (wall seconds, records)."""
    os.makedirs(directory, exist_ok=True)
    spec_path = os.path.join(directory, 'spec.yaml')
    with open(spec_path, 'w') as f:
        yaml.safe_dump(document, f, sort_keys=False)
    output_dir = os.path.join(directory, 'out')
    wall_time, _, _ = sweep_runs.run_sweep(
        spec_path, output_dir, workers, caller_directory=run_config.PACKAGE_ROOT,
        log_path=os.path.join(directory, 'sweep.log'))
    return wall_time, read_trials(output_dir)


def wall_time_of(directory, measured):
    """The wall time of a sweep: measured now, or as stored by an earlier, complete run."""
    path = os.path.join(directory, 'wall_time.json')
    if measured is not None:
        with open(path, 'w') as f:
            json.dump({'wall_time_s': measured}, f)
        return measured
    with open(path) as f:
        return json.load(f)['wall_time_s']


def table(rows, full_interval):
    """The printed comparison; `rows`: one dict per method."""
    full_steps = next((row['env_steps'] for row in rows if row['method'] == 'full'), None)
    lines = [f'{"method":12s} {"env steps":>11s} {"of full":>8s} {"wall":>9s} {"picked":>9s} '
             f'{"return on fresh seeds (95% t-interval)":>40s}']
    for row in rows:
        mean, low, high = row['retrained']
        share = f'{row["env_steps"] / full_steps:8.2f}' if full_steps else f'{"-":>8s}'
        lines.append(f'{row["method"]:12s} {row["env_steps"]:11,d} {share} '
                     f'{row["wall_time_s"] / 60:8.1f}m {row["config_id"]:>9s} '
                     f'{mean:12.1f} [{low:8.1f}, {high:8.1f}]')
    if full_interval is not None:
        _, low, high = full_interval
        for row in rows:
            if row['method'] == 'full':
                continue
            mean = row['retrained'][0]
            verdict = 'above' if mean > high else 'within' if mean >= low else 'below'
            steps = (f'{row["env_steps"] / full_steps:.2f} of its env steps'
                     if full_steps else '')
            lines.append(f'{row["method"]}: mean {mean:.1f} is {verdict} the full search\'s '
                         f'interval [{low:.1f}, {high:.1f}]; {steps}')
    return '\n'.join(lines)


def main(argv):
    del argv
    spec_path = sweep_spec.find(FLAGS.spec)
    sweep_spec.load(spec_path, name=FLAGS.spec)  # Checked before anything trains.
    with open(spec_path) as f:
        document = sweep_spec.document(f.read(), spec_path)
    os.makedirs(FLAGS.workdir, exist_ok=True)
    print(f'{FLAGS.spec}: {os.cpu_count()} cores, {FLAGS.workers} workers; in {FLAGS.workdir}',
          flush=True)
    rows, retrained = [], {}
    for method in FLAGS.methods:
        directory = os.path.join(FLAGS.workdir, method)
        done = os.path.exists(os.path.join(directory, 'wall_time.json'))
        measured, records = (None, read_trials(os.path.join(directory, 'out'))) if done else (
            run_sweep(method_spec(document, method, FLAGS.parallel), directory, FLAGS.workers))
        wall_time = wall_time_of(directory, measured)
        config_id, bindings = pick(os.path.join(directory, 'out'))
        print(f'{method}: {env_steps_spent(records):,d} env steps in {wall_time:.0f} s; picked '
              f'{config_id} {json.dumps(bindings)}', flush=True)
        if config_id not in retrained:
            _, fresh = run_sweep(retrain_spec(document, bindings, FLAGS.retrain_seeds),
                                 os.path.join(FLAGS.workdir, f'retrain-{config_id}'),
                                 FLAGS.workers)
            retrained[config_id] = t_interval([r['final_return'] for r in fresh])
        rows.append({'method': method, 'env_steps': env_steps_spent(records),
                     'wall_time_s': wall_time, 'config_id': config_id,
                     'retrained': retrained[config_id]})
    full = next((row['retrained'] for row in rows if row['method'] == 'full'), None)
    print()
    print(table(rows, full))


if __name__ == '__main__':
    app.run(main)
