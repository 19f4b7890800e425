"""Tests of the report's figures: SVGs of the intended size and text, reproducible bytes."""

import os
import xml.etree.ElementTree as ElementTree

from absl.testing import absltest

from pipelines.report import plots, run_reader

SVG = '{http://www.w3.org/2000/svg}'
CURVE = {'steps': [100, 200, 300, 400], 'mean': [-900.0, -500.0, None, -200.0],
         'lower': [-950.0, -600.0, None, -260.0], 'upper': [-850.0, -420.0, None, -150.0]}


class PlotsTest(absltest.TestCase):

    def setUp(self):
        super().setUp()
        self.directory = self.create_tempdir().full_path

    def path(self, name):
        return os.path.join(self.directory, name)

    def read(self, path, min_paths=10):
        """The SVG's root, after checking its width (8 inches) and that it draws something."""
        root = ElementTree.parse(path).getroot()
        self.assertEqual(root.tag, f'{SVG}svg')
        self.assertEqual(root.get('width'), '576pt')  # 8 inches at 72 points per inch.
        self.assertGreaterEqual(len(root.findall(f'.//{SVG}path')), min_paths)
        return root

    def texts(self, root):
        return [''.join(text.itertext()) for text in root.iter(f'{SVG}text')]

    def test_learning_curves_show_the_best_ten(self):
        curves = [(f'PPO.learning_rate={i}', CURVE) for i in range(12)]
        plots.learning_curves(curves, self.path('a.svg'))
        texts = self.texts(self.read(self.path('a.svg')))
        self.assertIn('Evaluation return (best 10 of 12)', texts)
        self.assertIn('PPO.learning_rate=9', texts)
        self.assertNotIn('PPO.learning_rate=10', texts)

    def test_same_data_same_bytes(self):
        plots.learning_curves([('x', CURVE)], self.path('a.svg'))
        plots.learning_curves([('x', CURVE)], self.path('b.svg'))
        plots.learning_curves([('y', CURVE)], self.path('c.svg'))
        with open(self.path('a.svg'), 'rb') as a, open(self.path('b.svg'), 'rb') as b, \
                open(self.path('c.svg'), 'rb') as c:
            first = a.read()
            self.assertEqual(first, b.read())
            self.assertNotEqual(first, c.read())

    def test_labels_are_text_not_markup_or_math(self):
        runs = [('seed $0$', [100, 200], [-900.0, -400.0]), ('<script>', [100], [-800.0])]
        plots.configuration_curve(CURVE, runs, self.path('a.svg'), 'lr=$x$ <b>')
        root = self.read(self.path('a.svg'))
        self.assertIn('lr=$x$ <b>', self.texts(root))
        self.assertIn('<script>', self.texts(root))
        self.assertEmpty(list(root.iter(f'{SVG}script')))

    def test_long_lines_are_thinned(self):
        steps = list(range(10_000))
        kept_steps, kept_values = plots.thin(steps, [2.0 * step for step in steps])
        self.assertLen(kept_steps, plots.MAX_LINE_POINTS)
        self.assertEqual((kept_steps[0], kept_steps[-1]), (0, 9999))
        self.assertEqual(list(kept_values), [2.0 * step for step in kept_steps])
        self.assertEqual(plots.thin([1, 2], [3, 4]), ([1, 2], [3, 4]))

    def test_interval_estimates_grow_with_rows(self):
        rows = [(f'config {i}', -100.0 * i, -100.0 * i - 30, -100.0 * i + 20) for i in range(20)]
        plots.interval_estimates(rows[:2], self.path('a.svg'))
        plots.interval_estimates(rows, self.path('b.svg'))
        small = self.read(self.path('a.svg'))
        large = self.read(self.path('b.svg'))
        self.assertGreater(float(large.get('height')[:-2]), float(small.get('height')[:-2]))
        self.assertIn('config 19', self.texts(large))

    def test_interval_estimates_of_budget_groups_in_panels_of_their_own(self):
        groups = [('Trained to the full budget of 2048 env steps', [('lr=0.001', -250.0, -260.0,
                                                                     -240.0)]),
                  ('Stopped at 512 env steps', [('lr=0.01', -180.0, -185.0, -175.0),
                                                ('lr=0.03', -410.0, -420.0, -400.0)])]
        plots.grouped_interval_estimates(groups, self.path('a.svg'))
        root = self.read(self.path('a.svg'))
        texts = self.texts(root)
        for title in ('IQM of final evaluation returns (95% CI)', groups[0][0], groups[1][0],
                      'lr=0.001', 'lr=0.01', 'lr=0.03'):
            self.assertIn(title, texts)
        # One pair of axes per group, each with its own final-return axis.
        self.assertEqual(texts.count('final evaluation return'), 2)
        self.assertLen([group for group in root.iter(f'{SVG}g')
                        if (group.get('id') or '').startswith('axes_')], 2)

    def test_sensitivity_numeric_log_and_categorical(self):
        numeric = [(lr, str(lr), [-200.0, -300.0], -250.0, -300.0, -200.0)
                   for lr in (1e-4, 1e-3, 1e-2)]
        plots.sensitivity('PPO.learning_rate', numeric, self.path('a.svg'))
        texts = self.texts(self.read(self.path('a.svg')))
        self.assertIn('Sensitivity to PPO.learning_rate', texts)
        # A logarithmic axis: ticks 10^-4, 10^-3, 10^-2 (superscripts as separate spans).
        self.assertContainsSubset({'10−4', '10−3', '10−2'},
                                  {''.join(text.split()) for text in texts})
        categorical = [('clipped', "'clipped'", [1.0], 1.0, 1.0, 1.0),
                       ('(64, 64)', '(64, 64)', [2.0, 3.0], 2.5, 2.0, 3.0)]
        plots.sensitivity('PPO.objective', categorical, self.path('b.svg'))
        texts = self.texts(self.read(self.path('b.svg')))
        self.assertIn("'clipped'", texts)
        self.assertIn('(64, 64)', texts)
        plots.sensitivity('PPO.objective', categorical, self.path('c.svg'), budget=512)
        self.assertIn('Sensitivity to PPO.objective at 512 env steps',
                      self.texts(self.read(self.path('c.svg'))))

    def test_run_curve_with_and_without_training_returns(self):
        plots.run_curve(([100, 200], [-900.0, -500.0]), ([50, 150], [-1000.0, -700.0]),
                        self.path('a.svg'), 'run a')
        plots.run_curve(([100], [-900.0]), ([], []), self.path('b.svg'), 'run b')
        self.assertIn('training episodes', self.texts(self.read(self.path('a.svg'))))
        self.assertNotIn('training episodes', self.texts(self.read(self.path('b.svg'))))

    def test_numbers_at_the_ends_of_the_range_the_report_takes(self):
        big, last = run_reader.MAX_MAGNITUDE, run_reader.MAX_STEP
        steps, returns = [0, last // 2, last], [-big, big, -big]
        curve = {'steps': steps, 'mean': returns, 'lower': [-big] * 3, 'upper': [big] * 3}
        plots.run_curve((steps, returns), (steps, returns), self.path('a.svg'), 'run')
        plots.configuration_curve(curve, [('a', steps, returns)], self.path('b.svg'), 'c')
        plots.learning_curves([('c', curve)], self.path('c.svg'))
        plots.interval_estimates([('c', big, -big, big), ('d', -big, -big, -big)],
                                 self.path('d.svg'))
        plots.sensitivity('p', [(1e-3, '1e-3', returns, -big, -big, big),
                                (big, '1e300', returns, big, -big, big)], self.path('e.svg'))
        for name in 'abcde':
            self.read(self.path(f'{name}.svg'), min_paths=3)

    def test_plain_text(self):
        self.assertEqual(plots.plain('a$b'), r'a\$b')
        self.assertEqual(plots.plain('x' * 100, limit=10), 'x' * 9 + '…')


if __name__ == '__main__':
    absltest.main()
