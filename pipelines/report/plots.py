"""The report's figures as SVG files, drawn with matplotlib (Agg backend: no display needed).

SVG with text kept as text is about twice as fast to write as PNG here, and sharp at any zoom.
Each function draws one figure on its own `Figure` object, never pyplot's global state, so
figures can be drawn from several threads, and writes it without a date and with fixed element
ids, so that the same data gives the same bytes.
"""

import math

import matplotlib
import numpy as np

matplotlib.use('Agg')

from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

WIDTH, HEIGHT, DPI = 8.0, 4.2, 100  # 800 x 420 pixels.
MAX_CURVES = 10
# Lines of more points are thinned: an 800-pixel plot shows no more, and drawing them is slow.
MAX_LINE_POINTS = 800
COLORS = ['#1f77b4', '#ff7f0e', '#2ca02c', '#d62728', '#9467bd', '#8c564b', '#e377c2',
          '#7f7f7f', '#bcbd22', '#17becf']


def color(index):
    return COLORS[index % len(COLORS)]


def plain(text, limit=60):
    """Text shown as is: '$' would start matplotlib's math mode; long labels are cut."""
    text = str(text).replace('$', r'\$')
    return text if len(text) <= limit else text[:limit - 1] + '…'


def _figure(height=HEIGHT):
    figure = Figure(figsize=(WIDTH, height), dpi=DPI)
    FigureCanvasAgg(figure)
    return figure, figure.add_subplot()


SVG_SETTINGS = {
    'svg.fonttype': 'none',  # Text as <text>, not as glyph outlines.
    'svg.hashsalt': 'batchppo-report',  # Element ids from the content, not random.
}


def _save(figure, path, tight=False):
    """Writes the SVG; `tight` fits the margins to the labels (an extra layout pass)."""
    with matplotlib.rc_context(SVG_SETTINGS):
        if tight:
            figure.tight_layout()
        else:
            figure.subplots_adjust(left=0.1, right=0.98, top=0.92, bottom=0.13)
        figure.savefig(path, format='svg', metadata={'Date': None})


def _finite(*columns):
    """Rows of `columns` where every value is a finite number."""
    rows = [row for row in zip(*columns, strict=True)
            if all(value is not None and math.isfinite(value) for value in row)]
    if not rows:
        return [[] for _ in columns]
    return [list(column) for column in zip(*rows, strict=True)]


def thin(steps, values, max_points=MAX_LINE_POINTS):
    """At most `max_points` evenly spread points of a line, its first and last included."""
    if len(steps) <= max_points:
        return steps, values
    keep = np.unique(np.linspace(0, len(steps) - 1, max_points).round().astype(int))
    return np.asarray(steps)[keep], np.asarray(values)[keep]


def learning_curves(curves, path, title='Evaluation return'):
    """Mean curves with their 95% bands, one per configuration, best first.

    Args:
      curves: [(label, {'steps', 'mean', 'lower', 'upper'})] in rank order; the first
        `MAX_CURVES` are drawn.
      path: the SVG file to write.
    """
    figure, axes = _figure()
    for index, (label, curve) in enumerate(curves[:MAX_CURVES]):
        steps, mean, lower, upper = _finite(curve['steps'], curve['mean'], curve['lower'],
                                            curve['upper'])
        axes.plot(steps, mean, color=color(index), label=plain(label), linewidth=1.5)
        axes.fill_between(steps, lower, upper, color=color(index), alpha=0.2, linewidth=0)
    shown = f' (best {MAX_CURVES} of {len(curves)})' if len(curves) > MAX_CURVES else ''
    axes.set_title(plain(title + shown, 100))
    axes.set_xlabel('environment steps')
    axes.set_ylabel('mean return (95% CI)')
    axes.grid(alpha=0.3)
    if curves:
        axes.legend(fontsize='small', loc='best')
    _save(figure, path)


def configuration_curve(curve, runs, path, title):
    """A configuration's mean curve and band over the thin curves of its runs.

    Args:
      curve: {'steps', 'mean', 'lower', 'upper'}.
      runs: [(label, steps, returns)] of its runs.
    """
    figure, axes = _figure()
    for index, (label, steps, returns) in enumerate(runs):
        axes.plot(*thin(steps, returns), color=color(index + 1), linewidth=0.8, alpha=0.6,
                  label=plain(label, 30))
    steps, mean, lower, upper = _finite(curve['steps'], curve['mean'], curve['lower'],
                                        curve['upper'])
    axes.fill_between(steps, lower, upper, color=color(0), alpha=0.25, linewidth=0,
                      label='95% CI of the mean')
    axes.plot(steps, mean, color=color(0), linewidth=2, label='mean')
    axes.set_title(plain(title, 100))
    axes.set_xlabel('environment steps')
    axes.set_ylabel('evaluation return')
    axes.grid(alpha=0.3)
    axes.legend(fontsize='x-small', loc='best', ncol=2)
    _save(figure, path)


def interval_estimates(rows, path, title='IQM of final evaluation returns (95% CI)'):
    """One horizontal interval per configuration, best on top.

    Args:
      rows: [(label, value, lower, upper)] in rank order.
    """
    height = max(2.0, 0.8 + 0.32 * len(rows))
    figure, axes = _figure(height)
    _draw_intervals(axes, rows)
    axes.set_title(plain(title, 100))
    axes.set_xlabel('final evaluation return')
    _save(figure, path, tight=True)


def grouped_interval_estimates(groups, path, title='IQM of final evaluation returns (95% CI)'):
    """`interval_estimates` in one panel per group, each with its own axis, so that no interval
    is set against another group's: configurations trained to different budgets.

    Args:
      groups: [(group title, rows)], rows as `interval_estimates` takes them, in rank order.
    """
    sizes = [max(1, len(rows)) for _, rows in groups]
    height = max(2.0, 0.8 + 0.32 * sum(sizes) + 0.75 * len(groups))
    figure = Figure(figsize=(WIDTH, height), dpi=DPI)
    FigureCanvasAgg(figure)
    panels = figure.subplots(len(groups), 1, squeeze=False,
                             gridspec_kw={'height_ratios': sizes})[:, 0]
    for axes, (group_title, rows) in zip(panels, groups, strict=True):
        _draw_intervals(axes, rows)
        axes.set_title(plain(group_title, 100), fontsize='medium')
        axes.set_xlabel('final evaluation return', fontsize='small')
    figure.suptitle(plain(title, 100))
    _save(figure, path, tight=True)


def _draw_intervals(axes, rows):
    for position, (_label, value, lower, upper) in enumerate(rows):
        axes.plot([lower, upper], [position, position], color=color(position), linewidth=6,
                  alpha=0.5, solid_capstyle='butt')
        axes.plot([value], [position], marker='|', markersize=14, color='black')
    axes.set_yticks(range(len(rows)), [plain(row[0], 45) for row in rows], fontsize='small')
    axes.set_ylim(len(rows) - 0.5, -0.5)
    axes.grid(alpha=0.3, axis='x')


def sensitivity(name, points, path, budget=None):
    """Final scores of runs against the value of one swept parameter.

    Args:
      name: the parameter, e.g. 'PPO.learning_rate'.
      points: [(value, value text, [run scores], iqm, lower, upper)], one per configuration.
        Numeric values get a numeric axis (logarithmic when positive and spanning more than
        a factor of 10 or more); others one position each, in the order given.
      budget: the env steps all these configurations were trained to, for the title (None:
        not said).
    """
    figure, axes = _figure()
    numeric = all(isinstance(point[0], (int, float)) and not isinstance(point[0], bool) and
                  math.isfinite(point[0]) for point in points)
    texts = list(dict.fromkeys(point[1] for point in points))
    for index, (value, text, scores, iqm, lower, upper) in enumerate(points):
        x = value if numeric else texts.index(text)
        axes.scatter([x] * len(scores), scores, color='#7f7f7f', s=12, alpha=0.7,
                     label='runs' if index == 0 else None, zorder=2)
        axes.errorbar([x], [iqm], yerr=[[iqm - lower], [upper - iqm]], fmt='o',
                      color=color(0), capsize=4, label='IQM (95% CI)' if index == 0 else None,
                      zorder=3)
    if numeric:
        values = [point[0] for point in points]
        if values and min(values) > 0 and max(values) / min(values) >= 10:
            axes.set_xscale('log')
    else:
        axes.set_xticks(range(len(texts)), [plain(text, 25) for text in texts],
                        fontsize='small')
    at = f' at {budget} env steps' if budget is not None else ''
    axes.set_title(plain(f'Sensitivity to {name}{at}', 100))
    axes.set_xlabel(plain(name, 100))
    axes.set_ylabel('final evaluation return')
    axes.grid(alpha=0.3)
    if points:
        axes.legend(fontsize='small', loc='best')
    _save(figure, path, tight=True)


def run_curve(eval_curve, train_curve, path, title):
    """One run: its evaluation returns and, if any, its training-episode returns.

    Args:
      eval_curve, train_curve: (steps, returns).
    """
    figure, axes = _figure()
    if len(train_curve[0]):
        axes.plot(*thin(*train_curve), color=color(1), linewidth=0.8, alpha=0.7,
                  label='training episodes')
    axes.plot(*thin(*eval_curve), color=color(0), linewidth=1.5,
              marker='o' if len(eval_curve[0]) < 30 else None, markersize=3, label='evaluation')
    axes.set_title(plain(title, 100))
    axes.set_xlabel('environment steps')
    axes.set_ylabel('return')
    axes.grid(alpha=0.3)
    axes.legend(fontsize='small', loc='best')
    _save(figure, path)
