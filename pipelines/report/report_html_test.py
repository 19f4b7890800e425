"""Tests of the report's pages: escaping, links, numbers as report.json holds them."""

import html.parser
import json
import os

from absl.testing import absltest

from pipelines.report import report_data, report_fixtures, report_html, run_reader

EVIL = '<script>alert("x")</script>'


class PageParser(html.parser.HTMLParser):
    """Tags, attributes and text of a page."""

    def __init__(self):
        super().__init__()
        self.tags, self.text = [], []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))

    def handle_data(self, data):
        self.text.append(data)


def parse(page):
    parser = PageParser()
    parser.feed(page)
    return parser


class TableParser(html.parser.HTMLParser):
    """The rows of the table with id `table_id`: [(row attributes, [cell texts])], each text
    with its white space collapsed."""

    def __init__(self, table_id):
        super().__init__()
        self.table_id, self.inside, self.rows, self.cell = table_id, False, [], None

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == 'table' and attrs.get('id') == self.table_id:
            self.inside = True
        elif self.inside and tag == 'tr':
            self.rows.append((attrs, []))
        elif self.inside and tag in ('td', 'th'):
            self.cell = []

    def handle_endtag(self, tag):
        if tag == 'table':
            self.inside = False
        elif self.inside and tag in ('td', 'th') and self.cell is not None:
            self.rows[-1][1].append(' '.join(''.join(self.cell).split()))
            self.cell = None

    def handle_data(self, data):
        if self.cell is not None:
            self.cell.append(data)


def table(page, table_id):
    parser = TableParser(table_id)
    parser.feed(page)
    return parser.rows


def make_halving_report():
    root = report_fixtures.make_halving_sweep(
        os.path.join(absltest.get_default_test_tmpdir(), 'halving'), events=False)
    return report_fixtures.build_report(root, report_data.Settings(
        root, '/out', bootstrap_reps=100, curve_bootstrap_reps=50))


def make_report():
    settings = report_data.Settings('/in/' + EVIL, '/out', bootstrap_reps=100,
                                    curve_bootstrap_reps=50)
    runs = []
    for name, seed, lr, final in ((EVIL, 0, "'<b>bold</b>'", -150.25), ('b', 1, "'<b>bold</b>'",
                                  -180.0), ('c', 0, '0.01', -400.0)):
        bindings = {'PPO.learning_rate': lr, 'train.seed': str(seed)}
        runs.append(run_reader.Run(name, f'/in/{name}', bindings, run_reader.config_key(bindings),
                                   seed, [100, 200], [-900.0, final], policy_dir='/p'))
    runs.append(run_reader.Run('broken & <i>', '/in/broken', error='no evaluation <results>'))
    runs[1].problems.append('events <file> is damaged')
    groups = {}
    for run in runs[:3]:
        groups.setdefault(run.config_key, []).append(run)
    configs = [report_data.summarize_configuration(key, group, settings)
               for key, group in groups.items()]
    configs[0]['video'] = {'path': report_data.video_path(configs[0]['id']), 'run': EVIL,
                           'seed': 0, 'return': -160.5, 'length': 200, 'width': 250,
                           'height': 250, 'frames': 201}
    configs[1]['video_problem'] = 'no <policy>'
    return report_data.build_report(runs, configs, [], settings)


class FormatNumberTest(absltest.TestCase):

    def test_formats(self):
        self.assertEqual(report_html.format_number(-150.25), '-150.2')
        self.assertEqual(report_html.format_number(0.0123456), '0.0123')
        self.assertEqual(report_html.format_number(2048), '2048')
        self.assertEqual(report_html.format_number(None), '—')
        self.assertEqual(report_html.format_number(float('nan')), '—')
        self.assertEqual(report_html.format_number(-1e300), '-1e+300')
        self.assertEqual(report_html.format_number(123456789012345.6), '123456789012345.6')
        self.assertEqual(report_html.format_number(1234567890123456.0), '1.235e+15')


class RenderTest(absltest.TestCase):

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.report = make_report()
        cls.index = report_html.render_index(cls.report)

    def test_names_and_values_are_escaped(self):
        page = parse(self.index)
        self.assertNotIn('script', [tag for tag, _ in page.tags])
        self.assertNotIn('i', [tag for tag, _ in page.tags])
        text = ''.join(page.text)
        self.assertIn(EVIL, text)
        self.assertIn('broken & <i>', text)
        self.assertIn('no evaluation <results>', text)
        self.assertIn("PPO.learning_rate='<b>bold</b>'", text)
        self.assertIn('&lt;script&gt;', self.index)

    def test_ranking_table_holds_the_report_numbers(self):
        page = parse(self.index)
        rows = [attrs['data-config'] for tag, attrs in page.tags if 'data-config' in attrs]
        self.assertEqual(rows, [config['id'] for config in self.report['configurations']])
        values = [json.loads(attrs['data-value']) for tag, attrs in page.tags
                  if tag == 'td' and 'iqm' in attrs.get('class', '').split()]
        self.assertEqual(values, [config['final']['iqm']['value']
                                  for config in self.report['configurations']])
        best = self.report['configurations'][0]['final']['iqm']
        self.assertIn(f'<span class="value">{report_html.format_number(best["value"])}</span>',
                      self.index)

    def test_links_stay_in_the_report(self):
        page = parse(self.index)
        sources = [attrs.get('src') or attrs.get('href') for tag, attrs in page.tags
                   if tag in ('img', 'video', 'a', 'link') and (attrs.get('src') or
                                                                 attrs.get('href'))]
        self.assertNotEmpty(sources)
        for source in sources:
            self.assertNotRegex(source, r'^(https?:|//|/)', source)
        videos = [attrs for tag, attrs in page.tags if tag == 'video']
        self.assertEqual([video['src'] for video in videos],
                         [self.report['configurations'][0]['video']['path']])
        self.assertIn('No video: no &lt;policy&gt;', self.index)

    def test_run_page(self):
        run = next(run for run in self.report['runs'] if run['id'] == EVIL)
        page = report_html.render_run(self.report, run)
        parsed = parse(page)
        self.assertNotIn('script', [tag for tag, _ in parsed.tags])
        self.assertIn(f'Run {EVIL}', ''.join(parsed.text))
        images = [attrs['src'] for tag, attrs in parsed.tags if tag == 'img']
        self.assertEqual(images, [os.path.basename(run['plot'])])
        videos = [attrs['src'] for tag, attrs in parsed.tags if tag == 'video']
        self.assertEqual(videos, ['../' + self.report['configurations'][0]['video']['path']])

    def test_a_report_without_stages_shows_no_budgets(self):
        self.assertFalse(self.report['staged'])
        self.assertIn('<h2>Configurations ranked by IQM</h2>', self.index)
        for absent in ('id="rungs"', 'budget-note', 'Budget', 'Stopped'):
            self.assertNotIn(absent, self.index)
        header, *rows = table(self.index, 'ranking')
        self.assertEqual(header[1], ['Rank', 'Configuration', 'Runs', 'IQM [95% CI]',
                                     'Mean [95% CI]', 'Median [95% CI]', 'Best run (video)'])
        self.assertEqual([attrs.get('data-config') for attrs, _ in rows],
                         [config['id'] for config in self.report['configurations']])

    def test_empty_report(self):
        report = report_data.build_report([], [], [], report_data.Settings('/in', '/out'))
        page = report_html.render_index(report)
        self.assertIn('No training runs were found', page)
        self.assertNotIn('<img', page)

    def test_write_report(self):
        directory = self.create_tempdir().full_path
        report_html.write_report(self.report, directory)
        with open(os.path.join(directory, 'report.json')) as f:
            self.assertEqual(json.load(f), json.loads(json.dumps(self.report)))
        for run in self.report['runs']:
            self.assertTrue(os.path.isfile(os.path.join(directory, run['page'])))
        with open(os.path.join(directory, 'index.html')) as f:
            self.assertEqual(f.read(), self.index)


class HalvingRenderTest(absltest.TestCase):
    """The pages of a successive-halving sweep's report (`report_fixtures.make_halving_sweep`)."""

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.report = make_halving_report()
        cls.index = report_html.render_index(cls.report)

    def test_rungs_table(self):
        header, *rows = table(self.index, 'rungs')
        self.assertEqual(header[1], ['Bracket', 'Rung', 'Budget (env steps)', 'Entered',
                                     'Went on', 'Configurations by score, best first'])
        lr = 'PPO.learning_rate='
        self.assertEqual([cells for _, cells in rows], [
            ['0', '0', '512', '4', '2',
             f'{lr}0.001: -150.0, went on {lr}0.003: -165.0, went on {lr}0.01: -180.0, pruned '
             f'{lr}0.03: -410.0, pruned'],
            ['0', '1', '1024', '2', '1', f'{lr}0.001: -200.0, went on {lr}0.003: -220.0, pruned'],
            ['0', '2', '2048', '1', '— (full budget)', f'{lr}0.001: -250.0, completed'],
        ])
        self.assertEqual([(attrs['data-bracket'], attrs['data-rung']) for attrs, _ in rows],
                         [('0', '0'), ('0', '1'), ('0', '2')])
        self.assertIn('the mean over its seeds of the mean_return', ' '.join(self.index.split()))

    def test_ranking_by_budget_then_iqm(self):
        self.assertIn('<h2>Configurations ranked by budget, then IQM</h2>', self.index)
        header, *rows = table(self.index, 'ranking')
        self.assertEqual(header[1], ['Rank', 'Configuration', 'Runs', 'Budget', 'Stopped',
                                     'IQM [95% CI]', 'Mean [95% CI]',
                                     'Median [95% CI]', 'Best run (video)'])
        lr = 'PPO.learning_rate='
        self.assertEqual([cells[:6] if 'data-config' in attrs else cells
                          for attrs, cells in rows], [
            ['Trained to the full budget of 2048 env steps: 1 configuration'],
            ['1', f'{lr}0.001', '2', '2048', 'rung 2, completed', '-250.0 [-260.0, -240.0]'],
            ['Stopped at 1024 env steps (pruned after rung 1): 1 configuration'],
            ['2', f'{lr}0.003', '2', '1024', 'rung 1, pruned', '-220.0 [-225.0, -215.0]'],
            ['Stopped at 512 env steps (pruned after rung 0): 2 configurations'],
            ['3', f'{lr}0.01', '2', '512', 'rung 0, pruned', '-180.0 [-185.0, -175.0]'],
            ['4', f'{lr}0.03', '2', '512', 'rung 0, pruned', '-410.0 [-420.0, -400.0]'],
        ])
        note = ' '.join(''.join(parse(self.index[self.index.index('<p id="budget-note">'):
                                      self.index.index('</p>', self.index.index(
                                          'budget-note'))]).text).split())
        self.assertIn('configurations are compared only with those trained to the same budget',
                      note)
        self.assertIn(f'the best configuration, {lr}0.001, is the best of those trained to 2048 '
                      'env steps (the full budget)', note)

    def test_where_each_configuration_and_run_stopped(self):
        text = ' '.join(''.join(parse(self.index).text).split())
        self.assertIn('#3 PPO.learning_rate=0.01 Stopped: pruned after rung 0 (512 env steps): '
                      'ranked 3 of 4 by max mean_return; the top 2 went on.', text)
        self.assertIn('#1 PPO.learning_rate=0.001 Stopped: trained to the full budget (2048 env '
                      'steps).', text)
        run = next(run for run in self.report['runs']
                   if run['config_label'] == 'PPO.learning_rate=0.003' and run['seed'] == 0)
        cells = [cells for _, cells in table(report_html.render_run(self.report, run),
                                             'run-numbers')]
        self.assertIn(['Sweep budget (env steps)', '1024'], cells)
        self.assertIn(['Rung, bracket', '1, 0'], cells)
        self.assertIn(['Stopped', 'pruned after rung 1 (1024 env steps): ranked 2 of 2 by max '
                       'mean_return; the top 1 went on'], cells)

    def test_links_stay_in_the_report(self):
        page = parse(self.index)
        for tag, attrs in page.tags:
            if tag == 'a':
                self.assertNotRegex(attrs['href'], r'^(https?:|//|/)')
        anchors = {attrs['id'] for tag, attrs in page.tags if tag == 'section'}
        for tag, attrs in page.tags:
            if tag == 'a' and attrs['href'].startswith('#'):
                self.assertIn(attrs['href'][1:], anchors)


if __name__ == '__main__':
    absltest.main()
