"""The sweep launcher on damaged records and beside another launcher, through the real binary.

A tiny successive-halving sweep (two configurations to 1024 steps, the better to 2048) runs to
the end, while a second launcher started beside it is refused within seconds, naming the first,
which finishes undisturbed. Then its `rungs.jsonl` is torn (rerun: repaired, exit 0), filled
with bytes that are not text (exit 1 with one line and no traceback; `--repair_state` then
rebuilds it), and a `search.db` that is no database is refused alike.

The launchers run in forks of this test's process, which imported their libraries once
(harness.run_module_forked): the same code from flag parsing to exit status and output, without
importing Beam and TensorFlow again for each of the six launches; the trials' trainers are the
launcher's own subprocesses. The launcher's real start-up is covered by bad_input_test.
"""

import json
import os

from absl.testing import absltest

from agents.runs import run_dir
from pipelines.sweep import sweep_testing
from reliability import harness

# Appended to the tiny spec.
SCHEDULE = """\
grid:
  PPO.learning_rate: [3.0e-4, 3.0e-3]
scheduler: {type: successive_halving, min_steps: 1024, reduction_factor: 2}
"""


class SweepDamageTest(absltest.TestCase):

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        harness.preload(pipelines=('sweep',))

    def setUp(self):
        super().setUp()
        self.cwd = self.create_tempdir().full_path
        sweep_testing.write_spec(self.cwd, SCHEDULE)
        self.out = os.path.join(self.cwd, 'out')
        self.rungs = os.path.join(self.out, 'rungs.jsonl')

    def start(self, *flags):
        """Starts the launcher (in a fork) with the spec and `flags`. Its Beam workers are
        threads: the trials are the trainers' processes either way, and Beam's worker processes
        are pipelines/sweep:sweep_test's."""
        return harness.start_module_forked(
            'pipelines.sweep', '--spec=spec.yaml', '--output_dir=out',
            '--direct_running_mode=multi_threading', *flags, cwd=self.cwd,
            env=harness.environment(BUILD_WORKING_DIRECTORY=self.cwd))

    def sweep(self, *flags):
        """Runs the launcher to its end; returns the CompletedProcess."""
        return self.start(*flags).wait(900)

    def decisions(self):
        with open(self.rungs) as f:
            return [json.loads(line) for line in f]

    def assert_refused(self, result, *parts):
        self.assertEqual(result.returncode, 1, result.stderr[-3000:])
        errors = [line for line in result.stderr.splitlines()
                  if line.startswith('sweep: error:')]
        self.assertLen(errors, 1, result.stderr[-3000:])
        for part in parts:
            self.assertIn(part, errors[0])
        self.assertNotIn('Traceback', result.stderr)

    def test_a_second_launcher_then_torn_and_damaged_records(self):
        first = self.start()
        self.addCleanup(first.kill)
        lock = os.path.join(self.out, run_dir.LOCK_FILE)

        def held():
            try:
                with open(lock) as f:
                    return json.loads(f.read() or '{}').get('pid') == first.pid
            except (FileNotFoundError, ValueError):
                return False

        # A second launcher beside a running one is refused, naming it; the first finishes.
        # The first stores its spec's copy just after it takes the hold.
        copy = os.path.join(self.out, run_dir.SPEC_COPY)
        harness.wait_for(lambda: held() and os.path.exists(copy), 300,
                         'the first launcher to hold output_dir and store its spec')
        with open(copy) as f:
            stored = f.read()
        # Refused, naming the holder (a launcher that waited for the lock would then run). Its
        # spec has the same trials in other text (a comment), which a launcher holding
        # output_dir would store; refused, it leaves the first's copy as it is.
        sweep_testing.write_spec(self.cwd, '# The same trials.\n' + SCHEDULE,
                                 name='same_trials.yaml')
        second = self.sweep('--spec=same_trials.yaml')
        self.assert_refused(second, f'output_dir {self.out} is in use by another sweep launcher',
                            f'pid {first.pid}', 'choose another --output_dir')
        with open(copy) as f:
            self.assertEqual(f.read(), stored)
        finished = first.wait(900)
        self.assertEqual(finished.returncode, 0, finished.stderr[-3000:])
        with open(os.path.join(self.out, 'trials.jsonl')) as f:
            records = [json.loads(line) for line in f]
        self.assertEqual([record['status'] for record in records], ['ok'] * 2)
        (decision,) = self.decisions()

        # A launcher killed mid-write on a storage without atomic writes: a torn last line.
        with open(self.rungs, 'rb') as f:
            whole = f.read()
        with open(self.rungs, 'wb') as f:
            f.write(whole[:len(whole) // 2])
        torn = self.sweep()
        self.assertEqual(torn.returncode, 0, torn.stderr[-3000:])
        self.assertIn('rungs.jsonl: dropped its torn last line', torn.stderr)
        self.assertEqual([d['promoted'] for d in self.decisions()], [decision['promoted']])

        # Bytes that are not text: refused before anything trains, nothing changed.
        with open(self.rungs, 'ab') as f:
            f.write(b'\xff\xfe\x00garbage')
        with open(self.rungs, 'rb') as f:
            damaged = f.read()
        garbage = self.sweep()
        self.assert_refused(garbage, f'{self.rungs}: bytes that are not UTF-8 text',
                            '--repair_state')
        with open(self.rungs, 'rb') as f:
            self.assertEqual(f.read(), damaged)
        repaired = self.sweep('--repair_state')
        self.assertEqual(repaired.returncode, 0, repaired.stderr[-3000:])
        self.assertEqual([d['promoted'] for d in self.decisions()], [decision['promoted']])
        self.assertTrue([name for name in os.listdir(self.out)
                         if name.startswith('rungs.jsonl.damaged-')])

        # A study database that SQLite cannot read.
        with open(os.path.join(self.out, 'search.db'), 'wb') as f:
            f.write(b'SQLite format 2\x00' + os.urandom(200))
        study = self.sweep()
        self.assert_refused(study, os.path.join(self.out, 'search.db'), 'not an SQLite database')


if __name__ == '__main__':
    absltest.main()
