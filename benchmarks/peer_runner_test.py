"""Tests of what the peer runners share: their command line, the check of their settings and the
metrics.jsonl lines they write. Nothing trains here, and the peers' packages are not needed."""

import contextlib
import io
import json
import os
import subprocess
import sys

from absl.testing import absltest

from agents.runs import environments, run_dir
from benchmarks import peer_runner, train_throughput

KEYS = ('env_id', 'activation')


def check(settings):
    peer_runner.check_keys(settings, KEYS)
    if settings['activation'] != 'tanh':
        raise peer_runner.UnsupportedSetting(
            f'activation = {settings["activation"]!r}: only tanh', 'activation')


def parse(argv):
    """(args, settings, stderr) of the runners' parser on `argv`; SystemExit's code instead of
    args on a usage error."""
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr):
        try:
            args, settings = peer_runner.parse_config(
                peer_runner.argument_parser('Trains a peer.\n\nMore.'), argv, check)
        except SystemExit as error:
            return error.code, None, stderr.getvalue()
    return args, settings, stderr.getvalue()


class SettingsTest(absltest.TestCase):

    def test_check_keys_names_missing_and_unknown_keys(self):
        peer_runner.check_keys({'env_id': 'Pendulum-v1', 'activation': 'tanh'}, KEYS)
        with self.assertRaises(peer_runner.UnsupportedSetting) as context:
            peer_runner.check_keys({'env_id': 'Pendulum-v1', 'clip_ratio': 0.2}, KEYS)
        self.assertEqual(str(context.exception),
                         "settings: missing keys ['activation'], unknown keys ['clip_ratio']")
        self.assertIsNone(context.exception.key)
        self.assertIsInstance(context.exception, ValueError)


class CommandLineTest(absltest.TestCase):

    def test_the_shared_arguments_and_their_defaults(self):
        config = {'env_id': 'Pendulum-v1', 'activation': 'tanh'}
        args, settings, stderr = parse([f'--config={json.dumps(config)}', '--logdir=/logs/run'])
        self.assertEqual(settings, config)
        self.assertEqual((args.logdir, args.seed, args.torch_threads, args.vec_env),
                         ('/logs/run', 0, 1, 'dummy'))
        self.assertEqual(stderr, '')
        args, _, _ = parse([f'--config={json.dumps(config)}', '--logdir=/logs/run', '--seed=3',
                            '--torch_threads=2', '--vec_env=subproc'])
        self.assertEqual((args.seed, args.torch_threads, args.vec_env), (3, 2, 'subproc'))

    def test_bad_values_are_usage_errors_that_name_them(self):
        config = json.dumps({'env_id': 'Pendulum-v1', 'activation': 'tanh'})
        cases = {
            '--vec_env': ([f'--config={config}', '--logdir=/l', '--vec_env=threads'],
                          "argument --vec_env: invalid choice: 'threads'"),
            '--seed': ([f'--config={config}', '--logdir=/l', '--seed=one'],
                       "argument --seed: invalid int value: 'one'"),
            '--logdir': ([f'--config={config}'], 'the following arguments are required: '
                         '--logdir'),
        }
        for name, (argv, message) in cases.items():
            with self.subTest(name=name):
                code, _, stderr = parse(argv)
                self.assertEqual(code, 2)
                self.assertIn(message, stderr)
                self.assertIn('usage:', stderr)

    def test_refused_settings_are_usage_errors_that_name_them(self):
        code, _, stderr = parse(['--config={"env_id": "Pendulum-v1", "activation": "relu"}',
                                 '--logdir=/l'])
        self.assertEqual(code, 2)
        self.assertIn("error: --config: activation = 'relu': only tanh", stderr)
        code, _, stderr = parse(['--config={"env_id": "Pendulum-v1"}', '--logdir=/l'])
        self.assertEqual(code, 2)
        self.assertIn("error: --config: settings: missing keys ['activation'], unknown keys "
                      '[]', stderr)

    def test_the_description_is_the_first_line_of_the_doc(self):
        self.assertEqual(peer_runner.argument_parser('Trains a peer.\n\nMore.').description,
                         'Trains a peer.')

    def test_runners_import_it_as_scripts(self):
        # The peers' python runs the runners as scripts: peer_runner.py is found beside them,
        # with no PYTHONPATH. The settings are refused before SB3 or torch is imported, so any
        # python shows it.
        env = {key: value for key, value in os.environ.items() if key != 'PYTHONPATH'}
        for runner in ('sb3_a2c_runner.py', 'sb3_sac_runner.py'):
            with self.subTest(runner=runner):
                result = subprocess.run(
                    [sys.executable, os.path.join(train_throughput.HERE, runner),
                     '--config={"env_id": "Pendulum-v1"}', '--logdir=/nonexistent/run'],
                    capture_output=True, text=True, check=False, env=env,
                    cwd=self.create_tempdir().full_path)
                self.assertEqual(result.returncode, 2, result.stderr)
                self.assertIn('error: --config: settings: missing keys [', result.stderr)


class MetricsTest(absltest.TestCase):

    def test_evaluation_seeds_are_offset_as_batchppos(self):
        self.assertEqual(peer_runner.EVAL_SEED_OFFSET, environments.EVAL_SEED_OFFSET)

    def test_evaluation_record_has_the_trainers_fields_in_order(self):
        record = peer_runner.evaluation_record(2048, [-100.0, -300.0], [200, 200], 512.0, 4.5)
        self.assertEqual(list(record.items()), [
            ('step', 2048), ('mean_return', -200.0), ('std_return', 100.0), ('episodes', 2),
            ('mean_length', 200.0), ('env_steps_per_sec', 512.0), ('wall_time_s', 4.5)])
        for key in ('mean_return', 'std_return', 'mean_length'):
            self.assertIs(type(record[key]), float)
        record = peer_runner.evaluation_record(10, [1.0], [10], 5.0, 3.0, compile_s=1.0,
                                               train_s=2.0)
        self.assertEqual(list(record)[-3:], ['wall_time_s', 'compile_s', 'train_s'])

    def test_append_metrics_writes_one_json_line_per_record(self):
        logdir = self.create_tempdir().full_path
        first = peer_runner.evaluation_record(1000, [-900.0], [200], 250.0, 4.0)
        second = peer_runner.evaluation_record(2000, [-150.0], [200], 250.0, 8.0)
        peer_runner.append_metrics(logdir, first)
        peer_runner.append_metrics(logdir, second)
        # Where and how the benchmarks read BatchPPO's own metrics.
        self.assertEqual(peer_runner.METRICS_FILE, run_dir.METRICS_FILE)
        with open(os.path.join(logdir, run_dir.METRICS_FILE), encoding='utf-8') as f:
            text = f.read()
        self.assertEqual(text, json.dumps(first) + '\n' + json.dumps(second) + '\n')
        evals = [dict(json.loads(line), seen_s=index + 1.0)
                 for index, line in enumerate(text.splitlines())]
        run = train_throughput.summarize_run(
            {'wall_s': 10.0, 'evals': evals, 'load_before': 0.0}, -200.0)
        self.assertEqual((run['steps'], run['final_return'], run['threshold_step']),
                         (2000, -150.0, 2000))
        self.assertEqual(run['steady_sps'], 250.0)


if __name__ == '__main__':
    absltest.main()
