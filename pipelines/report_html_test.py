"""Tests of the report's pages: escaping, links, numbers as report.json holds them."""

import html.parser
import json
import os

from absl.testing import absltest

from pipelines import report_data, report_html, run_reader

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


if __name__ == '__main__':
    absltest.main()
