"""Tests for log_noise: the libraries' chatter is dropped, everything else passes."""

import io
import logging
import os

import gin
import tensorflow as tf
from absl import logging as absl_logging
from absl.testing import absltest

from agents.runs import gcs_testing, run_config, run_dir
from agents.scripts import log_noise


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
            run_dir.write_text('gs://runs/run/config.gin', 'x = 1\n')

            def listing():
                run_dir.list_files('gs://runs/run')

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


if __name__ == '__main__':
    absltest.main()
