r"""Memory soak: does a long training run's resident memory keep growing after warm-up?

Issue 21 reported ~20 KB more RSS per Pendulum iteration (2,048 steps) on both backends; 10M
steps would then cost ~100 MB. For each backend this runs the real trainer binary
(`python -m agents.scripts.train`, the given gin files, default configs/pendulum.gin, with a
budget it never reaches), samples /proc/<pid>/status every --sample_secs (the trainer's VmRSS,
RssAnon, RssFile and threads; its descendants, the env workers of `train.env_mode = 'external'`,
summed separately), then stops it with SIGTERM (the trainer saves a checkpoint and exits) and
waits for it. The measured window (--minutes) starts once both --warmup_minutes and
--warmup_iterations have passed: imports, compilation and the allocator's first pools stay out.
Evaluations, checkpoints and policy exports run at the config's `eval_every_steps`, as in
users' runs, so the window holds their steady state too.

Printed per backend, over the window: steps and iterations covered, RSS at its start and end
(medians of the first and last minute, so one sample's allocator noise does not decide), the
least-squares slope in MB per minute and KB per iteration, the growth that slope makes over 10
minutes, and the verdict against --target_mb (growth over 10 minutes, by the slope and by the
end-start difference). The slope of the window's second half tells a growth that levels off
(allocator pools filling up) from a linear one (a leak).

Backends (--backends): gymnasium (`train.env_backend = 'gymnasium'`, pendulum.gin's in-process
envs), native (`'native'`), gymnasium_external (Gymnasium envs in worker processes). The trainer
inherits the environment, PYTHONPATH included (after the package's root): e.g. MALLOC_ARENA_MAX=2
separates allocator growth from a leak. What grew in issue 21: benchmarks/README.md.

    PYTHONPATH=. .venv/bin/python -m benchmarks.memory_soak --minutes=10 --warmup_minutes=2
    bazel run //benchmarks:memory_soak -- --backends=native --minutes=3
"""

import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time

import psutil
from absl import app, flags

from agents.runs import run_config, run_dir

BACKENDS = {
    'gymnasium': ("train.env_backend = 'gymnasium'",),
    'native': ("train.env_backend = 'native'",),
    'gymnasium_external': ("train.env_backend = 'gymnasium'", "train.env_mode = 'external'"),
}

flags.DEFINE_float('minutes', 10.0, 'Length of the measured window per backend, after warm-up.')
flags.DEFINE_float('warmup_minutes', 2.0, 'Minutes from launch left out of the fit (imports, '
                   'compilation, the first evaluations, allocator pools filling).')
flags.DEFINE_integer('warmup_iterations', 100, 'Iterations the run must also have done before '
                     'the window starts (a loaded machine compiles slowly).')
flags.DEFINE_list('backends', ['gymnasium', 'native'], f'Backends, run one after another: '
                  f'{", ".join(BACKENDS)}.')
flags.DEFINE_multi_string('gin_file', ['configs/pendulum.gin'], 'Gin files of the runs.')
flags.DEFINE_multi_string('gin_bindings', [], 'Bindings added after the backend\'s.')
flags.DEFINE_integer('total_steps', 10**12, 'Budget of the runs: more than a soak reaches.')
flags.DEFINE_float('sample_secs', 5.0, 'Interval of the RSS samples.')
flags.DEFINE_float('target_mb', 5.0, 'Target: growth over 10 minutes below this many MB.')
flags.DEFINE_integer('seed', 0, 'Seed of the runs.')
flags.DEFINE_string('workdir', None, 'Where the runs log (default: a new temporary directory).')
flags.DEFINE_string('output_json', None, 'Writes every sample and the summaries to this file.')
FLAGS = flags.FLAGS

STATUS_FIELDS = ('VmRSS', 'RssAnon', 'RssFile', 'Threads')
STOP_TIMEOUT_SECS = 120.0


def read_status(pid):
    """The STATUS_FIELDS of /proc/<pid>/status (memory in MB); None if the process is gone."""
    values = {}
    try:
        with open(f'/proc/{pid}/status') as f:
            for line in f:
                name, _, rest = line.partition(':')
                if name in STATUS_FIELDS:
                    number = int(rest.split()[0])
                    values[name] = number if name == 'Threads' else number / 1024
    except (OSError, ValueError, IndexError):
        return None
    return values if 'VmRSS' in values else None  # A zombie has no memory lines.


def descendants(root):
    """Pids of `root`'s descendants (the env worker processes)."""
    try:
        return [child.pid for child in psutil.Process(root).children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


class StepReader:
    """The run's latest environment step, from its metrics.jsonl (each evaluation) and its
    progress lines ('step N/M', every train.log_every_secs)."""

    PROGRESS = re.compile(r'\] step (\d+)/')

    def __init__(self, logdir, log_path):
        self._paths = [os.path.join(logdir, 'metrics.jsonl'), log_path]
        self._offsets = [0, 0]
        self._pending = ['', '']
        self.step = 0
        self.evaluations = 0

    def poll(self):
        for index, path in enumerate(self._paths):
            if not os.path.exists(path):
                continue
            with open(path, encoding='utf-8', errors='replace') as f:
                f.seek(self._offsets[index])
                text = self._pending[index] + f.read()
                self._offsets[index] = f.tell()
            *lines, self._pending[index] = text.split('\n')
            for line in lines:
                if index == 0 and line.strip():
                    self.step = max(self.step, json.loads(line)['step'])
                    self.evaluations += 1
                elif index == 1 and (match := self.PROGRESS.search(line)):
                    self.step = max(self.step, int(match.group(1)))
        return self.step


def steps_per_iteration(logdir):
    """num_envs x rollout_length, from the operative config the trainer wrote."""
    with open(os.path.join(logdir, run_dir.OPERATIVE_CONFIG_FILE), encoding='utf-8') as f:
        text = f.read()
    values = {name: int(re.search(rf'^train\.{name} = (\d+)', text, re.M).group(1))
              for name in ('num_envs', 'rollout_length')}
    return values['num_envs'] * values['rollout_length']


def soak(backend, workdir):
    """Runs one backend's trainer for warm-up + window; returns its samples and exit status."""
    logdir = os.path.join(workdir, backend)
    log_path = logdir + '.log'
    if os.path.exists(logdir):
        raise FileExistsError(f'{logdir} exists (the trainer would resume it); give an empty '
                              '--workdir')
    bindings = list(BACKENDS[backend]) + list(FLAGS.gin_bindings) + [
        f'train.total_steps = {FLAGS.total_steps}']
    command = ([sys.executable, '-m', 'agents.scripts.train', f'--logdir={logdir}',
                f'--seed={FLAGS.seed}'] +
               [f'--gin_file={run_config.find_gin_file(path)}' for path in FLAGS.gin_file] +
               [f'--gin_bindings={binding}' for binding in bindings])
    # Ahead of the caller's PYTHONPATH, which stays (e.g. a sitecustomize for an experiment).
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        filter(None, [run_config.PACKAGE_ROOT, os.environ.get('PYTHONPATH')])))
    samples = []
    os.makedirs(workdir, exist_ok=True)
    load_before = os.getloadavg()[0]
    warmup_end = None  # Seconds from launch; known once both warm-up conditions hold.
    per_iteration = None
    with open(log_path, 'w') as log:
        start = time.monotonic()
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
        reader = StepReader(logdir, log_path)
        try:
            next_sample = start
            while warmup_end is None or time.monotonic() - start < warmup_end + FLAGS.minutes * 60:
                if process.poll() is not None:
                    raise RuntimeError(f'{backend}: the trainer ended early ({process.returncode})'
                                       f'; see {log_path}:\n{_tail(log_path)}')
                trainer = read_status(process.pid)
                workers = [status for status in map(read_status, descendants(process.pid))
                           if status]
                now = time.monotonic() - start
                sample = {'t': now, 'step': reader.poll(), 'evaluations': reader.evaluations,
                          'workers': len(workers),
                          'workers_rss': sum(status['VmRSS'] for status in workers)}
                sample.update(trainer or {})
                samples.append(sample)
                if per_iteration is None and sample['step']:
                    per_iteration = steps_per_iteration(logdir)
                if (warmup_end is None and now >= FLAGS.warmup_minutes * 60 and per_iteration
                        and sample['step'] >= FLAGS.warmup_iterations * per_iteration):
                    warmup_end = now
                next_sample += FLAGS.sample_secs
                time.sleep(max(0.0, next_sample - time.monotonic()))
        finally:
            returncode = stop(process)
    return {'backend': backend, 'logdir': logdir, 'samples': samples, 'returncode': returncode,
            'warmup_end_s': warmup_end, 'steps_per_iteration': per_iteration,
            'load_before': load_before,
            'load_after': os.getloadavg()[0]}


def stop(process):
    """SIGTERM (the trainer checkpoints and exits 143), then waits; SIGKILL if it hangs."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            return process.wait(STOP_TIMEOUT_SECS)
        except subprocess.TimeoutExpired:
            process.kill()
    return process.wait()


def _tail(path, lines=15):
    with open(path, errors='replace') as f:
        return ''.join(f.readlines()[-lines:])


def fit(times, values):
    """Least-squares slope of values over times."""
    mean_t, mean_v = statistics.fmean(times), statistics.fmean(values)
    spread = sum((t - mean_t) ** 2 for t in times)
    return sum((t - mean_t) * (v - mean_v) for t, v in zip(times, values, strict=True)) / spread


def summarize(run):
    """The window's figures (see the module docstring) for one backend's samples."""
    window = [s for s in run['samples'] if s['t'] >= run['warmup_end_s'] and 'VmRSS' in s]
    if len(window) < 4:
        raise RuntimeError(f'{run["backend"]}: only {len(window)} samples after warm-up')
    minutes = [s['t'] / 60 for s in window]
    span = minutes[-1] - minutes[0]
    edge = [s for s in window if s['t'] / 60 <= minutes[0] + min(1.0, span / 4)]
    tail = [s for s in window if s['t'] / 60 >= minutes[-1] - min(1.0, span / 4)]
    iterations = (window[-1]['step'] - window[0]['step']) / run['steps_per_iteration']
    iterations_per_minute = iterations / span
    summary = {'backend': run['backend'], 'window_min': span, 'warmup_min': minutes[0],
               'steps': [window[0]['step'], window[-1]['step']], 'iterations': iterations,
               'evaluations': window[-1]['evaluations'] - window[0]['evaluations'],
               'worker_processes': window[-1]['workers'],
               'load': [run['load_before'], run['load_after']], 'returncode': run['returncode']}
    series = {'trainer': [s['VmRSS'] for s in window], 'anon': [s['RssAnon'] for s in window],
              'file': [s['RssFile'] for s in window]}
    if summary['worker_processes']:
        series['workers'] = [s['workers_rss'] for s in window]
        series['total'] = [s['VmRSS'] + s['workers_rss'] for s in window]
    half = [index for index, t in enumerate(minutes) if t >= minutes[0] + span / 2]
    for name, values in series.items():
        slope = fit(minutes, values)
        summary[name] = {
            'start_mb': statistics.median(values[:len(edge)]),
            'end_mb': statistics.median(values[-len(tail):]),
            'slope_mb_per_min': slope,
            'slope_kb_per_iteration': (slope * 1024 / iterations_per_minute
                                       if iterations_per_minute else None),
            'second_half_mb_per_min': fit([minutes[i] for i in half], [values[i] for i in half]),
            'growth_per_10min_mb': slope * 10,
        }
        summary[name]['end_minus_start_mb'] = summary[name]['end_mb'] - summary[name]['start_mb']
    main = summary['total' if summary['worker_processes'] else 'trainer']
    growth = max(main['growth_per_10min_mb'], main['end_minus_start_mb'] * 10 / span)
    summary['threads'] = [window[0].get('Threads'), window[-1].get('Threads')]
    summary['met'] = growth < FLAGS.target_mb
    return summary


def format_summary(summary):
    lines = [f'{summary["backend"]}: window {summary["window_min"]:.1f} min after '
             f'{summary["warmup_min"]:.1f} min warm-up, steps {summary["steps"][0]:,} to '
             f'{summary["steps"][1]:,} ({summary["iterations"]:,.0f} iterations, '
             f'{summary["evaluations"]} evaluations), threads {summary["threads"][0]} -> '
             f'{summary["threads"][1]}, env workers {summary["worker_processes"]}, load '
             f'{summary["load"][0]:.1f} -> {summary["load"][1]:.1f}, exit {summary["returncode"]}']
    for name in ('trainer', 'anon', 'file', 'workers', 'total'):
        if name not in summary:
            continue
        row = summary[name]
        per_iteration = row['slope_kb_per_iteration']
        lines.append(
            f'  {name:8s} RSS {row["start_mb"]:8.1f} -> {row["end_mb"]:8.1f} MB '
            f'({row["end_minus_start_mb"]:+6.2f}) | slope {row["slope_mb_per_min"]:+7.3f} MB/min'
            f' = {"-" if per_iteration is None else f"{per_iteration:+6.2f}"} KB/iteration '
            f'(second half {row["second_half_mb_per_min"]:+7.3f} MB/min) | '
            f'{row["growth_per_10min_mb"]:+6.2f} MB per 10 min')
    lines.append(f'  target < {FLAGS.target_mb:g} MB per 10 min (by slope and by end - start): '
                 f'{"MET" if summary["met"] else "NOT MET"}')
    return '\n'.join(lines)


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f'Unexpected arguments: {" ".join(argv[1:])}')
    unknown = [backend for backend in FLAGS.backends if backend not in BACKENDS]
    if unknown:
        raise app.UsageError(f'Unknown backends {unknown}; known: {", ".join(BACKENDS)}')
    if FLAGS.minutes <= 0 or FLAGS.warmup_minutes < 0 or FLAGS.sample_secs <= 0:
        raise app.UsageError('--minutes and --sample_secs must be positive, --warmup_minutes '
                             'not negative')
    workdir = FLAGS.workdir or tempfile.mkdtemp(prefix='memory_soak-')
    malloc = {key: value for key, value in os.environ.items() if key.startswith('MALLOC_')}
    print(f'workdir {workdir}; {os.cpu_count()} CPUs; allocator settings {malloc or "default"}',
          flush=True)
    runs, summaries = [], []
    for backend in FLAGS.backends:
        run = soak(backend, workdir)
        runs.append(run)
        summaries.append(summarize(run))
        print(format_summary(summaries[-1]), flush=True)
    if FLAGS.output_json:
        with open(FLAGS.output_json, 'w', encoding='utf-8') as f:
            json.dump({'runs': runs, 'summaries': summaries, 'malloc': malloc,
                       'gin_file': FLAGS.gin_file, 'gin_bindings': FLAGS.gin_bindings,
                       'cpus': os.cpu_count()}, f, indent=1)


if __name__ == '__main__':
    app.run(main)
