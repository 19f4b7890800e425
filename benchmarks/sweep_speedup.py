r"""A sweep on Beam's DirectRunner with N workers against the same trials one after another.

Both sides run every trial of the spec with the trainer binary in fresh output directories:
  sequential  trial.run for each trial in turn, in this process (no Beam); each trainer has the
              whole machine (TensorFlow picks its threads);
  sweep       the sweep binary (`python -m pipelines.sweep --direct_num_workers=N`), launch to
              exit: spec checks, Beam's workers, N trials at a time, outputs written.
Printed: both wall times (medians over --repeats, the two sides alternating), the mean trial
wall time on each side, the ratio sweep / sequential, and the load average around each run.

    bazel run //benchmarks:sweep_speedup -- --spec=configs/sweeps/pendulum.yaml --workers=2
"""

import os
import statistics
import tempfile
import time

from absl import app, flags

from agents.storage import locations
from benchmarks import sweep_runs
from pipelines.sweep import sweep_spec, trial

flags.DEFINE_string('spec', 'configs/sweeps/pendulum.yaml', 'The sweep spec to run.')
flags.DEFINE_integer('workers', 2, 'DirectRunner workers of the sweep.')
flags.DEFINE_integer('repeats', 1, 'Measurements per side; medians are reported.')
flags.DEFINE_string('workdir', None, 'Where the runs go (default: a new temporary directory).')

FLAGS = flags.FLAGS


def load_average():
    return '/'.join(f'{value:.2f}' for value in os.getloadavg())


def run_sequential(spec, output_dir):
    settings = trial.Settings(
        output_dir=output_dir, gin_files=spec.gin_files, env_steps=spec.env_steps,
        timeout_s=spec.timeout_s, caller_directory=locations.caller_directory())
    began = time.time()
    records = [trial.run(item, settings) for item in spec.trials()]
    return time.time() - began, records


def check(records, side):
    failed = [record['id'] for record in records if record['status'] != 'ok']
    if failed:
        raise RuntimeError(f'{side}: trials failed: {failed}')


def main(argv):
    del argv
    spec_path = sweep_spec.find(FLAGS.spec)
    spec = sweep_spec.load(spec_path, name=FLAGS.spec)
    workdir = FLAGS.workdir or tempfile.mkdtemp(prefix='sweep_speedup-')
    print(f'{FLAGS.spec}: {len(spec.trials())} trials of {spec.env_steps} env steps; '
          f'{os.cpu_count()} cores; sweep with {FLAGS.workers} workers; runs in {workdir}')
    times = {'sequential': [], 'sweep': []}
    trial_times = {'sequential': [], 'sweep': []}
    for repeat in range(FLAGS.repeats):
        order = ('sequential', 'sweep') if repeat % 2 == 0 else ('sweep', 'sequential')
        for side in order:
            output_dir = os.path.join(workdir, f'{side}-{repeat}')
            before = load_average()
            if side == 'sequential':
                wall_time, records = run_sequential(spec, output_dir)
            else:
                wall_time, records, _ = sweep_runs.run_sweep(spec_path, output_dir,
                                                             FLAGS.workers)
            check(records, side)
            times[side].append(wall_time)
            trial_times[side].append(statistics.mean(r['wall_time_s'] for r in records))
            print(f'repeat {repeat} {side:10s} {wall_time:7.1f} s  (mean trial '
                  f'{trial_times[side][-1]:.1f} s; load average {before} before, '
                  f'{load_average()} after)', flush=True)
    sequential = statistics.median(times['sequential'])
    parallel = statistics.median(times['sweep'])
    print()
    print(f'{"":28s} {"wall (s)":>9s} {"mean trial (s)":>15s}')
    print(f'{"one after another":28s} {sequential:9.1f} '
          f'{statistics.median(trial_times["sequential"]):15.1f}')
    print(f'{f"sweep, {FLAGS.workers} workers":28s} {parallel:9.1f} '
          f'{statistics.median(trial_times["sweep"]):15.1f}')
    print(f'ratio sweep / one after another: {parallel / sequential:.2f} '
          f'(medians of {FLAGS.repeats}; target <= 0.65)')


if __name__ == '__main__':
    app.run(main)
