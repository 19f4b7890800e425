"""Tests of reading metrics.jsonl: its lines as stored, the trainer's records, the curve."""

import os
import sys

from absl.testing import absltest

from agents.runs import metrics
from agents.storage import file_io, gcs_testing


class ReadLinesTest(absltest.TestCase):

    def setUp(self):
        super().setUp()
        self.dir = self.create_tempdir()

    def write(self, data, name='metrics.jsonl'):
        path = os.path.join(self.dir.full_path, name)
        with open(path, 'wb') as f:
            f.write(data)
        return path

    def test_lines_as_stored(self):
        path = self.write(b'{"step": 1}\n\n  \n[2]\r\n{"st')
        lines = list(metrics.read_lines(path))
        self.assertEqual([line.number for line in lines], [1, 4, 5])
        self.assertEqual([line.data for line in lines], [b'{"step": 1}', b'[2]\r', b'{"st'])
        self.assertEqual([line.record for line in lines], [{'step': 1}, [2], None])
        self.assertEqual([line.complete for line in lines], [True, True, False])
        self.assertIsNone(lines[0].problem)
        self.assertStartsWith(lines[2].problem, 'not JSON (')

    def test_blank_lines_on_request(self):
        path = self.write(b'{"step": 1}\n\n  \n')
        lines = list(metrics.read_lines(path, blank=True))
        self.assertEqual([(line.number, line.data, line.blank) for line in lines],
                         [(1, b'{"step": 1}', False), (2, b'', True), (3, b'  ', True)])

    def test_what_json_cannot_take_is_a_problem(self):
        digits = sys.get_int_max_str_digits()
        path = self.write(b'{"step": ' + b'9' * (digits + 1) + b'}\n' + b'[' * 100000 + b'\n' +
                          b'{"step": 1, "name": "\xff"}\n')
        lines = list(metrics.read_lines(path))
        self.assertEqual([line.problem for line in lines], [
            f'not JSON (a number of more than {digits} digits)', 'not JSON (nested too deeply)',
            None])
        self.assertEqual(lines[2].record, {'step': 1, 'name': '\ufffd'})

    def test_missing_file(self):
        with self.assertRaises(FileNotFoundError):
            list(metrics.read_lines(os.path.join(self.dir.full_path, 'missing')))

    def test_special_files_are_refused_without_blocking(self):
        fifo = os.path.join(self.dir.full_path, 'fifo')
        os.mkfifo(fifo)
        for path in (fifo, self.dir.full_path):
            with self.assertRaisesRegex(OSError, 'is not a regular file'):
                list(metrics.read_lines(path))


class EvaluationsTest(absltest.TestCase):

    def test_records_without_cut_or_other_lines(self):
        path = self.create_tempfile('metrics.jsonl', '{"step": 1, "mean_return": NaN}\n'
                                    '[1]\nnot json\n{"step": 2, "mean_ret').full_path
        records = metrics.evaluations(path)
        self.assertLen(records, 1)
        self.assertEqual(records[0]['step'], 1)
        self.assertNotEqual(records[0]['mean_return'], records[0]['mean_return'])  # NaN.

    def test_missing_file(self):
        self.assertEqual(metrics.evaluations(
            os.path.join(self.create_tempdir().full_path, 'metrics.jsonl')), [])

    def test_in_a_bucket(self):
        with gcs_testing.GcsEmulator(buckets=('runs',)):
            file_io.write_text('gs://runs/run/metrics.jsonl', '{"step": 1}\n{"st')
            self.assertEqual(metrics.evaluations('gs://runs/run/metrics.jsonl'), [{'step': 1}])
            self.assertEqual(metrics.evaluations('gs://runs/other/metrics.jsonl'), [])


class CurveTest(absltest.TestCase):

    def test_points_and_problems(self):
        lines = [
            '{"step": 1, "mean_return": -5}',
            'not json',
            '{"step": 2.0, "mean_return": 1}',
            '{"step": 3, "mean_return": Infinity}',
            '{"step": -1, "mean_return": 1}',
            f'{{"step": 4, "mean_return": {2 * metrics.MAX_MAGNITUDE}}}',
            '{"step": true, "mean_return": 1}',
            '["step", 5]',
            '{"step": 6, "mean_return": 2.5}',
        ]
        path = self.create_tempfile('metrics.jsonl', '\n'.join(lines)).full_path
        steps, returns, problems = metrics.curve(path)
        self.assertEqual(steps, [1, 6])
        self.assertEqual(returns, [-5.0, 2.5])
        self.assertIsInstance(returns[0], float)
        self.assertEqual(problems, [
            'metrics.jsonl line 2: not JSON (Expecting value)',
            'metrics.jsonl line 3: "step" 2.0 is not an integer',
            'metrics.jsonl line 4: no integer "step" and finite "mean_return"',
            'metrics.jsonl line 5: "step" -1 is out of range (0 to 2^63 - 1)',
            'metrics.jsonl line 6: "mean_return" 2e+300 is out of range (-1e+300 to 1e+300)',
            'metrics.jsonl line 7: "step" true is not an integer',
            'metrics.jsonl line 8: no integer "step" and finite "mean_return"',
        ])

    def test_missing_file_raises(self):
        with self.assertRaises(FileNotFoundError):
            metrics.curve(os.path.join(self.create_tempdir().full_path, 'metrics.jsonl'))


if __name__ == '__main__':
    absltest.main()
