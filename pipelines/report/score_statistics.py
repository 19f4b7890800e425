"""Aggregate scores of runs with bootstrap confidence intervals, as rliable defines them.

Follows Agarwal et al., "Deep RL at the Edge of the Statistical Precipice" (NeurIPS 2021) and
their library rliable (`rliable/metrics.py`, `rliable/library.py`), re-implemented with numpy
alone (rliable needs scipy and arch) and vectorized over bootstrap replications:

- Scores are a `[num_runs, num_tasks]` matrix (a configuration is one task here, its seeds the
  runs).
- The interquartile mean (IQM) is `scipy.stats.trim_mean(scores, 0.25, axis=None)`: the mean of
  the middle half of all runs x tasks pooled, cutting `int(0.25 * n)` scores at each end.
- The mean is the mean over tasks of each task's mean over runs (`aggregate_mean`).
- The stratified bootstrap (`StratifiedBootstrap` with `task_bootstrap=False`) resamples, in
  every replication, `num_runs` runs with replacement within each task independently: cell
  `(n, m)` of a resample is `scores[i, m]` for a fresh uniform run index `i`. For scores with
  more axes (points of a learning curve), every cell draws its own run index, as rliable's
  `np.random.choice(num_runs, scores.shape)` does.
- Confidence intervals are percentile intervals (arch's `conf_int(method='percentile')`): the
  `(1 - size) / 2` and `1 - (1 - size) / 2` percentiles of the replications, with numpy's
  default linear interpolation.

The median here is the median of all runs x tasks pooled. rliable's `aggregate_median` is the
median over tasks of the per-task means, which for one task is only the mean again.
"""

import numpy as np

IQM_PROPORTION = 0.25
# Bootstrap samples are drawn in blocks of about this many cells, bounding memory.
_BLOCK_CELLS = 2_000_000


def trim_mean(scores, proportion, axis=None):
    """`scipy.stats.trim_mean`: the mean after cutting `int(proportion * n)` values per end.

    With `axis=None` all values are pooled; otherwise the cut is along `axis`. Empty input
    gives NaN, as in scipy.
    """
    scores = np.asarray(scores, np.float64)
    if axis is None:
        scores, axis = scores.reshape(-1), 0
    count = scores.shape[axis]
    if count == 0:
        return np.nan
    lower = int(proportion * count)
    upper = count - lower
    if lower >= upper:
        raise ValueError(f'proportion {proportion} cuts all {count} values')
    ordered = np.sort(scores, axis=axis)
    return np.take(ordered, np.arange(lower, upper), axis=axis).mean(axis=axis)


def aggregate_iqm(scores):
    """rliable's IQM: the 25% trimmed mean of all runs x tasks of `scores` pooled."""
    return float(trim_mean(scores, IQM_PROPORTION, axis=None))


def aggregate_mean(scores):
    """rliable's mean: the mean over tasks of the mean score of each task over its runs."""
    return float(np.mean(np.mean(np.asarray(scores, np.float64), axis=0)))


def pooled_median(scores):
    """The median of all runs x tasks pooled."""
    return float(np.median(np.asarray(scores, np.float64)))


def _iqm_of_samples(samples):
    return trim_mean(samples.reshape(len(samples), -1), IQM_PROPORTION, axis=1)


def _mean_of_samples(samples):
    return samples.mean(axis=1).mean(axis=1)


def _median_of_samples(samples):
    return np.median(samples.reshape(len(samples), -1), axis=1)


# Each statistic as a point estimate on `[runs, tasks]` and vectorized over replications
# `[reps, runs, tasks]`.
STATISTICS = {
    'iqm': (aggregate_iqm, _iqm_of_samples),
    'mean': (aggregate_mean, _mean_of_samples),
    'median': (pooled_median, _median_of_samples),
}


def bootstrap_blocks(rng, reps, shape):
    """Run indices of `reps` stratified bootstrap resamples of scores of `shape`, in blocks.

    Yields int arrays `[block, *shape]`: entry `[r, n, m, ...]` is the run whose score fills
    cell `(n, m, ...)` of replication `r`, uniform over `range(shape[0])`. The block size
    depends only on `reps` and `shape`, so a seed always gives the same indices.
    """
    cells = int(np.prod(shape))
    block = max(1, _BLOCK_CELLS // max(cells, 1))
    for start in range(0, reps, block):
        yield rng.integers(0, shape[0], size=(min(block, reps - start), *shape))


def resample(scores, indices):
    """The resampled scores `[block, *scores.shape]` for run `indices` (`bootstrap_blocks`)."""
    strata = np.ogrid[tuple(slice(size) for size in scores.shape[1:])]
    return scores[(indices, *strata)]


def percentile_interval(replications, size=0.95):
    """The percentile confidence interval of `size` along the first axis: (lower, upper)."""
    tail = 100 * (1 - size) / 2
    lower, upper = np.percentile(replications, [tail, 100 - tail], axis=0)
    return lower, upper


def _check_scores(scores):
    scores = np.asarray(scores, np.float64)
    if scores.ndim == 1:
        scores = scores[:, None]
    if scores.ndim != 2 or scores.size == 0:
        raise ValueError(f'scores must be a non-empty [runs] or [runs, tasks] array, got shape '
                         f'{scores.shape}')
    if not np.all(np.isfinite(scores)):
        raise ValueError('scores must be finite')
    return scores


def interval_estimates(scores, rng, reps=50_000, size=0.95, statistics=('iqm', 'mean', 'median')):
    """Point estimates and stratified-bootstrap percentile intervals of aggregate statistics.

    Args:
      scores: `[num_runs, num_tasks]` (or `[num_runs]` for one task) finite scores.
      rng: a `numpy.random.Generator`; the same state gives the same intervals.
      reps: bootstrap replications (rliable's default is 50000).
      size: coverage of the intervals.
      statistics: names among `STATISTICS`.

    Returns:
      `{name: {'value': point estimate, 'ci': [lower, upper]}}`, plain floats.
    """
    scores = _check_scores(scores)
    if reps < 1:
        raise ValueError(f'reps must be positive, got {reps}')
    unknown = set(statistics) - set(STATISTICS)
    if unknown:
        raise ValueError(f'unknown statistics {sorted(unknown)}; known: {sorted(STATISTICS)}')
    replications = {name: [] for name in statistics}
    for indices in bootstrap_blocks(rng, reps, scores.shape):
        samples = resample(scores, indices)
        for name in statistics:
            replications[name].append(STATISTICS[name][1](samples))
    result = {}
    for name in statistics:
        lower, upper = percentile_interval(np.concatenate(replications[name]), size)
        result[name] = {'value': STATISTICS[name][0](scores), 'ci': [float(lower), float(upper)]}
    return result


def curve_band(values, rng, reps=2_000, size=0.95):
    """Mean learning curve of runs with a pointwise 95% stratified-bootstrap band.

    Args:
      values: `[num_runs, num_points]` scores of each run at common points; NaN where a run has
        no score (it ended earlier or started later). Each point is bootstrapped over the runs
        that have a score there, each point independently (as rliable does for curves).
      rng: a `numpy.random.Generator`.
      reps: bootstrap replications per point.
      size: coverage of the band.

    Returns:
      `(mean, lower, upper, count)` arrays of `[num_points]`; NaN where no run has a score.
    """
    values = np.asarray(values, np.float64)
    if values.ndim != 2:
        raise ValueError(f'values must be [runs, points], got shape {values.shape}')
    if reps < 1:
        raise ValueError(f'reps must be positive, got {reps}')
    num_runs, num_points = values.shape
    present = np.isfinite(values)
    count = present.sum(axis=0)
    # Scores of each point moved to the top rows, in run order: resampling rows below
    # `count[t]` of column t draws among the runs present at point t.
    filled = np.where(present, values, 0.0)
    order = np.argsort(~present, axis=0, kind='stable')
    compact = np.take_along_axis(filled, order, axis=0)
    with np.errstate(invalid='ignore', divide='ignore'):
        mean = np.where(count > 0, filled.sum(axis=0) / count, np.nan)
    lower = np.full(num_points, np.nan)
    upper = np.full(num_points, np.nan)
    columns = np.flatnonzero(count > 0)
    chunk = max(1, _BLOCK_CELLS // max(reps * num_runs, 1))
    for start in range(0, len(columns), chunk):
        cols = columns[start:start + chunk]
        draws = rng.random((reps, num_runs, len(cols)))
        indices = np.minimum((draws * count[cols]).astype(np.int64), count[cols] - 1)
        samples = np.take_along_axis(compact[:, cols][None], indices, axis=1)
        used = np.arange(num_runs)[None, :, None] < count[cols][None, None, :]
        replications = np.where(used, samples, 0.0).sum(axis=1) / count[cols]
        lower[cols], upper[cols] = percentile_interval(replications, size)
    return mean, lower, upper, count
