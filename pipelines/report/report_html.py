"""Writes the report's pages: `index.html`, one page per run, and `report.json`.

Pages come from the jinja2 templates in `templates/` with autoescaping on: run names, paths and
gin values are text, whatever characters they hold (a run named `<script>` shows as such). A
Content-Security-Policy in every page allows nothing but the report folder's own images and
videos, so the report is self-contained and runs no script. `report.json` is the data the pages
show, every number at full precision; the pages round them with `format_number`.
"""

import functools
import json
import math
import os
import posixpath

import jinja2

from agents.storage import file_io, locations

TEMPLATES_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'templates')
REPORT_FILE = 'report.json'
INDEX_FILE = 'index.html'


def format_number(value):
    """How the pages show a number: one decimal, three significant digits below 1, four from
    1e15 on."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return '—'
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    if abs(value) >= 1e15:  # Not hundreds of digits for a return of 1e300.
        return f'{value:.4g}'
    return f'{value:.1f}' if abs(value) >= 1 else f'{value:.3g}'


@functools.cache
def environment():
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES_DIR), autoescape=True,
        undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    env.filters['num'] = format_number
    env.filters['basename'] = posixpath.basename
    return env


def render_index(report):
    runs_by_id = {run['id']: run for run in report['runs']}
    configs_by_id = {config['id']: config for config in report['configurations']}
    return environment().get_template('index.html.j2').render(
        report=report, runs_by_id=runs_by_id, configs_by_id=configs_by_id)


def render_run(report, run):
    configs = {config['id']: config for config in report['configurations']}
    return environment().get_template('run.html.j2').render(
        report=report, run=run, config=configs.get(run['config']))


def write_report(report, directory):
    """Writes report.json, runs/*.html and, last, index.html into `directory` (a local path or
    a URL), each file whole or not at all."""
    for run in report['runs']:
        _write(locations.join(directory, run['page']), render_run(report, run), 'text/html')
    _write(locations.join(directory, REPORT_FILE),
           json.dumps(report, indent=1, sort_keys=True, allow_nan=False) + '\n',
           'application/json')
    _write(locations.join(directory, INDEX_FILE), render_index(report), 'text/html')


def _write(path, text, mime_type):
    file_io.write_bytes(path, text.encode('utf-8'), mime_type=f'{mime_type}; charset=utf-8')
