"""The bad-input catalogue of docs/errors.md, row by row, through the real binaries.

Each row of the table there is one test: its command runs in a fresh directory with fixtures
for the placeholders; it must exit non-zero with the row's message in its output and leave every
fixture and the directory as they were. gs:// paths reach a real GCS API server on loopback
(fake-gcs-server) holding the bucket `{bucket}`, which must stay empty. The table is parsed from
the document, so the document cannot drift from the behaviour.

A binary's start is mostly importing TensorFlow, gin, Gymnasium and Beam, the same for every
row, while a row is about what the binary does with its input. So the rows of SUBPROCESS_ROWS,
one per binary, run as `python -m` subprocesses, covering the real start-up; every other row
runs the binary's module as `__main__` in a fork of this process, which imported those libraries
once (harness.run_module_forked): the same code from flag parsing to exit status and output.
"""

import os
import shlex
import subprocess
import sys

from absl.testing import absltest, parameterized

from agents.runs import run_config, run_dir
from agents.scripts import testing_utils
from agents.storage import gcs_testing
from reliability import harness

CATALOGUE = os.path.join(harness.ROOT, 'docs', 'errors.md')
TESTDATA = os.path.join(harness.ROOT, 'reliability', 'testdata')
MODULES = {
    'train': 'agents.scripts.train', 'evaluate': 'agents.scripts.evaluate',
    'export': 'agents.scripts.export', 'visualize': 'agents.scripts.visualize',
    'sweep': 'pipelines.sweep', 'report': 'pipelines.report',
}
HEADER = '| id | mistake | command | message |'
MINIMUM_ROWS = 20
# The rows that run as `python -m` subprocesses: one per binary.
SUBPROCESS_ROWS = ('unknown_flag', 'evaluate_missing_policy', 'export_missing_checkpoint',
                   'visualize_missing_logdir', 'sweep_missing_spec', 'report_no_input')
BUCKET = 'runs'  # An empty bucket on the test's GCS API server; other buckets do not exist.


def stored_config(gin_file):
    """The configuration the trainer stores for `gin_file` (default flags), parsed in a child
    process: its gin registry is the trainer's."""
    def main():
        from agents.scripts import train  # noqa: F401 (the trainer's configurables)
        sys.stdout.write(run_config.load([gin_file], [], seed=0))
    result = harness.run_forked(main, cwd=harness.ROOT)
    if result.returncode:
        raise RuntimeError(f'cannot load {gin_file}: {result.stderr[-3000:]}')
    return result.stdout


def read_catalogue(path=CATALOGUE):
    """The rows of the table: dicts of id, mistake, command and message (without backticks)."""
    with open(path, encoding='utf-8') as f:
        lines = f.read().splitlines()
    start = lines.index(HEADER) + 2  # Past the header and its rule.
    rows = []
    for line in lines[start:]:
        if not line.startswith('|'):
            break
        cells = [cell.strip() for cell in line.strip().strip('|').split(' | ')]
        if len(cells) != 4:
            raise ValueError(f'{path}: a row needs 4 cells: {line}')
        identifier, mistake, command, message = cells
        if not (command.startswith('`') and command.endswith('`') and
                message.startswith('`') and message.endswith('`')):
            raise ValueError(f'{path}: command and message must be `code`: {line}')
        rows.append({'id': identifier, 'mistake': mistake, 'command': command[1:-1],
                     'message': message[1:-1]})
    return rows


ROWS = read_catalogue()


class CatalogueTest(absltest.TestCase):

    def test_catalogue_is_complete_and_well_formed(self):
        self.assertGreaterEqual(len(ROWS), MINIMUM_ROWS)
        ids = [row['id'] for row in ROWS]
        self.assertEqual(len(ids), len(set(ids)), 'ids repeat')
        for row in ROWS:
            self.assertRegex(row['id'], r'^[a-z_]+$')
            self.assertIn(shlex.split(row['command'])[0], MODULES, row['id'])
            self.assertNotEmpty(row['message'], row['id'])

    def test_every_binary_starts_as_a_subprocess_in_some_row(self):
        tools = {row['id']: shlex.split(row['command'])[0] for row in ROWS}
        self.assertContainsSubset(SUBPROCESS_ROWS, tools)
        self.assertCountEqual([tools[identifier] for identifier in SUBPROCESS_ROWS], MODULES)


class BadInputTest(parameterized.TestCase):

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.emulator = gcs_testing.GcsEmulator(buckets=(BUCKET,),
                                               log_dir=absltest.TEST_TMPDIR.value)
        cls.emulator.__enter__()
        harness.preload()
        cls.pendulum_config = stored_config('configs/pendulum.gin')

    @classmethod
    def tearDownClass(cls):
        cls.emulator.__exit__(None, None, None)
        super().tearDownClass()

    def setUp(self):
        super().setUp()
        self.cwd = self.create_tempdir('cwd').full_path
        fixtures = self.create_tempdir('fixtures')
        self.file = fixtures.create_file('file', 'not a directory').full_path
        self.foreign = os.path.join(fixtures.full_path, 'foreign')
        os.makedirs(self.foreign)
        with open(os.path.join(self.foreign, 'notes.txt'), 'w') as f:
            f.write('mine')
        self.run_dir = os.path.join(fixtures.full_path, 'run')
        run_config.prepare_logdir(self.run_dir, "train.env_id = 'Pendulum-v1'\n")
        with open(os.path.join(self.run_dir, run_dir.OPERATIVE_CONFIG_FILE), 'w') as f:
            f.write("train.env_id = 'Pendulum-v1'\ntrain.total_steps = 1000\n")
        self.other_run = os.path.join(fixtures.full_path, 'other_run')
        run_config.prepare_logdir(self.other_run, "train.env_id = 'CartPole-v1'\n")
        with open(os.path.join(self.other_run, 'metrics.jsonl'), 'w') as f:
            f.write('{"step": 512, "mean_return": 20.0}\n')
        self.longer_run = os.path.join(fixtures.full_path, 'longer_run')
        run_config.prepare_logdir(self.longer_run, self.pendulum_config)
        self.locked = os.path.join(fixtures.full_path, 'locked')
        self.lock = run_config.lock_logdir(self.locked)  # Held by this process.
        self.addCleanup(self.lock.release)
        self.fixtures = fixtures.full_path
        self.placeholders = {
            'file': self.file, 'foreign': self.foreign, 'run': self.run_dir,
            'other_run': self.other_run, 'longer_run': self.longer_run, 'locked': self.locked,
            'holder': str(os.getpid()),
            'missing': os.path.join(fixtures.full_path, 'missing'), 'testdata': TESTDATA,
            'bucket': BUCKET,
        }

    def fill(self, text):
        for name, value in self.placeholders.items():
            text = text.replace(f'{{{name}}}', value)
        return text

    @parameterized.named_parameters((row['id'], row) for row in ROWS)
    def test_row(self, row):
        tool, *args = shlex.split(self.fill(row['command']))
        before = testing_utils.snapshot(self.fixtures)
        env = self.emulator.environment(harness.environment(BUILD_WORKING_DIRECTORY=self.cwd))
        if row['id'] in SUBPROCESS_ROWS:
            result = subprocess.run(
                [sys.executable, '-m', MODULES[tool], *args], capture_output=True, text=True,
                timeout=300, cwd=self.cwd, stdin=subprocess.DEVNULL, env=env, check=False)
        else:
            result = harness.run_module_forked(MODULES[tool], *args, cwd=self.cwd, env=env)
        output = result.stdout + result.stderr
        self.assertNotEqual(result.returncode, 0, output[-3000:])
        message = self.fill(row['message'])
        self.assertIn(message, output, f'{row["id"]}: {output[-3000:]}')
        self.assertNotIn('Traceback', output)
        after = testing_utils.snapshot(self.fixtures)
        self.assertEqual(sorted(after), sorted(before), 'files appeared or vanished')
        for name, content in before.items():
            self.assertEqual(after[name], content, f'{name} changed')
        self.assertEqual(os.listdir(self.cwd), [], 'the command left files behind')
        self.assertEqual(self.emulator.objects(BUCKET), {}, 'the command wrote to the bucket')


if __name__ == '__main__':
    absltest.main()
