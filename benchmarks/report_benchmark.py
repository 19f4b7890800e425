r"""How long //pipelines:report takes on a large synthetic sweep, without videos.

    bazel run //benchmarks:report_benchmark -- --runs=200 --points=3000

Writes `--runs` synthetic runs (`--seeds` seeds per configuration), each with `--points`
evaluations in metrics.jsonl and TensorBoard events (evaluation and training returns) and its
operative_config.gin, then times the report pipeline on them (default bootstrap settings) in
Beam's DirectRunner in this process and in `--workers` worker processes (the default mode).
Prints the median of `--repeats` timings of each and the load average, since other work on the
machine slows it.
"""

import json
import os
import shutil
import statistics
import tempfile
import time

import numpy as np
from absl import app, flags

flags.DEFINE_integer('runs', 200, 'Synthetic runs.')
flags.DEFINE_integer('seeds', 4, 'Runs per configuration.')
flags.DEFINE_integer('points', 3000, 'Evaluations per run.')
flags.DEFINE_integer('repeats', 3, 'Timings per runner mode; the median is reported.')
flags.DEFINE_integer('workers', os.cpu_count() or 1, 'Worker processes of the default mode.')
flags.DEFINE_string('workdir', None, 'Where to write the runs (kept, and reused when run again); '
                    'default a temporary directory, removed at the end.')

FLAGS = flags.FLAGS


def write_run(logdir, config_index, seed, points, rng):
    """A run like the trainer's: gin bindings, metrics.jsonl, TF2 scalar events."""
    import tensorflow as tf
    from tensorboard.compat.proto import event_pb2, summary_pb2, tensor_pb2, types_pb2

    os.makedirs(logdir)
    learning_rate = 1e-4 * (1 + config_index % 10)
    clip = 0.1 + 0.05 * (config_index // 10)
    with open(os.path.join(logdir, 'operative_config.gin'), 'w') as f:
        f.write(f"PPO.clip_ratio = {clip!r}\nPPO.learning_rate = {learning_rate!r}\n"
                f"train.env_id = 'Pendulum-v1'\ntrain.seed = {seed}\n")
    steps = np.arange(1, points + 1) * 1000
    skill = -1200 + 1000 * (1 - np.exp(-steps / (steps[-1] / 3))) * (0.5 + 0.05 * config_index
                                                                      % 10)
    returns = skill + rng.normal(0, 30, points)
    with open(os.path.join(logdir, 'metrics.jsonl'), 'w') as f:
        for step, value in zip(steps, returns, strict=True):
            f.write(json.dumps({'step': int(step), 'mean_return': float(value),
                                'std_return': 0.0, 'episodes': 10}) + '\n')
    metadata = summary_pb2.SummaryMetadata(
        plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name='scalars'))
    path = os.path.join(logdir, f'events.out.tfevents.{seed}.benchmark.v2')
    with tf.io.TFRecordWriter(path) as writer:
        for step, value in zip(steps, returns, strict=True):
            for tag, number in (('train/episode_return', value - 40), ('eval/mean_return',
                                                                       value)):
                # Encoded as TF2's tf.summary.scalar writes it (see run_reader._scalar).
                tensor = tensor_pb2.TensorProto(dtype=types_pb2.DT_FLOAT,
                                                tensor_content=np.float32(number).tobytes())
                event = event_pb2.Event(step=int(step), wall_time=float(step), summary=(
                    summary_pb2.Summary(value=[summary_pb2.Summary.Value(
                        tag=tag, tensor=tensor, metadata=metadata)])))
                writer.write(event.SerializeToString())


def time_report(input_dir, beam_args):
    from pipelines.report import report, report_data

    output = tempfile.mkdtemp()
    settings = report_data.Settings(input_dir=input_dir, output_dir=os.path.join(output, 'r'),
                                    videos=False)
    try:
        started = time.perf_counter()
        result = report.make_report(settings, report.pipeline_options(beam_args))
        elapsed = time.perf_counter() - started
    finally:
        shutil.rmtree(output)
    assert result['num_runs'] == FLAGS.runs, result['num_runs']
    return elapsed


def main(argv):
    del argv
    workdir = FLAGS.workdir or tempfile.mkdtemp(prefix='report-benchmark-')
    try:
        run_benchmark(os.path.join(workdir, 'runs'))
    finally:
        if not FLAGS.workdir:
            shutil.rmtree(workdir)


def run_benchmark(input_dir):
    if not os.path.isdir(input_dir):
        rng = np.random.default_rng(0)
        started = time.perf_counter()
        for index in range(FLAGS.runs):
            write_run(os.path.join(input_dir, f'run-{index:04d}'), index // FLAGS.seeds,
                      index % FLAGS.seeds, FLAGS.points, rng)
        print(f'Wrote {FLAGS.runs} runs x {FLAGS.points} evaluations in '
              f'{time.perf_counter() - started:.1f} s to {input_dir}')
    modes = {
        'in this process': ['--direct_running_mode=in_memory'],
        f'{FLAGS.workers} worker processes': [f'--direct_num_workers={FLAGS.workers}'],
    }
    print(f'{"runner":<28} {"median s":>9}  all (s)  load average before each')
    for name, beam_args in modes.items():
        timings, loads = [], []
        for _ in range(FLAGS.repeats):
            loads.append(os.getloadavg()[0])
            timings.append(time_report(input_dir, beam_args))
        print(f'{name:<28} {statistics.median(timings):9.1f}  '
              f'{" ".join(f"{t:.1f}" for t in timings)}  '
              f'{" ".join(f"{load:.2f}" for load in loads)}')


if __name__ == '__main__':
    app.run(main)
