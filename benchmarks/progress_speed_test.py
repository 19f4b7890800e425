"""Tests of what the side-by-side training benchmarks share: the progress lines read as iteration
ends, the steady speed of a window and the bindings of a timed run."""

from absl import app
from absl.testing import absltest, flagsaver

from agents.runs import run_config, run_settings
from benchmarks import progress_speed, train_throughput

LOG = '''\
I1206 23:59:58.000000 1400 train.py:120] Training in /tmp/run
I1206 23:59:59.000000 1400 progress.py:159] step 0/4096 | the first iteration (tracing and compiling) for 5 s
I1206 23:59:59.500000 1400 progress.py:43] step 1024/4096 | 512 env steps/s | ETA 0:00:06 | train return n/a | eval return n/a
I1207 00:00:01.500000 1400 progress.py:43] step 2048/4096 | 683 env steps/s | ETA 0:00:03 | train return n/a | eval return n/a
I1207 00:00:01.700000 1400 progress.py:159] step 2048/4096 | an iteration for 1 s
I1207 00:00:03.500000 1400 progress.py:43] step 3072/4096 | 768 env steps/s | ETA 0:00:01 | train return -21.0 | eval return n/a
I1207 00:00:09.000000 1400 progress.py:43] step 4096/4096 | 819 env steps/s | ETA 0:00:00 | train return n/a | eval return -21.0
I1207 00:00:09.000100 1400 progress.py:63] Done: 4096 steps in 7.0 s, 819 env steps/s, eval return -21.0.
'''  # noqa: E501


class ProgressSeriesTest(absltest.TestCase):

    def test_reads_the_progress_lines_across_midnight(self):
        points = progress_speed.progress_series(LOG)
        self.assertEqual([step for step, _, _ in points], [1024, 2048, 3072, 4096])
        self.assertEqual([wall for _, wall, _ in points], [0.0, 2.0, 4.0, 9.5])
        self.assertAlmostEqual(points[0][2], 2.0)  # 1024 / 512 steps/s.
        self.assertAlmostEqual(points[-1][2], 4096 / 819)

    def test_population_lines_and_other_lines_are_not_points(self):
        text = ('I1206 10:00:00.000000 1 progress.py:43] step 512/1024 | 2 members x 100 = 200 '
                'env steps/s | ETA ?\nstep 1024/1024 | 5 env steps/s\n')
        self.assertEqual(progress_speed.progress_series(text), [])

    def test_steady_speed_of_the_window_after_the_warmup(self):
        points = [(1024, 0.0), (2048, 2.0), (3072, 4.0), (4096, 5.0)]
        self.assertEqual(progress_speed.steady_speed(points, 2048), 2048 / 3.0)
        self.assertEqual(progress_speed.steady_speed(points, 0), 3072 / 5.0)
        self.assertIsNone(progress_speed.steady_speed(points, 4000))
        self.assertIsNone(progress_speed.steady_speed([], 0))

    def test_ours_speeds_leave_the_final_evaluation_out_of_the_wall_clock(self):
        speeds = progress_speed.ours_speeds(LOG, 2048)
        self.assertEqual(speeds['wall'], 1024 / 2.0)  # 2048 to 3072, not the line after eval.
        self.assertAlmostEqual(speeds['train'], 2048 / (4096 / 819 - 2048 / 683))
        self.assertEqual(speeds['points'], 4)

    def test_ours_bindings_make_a_valid_run_without_evaluations(self):
        bindings = progress_speed.ours_bindings(4096)
        run_config.load([run_config.find_gin_file('configs/pendulum.gin')], bindings)
        settings = run_settings.from_gin()
        self.assertEqual(settings.total_steps, 4096)
        self.assertGreater(settings.eval_every_steps, 10**12)
        self.assertLess(settings.log_every_secs, 0.01)

    def test_spread(self):
        self.assertEqual(progress_speed.spread([2.0, None, 1.0, 4.0]), '2.00 (1.00 to 4.00)')
        self.assertEqual(progress_speed.spread([None]), '-')
        self.assertEqual(progress_speed.spread([1500.4], 0), '1500 (1500 to 1500)')

    @flagsaver.flagsaver(seeds=3)
    def test_check_flags_refuses_arguments_and_the_named_flags_given(self):
        train_throughput.FLAGS['seeds'].present = 1
        try:
            with self.assertRaisesRegex(app.UsageError, '--seeds: not taken'):
                progress_speed.check_flags(['prog'], train_throughput.FLAGS, ('seeds', 'tasks'))
        finally:
            train_throughput.FLAGS['seeds'].present = 0
        progress_speed.check_flags(['prog'], train_throughput.FLAGS, ('seeds', 'tasks'))
        with self.assertRaisesRegex(app.UsageError, 'Unexpected arguments: extra'):
            progress_speed.check_flags(['prog', 'extra'], train_throughput.FLAGS, ())


if __name__ == '__main__':
    absltest.main()
