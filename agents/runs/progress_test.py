"""Tests of what a run tells: progress lines, iteration scalars, the heartbeat."""

import glob
import os
import time
import types

import numpy as np
import tensorflow as tf
from absl import logging
from absl.testing import absltest

from agents.runs import progress


def _iteration(episodes, return_sum, loss, dropped=(False,)):
    return types.SimpleNamespace(
        episodes=np.array(episodes), return_sum=np.array(return_sum, float),
        length_sum=np.array(episodes) * 200.0, metrics={'loss': np.array(loss, np.float32)},
        dropped=np.array(dropped))


class ProgressTest(absltest.TestCase):

    def test_formats(self):
        self.assertEqual(progress.format_seconds(3725), '1:02:05')
        self.assertEqual(progress.format_seconds(float('inf')), '?')
        self.assertEqual(progress.format_return(None), 'n/a')
        self.assertEqual(progress.format_return(-3.14159), '-3.1')

    def test_progress_line(self):
        with self.assertLogs(level='INFO') as logs:
            progress.log_progress(500, 1000, 100.0, (2, -30.0), {'mean_return': -7.0}, 1)
            progress.log_progress(500, 1000, 100.0, (0, 0.0), None, 4)
        self.assertEqual(logs.output[0].split(':', 2)[2], 'step 500/1000 | 100 env steps/s | '
                         'ETA 0:00:05 | train return -15.0 | eval return -7.0')
        self.assertIn('| 4 members x 100 = 400 env steps/s |', logs.output[1])
        self.assertIn('train return n/a | eval return n/a', logs.output[1])
        with self.assertLogs(level='INFO') as logs:
            progress.log_progress(500, 1000, 100.0, (2, -3.0), None, 1,
                                  train_return='life_return_clipped')
        self.assertIn('| train life return clipped -1.5 | eval return n/a', logs.output[0])
        with self.assertLogs(level='INFO') as logs:
            progress.log_progress(500, 1000, 100.0, (2, -3.0), None, 1,
                                  train_return='life_return_clipped', games=(2, 25.0))
            progress.log_progress(500, 1000, 100.0, (2, -3.0), None, 1,
                                  train_return='life_return_clipped', games=(0, 0.0))
        self.assertIn('| train game score 12.5 | train life return clipped -1.5 |',
                      logs.output[0])
        self.assertIn('| train game score n/a | train life return clipped -1.5 |',
                      logs.output[1])

    def test_iteration_scalars_leave_out_dropped_metrics_and_returns_of_no_episode(self):
        names, values = progress.iteration_scalars(
            [_iteration([2, 0], [-10.0, 0.0], [1.0, 2.0], dropped=[False, True])], 2, 50.0)
        self.assertEqual(names, ['train/loss', 'train/episode_return', 'train/episode_length',
                                 'train/env_steps_per_sec'])
        np.testing.assert_array_equal(values[0], [[1.0, -5.0, 200.0, 50.0],
                                                  [np.nan, np.nan, np.nan, 50.0]])
        names, _ = progress.iteration_scalars(
            [_iteration([2, 0], [-10.0, 0.0], [1.0, 2.0], dropped=[False, False])], 2, 50.0,
            ('life_return_clipped', 'life_length'))
        self.assertEqual(names[1:3], ['train/life_return_clipped', 'train/life_length'])

    def test_iteration_scalars_give_the_calls_games_at_its_last_iteration(self):
        iterations = [_iteration([1], [-1.0], [1.0]), _iteration([0], [0.0], [2.0])]
        episodes = ('life_return_clipped', 'life_length')
        games = (np.array([30.0, 10.0]), np.array([600, 400]))
        names, values = progress.iteration_scalars(iterations, 1, 50.0, episodes, games)
        self.assertEqual(names, ['train/loss', 'train/life_return_clipped', 'train/life_length',
                                 'train/env_steps_per_sec', *progress.GAME_SCALARS])
        np.testing.assert_array_equal(values[:, 0], [[1.0, -1.0, 200.0, 50.0, np.nan, np.nan],
                                                     [2.0, np.nan, np.nan, 50.0, 20.0, 500.0]])
        # A call where no game ended writes none; the names stay (one program writes them).
        names_without, values = progress.iteration_scalars(
            iterations, 1, 50.0, episodes, (np.array([]), np.array([], np.int64)))
        self.assertEqual(names_without, names)
        self.assertTrue(np.isnan(values[:, 0, -2:]).all())

    def test_scalar_writer_writes_all_but_nans_in_one_call(self):
        logdir = self.create_tempdir().full_path
        writer = tf.summary.create_file_writer(logdir)
        write = progress.ScalarWriter(writer, ['a', 'b'])
        write(tf.constant([10, 20], tf.int64), tf.constant([[1.0, np.nan], [3.0, 4.0]]))
        writer.flush()
        found = []
        for path in glob.glob(os.path.join(logdir, 'events.out.tfevents.*')):
            for event in tf.compat.v1.train.summary_iterator(path):
                for value in event.summary.value:
                    found.append((value.tag, event.step, float(tf.make_ndarray(value.tensor))))
        self.assertCountEqual(found, [('a', 10, 1.0), ('a', 20, 3.0), ('b', 20, 4.0)])

    def test_heartbeat_names_a_long_phase(self):
        lines = []
        original = logging.info
        logging.info = lambda fmt, line: lines.append(line)
        try:
            line = lambda phase, seconds: f'{phase} {seconds >= 0.2}'  # noqa: E731
            with progress.Heartbeat(0.2, line) as beat:
                beat.phase('compiling')
                time.sleep(1.5)
        finally:
            logging.info = original
        self.assertIn('compiling True', lines)


if __name__ == '__main__':
    absltest.main()
