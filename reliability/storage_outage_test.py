"""The train binary against a bucket that becomes unreachable: a real GCS API server
(fake-gcs-server) behind a fault-injecting TCP proxy that refuses every connection.

A run stops promptly on SIGTERM during an outage, leaving what did not reach the bucket for a
rerun on the same machine; the rerun resumes, uploads it, and goes on training through an outage
of its own (its saves kept in the local staging directory, then waiting for the bucket once
`staging.max_pending_saves` are only local), uploading every row when the bucket is back. Past
`max_outage_s` a run stops with a one-line error.
"""

import json
import os
import re
import signal
import time

from absl.testing import absltest

from agents.storage import gcs_testing
from reliability import harness

URL = 'gs://runs/run'
STARTUP_TIMEOUT = 300
OUTAGE_TIMEOUT = 120
EVAL_EVERY = 2048
# A rerun's budget: room for an evaluation after it resumes, the saves of its outage and more.
TOTAL_STEPS = 20_480
# Saves only local before training waits for the bucket: training goes on through two
# evaluations of an outage, then waits (idle) until the bucket is back.
MAX_PENDING = 2


def run_flags(**overrides):
    """A Pendulum run into the bucket: 4 environments x 128 steps, evaluated and saved every
    4 iterations, a progress line per iteration."""
    values = dict(train__env_mode='in_process', train__num_envs=4, train__rollout_length=128,
                  train__total_steps=400_000, train__eval_every_steps=EVAL_EVERY,
                  train__eval_episodes=1, train__log_every_secs=0.001,
                  PPO__num_minibatches=4, PPO__num_epochs=2)
    values.update(overrides)
    return ['--gin_file=configs/pendulum.gin', f'--logdir={URL}', *harness.bindings(**values)]


class StorageOutageTest(absltest.TestCase):

    def setUp(self):
        super().setUp()
        self.root = self.create_tempdir().full_path
        self.emulator = self.enter_context(gcs_testing.GcsEmulator(buckets=('runs',),
                                                                   faults=True))
        self.staging_root = os.path.join(self.root, 'staging')
        self.env = self.emulator.environment(harness.environment(
            BATCHPPO_STAGING_DIR=self.staging_root, TMPDIR=self.root))

    def start(self, *flags, name='train.log'):
        trainer = harness.Binary('train', *flags, log_path=os.path.join(self.root, name),
                                 env=self.env)
        self.addCleanup(trainer.__exit__)
        return trainer

    def bucket_steps(self):
        """The steps of the bucket's metrics.jsonl, or []."""
        objects = self.emulator.objects('runs', 'run/')
        data = objects.get('run/metrics.jsonl', b'')
        return [json.loads(line)['step'] for line in data.decode().splitlines() if line]

    def local_steps(self):
        """The steps of metrics.jsonl in the run's staging directory, or []."""
        try:
            (staging,) = os.listdir(self.staging_root)
            with open(os.path.join(self.staging_root, staging, 'run', 'metrics.jsonl')) as f:
                return [json.loads(line)['step'] for line in f if line.strip()]
        except (FileNotFoundError, ValueError):
            return []

    def first_upload(self, trainer, after=0):
        """Waits for an evaluation past step `after` in the bucket; returns the bucket's steps."""
        return harness.wait_for(lambda: [s for s in self.bucket_steps() if s > after] and
                                self.bucket_steps(), STARTUP_TIMEOUT,
                                f'an evaluation past step {after} in the bucket', interval=0.05,
                                process=trainer)

    def progress_during(self, output, marker):
        """The steps of the progress lines after `marker` in `output`."""
        return [int(step) for step, _ in harness.PROGRESS.findall(output.split(marker, 1)[-1])]

    def test_sigterm_during_an_outage_stops_promptly_and_a_rerun_rides_one_out(self):
        flags = run_flags(train__total_steps=TOTAL_STEPS,
                          staging__max_pending_saves=MAX_PENDING)
        trainer = self.start(*flags)
        self.first_upload(trainer)
        self.emulator.faults.refuse()
        outage_began = trainer.progress()
        # Signalled once a save is only local.
        harness.wait_for(lambda: self.local_steps() and self.local_steps()[-1] >
                         self.bucket_steps()[-1], OUTAGE_TIMEOUT, 'a save only in staging',
                         process=trainer)
        trainer.signal(signal.SIGTERM)
        signalled = time.monotonic()
        status = trainer.wait(60)
        self.assertLess(time.monotonic() - signalled, 30.0)
        output = trainer.output()
        self.assertEqual(status, 128 + signal.SIGTERM, output[-3000:])
        stopped_at = re.search(r'interrupted by SIGTERM at step (\d+)', output)
        self.assertIsNotNone(stopped_at, output[-3000:])
        # Says what reached the bucket and what is only local.
        self.assertRegex(output, rf'step \d+ reached {URL}; saves up to step '
                                 rf'{stopped_at.group(1)} are only in \S+staging')
        self.assertNotIn('Traceback', output)
        local_steps = self.local_steps()
        self.assertLess(self.bucket_steps()[-1], local_steps[-1])  # Some saves only local.
        self.emulator.faults.restore()

        # The rerun resumes from the local saves and uploads them, then rides out an outage.
        rerun = self.start(*flags, name='rerun.log')
        before = self.first_upload(rerun, after=local_steps[-1])
        self.emulator.faults.refuse()
        with open(rerun.log_path, 'a') as log:
            log.write('--- outage begins ---\n')
        told = re.compile(r'\] step \d+/\d+ \|.*(storage unreachable for|storage not answering '
                          r'for)')
        harness.wait_for(lambda: told.search(rerun.output().split('--- outage begins ---')[1]),
                         OUTAGE_TIMEOUT, 'a progress line telling the outage', process=rerun)
        # Training went on through the outage's saves, up to max_pending_saves only local.
        harness.wait_for(lambda: 'waiting for storage' in rerun.output(), OUTAGE_TIMEOUT,
                         'the run to wait for the bucket', process=rerun)
        during = self.progress_during(rerun.output(), '--- outage begins ---')
        self.emulator.faults.restore()
        status = rerun.wait(STARTUP_TIMEOUT)
        output = rerun.output()
        self.assertEqual(status, 0, output[-3000:])
        resumed = re.search(r'Resumed from \S+ at step (\d+)', output)
        self.assertIsNotNone(resumed, output[-3000:])
        self.assertGreaterEqual(int(resumed.group(1)), outage_began)
        self.assertGreater(len(set(during)), 2, 'training did not go on during the outage')
        self.assertEqual(during, sorted(during))
        self.assertGreaterEqual(max(during), before[-1] + MAX_PENDING * EVAL_EVERY, during)
        steps = self.bucket_steps()
        self.assertEqual(steps, list(range(EVAL_EVERY, TOTAL_STEPS + 1, EVAL_EVERY)))
        self.assertEqual(os.listdir(self.staging_root), [])  # All uploaded: the copy is gone.

    def test_an_outage_past_max_outage_s_stops_with_what_is_where(self):
        trainer = self.start(*run_flags(staging__max_outage_s=4.0))
        self.first_upload(trainer)
        reached = self.bucket_steps()[-1]
        self.emulator.faults.refuse()
        status = trainer.wait(STARTUP_TIMEOUT)
        output = trainer.output()
        self.assertEqual(status, 1, output[-3000:])
        errors = [line for line in output.splitlines() if line.startswith('train: error:')]
        self.assertLen(errors, 1, output[-3000:])
        staging = os.path.join(self.staging_root, os.listdir(self.staging_root)[0])
        for part in (URL, 'longer than max_outage_s = 4', staging):
            self.assertIn(part, errors[0])
        self.assertRegex(errors[0], rf'the last step that reached the bucket is {reached}\b|'
                                    r'the last step that reached the bucket is \d+')
        self.assertNotIn('Traceback', output)
        # Nothing deleted: the local copy holds the newest save.
        local = os.path.join(staging, 'run', 'metrics.jsonl')
        with open(local) as f:
            local_steps = [json.loads(line)['step'] for line in f if line.strip()]
        self.assertGreater(local_steps[-1], reached)


if __name__ == '__main__':
    absltest.main()
