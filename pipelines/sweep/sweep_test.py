"""Tests of the sweep binary: tiny sweeps with the real trainer on Beam's DirectRunner and
portable runner, failures, resume after a kill, refusals; and the pieces it writes with."""

import contextlib
import csv
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
from unittest import mock

import psutil
from absl.testing import absltest
from apache_beam.options.pipeline_options import DirectOptions, SetupOptions, WorkerOptions

from agents.runs import run_config, run_dir
from agents.scripts import testing_utils
from agents.storage import gcs_testing
from pipelines.portable_testing import PortableCluster
from pipelines.process_testing import lock_is_free, process_gone, wait_for
from pipelines.sweep import sweep, sweep_spec, trial
from pipelines.sweep.sweep_testing import TINY_SPEC as TINY
from pipelines.sweep.sweep_testing import environment, sweep_command, write_spec

ROOT = run_config.PACKAGE_ROOT


def run_sweep(cwd, *args, timeout=600):
    return subprocess.run(sweep_command(*args), env=environment(cwd), capture_output=True,
                          text=True, timeout=timeout, check=False)


def read_jsonl(path):
    with open(path) as f:
        return [json.loads(line) for line in f]


def read_csv(path):
    with open(path) as f:
        return list(csv.DictReader(f))


def group_gone(pgid):
    """Whether no live (non-zombie) process is left in process group `pgid`."""
    for pid in psutil.pids():
        with contextlib.suppress(ProcessLookupError):  # It ended meanwhile.
            if os.getpgid(pid) == pgid and not process_gone(pid):
                return False
    return True


class SweepTest(absltest.TestCase):

    def assert_trained(self, output_dir, record):
        self.assertEqual(record['status'], 'ok', record['error'])
        self.assertGreaterEqual(record['env_steps'], 2048)
        logdir = os.path.join(output_dir, record['logdir'])
        steps = [evaluation['step'] for evaluation in trial.read_metrics(logdir)]
        self.assertEqual(steps, sorted(set(steps)), 'evaluations repeat or go back')
        self.assertEqual(record['final_return'], trial.read_metrics(logdir)[-1]['mean_return'])
        for name in ('config.gin', 'operative_config.gin', 'checkpoints', 'result.json'):
            self.assertTrue(os.path.exists(os.path.join(logdir, name)), name)

    def test_a_failing_trial_does_not_stop_the_others_and_is_retried(self):
        cwd = self.create_tempdir().full_path
        # Pendulum's constructor rejects the keyword at run time, past every up-front check.
        write_spec(cwd, """
            seeds: [0, 1]
            grid:
              train.env_kwargs: [{}, {bogus_kwarg: 1}]
            """)
        first = run_sweep(cwd, '--spec=spec.yaml', '--output_dir=out')
        self.assertEqual(first.returncode, 1, first.stderr[-3000:])
        self.assertIn('sweep: 2 of 4 trials failed', first.stderr)
        output_dir = os.path.join(cwd, 'out')
        records = read_jsonl(os.path.join(output_dir, 'trials.jsonl'))
        self.assertEqual([r['index'] for r in records], [0, 1, 2, 3])
        self.assertEqual([r['seed'] for r in records], [0, 1, 0, 1])
        self.assertEqual([r['bindings']['train.env_kwargs'] for r in records],
                         [{}, {}, {'bogus_kwarg': 1}, {'bogus_kwarg': 1}])
        for record in records[:2]:
            self.assert_trained(output_dir, record)
        for record in records[2:]:
            self.assertEqual(record['status'], 'failed')
            self.assertIn("unexpected keyword argument 'bogus_kwarg'", record['error'])
            self.assertIsNone(record['final_return'])
        self.assertEqual(sorted(os.listdir(os.path.join(output_dir, 'trials'))),
                         sorted(r['id'] for r in records))
        summary = read_csv(os.path.join(output_dir, 'summary.csv'))
        self.assertEqual([row['rank'] for row in summary], ['1', '2'])
        self.assertEqual(summary[0]['config_id'], records[0]['config_id'])
        self.assertEqual((summary[0]['count'], summary[0]['failed']), ('2', '0'))
        finals = [r['final_return'] for r in records[:2]]
        self.assertAlmostEqual(float(summary[0]['mean_final_return']), sum(finals) / 2,
                               delta=1e-4)
        self.assertEqual(
            (summary[1]['count'], summary[1]['failed'], summary[1]['mean_final_return']),
            ('0', '2', ''))
        with open(os.path.join(output_dir, 'sweep_spec.yaml')) as f, \
                open(os.path.join(cwd, 'spec.yaml')) as g:
            self.assertEqual(f.read(), g.read())

        # The same command again: ok trials are kept untouched, failed ones run again.
        ok_dirs = {r['id']: testing_utils.snapshot(os.path.join(output_dir, r['logdir']))
                   for r in records[:2]}
        second = run_sweep(cwd, '--spec=spec.yaml', '--output_dir=out')
        self.assertEqual(second.returncode, 1, second.stderr[-3000:])
        self.assertIn('2 done earlier, 2 to train', second.stderr)
        again = read_jsonl(os.path.join(output_dir, 'trials.jsonl'))
        self.assertEqual(again[:2], records[:2])
        for record in again[2:]:
            self.assertEqual(record['status'], 'failed')
        self.assertGreater(again[2]['finished_at'], records[3]['finished_at'])
        for trial_id, files in ok_dirs.items():
            self.assertEqual(
                testing_utils.snapshot(os.path.join(output_dir, 'trials', trial_id)), files)

    def test_halving_continues_the_best_and_resumes_after_a_kill(self):
        cwd = self.create_tempdir().full_path
        # Rungs of 1024 and 2048 steps: three trials to 1024 (one iteration), the best of them
        # continued to 2048. Killed mid-way through rung 0 (a stage as a sweep without a
        # scheduler has one), then rerun: what finished is kept, the rest trains.
        write_spec(cwd, """
            grid:
              PPO.learning_rate: [3.0e-4, 1.0e-3, 3.0e-3]
            scheduler: {type: successive_halving, min_steps: 1024, reduction_factor: 3}
            """)
        output_dir = os.path.join(cwd, 'out')
        ids = [t.id for t in sweep_spec.load(os.path.join(cwd, 'spec.yaml')).trials()]
        results = os.path.join(output_dir, 'trials', '{}', 'result.json')
        process = subprocess.Popen(
            sweep_command('--spec=spec.yaml', '--output_dir=out', '--direct_num_workers=2'),
            env=environment(cwd), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True)
        self.addCleanup(lambda: process.poll() is None and os.killpg(process.pid, signal.SIGKILL))

        def finished():
            return [i for i in ids if os.path.exists(results.format(i))]

        wait_for(lambda: finished() or process.poll() is not None, 400, 'a finished trial')
        process.kill()  # Mid-way through rung 0.
        process.wait()
        wait_for(lambda: group_gone(process.pid), 60, 'the sweep\'s workers to exit')
        for trial_id in ids:
            logdir = os.path.join(output_dir, 'trials', trial_id)
            if os.path.isdir(logdir):
                wait_for(lambda logdir=logdir: lock_is_free(logdir), 60, f'{trial_id} to stop')
        done_before = {i: trial.read_result(output_dir, i) for i in finished()}
        self.assertLess(len(done_before), len(ids), 'rung 0 ended before the kill')
        self.assertFalse(os.path.exists(os.path.join(output_dir, 'rungs.jsonl')))

        rerun = run_sweep(cwd, '--spec=spec.yaml', '--output_dir=out')
        self.assertEqual(rerun.returncode, 0, rerun.stderr[-3000:])
        self.assertIn(f'{len(done_before)} done earlier', rerun.stderr)
        records = {r['id']: r for r in read_jsonl(os.path.join(output_dir, 'trials.jsonl'))}
        self.assertEqual(sorted(records), sorted(ids))
        (decision,) = read_jsonl(os.path.join(output_dir, 'rungs.jsonl'))
        (winner,) = decision['promoted']
        self.assertEqual((decision['rung'], decision['budget']), (0, 1024))
        for trial_id, record in records.items():
            self.assertEqual(record['status'], 'ok', record['error'])
            with open(os.path.join(output_dir, 'trials', trial_id, 'train.log')) as f:
                log = f.read()
            attempts = re.findall(r'^=== .* ===$', log, re.MULTILINE)
            if record['config_id'] == winner:
                self.assertEqual((record['stop_reason'], record['rung'], record['budget'],
                                  record['env_steps']), ('completed', 1, 2048, 2048))
                # Rung 1 continued the run from its checkpoint of rung 0.
                self.assertIn('Resumed from', log)
                self.assertRegex(log, r'Resumed from \S+ckpt-1024 at step 1024')
                # One finished attempt per rung (a killed attempt logs none).
                self.assertLen(attempts, 2, log[-3000:])
            else:
                self.assertEqual((record['stop_reason'], record['rung'], record['budget'],
                                  record['env_steps']), ('pruned', 0, 1024, 1024))
                self.assertIn('pruned after rung 0 (1024 env steps): ranked', record['stop_detail'])
                # Trained to rung 0 once, whether before the kill or after it.
                self.assertLen(attempts, 1, log[-3000:])
            logdir = os.path.join(output_dir, record['logdir'])
            self.assertEqual(record['final_return'], trial.read_metrics(logdir)[-1]['mean_return'])
        for trial_id, record in done_before.items():
            if record['config_id'] != winner:
                self.assertEqual(trial.read_result(output_dir, trial_id), record)
        summary = read_csv(os.path.join(output_dir, 'summary.csv'))
        self.assertEqual((summary[0]['config_id'], summary[0]['rung'], summary[0]['budget']),
                         (winner, '1', '2048'))
        self.assertEqual({row['budget'] for row in summary[1:]}, {'1024'})

    def test_bad_spec_is_refused_before_anything_runs(self):
        cwd = self.create_tempdir().full_path
        write_spec(cwd, """
            grid:
              PPO.learning_rate: [0.001]
              PPO.learnig_rate: [0.001]
            """)
        result = run_sweep(cwd, '--spec=spec.yaml', '--output_dir=out')
        self.assertNotEqual(result.returncode, 0)
        self.assertIn('sweep: error: spec.yaml:14: grid parameter PPO.learnig_rate', result.stderr)
        self.assertIn("doesn't have a parameter named 'learnig_rate'", result.stderr)
        self.assertEqual(os.listdir(cwd), ['spec.yaml'])

    def test_missing_spec_and_unknown_flags(self):
        cwd = self.create_tempdir().full_path
        result = run_sweep(cwd, '--spec=nope.yaml', '--output_dir=out')
        self.assertNotEqual(result.returncode, 0)
        self.assertIn('sweep: error: nope.yaml: cannot read the sweep spec', result.stderr)
        write_spec(cwd, '')
        result = run_sweep(cwd, '--spec=spec.yaml', '--output_dir=out', '--direct_num_worker=2')
        self.assertNotEqual(result.returncode, 0)
        self.assertIn('sweep: error: unknown flags: --direct_num_worker=2', result.stderr)
        self.assertEqual(os.listdir(cwd), ['spec.yaml'])
        result = run_sweep(cwd, '--spec=spec.yaml', '--output_dir=spec.yaml/out')
        self.assertNotEqual(result.returncode, 0)
        self.assertIn(f'sweep: error: cannot write to output_dir {cwd}/spec.yaml/out',
                      result.stderr)

    def test_a_launcher_refused_beside_a_running_one_stops_before_loading_tensorflow(self):
        cwd = self.create_tempdir().full_path
        output_dir = os.path.join(cwd, 'out')
        write_spec(cwd, 'grid: {PPO.learning_rate: [0.001]}\n')
        # This process holds output_dir as a running launcher does.
        held = run_config.LogdirLock(output_dir, user=sweep.LAUNCHER,
                                     flag=sweep.OUTPUT_DIR_FLAG)
        self.addCleanup(held.release)
        before = testing_utils.snapshot(output_dir)
        # The launcher, telling on its way out whether it loaded TensorFlow.
        report = ('import atexit, runpy, sys; atexit.register(lambda: sys.stderr.write('
                  '"tensorflow loaded: %s\\n" % ("tensorflow" in sys.modules))); '
                  'sys.argv = ["sweep", *sys.argv[1:]]; '
                  'runpy.run_module("pipelines.sweep", run_name="__main__")')
        result = subprocess.run(
            [sys.executable, '-c', report, '--spec=spec.yaml', '--output_dir=out'],
            env=environment(cwd), capture_output=True, text=True, timeout=300, check=False)
        self.assertEqual(result.returncode, 1, result.stderr[-3000:])
        self.assertIn(f'sweep: error: output_dir {output_dir} is in use by another sweep '
                      f'launcher: pid {os.getpid()}', result.stderr)
        self.assertIn('tensorflow loaded: False', result.stderr)
        self.assertEqual(testing_utils.snapshot(output_dir), before)

    def test_a_different_spec_on_the_same_output_dir_is_refused(self):
        cwd = self.create_tempdir().full_path
        output_dir = os.path.join(cwd, 'out')
        first = write_spec(cwd, 'grid: {PPO.learning_rate: [0.001]}\n', 'first.yaml')
        with open(first) as f:
            sweep.prepare_output_dir(output_dir, sweep_spec.load(first), f.read())
        before = testing_utils.snapshot(output_dir)
        write_spec(cwd, 'grid: {PPO.learning_rate: [0.002]}\n', 'second.yaml')
        result = run_sweep(cwd, '--spec=second.yaml', '--output_dir=out')
        self.assertNotEqual(result.returncode, 0)
        self.assertIn(f'sweep: error: output_dir {output_dir} holds a sweep of a different spec',
                      result.stderr)
        self.assertIn('+grid: {PPO.learning_rate: [0.002]}', result.stderr)
        self.assertEqual(testing_utils.snapshot(output_dir), before)


class PackedSweepTest(absltest.TestCase):
    """Trials on native environments that differ only in seeds and scalars share a trainer: a
    sweep in a bucket (a GCS API server on loopback), as on Dataflow."""

    def test_trials_packed_into_populations_are_recorded_as_trials(self):
        cwd = self.create_tempdir().full_path
        # Without XLA, whose compilation of the population's program would cost more than
        # its training; packing does not depend on it.
        with open(os.path.join(cwd, 'spec.yaml'), 'w') as f:
            f.write(textwrap.dedent("""\
                gin_files: [configs/pendulum_native.gin]
                bindings: {train.eval_every_steps: 2048, train.eval_episodes: 2,
                           train.jit_compile: false}
                budget: {env_steps: 4096, timeout_s: 600}
                seeds: [0, 1]
                grid:
                  PPO.learning_rate: [3.0e-4, 1.0e-3]
                """))
        command = sweep_command('--spec=spec.yaml', '--output_dir=gs://sweeps/sweep',
                                '--direct_num_workers=1')
        with gcs_testing.GcsEmulator(buckets=('sweeps',),
                                     log_dir=self.create_tempdir().full_path) as emulator:
            env = emulator.environment(environment(cwd))
            result = subprocess.run(command, env=env, cwd=cwd, capture_output=True, text=True,
                                    timeout=900, check=False)
            self.assertEqual(result.returncode, 0, result.stderr[-4000:])
            self.assertIn('4 of 4 trials packed into 1 populations', result.stderr)
            objects = emulator.objects('sweeps', 'sweep/')
            # Rerun, with packing now off: the spec is the same sweep, nothing trains again.
            with open(os.path.join(cwd, 'spec.yaml'), 'a') as f:
                f.write('populations: {pack: false}\n')
            again = subprocess.run(command, env=env, cwd=cwd, capture_output=True, text=True,
                                   timeout=900, check=False)
            self.assertEqual(again.returncode, 0, again.stderr[-4000:])
            self.assertIn('4 done earlier, 0 to train', again.stderr)
            self.assertEqual(emulator.objects('sweeps', 'sweep/trials.jsonl'),
                             {'sweep/trials.jsonl': objects['sweep/trials.jsonl']})
        records = [json.loads(line) for line in objects['sweep/trials.jsonl'].splitlines()]
        trials = sweep_spec.load(os.path.join(cwd, 'spec.yaml')).trials()
        self.assertEqual([r['id'] for r in records], [t.id for t in trials])
        (population,) = {r['population'] for r in records}
        for index, (record, spec_trial) in enumerate(zip(records, trials, strict=True)):
            self.assertEqual(record['status'], 'ok', record['error'])
            self.assertEqual(record['logdir'], f'populations/{population}/member-{index}')
            self.assertEqual((record['env_steps'], record['seed'], record['bindings']),
                             (4096, spec_trial.seed, spec_trial.bindings))
            self.assertEqual(
                json.loads(objects[f'sweep/trials/{record["id"]}/result.json']), record)
            # The member's directory is the run of its trial: its seed and learning rate.
            member = f'sweep/{record["logdir"]}'
            metrics = [json.loads(line) for line in objects[f'{member}/metrics.jsonl'].splitlines()]
            self.assertEqual([m['step'] for m in metrics], [2048, 4096])
            self.assertEqual(record['final_return'], metrics[-1]['mean_return'])
            config = objects[f'{member}/config.gin'].decode()
            self.assertIn(f'train.seed = {spec_trial.seed}\n', config)
            self.assertIn(f'PPO.learning_rate = {spec_trial.bindings["PPO.learning_rate"]}\n',
                          config)
            self.assertNotIn('population', config)
            self.assertIn(f'{member}/checkpoints/ckpt-4096.index', objects)
            self.assertIn(f'{member}/policy/4096/saved_model.pb', objects)
        self.assertIn(f'sweep/populations/{population}/population.gin', objects)
        log = objects[f'sweep/populations/{population}/train.log'].decode()
        self.assertIn('4 of 4 trials ok', log)
        self.assertEqual(os.listdir(cwd), ['spec.yaml'])


class ObjectStorageTest(absltest.TestCase):
    """gs:// output directories: refusals in one line before any trial starts, nothing written."""

    def setUp(self):
        super().setUp()
        self.cwd = self.create_tempdir().full_path
        write_spec(self.cwd, 'grid: {PPO.learning_rate: [0.001]}\n')

    def sweep(self, output_dir, env):
        return subprocess.run(sweep_command('--spec=spec.yaml', f'--output_dir={output_dir}'),
                              env=env, cwd=self.cwd, capture_output=True, text=True,
                              timeout=300, check=False)

    def assert_refused(self, result, *expected):
        self.assertEqual(result.returncode, 1, result.stderr)
        error = result.stderr.strip().splitlines()[-1]
        self.assertStartsWith(error, 'sweep: error: ')
        for text in expected:
            self.assertIn(text, error)
        self.assertNotIn('Traceback', result.stderr)
        self.assertEqual(os.listdir(self.cwd), ['spec.yaml'])  # No local gs: directory.

    def test_unknown_bucket(self):
        with gcs_testing.GcsEmulator(buckets=('sweeps',),
                                     log_dir=self.create_tempdir().full_path) as emulator:
            result = self.sweep('gs://missing/sweep', emulator.environment(environment(
                self.cwd)))
            self.assert_refused(result, 'bucket missing', 'does not exist')
            self.assertEqual(emulator.objects('sweeps'), {})

    def test_permission_denied_and_no_credentials(self):
        for status, expected in ((403, 'permission denied on gs://sweeps/sweep'),
                                 (401, 'no credentials to access gs://sweeps/sweep')):
            with gcs_testing.RefusingGcsServer(status) as server:
                result = self.sweep('gs://sweeps/sweep', server.environment(environment(
                    self.cwd)))
                self.assert_refused(result, expected)

    def test_without_the_gcp_extra(self):
        hidden = self.create_tempdir().full_path
        result = self.sweep('gs://sweeps/sweep', gcs_testing.without_gcp_extra(
            hidden, environment(self.cwd)))
        self.assert_refused(result, "pip install 'apache-beam[gcp]'")

    def test_dataflow_needs_a_bucket(self):
        result = subprocess.run(sweep_command(
            '--spec=spec.yaml', '--output_dir=out', '--runner=DataflowRunner',
            '--project=p', '--region=r', '--temp_location=gs://b/tmp'),
            env=environment(self.cwd), cwd=self.cwd, capture_output=True, text=True,
            timeout=300, check=False)
        self.assertEqual(result.returncode, 1, result.stderr)
        self.assertIn('sweep: error: --runner=DataflowRunner needs an --output_dir its workers '
                      'can reach, such as gs://BUCKET/sweep', result.stderr)


class PortableRunnerTest(absltest.TestCase):
    """The sweep through Beam's portable runner: a job service and a pool of worker processes,
    started here on localhost as a cluster would run them."""

    def test_sweep_on_the_portable_runner(self):
        self.dir = self.create_tempdir().full_path
        env = dict(os.environ, PYTHONPATH=ROOT)
        cluster = self.enter_context(PortableCluster(self.dir, env=env))
        # Successive halving: both trials to 1024 steps, the better one continued to 2048.
        write_spec(self.dir, 'grid: {PPO.learning_rate: [3.0e-4, 1.0e-3]}\n'
                   'scheduler: {type: successive_halving, min_steps: 1024, '
                   'reduction_factor: 2}\n')
        with open(os.path.join(self.dir, 'sweep.log'), 'w') as log:
            sweep_process = subprocess.Popen(
                sweep_command('--spec=spec.yaml', '--output_dir=out', *cluster.pipeline_args(),
                              '--threads_per_trial=1'),
                stdout=log, stderr=subprocess.STDOUT, env=environment(self.dir),
                start_new_session=True)
        self.addCleanup(lambda: sweep_process.poll() is None and os.killpg(
            sweep_process.pid, signal.SIGKILL))
        returncode = sweep_process.wait(timeout=900)
        with open(os.path.join(self.dir, 'sweep.log')) as f:
            self.assertEqual(returncode, 0, f'{f.read()[-4000:]}\n{cluster.logs()}')
        output_dir = os.path.join(self.dir, 'out')
        records = read_jsonl(os.path.join(output_dir, 'trials.jsonl'))
        self.assertLen(records, 2)
        for record in records:
            self.assertEqual(record['status'], 'ok', record['error'])
        self.assertCountEqual([(r['stop_reason'], r['env_steps']) for r in records],
                              [('completed', 2048), ('pruned', 1024)])
        self.assertLen(read_csv(os.path.join(output_dir, 'summary.csv')), 2)
        # The trials ran in worker processes the pool started, not in the sweep's process or
        # the job service, and logged their progress there.
        workers = {int(record['worker'].rsplit('/', 1)[1]) for record in records}
        self.assertEmpty(workers & {sweep_process.pid, cluster.job_service.pid,
                                    cluster.pool.pid})
        with open(cluster.pool_log) as f:
            log = f.read()
        self.assertIn('Starting worker with command', log)
        for record in records:
            self.assertIn(f'Trial {record["id"]} ok', log)


def record(config_id, seed, status='ok', final=None, best=None, index=0, bindings=None):
    return {'id': f'{config_id}-seed{seed}', 'config_id': config_id, 'index': index,
            'seed': seed, 'bindings': bindings or {'PPO.learning_rate': 0.001}, 'status': status,
            'final_return': final, 'best_return': best, 'env_steps': 2048 if final else None,
            'wall_time_s': 1.0, 'error': None if status == 'ok' else 'boom',
            'logdir': f'trials/{config_id}-seed{seed}', 'finished_at': 100.0}


class OutputsTest(absltest.TestCase):

    def test_summary_ranks_configurations_by_mean_final_return(self):
        records = [
            record('low', 0, final=-900.0, best=-800.0, bindings={'PPO.clip_ratio': 0.1}),
            record('low', 1, final=-700.0, best=-600.0, bindings={'PPO.clip_ratio': 0.1}),
            record('high', 0, final=-200.0, best=-150.0, bindings={'PPO.clip_ratio': 0.3}),
            record('high', 1, status='failed', bindings={'PPO.clip_ratio': 0.3}),
            record('broken', 0, status='failed', bindings={'PPO.clip_ratio': [1, 2]}),
        ]
        rows = sweep.summarize(records)
        self.assertEqual([row['config_id'] for row in rows], ['high', 'low', 'broken'])
        self.assertEqual([row['rank'] for row in rows], [1, 2, 3])
        self.assertEqual((rows[1]['mean_final_return'], rows[1]['count'], rows[1]['failed']),
                         (-800.0, 2, 0))
        self.assertAlmostEqual(rows[1]['std_final_return'], 141.4214, places=3)  # Sample std.
        self.assertEqual((rows[0]['std_final_return'], rows[0]['count'], rows[0]['failed']),
                         (0.0, 1, 1))
        self.assertIsNone(rows[2]['mean_final_return'])
        text = sweep.summary_csv(rows)
        self.assertEqual(text.splitlines(), [
            'rank,config_id,PPO.clip_ratio,mean_final_return,std_final_return,count,failed,'
            'mean_best_return',
            '1,high,0.3,-200,0,1,1,-150',
            '2,low,0.1,-800,141.42136,2,0,-700',
            '3,broken,"[1, 2]",,,0,1,',
        ])

    def test_write_outputs_in_spec_order(self):
        output_dir = self.create_tempdir().full_path
        records = [record('b', 0, final=-1.0, best=-1.0, index=1),
                   record('a', 0, final=-2.0, best=-2.0, index=0)]
        self.assertEqual(sweep.write_outputs(records, output_dir), 2)
        self.assertEqual([r['index'] for r in read_jsonl(
            os.path.join(output_dir, 'trials.jsonl'))], [0, 1])
        self.assertEqual(sorted(os.listdir(output_dir)), ['summary.csv', 'trials.jsonl'])
        rows = read_csv(os.path.join(output_dir, 'summary.csv'))
        self.assertEqual([row['config_id'] for row in rows], ['b', 'a'])

    def test_progress_counts_this_runs_failures_and_estimates_the_rest(self):
        output_dir = self.create_tempdir().full_path
        earlier_failure = record('c', 0, status='failed')  # Before this run: pending again.
        earlier_failure['finished_at'] = 50.0
        for item in (record('a', 0, final=-1.0), record('b', 0, status='failed'),
                     earlier_failure):
            os.makedirs(os.path.join(output_dir, item['logdir']))
            with open(os.path.join(output_dir, item['logdir'], 'result.json'), 'w') as f:
                json.dump(item, f)
        ids = [('a-seed0', 2048), ('b-seed0', 2048), ('c-seed0', 2048), ('d-seed0', 2048)]
        # Two trials finished in the 60 s since the run started at 90: two left, 60 s to go.
        self.assertEqual(sweep.progress(output_dir, ids, started_at=90.0, now=150.0),
                         '2/4 trials done, 1 failed, ETA 0:01:00')
        self.assertEqual(sweep.progress(output_dir, ids, started_at=200.0, now=210.0),
                         '1/4 trials done, 0 failed, ETA ?')


class SplitWorkTest(absltest.TestCase):

    def test_done_trials_and_trials_to_train(self):
        output_dir = self.create_tempdir().full_path
        spec = sweep_spec.parse(TINY + 'grid: {PPO.learning_rate: [1.0, 2.0, 3.0, 4.0, 5.0]}\n',
                                's')
        trials = spec.trials()
        settings = trial.Settings(output_dir=output_dir, gin_files=spec.gin_files,
                                  env_steps=spec.env_steps)
        stored = {trials[0].id: ('ok', 50.0, None), trials[1].id: ('failed', 50.0, None),
                  trials[2].id: ('failed', 150.0, None),
                  trials[4].id: ('ok', 50.0, 1024)}  # trials[3] has no result.
        for trial_id, (status, finished_at, budget) in stored.items():
            path = os.path.join(output_dir, 'trials', trial_id, 'result.json')
            os.makedirs(os.path.dirname(path))
            with open(path, 'w') as f:
                json.dump({'id': trial_id, 'status': status, 'finished_at': finished_at,
                           'budget': budget or spec.env_steps}, f)
        work = [(t, None) for t in trials]
        # A new run of the sweep retrains every trial that is not ok, and the one whose result
        # is of an earlier rung (1024 steps) when it is to train to the full budget.
        done, pending = sweep.split_work(settings, work)
        self.assertEqual([r['id'] for r in done], [trials[0].id])
        self.assertEqual(pending, work[1:])
        # ... but not when it is to train to that rung.
        done, pending = sweep.split_work(settings, work[:4] + [(trials[4], 1024)])
        self.assertEqual([r['id'] for r in done], [trials[0].id, trials[4].id])
        # A pipeline rerun within a run that started at 100 retrains only the unfinished ones:
        # a trial that failed since then already had its try.
        done, pending = sweep.split_work(settings, work[:4], started_at=100.0)
        self.assertEqual([r['id'] for r in done], [trials[0].id, trials[2].id])
        self.assertEqual(pending, [work[1], work[3]])


class OutputDirTest(absltest.TestCase):

    def setUp(self):
        super().setUp()
        self.dir = self.create_tempdir().full_path
        self.output_dir = os.path.join(self.dir, 'out')

    def spec(self, extra=''):
        text = TINY + extra
        return sweep_spec.parse(text, 'spec.yaml'), text

    def test_stores_the_spec_and_accepts_it_again(self):
        spec, text = self.spec()
        sweep.prepare_output_dir(self.output_dir, spec, text)
        with open(os.path.join(self.output_dir, 'sweep_spec.yaml')) as f:
            self.assertEqual(f.read(), text)
        sweep.prepare_output_dir(self.output_dir, spec, text)

    def test_comments_and_timeout_may_change(self):
        spec, text = self.spec()
        sweep.prepare_output_dir(self.output_dir, spec, text)
        changed = '# longer timeout\n' + text.replace('timeout_s: 600', 'timeout_s: 1200')
        sweep.prepare_output_dir(self.output_dir, sweep_spec.parse(changed, 's.yaml'), changed)
        with open(os.path.join(self.output_dir, 'sweep_spec.yaml')) as f:
            self.assertEqual(f.read(), changed)

    def test_refuses_a_different_spec(self):
        spec, text = self.spec()
        sweep.prepare_output_dir(self.output_dir, spec, text)
        for extra in ('seeds: 2\n', 'grid: {PPO.learning_rate: [0.1]}\n'):
            other, other_text = self.spec(extra)
            with self.assertRaisesRegex(sweep.SweepError, 'holds a sweep of a different spec'):
                sweep.prepare_output_dir(self.output_dir, other, other_text)
        with open(os.path.join(self.output_dir, 'sweep_spec.yaml')) as f:
            self.assertEqual(f.read(), text)

    def test_refuses_a_changed_scheduler_at_its_line(self):
        halving = ('grid: {PPO.learning_rate: [0.1, 0.2]}\n'
                   'scheduler:\n  type: successive_halving\n  min_steps: 1024\n')
        spec, text = self.spec(halving)
        sweep.prepare_output_dir(self.output_dir, spec, text)
        for changed in (halving + '  reduction_factor: 2\n',
                        halving.replace('successive_halving', 'hyperband'),
                        halving + '  metric: mean_length\n  mode: min\n'):
            other, other_text = self.spec(changed)
            line = other_text.splitlines().index('scheduler:') + 1
            with self.assertRaisesRegex(
                    sweep_spec.SpecError,
                    rf'^spec.yaml:{line}: the scheduler differs from the one output_dir '
                    rf'{re.escape(self.output_dir)} was started with \(\{{"brackets": 1, '
                    r'"min_steps": 1024, "reduction_factor": 3, "type": "successive_halving"}\): '
                    'a resumed '
                    'sweep keeps its scheduler'):
                sweep.prepare_output_dir(self.output_dir, other, other_text)
        # Dropped, it is refused too (at the top of the spec, where it is missing).
        other, other_text = self.spec('grid: {PPO.learning_rate: [0.1, 0.2]}\n')
        with self.assertRaisesRegex(sweep_spec.SpecError, '^spec.yaml:1: the scheduler differs'):
            sweep.prepare_output_dir(self.output_dir, other, other_text)
        with open(os.path.join(self.output_dir, 'sweep_spec.yaml')) as f:
            self.assertEqual(f.read(), text)

    def test_refuses_a_directory_that_is_not_a_sweep(self):
        os.makedirs(self.output_dir)
        with open(os.path.join(self.output_dir, 'notes.txt'), 'w') as f:
            f.write('mine')
        spec, text = self.spec()
        with self.assertRaisesRegex(sweep.SweepError, 'is not empty and holds no sweep_spec'):
            sweep.prepare_output_dir(self.output_dir, spec, text)
        self.assertEqual(os.listdir(self.output_dir), ['notes.txt'])

    def test_checking_writes_nothing(self):
        # What a launcher checks before it holds output_dir: a launcher refused beside a
        # running one must leave that sweep's files as they are.
        spec, text = self.spec()
        self.assertTrue(sweep.check_output_dir(self.output_dir, spec, text))
        self.assertFalse(os.path.exists(self.output_dir))
        sweep.prepare_output_dir(self.output_dir, spec, text)
        self.assertFalse(sweep.check_output_dir(self.output_dir, spec, text))
        changed = text.replace('timeout_s: 600', 'timeout_s: 1200')
        self.assertTrue(sweep.check_output_dir(
            self.output_dir, sweep_spec.parse(changed, 's.yaml'), changed))
        with open(os.path.join(self.output_dir, 'sweep_spec.yaml')) as f:
            self.assertEqual(f.read(), text)

    def test_a_launchers_lock_alone_is_no_content(self):
        # A launcher killed between taking its hold and storing the spec left only its lock.
        lock = run_config.LogdirLock(self.output_dir, user='sweep launcher')
        lock.release()
        spec, text = self.spec()
        sweep.prepare_output_dir(self.output_dir, spec, text)
        self.assertEqual(sorted(os.listdir(self.output_dir)),
                         sorted([run_dir.LOCK_FILE, 'sweep_spec.yaml']))


class OptionsTest(absltest.TestCase):

    def test_local_defaults(self):
        options = sweep.pipeline_options([])
        direct = options.view_as(DirectOptions)
        self.assertEqual(direct.direct_running_mode, 'multi_processing')
        self.assertEqual(direct.direct_num_workers, os.cpu_count())
        self.assertEqual(sweep.local_workers(options), os.cpu_count())
        self.assertEqual(options.view_as(WorkerOptions).default_sdk_harness_log_level, 'WARNING')

    def test_local_runs_use_the_fn_api_runner(self):
        from apache_beam.runners.portability.fn_api_runner import fn_runner
        self.assertIsInstance(sweep.default_runner(sweep.pipeline_options([])),
                              fn_runner.FnApiRunner)
        self.assertIsInstance(sweep.default_runner(sweep.pipeline_options(
            ['--runner=DirectRunner'])), fn_runner.FnApiRunner)
        self.assertIsNone(sweep.default_runner(sweep.pipeline_options(
            ['--runner=PortableRunner', '--job_endpoint=localhost:1'])))

    def test_given_options_win(self):
        options = sweep.pipeline_options(['--direct_num_workers=3',
                                          '--default_sdk_harness_log_level=INFO'])
        self.assertEqual(sweep.local_workers(options), 3)
        self.assertEqual(options.view_as(WorkerOptions).default_sdk_harness_log_level, 'INFO')
        in_memory = sweep.pipeline_options(['--direct_running_mode=in_memory'])
        self.assertEqual(sweep.local_workers(in_memory), 1)
        self.assertIsNone(sweep.local_workers(sweep.pipeline_options(
            ['--runner=PortableRunner', '--job_endpoint=localhost:1'])))

    def test_package_paths_are_taken_from_the_callers_directory(self):
        with mock.patch.dict(os.environ, {'BUILD_WORKING_DIRECTORY': '/repo'}):
            options = sweep.pipeline_options([
                '--runner=DataflowRunner', '--setup_file=./pyproject.toml',
                '--extra_package=dist/batchppo.whl', '--extra_package=/abs/other.whl'])
        setup = options.view_as(SetupOptions)
        self.assertEqual(setup.setup_file, '/repo/pyproject.toml')
        self.assertEqual(setup.extra_packages, ['/repo/dist/batchppo.whl', '/abs/other.whl'])
        self.assertIsNone(sweep.local_workers(options))

    def test_unknown_and_bad_options(self):
        with self.assertRaisesRegex(sweep.SweepError, 'unknown flags: --nope=1 stray'):
            sweep.pipeline_options(['--nope=1', 'stray'])
        with self.assertRaisesRegex(sweep.SweepError, 'direct_num_workers must be >= 1'):
            sweep.pipeline_options(['--direct_num_workers=-2'])


if __name__ == '__main__':
    absltest.main()
