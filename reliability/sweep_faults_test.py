"""Sweeps: a trial that crashes and one that hangs fail alone; a rerun retries only them.

A sweep of three trials through the sweep binary (pipelines/sweep/sweep.py) on the faulty Pendulum:
one trains normally, one crashes its trainer (the process exits at its 50th environment step),
one hangs forever at its 50th step and is killed at the spec's per-trial timeout. The sweep
finishes the good trial, marks the other two failed with the reason, and exits non-zero. The
faults strike once (marker files), so the rerun of the same command retries exactly the two
failed trials, which then succeed, and leaves the finished one untouched.

The launcher runs in a fork of this test's process, which imported its libraries once
(harness.run_module_forked): the same code from flag parsing to exit status and output; the
trials' trainers are its own subprocesses. Its real start-up is covered by bad_input_test.
"""

import json
import os

from absl.testing import absltest

from agents.scripts import testing_utils
from reliability import faulty_envs, harness

# Long enough for a trial on a loaded 2-core machine (under 40 s seen at a load of 6 to 8),
# short for a hang: the first sweep waits it out.
TIMEOUT_S = 60


class SweepFaultsTest(absltest.TestCase):

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        harness.preload(pipelines=('sweep',))

    def sweep(self, cwd):
        # A worker per trial: the hanging trial's timeout runs from the sweep's start, not from
        # the end of the trial before it. Worker threads: the trials are the trainers'
        # processes either way, and Beam's worker processes are pipelines/sweep:sweep_test's.
        return harness.run_module_forked(
            'pipelines.sweep', '--spec=spec.yaml', '--output_dir=out', '--direct_num_workers=3',
            '--direct_running_mode=multi_threading', timeout=900, cwd=cwd,
            env=harness.environment(BUILD_WORKING_DIRECTORY=cwd))

    def test_crashing_and_hanging_trials_fail_alone_and_are_retried(self):
        cwd = self.create_tempdir().full_path
        crash = os.path.join(cwd, 'crash.marker')
        hang = os.path.join(cwd, 'hang.marker')
        faults = [{}, {'fault': 'exit', 'at_step': 50, 'once_marker': crash},
                  {'fault': 'hang', 'at_step': 50, 'once_marker': hang}]
        with open(os.path.join(cwd, 'spec.yaml'), 'w') as f:
            f.write(f"""\
gin_files: [configs/pendulum.gin]
bindings:
  train.env_id: {json.dumps(faulty_envs.ENV_ID)}
  train.num_envs: 4
  train.rollout_length: 128
  train.eval_every_steps: 512
  train.eval_episodes: 1
  PPO.num_minibatches: 4
  PPO.num_epochs: 2
budget: {{env_steps: 512, timeout_s: {TIMEOUT_S}}}
seeds: 1
grid:
  train.env_kwargs: {json.dumps(faults)}
""")
        first = self.sweep(cwd)
        self.assertEqual(first.returncode, 1, first.stderr[-5000:])
        self.assertIn('sweep: 2 of 3 trials failed', first.stderr)
        trials_path = os.path.join(cwd, 'out', 'trials.jsonl')
        with open(trials_path) as f:
            records = [json.loads(line) for line in f]
        self.assertEqual([record['status'] for record in records], ['ok', 'failed', 'failed'])
        self.assertEqual(records[0]['env_steps'], 512)
        self.assertIn(f'trainer exited with status {faulty_envs.EXIT_CODE}', records[1]['error'])
        self.assertIn(f'timed out after {TIMEOUT_S} s; its process group was killed',
                      records[2]['error'])
        self.assertTrue(os.path.exists(crash) and os.path.exists(hang))
        good = os.path.join(cwd, 'out', records[0]['logdir'])
        before = testing_utils.snapshot(good)

        second = self.sweep(cwd)
        self.assertEqual(second.returncode, 0, second.stderr[-5000:])
        self.assertIn('1 done earlier, 2 to train', second.stderr)
        with open(trials_path) as f:
            again = [json.loads(line) for line in f]
        self.assertEqual(again[0], records[0])
        self.assertEqual([record['status'] for record in again], ['ok', 'ok', 'ok'])
        for old, new in zip(records[1:], again[1:], strict=True):
            self.assertGreater(new['finished_at'], old['finished_at'])
            self.assertEqual(new['env_steps'], 512)
        self.assertEqual(testing_utils.snapshot(good), before)


if __name__ == '__main__':
    absltest.main()
