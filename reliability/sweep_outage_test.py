"""A sweep and its report in a bucket that becomes unreachable: a real GCS API server
(fake-gcs-server) behind a fault-injecting TCP proxy that refuses every connection.

A sweep of TPE proposals pruned by successive halving keeps its study, rung decisions and the
trials' checkpoints in the bucket. Its launcher, workers and trainers ride out an outage shorter
than --max_outage_s and the sweep finishes with the decisions a sweep without an outage makes;
the report does the same. Past the limit, both stop with one line and no traceback. A second
launcher on the sweep's bucket directory is refused by the lease of the first.
"""

import json
import os
import subprocess
import sys
import time

from absl.testing import absltest

from agents.runs import run_dir
from agents.storage import gcs_testing
from pipelines.sweep import sweep_testing
from reliability import harness

SWEEP = 'gs://sweeps/sweep'
REPORT = 'gs://sweeps/report'
# Two TPE proposals to 1024 steps, the better continued to 2048.
SEARCH = """
search:
  sampler: tpe
  num_trials: 2
  parallel: 2
  parameters:
    PPO.learning_rate: {log_uniform: [1.0e-4, 3.0e-3]}
scheduler: {type: successive_halving, min_steps: 1024, reduction_factor: 2}
"""
# One configuration to 2048 steps: a trial for the outage to strike.
GRID = 'grid: {PPO.learning_rate: [3.0e-4]}\n'
# Longer than the 10 s after which a call that the client library retries inside is told.
OUTAGE_S = 14.0
TIMEOUT_S = 600
# What the launcher, its workers, the trainers or the report say while the bucket is out.
TOLD = ('Storage unreachable for', 'Storage not answering for', 'storage unreachable for',
        'storage not answering for')
REPORT_FLAGS = ('--bootstrap_reps=2000', '--curve_bootstrap_reps=200', '--video_max_steps=30',
                '--video_size=64')
# One Beam worker process (the default is one per core): the trials, runs and videos go through
# a worker all the same, and each further worker is one more Python start-up per pipeline.
WORKERS = '--direct_num_workers=1'


class SweepOutageTest(absltest.TestCase):

    def setUp(self):
        super().setUp()
        self.cwd = self.create_tempdir().full_path
        self.emulator = self.enter_context(gcs_testing.GcsEmulator(buckets=('sweeps',),
                                                                   faults=True))
        self.env = self.emulator.environment(sweep_testing.environment(
            self.cwd, harness.environment(
                BATCHPPO_STAGING_DIR=os.path.join(self.cwd, 'staging'))))

    def start(self, command, name):
        """Starts `command` with its output in `name` (in the test's directory)."""
        log_path = os.path.join(self.cwd, name)
        with open(log_path, 'w') as log:
            process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                       cwd=self.cwd, env=self.env, stdin=subprocess.DEVNULL,
                                       start_new_session=True)
        self.addCleanup(lambda: process.poll() is not None or process.kill())
        process.log_path = log_path
        return process

    def launch(self, *flags, name='sweep.log'):
        return self.start(sweep_testing.sweep_command('--spec=spec.yaml', f'--output_dir={SWEEP}',
                                                      WORKERS, *flags), name)

    def report(self, *flags, name='report.log'):
        return self.start([sys.executable, '-m', 'pipelines.report', f'--input={SWEEP}',
                           f'--output_dir={REPORT}', *REPORT_FLAGS, WORKERS, *flags], name)

    def output(self, process):
        with open(process.log_path) as f:
            return f.read()

    def names(self, prefix):
        return self.emulator.names('sweeps', prefix)

    def first_checkpoint(self, launcher):
        """Waits until a trial's first checkpoint is in the bucket."""
        harness.wait_for(
            lambda: any(name.endswith('.index') for name in self.names('sweep/trials/')),
            TIMEOUT_S, "a trial's first checkpoint in the bucket", interval=0.1,
            process=launcher)

    def outage(self, seconds, noticed):
        """Refuses connections for `seconds`, and on until `noticed()` (a process said so)."""
        self.emulator.faults.refuse()
        began = time.monotonic()
        harness.wait_for(noticed, TIMEOUT_S, 'the outage to be told', interval=0.5)
        time.sleep(max(0.0, seconds - (time.monotonic() - began)))
        self.emulator.faults.restore()

    def said_outage(self, process):
        """Whether `process` said the bucket was out."""
        return any(phrase in self.output(process) for phrase in TOLD)

    def told(self, process):
        """Whether `process`, or a trial's train.log in the bucket, said the bucket was out."""
        texts = [self.output(process)] + [
            data.decode(errors='replace') for name, data in
            self.emulator.objects('sweeps', 'sweep/trials/').items()
            if name.endswith('train.log')]
        return any(phrase in text for phrase in TOLD for text in texts)

    def one_error_line(self, process, prefix):
        output = self.output(process)
        errors = [line for line in output.splitlines() if line.startswith(prefix)]
        self.assertLen(errors, 1, output[-3000:])
        self.assertNotIn('Traceback', output)
        return errors[0]

    def test_a_sweep_and_its_report_ride_out_an_outage(self):
        sweep_testing.write_spec(self.cwd, SEARCH)
        launcher = self.launch()
        harness.wait_for(lambda: f'sweep/{run_dir.LEASE_FILE}' in self.names('sweep/'),
                         TIMEOUT_S, 'the launcher to take the lease', interval=0.1,
                         process=launcher)

        # The lease in the bucket refuses a second launcher, naming the first.
        second = self.launch(name='second.log')
        began = time.monotonic()
        self.assertEqual(second.wait(60), 1, self.output(second)[-3000:])
        self.assertLess(time.monotonic() - began, 30)
        refusal = self.one_error_line(second, 'sweep: error:')
        self.assertIn(f'output_dir {SWEEP} is in use by another sweep launcher: pid '
                      f'{launcher.pid}', refusal)

        self.first_checkpoint(launcher)
        self.outage(OUTAGE_S, lambda: self.told(launcher))
        self.assertEqual(launcher.wait(TIMEOUT_S), 0, self.output(launcher)[-3000:])
        self.assertTrue(self.told(launcher), 'the outage was not noticed')
        objects = self.emulator.objects('sweeps', 'sweep/')
        self.assertEqual(objects['sweep/search.db'][:16], b'SQLite format 3\x00')
        records = [json.loads(line) for line in objects['sweep/trials.jsonl'].splitlines()]
        self.assertCountEqual([(r['stop_reason'], r['env_steps']) for r in records],
                              [('completed', 2048), ('pruned', 1024)])
        (decision,) = [json.loads(line) for line in objects['sweep/rungs.jsonl'].splitlines()]
        winner = next(r for r in records if r['stop_reason'] == 'completed')
        self.assertEqual(decision['promoted'], [winner['config_id']])
        log = objects[f'sweep/trials/{winner["id"]}/train.log'].decode()
        self.assertRegex(log, r'Resumed from \S+ckpt-1024 at step 1024')
        self.assertIn(f'sweep/trials/{winner["id"]}/checkpoints/ckpt-2048.index', objects)
        self.assertEqual(sorted(os.listdir(self.cwd)), ['second.log', 'spec.yaml', 'staging',
                                                        'sweep.log'])
        self.assertEqual(os.listdir(os.path.join(self.cwd, 'staging')), [])  # All uploaded.

        # A rerun proposes nothing new and trains nothing.
        again = self.launch(name='again.log')
        self.assertEqual(again.wait(TIMEOUT_S), 0, self.output(again)[-3000:])
        self.assertNotIn('Search batch', self.output(again))
        self.assertNotIn('Stage:', self.output(again))

        report = self.report()
        # Found, the runs are read and rendered by the pipeline's workers.
        harness.wait_for(lambda: 'Found 2 runs under' in self.output(report), TIMEOUT_S,
                         'the report to find the runs', interval=0.1, process=report)
        self.outage(OUTAGE_S, lambda: self.said_outage(report))
        self.assertEqual(report.wait(TIMEOUT_S), 0, self.output(report)[-3000:])
        self.assertTrue(self.said_outage(report),
                        'the outage was not noticed: ' + self.output(report)[-3000:])
        self.assertIn('report/index.html', self.names('report/'))
        self.assertIn('Report of 2 runs in 2 configurations', self.output(report))

    def test_past_max_outage_s_the_sweep_and_the_report_stop_with_one_line(self):
        sweep_testing.write_spec(self.cwd, GRID)
        launcher = self.launch('--max_outage_s=4')
        self.first_checkpoint(launcher)
        self.emulator.faults.refuse()
        began = time.monotonic()
        self.assertEqual(launcher.wait(TIMEOUT_S), 1, self.output(launcher)[-3000:])
        self.assertLess(time.monotonic() - began, 120, self.output(launcher)[-6000:])
        error = self.one_error_line(launcher, 'sweep: error:')
        self.assertIn('longer than max_outage_s = 4', error)
        self.assertIn(SWEEP, error)

        report = self.report('--max_outage_s=3')
        self.assertEqual(report.wait(TIMEOUT_S), 1, self.output(report)[-3000:])
        error = self.one_error_line(report, 'report: error:')
        self.assertIn('longer than max_outage_s = 3', error)
        self.assertIn(SWEEP, error)


if __name__ == '__main__':
    absltest.main()
