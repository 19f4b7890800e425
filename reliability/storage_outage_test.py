"""The train binary against a bucket that becomes unreachable: a real GCS API server
(fake-gcs-server) behind a fault-injecting TCP proxy that refuses every connection.

Training goes on through an outage (its saves kept in the local staging directory and uploaded
when the bucket is back), stops with a one-line error after `max_outage_s`, and stops promptly
on SIGTERM during an outage, leaving what did not reach the bucket for a rerun on the same
machine.
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
OUTAGE_S = 25.0


def run_flags(**overrides):
    """A Pendulum run into the bucket: 4 environments x 128 steps, evaluated and saved every
    4 iterations, a progress line per iteration."""
    values = dict(train__env_mode='in_process', train__num_envs=4, train__rollout_length=128,
                  train__total_steps=40_960, train__eval_every_steps=2048,
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

    def first_upload(self, trainer):
        harness.wait_for(self.bucket_steps, STARTUP_TIMEOUT, 'the first evaluation in the bucket',
                         interval=0.05, process=trainer)

    def progress_during(self, output, marker):
        """The steps of the progress lines after `marker` in `output`."""
        return [int(step) for step, _ in harness.PROGRESS.findall(output.split(marker, 1)[-1])]

    def test_training_goes_on_through_an_outage_and_uploads_every_row_after_it(self):
        trainer = self.start(*run_flags())
        self.first_upload(trainer)
        began = time.monotonic()
        self.emulator.faults.refuse()
        with open(trainer.log_path, 'a') as log:
            log.write('--- outage begins ---\n')
        harness.wait_for(lambda: 'storage unreachable for' in trainer.output()
                         or 'storage not answering for' in trainer.output(),
                         OUTAGE_S, 'a progress line telling the outage', process=trainer)
        time.sleep(max(0.0, OUTAGE_S - (time.monotonic() - began)))
        during = self.progress_during(trainer.output(), '--- outage begins ---')
        self.emulator.faults.restore()
        status = trainer.wait(STARTUP_TIMEOUT)
        output = trainer.output()
        self.assertEqual(status, 0, output[-3000:])
        self.assertGreater(len(set(during)), 2, 'training did not go on during the outage')
        self.assertEqual(during, sorted(during))
        steps = self.bucket_steps()
        self.assertEqual(steps, list(range(2048, 40_961, 2048)))  # Every row, in order.
        self.assertEqual(os.listdir(self.staging_root), [])  # All uploaded: the copy is gone.

    def test_an_outage_past_max_outage_s_stops_with_what_is_where(self):
        trainer = self.start(*run_flags(staging__max_outage_s=4.0,
                                        train__total_steps=400_000))
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

    def test_sigterm_during_an_outage_stops_promptly_and_a_rerun_resumes(self):
        trainer = self.start(*run_flags(train__total_steps=400_000))
        self.first_upload(trainer)
        self.emulator.faults.refuse()
        outage_began = trainer.progress()
        time.sleep(8.0)
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

        staging = os.path.join(self.staging_root, os.listdir(self.staging_root)[0])
        with open(os.path.join(staging, 'run', 'metrics.jsonl')) as f:
            local_steps = [json.loads(line)['step'] for line in f if line.strip()]
        self.assertLess(self.bucket_steps()[-1], local_steps[-1])  # Some saves only local.
        self.emulator.faults.restore()
        stop = local_steps[-1] + 4096
        rerun = self.start(*run_flags(train__total_steps=400_000), f'--stop_at_step={stop}',
                           name='rerun.log')
        status = rerun.wait(STARTUP_TIMEOUT)
        output = rerun.output()
        self.assertEqual(status, 0, output[-3000:])
        resumed = re.search(r'Resumed from \S+ at step (\d+)', output)
        self.assertIsNotNone(resumed, output[-3000:])
        self.assertGreaterEqual(int(resumed.group(1)), outage_began)
        steps = self.bucket_steps()
        self.assertEqual(steps, list(range(2048, stop + 1, 2048)))  # Every row, in order.
        self.assertEqual(os.listdir(self.staging_root), [])


if __name__ == '__main__':
    absltest.main()
