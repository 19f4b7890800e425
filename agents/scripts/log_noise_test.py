"""Tests for log_noise: the libraries' chatter is dropped, everything else passes."""

import io
import logging
import os
import re
import subprocess
import sys

import gin
import tensorflow as tf
from absl import logging as absl_logging
from absl.testing import absltest

from agents.runs import run_config
from agents.scripts import log_noise, testing_utils
from agents.storage import file_io, gcs_testing


class LogNoiseTest(absltest.TestCase):

    def setUp(self):
        super().setUp()
        verbosity = absl_logging.get_verbosity()
        absl_logging.set_verbosity(absl_logging.INFO)
        self.addCleanup(absl_logging.set_verbosity, verbosity)

    def capture(self, action, filtered):
        """What `action` logs through the root logger's handlers, with or without the filter."""
        stream = io.StringIO()
        handler = logging.StreamHandler(stream)
        if filtered:
            handler.addFilter(log_noise.NoiseFilter())
        logging.getLogger().addHandler(handler)
        try:
            action()
        finally:
            logging.getLogger().removeHandler(handler)
        return stream.getvalue()

    def save_model(self):
        module = tf.Module()
        module.weight = tf.Variable(1.0)
        module.double = tf.function(lambda x: 2 * x * module.weight,
                                    input_signature=[tf.TensorSpec([], tf.float32)])
        tf.saved_model.save(module, self.create_tempdir().full_path)
        tf.train.Checkpoint(module=module).write(
            os.path.join(self.create_tempdir().full_path, 'ckpt'))

    def test_tensorflow_writers_info_lines_are_dropped(self):
        noise = self.capture(self.save_model, filtered=False)
        self.assertIn('Sharding callback duration', noise)  # What TensorFlow says today.
        self.assertIn('Writing fingerprint', noise)
        self.assertEqual(self.capture(self.save_model, filtered=True), '')

    def test_gin_include_probe_is_dropped_and_a_missing_include_still_fails(self):
        directory = self.create_tempdir()
        directory.create_file('base.gin', 'log_noise_test_value.x = 1\n')
        main = directory.create_file('main.gin', "include 'base.gin'\n").full_path
        gin.external_configurable(dict, 'log_noise_test_value')
        self.addCleanup(gin.clear_config)

        def load():
            run_config.load([main], [])

        self.assertIn('Path not found: base.gin', self.capture(load, filtered=False))
        self.assertNotIn('base.gin', self.capture(load, filtered=True))
        broken = directory.create_file('broken.gin', "include 'missing.gin'\n").full_path
        with self.assertRaisesRegex(run_config.ConfigError, 'missing.gin'):
            run_config.load([broken], [])

    def test_beam_gcs_listing_lines_are_dropped(self):
        with gcs_testing.GcsEmulator(buckets=('runs',)):
            file_io.write_text('gs://runs/run/config.gin', 'x = 1\n')

            def listing():
                file_io.list_files('gs://runs/run')

            self.assertIn('Finished listing 1 files', self.capture(listing, filtered=False))
            self.assertEqual(self.capture(listing, filtered=True), '')

    def test_warnings_of_the_same_modules_and_other_info_lines_pass(self):
        noise_filter = log_noise.NoiseFilter()

        def record(path, level):
            return logging.LogRecord('absl', level, path, 1, 'message', (), None)

        saver = '/venv/lib/tensorflow/python/checkpoint/functional_saver.py'
        self.assertFalse(noise_filter.filter(record(saver, logging.INFO)))
        self.assertTrue(noise_filter.filter(record(saver, logging.WARNING)))
        self.assertTrue(noise_filter.filter(record('/work/agents/trainer.py', logging.INFO)))
        self.assertTrue(noise_filter.filter(
            record('/venv/lib/tensorflow/python/eager/polymorphic_function.py', logging.INFO)))

    def test_quiet_filters_absl_handler_and_tensorflow_logger_once(self):
        for filterer in (absl_logging.get_absl_handler(), logging.getLogger('tensorflow')):
            self.addCleanup(lambda f=filterer: [f.removeFilter(x) for x in list(f.filters)
                                                if isinstance(x, log_noise.NoiseFilter)])
        log_noise.quiet()
        log_noise.quiet()
        for filterer in (absl_logging.get_absl_handler(), logging.getLogger('tensorflow')):
            self.assertLen(
                [x for x in filterer.filters if isinstance(x, log_noise.NoiseFilter)], 1)


# What TensorFlow 2.21's libraries write when they load on a machine without a GPU.
START_UP = [
    b'WARNING: All log messages before absl::InitializeLog() is called are written to STDERR',
    b'I0000 00:00:1796201497.634040     928 port.cc:153] oneDNN custom operations are on. You may '
    b'see slightly different numerical results due to floating-point round-off errors.',
    b'I0000 00:00:1796201497.684136     928 cpu_feature_guard.cc:227] This TensorFlow binary is '
    b'optimized to use available CPU instructions in performance-critical operations.',
    b'To enable the following instructions: AVX2 FMA, in other operations, rebuild TensorFlow with '
    b'the appropriate compiler flags.',
]
NO_GPU = [
    b'I0000 00:00:1796201497.634388     928 cudart_stub.cc:31] Could not find cuda drivers on your '
    b'machine, GPU will not be used.',
    b'E0000 00:00:1796201500.161156     928 cuda_platform.cc:52] failed call to cuInit: INTERNAL: '
    b'CUDA error: Failed call to cuInit: UNKNOWN ERROR (303)',
]
# A line TensorFlow's C++ logging writes before any of this program's own.
TENSORFLOW_LINE = re.compile(r'^([IWEF]\d{4} |WARNING: All log messages before absl)', re.M)


def environment(**variables):
    """This process's environment without TF_CPP_MIN_LOG_LEVEL, plus `variables`."""
    env = {name: value for name, value in os.environ.items() if name != 'TF_CPP_MIN_LOG_LEVEL'}
    return dict(env, **variables)


class TensorFlowStartTest(absltest.TestCase):

    def test_a_binary_starts_quietly_and_shows_tensorflows_lines_when_asked(self):
        missing = os.path.join(self.create_tempdir().full_path, 'missing')
        error = f'evaluate: error: logdir {missing} does not exist or is not a directory'
        # evaluate imports TensorFlow and its algorithms, then refuses the logdir.
        quiet = testing_utils.run_script('evaluate', f'--logdir={missing}', env=environment())
        self.assertEqual(quiet.returncode, 1, quiet.stderr)
        self.assertEqual(quiet.stderr.strip(), error)  # Nothing before it, or after.
        for asked, args, env in (
                ('the flag', ['--verbosity=1'], environment()),
                ('the variable', [], environment(TF_CPP_MIN_LOG_LEVEL='0'))):
            with self.subTest(asked):
                verbose = testing_utils.run_script(
                    'evaluate', f'--logdir={missing}', *args, env=env)
                self.assertEqual(verbose.returncode, 1, verbose.stderr)
                self.assertRegex(verbose.stderr, TENSORFLOW_LINE)
                # Lines the filter would drop: its list still names what TensorFlow says.
                noise = re.compile(log_noise.start_up_noise())
                self.assertTrue(any(noise.fullmatch(line)
                                    for line in verbose.stderr.splitlines()), verbose.stderr)
                self.assertIn(error, verbose.stderr)

    def test_other_lines_pass_even_when_the_process_dies_while_loading(self):
        # A library that fails to load aborts with its FATAL line: it must be seen.
        fatal = b'F0000 00:00:1.2   5 cpu_feature_guard.cc:1] compiled to use AVX\n'
        written = b'\n'.join(START_UP + NO_GPU) + b'\n' + fatal + b'a partial line'
        program = ('import os, sys\n'
                   'from agents.scripts import log_noise\n'
                   'with log_noise.tensorflow_start():\n'
                   '    os.write(2, os.fsencode(sys.argv[1]))\n'
                   '    os.abort()\n')
        result = subprocess.run([sys.executable, '-c', program, os.fsdecode(written)],
                                capture_output=True, check=False,
                                env=environment(PYTHONPATH=testing_utils.ROOT))
        self.assertEqual(result.returncode, -6)  # SIGABRT, before the filter could be waited for.
        passed = fatal + b'a partial line'
        if log_noise.has_gpu_device():  # There the CUDA lines tell why the GPU is not used.
            passed = b'\n'.join(NO_GPU) + b'\n' + passed
        self.assertEqual(result.stderr, passed)

    def test_the_cuda_lines_are_dropped_only_without_a_gpu(self):
        without_gpu = re.compile(log_noise.start_up_noise(gpu=False).encode())
        with_gpu = re.compile(log_noise.start_up_noise(gpu=True).encode())
        for line in START_UP:
            self.assertTrue(without_gpu.fullmatch(line) and with_gpu.fullmatch(line), line)
        for line in NO_GPU:
            self.assertTrue(without_gpu.fullmatch(line), line)
            self.assertFalse(with_gpu.fullmatch(line), line)
        for line in (b'E0000 00:00:1796201500.161156     928 cuda_executor.cc:1] failed to '
                     b'allocate 2.0G (2147483648 bytes) from device: CUDA_ERROR_OUT_OF_MEMORY',
                     b'W0000 00:00:1.5   9 port.cc:153] something else from port.cc',
                     b'Traceback (most recent call last):'):
            self.assertFalse(without_gpu.fullmatch(line), line)

    def test_verbose_requested(self):
        for argv, environ, verbose in (
                ([], {}, False),
                (['--verbosity=1'], {}, True),
                (['--verbosity', '2'], {}, True),
                (['-v=1'], {}, True),
                (['-v', '1'], {}, True),
                (['--v=1'], {}, True),
                (['--verbosity=0'], {}, False),
                (['--verbosity=1', '--verbosity=0'], {}, False),  # The last one counts.
                (['--', '--verbosity=1'], {}, False),
                (['--verbosity=x'], {}, False),
                (['--verbose=1'], {}, False),
                ([], {'TF_CPP_MIN_LOG_LEVEL': '0'}, True),
                ([], {'TF_CPP_MIN_LOG_LEVEL': '1'}, False),
                ([], {'TF_CPP_MIN_LOG_LEVEL': '2'}, False)):
            self.assertEqual(log_noise.verbose_requested(argv, environ), verbose, (argv, environ))


if __name__ == '__main__':
    absltest.main()
