"""Tests of the launcher's record check: a torn last line repaired, any other damage refused with
a sentence naming the file and the recovery, which `repair` then carries out; locally and in a
bucket."""

import glob
import os

import optuna
from absl.testing import absltest

from agents.runs import run_dir
from agents.storage import file_io, gcs_testing, locations
from pipelines.sweep import sweep_state

RUNGS = ('{"bracket": 0, "rung": 0, "promoted": ["a"]}\n'
         '{"bracket": 0, "rung": 1, "promoted": ["a"]}\n')


class SweepStateTest(absltest.TestCase):

    def setUp(self):
        super().setUp()
        self.dir = self.create_tempdir().full_path

    def write(self, name, data):
        with open(os.path.join(self.dir, name), 'wb') as f:
            f.write(data)

    def read(self, name):
        with open(os.path.join(self.dir, name), 'rb') as f:
            return f.read()

    def kept(self, name, why):
        return glob.glob(os.path.join(self.dir, f'{name}.{why}-*'))

    def test_sound_records_pass_untouched(self):
        self.write(run_dir.RUNGS_FILE, RUNGS.encode())
        self.write(run_dir.TRIALS_FILE, b'{"id": "t1"}\n')
        sweep_state.check(self.dir)
        self.assertEqual(self.read(run_dir.RUNGS_FILE), RUNGS.encode())
        self.assertEqual(os.listdir(self.dir).__len__(), 2)
        sweep_state.check(self.create_tempdir().full_path)  # Nothing there yet: fine.

    def test_a_torn_last_line_is_dropped_with_a_warning_and_the_file_kept(self):
        for name in (run_dir.RUNGS_FILE, run_dir.TRIALS_FILE):
            torn = RUNGS.encode() + b'{"bracket": 0, "ru'
            self.write(name, torn)
            with self.assertLogs(level='WARNING') as logs:
                sweep_state.check(self.dir)
            self.assertEqual(self.read(name), RUNGS.encode())
            (kept,) = self.kept(name, 'torn')
            with open(kept, 'rb') as f:
                self.assertEqual(f.read(), torn)
            self.assertIn(f'{name}: dropped its torn last line', logs.output[0])
            self.assertIn('{"bracket": 0, "ru', logs.output[0])

    def test_other_damage_is_refused_naming_the_file_and_the_recovery(self):
        path = os.path.join(self.dir, run_dir.RUNGS_FILE)
        for data, problem in (
                (RUNGS.encode() + b'\xff\xfe garbage',
                 f'bytes that are not UTF-8 text at byte {len(RUNGS)}'),
                (b'not json\n' + RUNGS.encode(), "line 1 is not a JSON record ('not json')"),
                (b'[1, 2]\n', "line 1 is not a JSON record ('[1, 2]')")):
            self.write(run_dir.RUNGS_FILE, data)
            with self.assertRaises(sweep_state.StateError) as raised:
                sweep_state.check(self.dir)
            self.assertEqual(
                str(raised.exception),
                f'{path}: {problem}; rerun with --repair_state to keep it as '
                f'{run_dir.RUNGS_FILE}.damaged-<time> and rebuild it from the trials\' '
                'result.json files')
            self.assertEqual(self.read(run_dir.RUNGS_FILE), data)  # Untouched.

    def test_repair_moves_damage_aside(self):
        data = b'\x00\x01 not text \xff'
        self.write(run_dir.RUNGS_FILE, data)
        with self.assertLogs(level='WARNING'):
            sweep_state.check(self.dir, repair=True)
        self.assertFalse(os.path.exists(os.path.join(self.dir, run_dir.RUNGS_FILE)))
        (kept,) = self.kept(run_dir.RUNGS_FILE, 'damaged')
        with open(kept, 'rb') as f:
            self.assertEqual(f.read(), data)

    def test_a_damaged_study_is_refused_and_a_sound_one_passes(self):
        path = os.path.join(self.dir, run_dir.STUDY_FILE)
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        optuna.create_study(storage=f'sqlite:///{path}', study_name='sweep')
        sweep_state.check(self.dir)
        with open(path, 'r+b') as f:  # Its header overwritten: no database any more.
            f.write(b'\x00' * 100)
        with self.assertRaisesRegex(sweep_state.StateError,
                                    rf'^{path}: not an SQLite database SQLite can read '
                                    r'\(file is not a database\); rerun with --repair_state'):
            sweep_state.check(self.dir)
        self.write(run_dir.STUDY_FILE, b'plain text')
        with self.assertRaisesRegex(sweep_state.StateError, 'not an SQLite database'):
            sweep_state.check(self.dir)

    def test_an_sqlite_file_without_a_study_is_refused_unchanged(self):
        import sqlite3
        path = os.path.join(self.dir, run_dir.STUDY_FILE)
        connection = sqlite3.connect(path)
        connection.execute('CREATE TABLE other (x)')
        connection.commit()
        connection.close()
        before = self.read(run_dir.STUDY_FILE)
        with self.assertRaisesRegex(sweep_state.StateError,
                                    'an SQLite database without an Optuna study'):
            sweep_state.check(self.dir)
        self.assertEqual(self.read(run_dir.STUDY_FILE), before)


class SweepStateInBucketTest(absltest.TestCase):

    def test_torn_line_and_damage_in_a_bucket(self):
        with gcs_testing.GcsEmulator(buckets=('sweeps',)) as emulator:
            output_dir = 'gs://sweeps/out'
            rungs = locations.join(output_dir, run_dir.RUNGS_FILE)
            file_io.write_bytes(rungs, RUNGS.encode() + b'{"torn')
            with self.assertLogs(level='WARNING'):
                sweep_state.check(output_dir)
            self.assertEqual(file_io.read_bytes(rungs), RUNGS.encode())
            study = locations.join(output_dir, run_dir.STUDY_FILE)
            file_io.write_bytes(study, b'not a database')
            with self.assertRaisesRegex(sweep_state.StateError, f'^{study}: not an SQLite'):
                sweep_state.check(output_dir)
            with self.assertLogs(level='WARNING'):
                sweep_state.check(output_dir, repair=True)
            names = emulator.names('sweeps', 'out/')
            self.assertNotIn('out/search.db', names)
            self.assertTrue([name for name in names if name.startswith('out/search.db.damaged-')])


if __name__ == '__main__':
    absltest.main()
