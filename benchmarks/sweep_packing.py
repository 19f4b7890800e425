r"""A sweep whose trials are packed into populations against the same sweep trained trial by trial.

Both sides run the sweep binary on the same spec (`python -m pipelines.sweep
--direct_num_workers=N`) into fresh output directories, launch to exit: packed as the spec says
(by default, where the trainer can) and with `populations: {pack: false}` added. Printed per
run and as medians over --repeats (the sides alternating): wall time, the ratio alone / packed
with its spread over the pairs, and each configuration's mean final return on both sides (the
same trials, so a quality check, not a target).

    bazel run //benchmarks:sweep_packing -- --spec=configs/sweeps/pendulum_native.yaml
"""

import os
import statistics
import tempfile

from absl import app, flags

from benchmarks import sweep_runs
from pipelines.sweep import sweep_spec

flags.DEFINE_string('spec', 'configs/sweeps/pendulum_native.yaml', 'The sweep spec to run.')
flags.DEFINE_integer('workers', 2, 'DirectRunner workers of both sweeps.')
flags.DEFINE_integer('repeats', 3, 'Measurements per side; medians are reported.')
flags.DEFINE_string('workdir', None, 'Where the runs go (default: a new temporary directory).')

FLAGS = flags.FLAGS
SIDES = ('packed', 'alone')


def run_sweep(spec_path, output_dir, workers):
    """(wall time, records, the populations line of the log) of one sweep, launch to exit."""
    wall_time, records, log = sweep_runs.run_sweep(spec_path, output_dir, workers)
    packed = [line.split('] ', 1)[-1].rstrip('.') for line in log.splitlines()
              if 'packed into' in line]
    return wall_time, records, packed[0] if packed else 'no population'


def finals(records):
    """{config id: mean final return over its seeds}."""
    by_config = {}
    for record in records:
        by_config.setdefault(record['config_id'], []).append(record['final_return'])
    return {config_id: statistics.mean(values) for config_id, values in by_config.items()}


def main(argv):
    del argv
    spec_path = sweep_spec.find(FLAGS.spec)
    spec = sweep_spec.load(spec_path, name=FLAGS.spec)
    workdir = FLAGS.workdir or tempfile.mkdtemp(prefix='sweep_packing-')
    os.makedirs(workdir, exist_ok=True)
    with open(spec_path) as f:
        text = f.read()
    alone_path = os.path.join(workdir, 'alone.yaml')
    with open(alone_path, 'w') as f:
        f.write(text.rstrip('\n') + '\npopulations: {pack: false}\n')
    # Relative gin files are the caller's: the copy names them as the original does.
    print(f'{FLAGS.spec}: {len(spec.trials())} trials of {spec.env_steps} env steps; '
          f'{os.cpu_count()} cores; {FLAGS.workers} workers; runs in {workdir}')
    times = {side: [] for side in SIDES}
    returns = {side: [] for side in SIDES}
    for repeat in range(FLAGS.repeats):
        for side in SIDES if repeat % 2 == 0 else SIDES[::-1]:
            output_dir = os.path.join(workdir, f'{side}-{repeat}')
            wall_time, records, packed = run_sweep(
                spec_path if side == 'packed' else alone_path, output_dir, FLAGS.workers)
            failed = [record['id'] for record in records if record['status'] != 'ok']
            if failed:
                raise RuntimeError(f'{side}: trials failed: {failed}')
            times[side].append(wall_time)
            returns[side].append(finals(records))
            print(f'repeat {repeat} {side:6s} {wall_time:7.1f} s  ({packed}; load average '
                  f'{os.getloadavg()[0]:.2f})', flush=True)
    ratios = [alone / packed for alone, packed in zip(times['alone'], times['packed'],
                                                       strict=True)]
    print()
    print(f'{"":8s} {"wall (s), median":>17s}')
    for side in SIDES:
        print(f'{side:8s} {statistics.median(times[side]):17.1f}')
    print(f'speed-up alone / packed: {statistics.median(ratios):.2f} '
          f'[{min(ratios):.2f}, {max(ratios):.2f}] over {len(ratios)} pairs')
    print()
    print('mean final return per configuration (median over repeats): packed, alone')
    for config_id in returns['packed'][0]:
        values = [statistics.median(r[config_id] for r in returns[side]) for side in SIDES]
        print(f'  {config_id}  {values[0]:8.1f}  {values[1]:8.1f}')


if __name__ == '__main__':
    app.run(main)
