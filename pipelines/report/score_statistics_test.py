"""Tests of the aggregate statistics against direct implementations of rliable's definitions."""

import math

import numpy as np
from absl.testing import absltest, parameterized

from pipelines.report import score_statistics


def reference_trim_mean(values, proportion):
    """scipy.stats.trim_mean(values, proportion, axis=None), written out."""
    ordered = sorted(float(value) for value in np.ravel(values))
    cut = int(proportion * len(ordered))
    kept = ordered[cut:len(ordered) - cut]
    return sum(kept) / len(kept)


def reference_percentile(values, percent):
    """numpy's default ('linear') percentile, written out."""
    ordered = sorted(values)
    position = percent / 100 * (len(ordered) - 1)
    below = math.floor(position)
    above = min(below + 1, len(ordered) - 1)
    return ordered[below] + (position - below) * (ordered[above] - ordered[below])


def reference_median(values):
    ordered = sorted(float(value) for value in values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def reference_resample(scores, indices):
    """One stratified resample: cell (n, m) is scores[indices[n, m], m]."""
    num_runs, num_tasks = scores.shape
    return np.array([[scores[indices[n, m], m] for m in range(num_tasks)]
                     for n in range(num_runs)])


REFERENCE_STATISTICS = {
    'iqm': lambda sample: reference_trim_mean(sample, 0.25),
    'mean': lambda sample: np.mean([np.mean(sample[:, m]) for m in range(sample.shape[1])]),
    'median': lambda sample: reference_median(np.ravel(sample)),
}


class TrimMeanTest(parameterized.TestCase):

    def test_known_values(self):
        # 8 values: cut 2 per end, keep 3..6.
        self.assertEqual(score_statistics.aggregate_iqm(np.arange(1, 9)), 4.5)
        # 5 values: cut int(1.25) = 1 per end; the outliers go.
        self.assertEqual(score_statistics.aggregate_iqm([1000, 1, 2, 3, -1000]), 2.0)
        # Fewer than 4 values: nothing is cut, the IQM is the mean.
        self.assertEqual(score_statistics.aggregate_iqm([1, 2, 6]), 3.0)

    @parameterized.parameters(1, 2, 3, 4, 5, 7, 10, 13, 40)
    def test_matches_reference_on_random_data(self, num_runs):
        rng = np.random.default_rng(num_runs)
        for num_tasks in (1, 3):
            scores = rng.normal(size=(num_runs, num_tasks)) * 100
            self.assertAlmostEqual(score_statistics.aggregate_iqm(scores),
                                   reference_trim_mean(scores, 0.25), places=9)

    def test_along_axis(self):
        scores = np.random.default_rng(0).normal(size=(6, 9))
        expected = [reference_trim_mean(row, 0.1) for row in scores]
        np.testing.assert_allclose(score_statistics.trim_mean(scores, 0.1, axis=1), expected)

    def test_empty_is_nan_and_too_large_proportion_raises(self):
        self.assertTrue(np.isnan(score_statistics.trim_mean([], 0.25)))
        with self.assertRaisesRegex(ValueError, 'cuts all'):
            score_statistics.trim_mean([1.0, 2.0], 0.5)

    def test_mean_averages_task_means(self):
        scores = np.array([[1.0, 10.0], [3.0, 30.0]])
        self.assertEqual(score_statistics.aggregate_mean(scores), (2.0 + 20.0) / 2)
        self.assertEqual(score_statistics.pooled_median(scores), (3.0 + 10.0) / 2)


class StratifiedBootstrapTest(parameterized.TestCase):

    def test_resamples_runs_within_each_task(self):
        num_runs, num_tasks = 5, 3
        # Task m holds 1000 * m + run: the value says which task and run it came from.
        scores = 1000.0 * np.arange(num_tasks)[None] + np.arange(num_runs)[:, None]
        counts = np.zeros(num_runs)
        for indices in score_statistics.bootstrap_blocks(np.random.default_rng(0), 4000,
                                                         scores.shape):
            samples = score_statistics.resample(scores, indices)
            self.assertEqual(samples.shape[1:], scores.shape)
            np.testing.assert_array_equal(samples // 1000, np.broadcast_to(
                np.arange(num_tasks), samples.shape))
            counts += np.bincount((samples % 1000).astype(int).ravel(), minlength=num_runs)
        # Uniform over runs: each of 60000 draws hits a run with probability 1/5 (std ~98).
        np.testing.assert_allclose(counts / counts.sum(), np.full(num_runs, 0.2), atol=0.01)

    def test_blocks_cover_all_replications(self):
        # Large scores force several blocks.
        shape = (50, 1000)
        sizes = [len(block) for block in score_statistics.bootstrap_blocks(
            np.random.default_rng(0), 95, shape)]
        self.assertGreater(len(sizes), 1)
        self.assertEqual(sum(sizes), 95)

    @parameterized.parameters((3, 1), (5, 1), (10, 2), (7, 4))
    def test_intervals_match_reference_on_random_data(self, num_runs, num_tasks):
        data_rng = np.random.default_rng(100 + num_runs)
        scores = data_rng.gamma(2.0, 50.0, size=(num_runs, num_tasks)) - 200
        reps, seed = 300, 7
        result = score_statistics.interval_estimates(scores, np.random.default_rng(seed), reps=reps)
        # The reference replays the same run indices, one replication at a time.
        all_indices = np.concatenate(list(score_statistics.bootstrap_blocks(
            np.random.default_rng(seed), reps, scores.shape)))
        for name, reference in REFERENCE_STATISTICS.items():
            replications = [reference(reference_resample(scores, indices))
                            for indices in all_indices]
            self.assertAlmostEqual(result[name]['value'], reference(scores), places=9)
            self.assertAlmostEqual(result[name]['ci'][0],
                                   reference_percentile(replications, 2.5), places=9)
            self.assertAlmostEqual(result[name]['ci'][1],
                                   reference_percentile(replications, 97.5), places=9)
            self.assertLessEqual(result[name]['ci'][0], result[name]['ci'][1])

    def test_mean_interval_has_the_bootstrap_width(self):
        # For the mean of n normal scores the percentile interval is about +-1.96 sd/sqrt(n).
        scores = np.random.default_rng(3).normal(10.0, 2.0, size=(400, 1))
        result = score_statistics.interval_estimates(scores, np.random.default_rng(0), reps=4000,
                                               statistics=('mean',))
        lower, upper = result['mean']['ci']
        expected = 2 * 1.96 * scores.std() / math.sqrt(len(scores))
        self.assertAlmostEqual((upper - lower) / expected, 1.0, delta=0.08)
        self.assertLess(lower, scores.mean())
        self.assertGreater(upper, scores.mean())

    def test_deterministic_for_a_seed(self):
        scores = np.random.default_rng(1).normal(size=(6, 1))
        first = score_statistics.interval_estimates(scores, np.random.default_rng(5), reps=500)
        again = score_statistics.interval_estimates(scores, np.random.default_rng(5), reps=500)
        other = score_statistics.interval_estimates(scores, np.random.default_rng(6), reps=500)
        self.assertEqual(first, again)
        self.assertNotEqual(first['iqm']['ci'], other['iqm']['ci'])

    def test_single_run_gives_a_point_interval(self):
        result = score_statistics.interval_estimates([-150.0], np.random.default_rng(0), reps=100)
        for name in ('iqm', 'mean', 'median'):
            self.assertEqual(result[name], {'value': -150.0, 'ci': [-150.0, -150.0]})

    @parameterized.named_parameters(
        ('empty', np.zeros((0, 1)), {}, 'non-empty'),
        ('nan', [1.0, np.nan], {}, 'finite'),
        ('three_dims', np.zeros((2, 2, 2)), {}, 'non-empty'),
        ('no_reps', [1.0, 2.0], {'reps': 0}, 'reps must be positive'),
        ('unknown_statistic', [1.0, 2.0], {'statistics': ('mode',)}, 'unknown statistics'),
    )
    def test_bad_input(self, scores, kwargs, message):
        with self.assertRaisesRegex(ValueError, message):
            score_statistics.interval_estimates(scores, np.random.default_rng(0), **kwargs)


class CurveBandTest(absltest.TestCase):

    def test_matches_reference_with_the_same_draws(self):
        values = np.random.default_rng(0).normal(size=(4, 6)) * 10
        values[3, 4:] = np.nan  # A run that ended early.
        values[:, 5] = np.nan   # A point no run reached.
        values[1:, 0] = np.nan  # A point only one run has.
        reps, seed = 200, 3
        mean, lower, upper, count = score_statistics.curve_band(values, np.random.default_rng(seed),
                                                          reps=reps)
        np.testing.assert_array_equal(count, [1, 4, 4, 4, 3, 0])
        columns = [0, 1, 2, 3, 4]
        draws = np.random.default_rng(seed).random((reps, 4, len(columns)))
        for c, point in enumerate(columns):
            present = values[np.isfinite(values[:, point]), point]
            replications = [np.mean([present[int(draws[r, j, c] * len(present))]
                                     for j in range(len(present))]) for r in range(reps)]
            self.assertAlmostEqual(mean[point], np.mean(present), places=9)
            self.assertAlmostEqual(lower[point], reference_percentile(replications, 2.5), places=9)
            self.assertAlmostEqual(upper[point], reference_percentile(replications, 97.5),
                                   places=9)
        self.assertEqual(lower[0], upper[0])
        self.assertTrue(np.isnan(mean[5]) and np.isnan(lower[5]) and np.isnan(upper[5]))

    def test_band_agrees_with_an_independent_bootstrap(self):
        rng = np.random.default_rng(1)
        values = rng.normal(0.0, 1.0, size=(12, 3)) + np.array([0.0, 5.0, 10.0])
        _, lower, upper, _ = score_statistics.curve_band(values, np.random.default_rng(2),
                                                         reps=20000)
        for point in range(3):
            replications = values[rng.integers(0, 12, size=(20000, 12)), point].mean(axis=1)
            expected = np.percentile(replications, [2.5, 97.5])
            np.testing.assert_allclose([lower[point], upper[point]], expected, atol=0.03)

    def test_bad_input(self):
        with self.assertRaisesRegex(ValueError, 'runs, points'):
            score_statistics.curve_band(np.zeros(3), np.random.default_rng(0))
        with self.assertRaisesRegex(ValueError, 'reps'):
            score_statistics.curve_band(np.zeros((2, 3)), np.random.default_rng(0), reps=0)


if __name__ == '__main__':
    absltest.main()
