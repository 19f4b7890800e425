"""Loads a report in headless Chromium: it shows, plays and says what report.json says.

By default the report is built from a synthetic sweep with damaged runs (see
`report_fixtures.make_sweep`); with REPORT_DIR set, the report in that directory is checked
instead (e.g. the example sweep's). The report is served over HTTP from 127.0.0.1, as it would
be from any static host, and driven by Selenium with Debian's chromium and chromedriver. Checks:
no console errors on any page, nothing fetched from outside the report, every image loaded,
every video playable, the ranked table as in report.json, run names shown as text. A full-page
screenshot goes to $TEST_UNDECLARED_OUTPUTS_DIR (Bazel's test artifacts; REPORT_SCREENSHOT
overrides the path).

The same checks, and those of its Rungs table and of a ranking by budget, run on the report of
a successive-halving sweep (`report_fixtures.make_halving_sweep`), built whatever REPORT_DIR
says; its screenshot is report-halving.png.

Without /usr/bin/chromium the test is skipped, except under CI=true, where it fails.
"""

import functools
import http.server
import json
import os
import tempfile
import threading

from absl.testing import absltest, flagsaver

from pipelines.report import report, report_fixtures, report_html

CHROMIUM = '/usr/bin/chromium'
CHROMEDRIVER = '/usr/bin/chromedriver'
CHROMIUM_FLAGS = ['--headless', '--no-sandbox', '--disable-gpu',
                  '--disable-background-networking', '--disable-component-update',
                  '--disable-sync', '--no-first-run', '--hide-scrollbars', '--mute-audio',
                  '--autoplay-policy=no-user-gesture-required']
WIDTH = 1000
TIMEOUT_SECS = 60

MEDIA_STATE = """
return {
  images: [...document.images].map(i => ({src: i.getAttribute('src'), complete: i.complete,
                                          width: i.naturalWidth})),
  videos: [...document.querySelectorAll('video')].map(v => ({
      src: v.getAttribute('src'), readyState: v.readyState, duration: v.duration,
      error: v.error && v.error.message, width: v.videoWidth})),
  resources: performance.getEntriesByType('resource').map(r => r.name),
  scripts: document.scripts.length,
};
"""


def chromium_or_skip(test):
    if os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER):
        return
    message = (f'{CHROMIUM} or {CHROMEDRIVER} is missing: apt-get install chromium '
               'chromium-driver')
    if os.environ.get('CI') == 'true':
        test.fail(f'{message} (CI must run the browser test)')
    test.skipTest(message)


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


class ReportBrowserTest(absltest.TestCase):

    SCREENSHOT = 'report.png'

    @classmethod
    def make_report(cls):
        """The directory of the report to check."""
        if os.environ.get('REPORT_DIR'):
            return os.environ['REPORT_DIR']
        tmp = tempfile.mkdtemp(dir=absltest.get_default_test_tmpdir())
        policy = report_fixtures.train_tiny_policy(os.path.join(tmp, 'tiny'))
        sweep = report_fixtures.make_sweep(os.path.join(tmp, 'sweep'), policy)
        directory = os.path.join(tmp, 'report')
        with flagsaver.flagsaver(input=sweep, output_dir=directory, video_max_steps=60,
                                 video_size=160, bootstrap_reps=2000, curve_bootstrap_reps=200):
            report.main(['report', '--direct_running_mode=in_memory'])
        return directory

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.directory = cls.make_report()
        with open(os.path.join(cls.directory, report_html.REPORT_FILE), encoding='utf-8') as f:
            cls.report = json.load(f)
        handler = functools.partial(QuietHandler, directory=cls.directory)
        cls.server = http.server.ThreadingHTTPServer(('127.0.0.1', 0), handler)
        cls.origin = f'http://127.0.0.1:{cls.server.server_address[1]}/'
        threading.Thread(target=cls.server.serve_forever, daemon=True).start()
        cls.driver = None

    @classmethod
    def tearDownClass(cls):
        if cls.driver is not None:
            cls.driver.quit()
        cls.server.shutdown()
        cls.server.server_close()
        super().tearDownClass()

    def setUp(self):
        super().setUp()
        chromium_or_skip(self)
        if type(self).driver is None:
            type(self).driver = self.start_chromium()

    def start_chromium(self):
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service

        options = webdriver.ChromeOptions()
        options.binary_location = CHROMIUM
        for flag in CHROMIUM_FLAGS:
            options.add_argument(flag)
        options.add_argument(f'--user-data-dir={tempfile.mkdtemp()}')
        options.add_argument(f'--window-size={WIDTH},900')
        options.set_capability('goog:loggingPrefs', {'browser': 'ALL'})
        return webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)

    def load(self, page):
        """Opens a page of the report, waits for its media; returns their state."""
        from selenium.webdriver.support.ui import WebDriverWait

        self.driver.get(self.origin + page)

        def settled(driver):
            state = driver.execute_script(MEDIA_STATE)
            done = (all(image['complete'] for image in state['images']) and
                    all(video['readyState'] >= 2 or video['error']
                        for video in state['videos']))
            return state if done else False

        state = WebDriverWait(self.driver, TIMEOUT_SECS, poll_frequency=0.2).until(settled)
        errors = [entry for entry in self.driver.get_log('browser')
                  if entry['level'] in ('SEVERE', 'ERROR')]
        self.assertEqual(errors, [], f'console errors on {page}')
        for image in state['images']:
            self.assertGreater(image['width'], 0, f'image {image["src"]} on {page} did not load')
        for video in state['videos']:
            self.assertIsNone(video['error'], f'video {video["src"]} on {page}')
            self.assertGreaterEqual(video['readyState'], 2, video)
            self.assertGreater(video['duration'], 0, video)
            self.assertGreater(video['width'], 0, video)
        self.assertEqual(state['scripts'], 0)
        for resource in state['resources']:
            self.assertTrue(resource.startswith(self.origin), f'{page} fetched {resource}')
        return state

    def test_index_page(self):
        state = self.load('index.html')
        configs = self.report['configurations']
        self.assertLen(state['videos'], sum(1 for config in configs if config['video']))
        if configs:
            self.assertGreaterEqual(len(state['images']), 2 + len(configs))
        self.save_screenshot()

    def test_videos_play(self):
        self.load('index.html')
        videos = self.driver.find_elements('css selector', 'video')
        for video in videos:
            self.driver.execute_script('arguments[0].play();', video)
        from selenium.webdriver.support.ui import WebDriverWait
        WebDriverWait(self.driver, TIMEOUT_SECS, poll_frequency=0.2).until(
            lambda driver: all(driver.execute_script('return arguments[0].currentTime > 0;', v)
                               for v in videos))

    def test_ranked_table_matches_report_json(self):
        self.load('index.html')
        rows = self.driver.execute_script("""
            return [...document.querySelectorAll('#ranking tbody tr[data-config]')].map(row => ({
              id: row.dataset.config,
              rank: row.querySelector('.rank').textContent.trim(),
              label: row.querySelector('.label').textContent.trim(),
              runs: row.querySelector('.count').textContent.trim(),
              values: Object.fromEntries(['iqm', 'mean', 'median'].map(name => {
                const cell = row.querySelector('.' + name);
                return [name, {value: JSON.parse(cell.dataset.value),
                               ci: JSON.parse(cell.dataset.ci),
                               text: cell.querySelector('.value').textContent.trim()}];
              })),
            }));""")
        configs = self.report['configurations']
        self.assertEqual([row['id'] for row in rows], [config['id'] for config in configs])
        for row, config in zip(rows, configs, strict=True):
            self.assertEqual(row['rank'], str(config['rank']))
            self.assertEqual(row['label'], config['label'])
            self.assertEqual(row['runs'], str(len(config['runs'])))
            for name, shown in row['values'].items():
                self.assertEqual(shown['value'], config['final'][name]['value'])
                self.assertEqual(shown['ci'], config['final'][name]['ci'])
                self.assertEqual(shown['text'],
                                 report_html.format_number(config['final'][name]['value']))
        # By IQM within each budget (one, but in a staged sweep's report), highest budget first.
        groups = self.report.get('budget_groups') or [
            {'configurations': [config['id'] for config in configs]}]
        self.assertEqual([key for group in groups for key in group['configurations']],
                         [config['id'] for config in configs])
        by_id = {config['id']: config for config in configs}
        for group in groups:
            iqms = [by_id[key]['final']['iqm']['value'] for key in group['configurations']]
            self.assertEqual(iqms, sorted(iqms, reverse=True))
        skipped = self.driver.execute_script(
            "return [...document.querySelectorAll('#skipped tbody tr td:first-child')]"
            ".map(cell => cell.textContent);")
        self.assertEqual(skipped, [entry['run'] for entry in self.report['skipped']])

    def test_run_pages(self):
        for run in self.report['runs']:
            with self.subTest(run['id']):
                state = self.load(run['page'])
                self.assertLen(state['images'], 1)
                heading = self.driver.find_element('css selector', 'h1').text
                self.assertEqual(heading, f'Run {run["id"]}')

    def save_screenshot(self):
        path = os.path.join(os.environ.get('TEST_UNDECLARED_OUTPUTS_DIR') or
                            absltest.get_default_test_tmpdir(), self.SCREENSHOT)
        if os.environ.get('REPORT_SCREENSHOT'):
            base, extension = os.path.splitext(os.environ['REPORT_SCREENSHOT'])
            path = base + os.path.splitext(self.SCREENSHOT)[0].removeprefix('report') + extension
        height = self.driver.execute_script('return document.documentElement.scrollHeight;')
        self.driver.set_window_size(WIDTH, min(max(height, 600), 12000))
        try:
            self.driver.execute_script('window.scrollTo(0, 0);')
            self.assertTrue(self.driver.save_screenshot(path))
        finally:
            self.driver.set_window_size(WIDTH, 900)
        print(f'Screenshot: {path}')



class HalvingReportBrowserTest(ReportBrowserTest):
    """The report of a successive-halving sweep: every check above, its Rungs table, and the
    ranking by budget reached."""

    SCREENSHOT = 'report-halving.png'

    @classmethod
    def make_report(cls):
        tmp = tempfile.mkdtemp(dir=absltest.get_default_test_tmpdir())
        sweep = report_fixtures.make_halving_sweep(os.path.join(tmp, 'sweep'))
        directory = os.path.join(tmp, 'report')
        with flagsaver.flagsaver(input=sweep, output_dir=directory, videos=False,
                                 bootstrap_reps=2000, curve_bootstrap_reps=200):
            cls.exit_code = report.main(['report', '--direct_running_mode=in_memory'])
        return directory

    def test_the_report_is_complete(self):
        self.assertEqual((self.exit_code, self.report['problems'], self.report['skipped']),
                         (0, [], []))

    def test_rungs_table_shows_each_rung(self):
        self.load('index.html')
        rungs = self.driver.find_element('id', 'rungs')
        self.assertTrue(rungs.is_displayed())
        rows = self.driver.execute_script("""
            const text = element => element.textContent.trim().replace(/\\s+/g, ' ');
            return [...document.querySelectorAll('#rungs tbody tr')].map(row => [
              ...['bracket', 'rung', 'budget', 'entered', 'went-on'].map(
                  name => text(row.querySelector('.' + name))),
              [...row.querySelectorAll('li')].map(item => [
                  text(item.querySelector('.name')), text(item.querySelector('.score')),
                  text(item.querySelector('.status'))])]);""")
        lr = 'PPO.learning_rate='
        self.assertEqual(rows, [
            ['0', '0', '512', '4', '2', [[lr + '0.001', '-150.0', 'went on'],
                                         [lr + '0.003', '-165.0', 'went on'],
                                         [lr + '0.01', '-180.0', 'pruned'],
                                         [lr + '0.03', '-410.0', 'pruned']]],
            ['0', '1', '1024', '2', '1', [[lr + '0.001', '-200.0', 'went on'],
                                          [lr + '0.003', '-220.0', 'pruned']]],
            ['0', '2', '2048', '1', '— (full budget)', [[lr + '0.001', '-250.0', 'completed']]],
        ])
        # Each configuration's name leads to its section.
        link = self.driver.find_element('css selector', '#rungs li[data-status="pruned"] a')
        self.assertEqual(link.get_attribute('href'), self.origin + 'index.html#' +
                         self.report['rungs'][0]['configurations'][2]['config'])

    def test_the_full_budget_configuration_ranks_first(self):
        self.load('index.html')
        rows = self.driver.execute_script("""
            const text = element => element.textContent.trim().replace(/\\s+/g, ' ');
            return [...document.querySelectorAll('#ranking tbody tr')].map(row =>
              row.dataset.config ? ['rank', 'label', 'budget', 'stop', 'iqm'].map(
                  name => text(row.querySelector('.' + name))) : [text(row)]);""")
        lr = 'PPO.learning_rate='
        self.assertEqual(rows, [
            ['Trained to the full budget of 2048 env steps: 1 configuration'],
            ['1', lr + '0.001', '2048', 'rung 2, completed', '-250.0 [-260.0, -240.0]'],
            ['Stopped at 1024 env steps (pruned after rung 1): 1 configuration'],
            ['2', lr + '0.003', '1024', 'rung 1, pruned', '-220.0 [-225.0, -215.0]'],
            ['Stopped at 512 env steps (pruned after rung 0): 2 configurations'],
            # Its final return is the highest, but after a quarter of the budget.
            ['3', lr + '0.01', '512', 'rung 0, pruned', '-180.0 [-185.0, -175.0]'],
            ['4', lr + '0.03', '512', 'rung 0, pruned', '-410.0 [-420.0, -400.0]'],
        ])
        note = self.driver.find_element('id', 'budget-note')
        self.assertTrue(note.is_displayed())
        self.assertIn('the best configuration, PPO.learning_rate=0.001, is the best of those '
                      'trained to 2048 env steps (the full budget)', note.text)


if __name__ == '__main__':
    absltest.main()
