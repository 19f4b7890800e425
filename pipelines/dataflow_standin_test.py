"""A sweep as Dataflow runs it, with real parts standing in for Google Cloud, offline.

- Storage: a real GCS JSON API server on loopback (fake-gcs-server), reached by Beam's gs://
  filesystem and google-cloud-storage through STORAGE_EMULATOR_HOST; the GCE metadata server
  is pointed at a closed loopback port, so no request leaves the machine.
- Code: the package built as Beam's stager builds it for `--setup_file` (`python -m build
  --sdist --no-isolation`) and pip-installed into a fresh venv, as a Dataflow worker installs
  it; the launcher and the workers run from that venv, in directories outside the repository,
  with no repository on their path (dependencies come from the locked venv through a .pth file,
  standing in for the worker image's installed dependencies).
- Runner: Beam's portable runner: a job service and a pool of external SDK worker processes.

A worker process is killed in the middle of a trial: the trial resumes from its checkpoint in
the bucket and ends `ok` with one continuous step count. Then the report runs from the bucket
into the bucket and is checked in the browser.
"""

import io
import json
import os
import signal
import subprocess
import sys
import tarfile
import unittest
from unittest import mock

from absl.testing import absltest
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.runners.portability.stager import Stager

from agents.storage import gcs_testing
from pipelines.packaging_testing import clean_env, copy_tree, run, staged
from pipelines.portable_testing import PortableCluster
from pipelines.process_testing import wait_for
from pipelines.report import report_browser_test
from pipelines.sweep import sweep_testing
from tools import source_tree

BUCKET = 'sweeps'
SWEEP = f'gs://{BUCKET}/sweep'
# Two trials of four evaluations each (one per iteration), small enough for two cores.
BUDGET = 4096
SPEC = sweep_testing.tiny_spec('pendulum.gin', BUDGET, 900) + (
    'grid: {PPO.learning_rate: [3.0e-4, 1.0e-3]}\n')


def build_sdist(tree, directory):
    """The package Beam stages for `--setup_file=<tree>/pyproject.toml` (workflow.tar.gz)."""
    options = PipelineOptions([f'--setup_file={os.path.join(tree, "pyproject.toml")}'])
    resources = Stager.create_job_resources(options, directory,
                                            log_submission_env_dependencies=False)
    return staged(resources)['workflow.tar.gz']


def install_in_fresh_venv(sdist, path):
    """A fresh venv with the sdist pip-installed (offline, no deps: they come from this
    interpreter's site-packages through a .pth file); returns the venv's bin directory.

    The venv gets no pip of its own (ensurepip takes seconds): this interpreter's pip installs
    into it (`pip --python`)."""
    run([sys.executable, '-m', 'venv', '--without-pip', path], env=clean_env())
    python = os.path.join(path, 'bin', 'python')
    site_packages = run([python, '-c', 'import sysconfig; print(sysconfig.get_path("purelib"))'],
                        env=clean_env()).strip()
    ours = run([sys.executable, '-c', 'import sysconfig; print(sysconfig.get_path("purelib"))'],
               env=clean_env()).strip()
    with open(os.path.join(site_packages, 'locked_dependencies.pth'), 'w') as f:
        f.write(ours + '\n')
    run([sys.executable, '-m', 'pip', '--python', python, 'install', '--no-deps',
         '--no-build-isolation', sdist], env=clean_env(), cwd=path)
    return os.path.join(path, 'bin')


class DataflowStandInTest(absltest.TestCase):

    def setUp(self):
        super().setUp()
        self.dir = self.create_tempdir().full_path
        root = source_tree.workspace_root(anchor='pyproject.toml')
        tree = copy_tree(root, os.path.join(self.dir, 'checkout'))
        sdist = build_sdist(tree, os.path.join(self.dir, 'staging'))
        with tarfile.open(sdist) as archive:
            names = archive.getnames()
        self.assertFalse([name for name in names if name.endswith('_test.py')])
        self.bin = install_in_fresh_venv(sdist, os.path.join(self.dir, 'venv'))
        self.home = os.path.join(self.dir, 'home')  # Outside the repository, as on a worker.
        os.makedirs(self.home)
        self.emulator = self.enter_context(gcs_testing.GcsEmulator(
            buckets=(BUCKET,), log_dir=self.dir))
        self.env = self.emulator.environment(clean_env())

    def command(self, name, *args):
        """A console script of the installed package, run in the home directory."""
        log_path = os.path.join(self.dir, f'{name}.log')
        log = open(log_path, 'w')
        self.addCleanup(log.close)
        process = subprocess.Popen([os.path.join(self.bin, name), *args], stdout=log,
                                   stderr=subprocess.STDOUT, cwd=self.home, env=self.env,
                                   stdin=subprocess.DEVNULL, start_new_session=True)
        self.addCleanup(lambda: process.poll() is None and os.killpg(process.pid, 9))
        return process, log_path

    def objects(self, prefix):
        return self.emulator.objects(BUCKET, prefix)

    def test_sweep_survives_a_lost_worker_and_reports_from_the_bucket(self):
        python = os.path.join(self.bin, 'python')
        # The package, not a checkout, is what the workers import.
        where = run([python, '-c', 'import agents, pipelines; print(agents.__file__)'],
                    env=self.env, cwd=self.home)
        self.assertIn(os.path.join(self.dir, 'venv'), where)
        cluster = self.enter_context(PortableCluster(
            self.dir, env=self.env, worker_python=python, worker_env=self.env,
            worker_cwd=self.home))
        with open(os.path.join(self.home, 'spec.yaml'), 'w') as f:
            f.write(SPEC)
        sweep, sweep_log = self.command(
            'batchppo-sweep', '--spec=spec.yaml', f'--output_dir={SWEEP}',
            *cluster.pipeline_args(), '--threads_per_trial=1')

        # Kill the worker once a trial has a checkpoint and an evaluation in the bucket.
        def first_evaluated():
            return sorted(name for name in self.objects('sweep/trials/')
                          if name.endswith('/metrics.jsonl'))
        wait_for(lambda: first_evaluated() or sweep.poll() is not None, 600,
                 'a first evaluation in the bucket', interval=0.2)
        self.assertIsNone(sweep.poll(), 'the sweep ended before any worker was killed')
        workers = cluster.worker_pids()
        self.assertNotEmpty(workers)
        for pid in workers:
            os.kill(pid, signal.SIGKILL)
        killed_trial = first_evaluated()[0].split('/')[2]
        stored = self.objects(f'sweep/trials/{killed_trial}/metrics.jsonl')
        steps_at_kill = [json.loads(line)['step'] for line in
                         next(iter(stored.values())).decode().splitlines()]
        self.assertLess(steps_at_kill[-1], BUDGET, 'the trial ended before the kill')

        returncode = sweep.wait(timeout=1200)
        with open(sweep_log) as f:
            log = f.read()
        self.assertEqual(returncode, 0, f'{log[-6000:]}\n{cluster.logs()}')
        self.assertIn('The pipeline failed', log)  # The lost worker failed the first attempt.

        records = [json.loads(line) for line in
                   self.objects('sweep/trials.jsonl')['sweep/trials.jsonl'].decode().splitlines()]
        self.assertLen(records, 2)
        for record in records:
            self.assertEqual(record['status'], 'ok', record['error'])
            self.assertGreaterEqual(record['env_steps'], BUDGET)
        trial_files = self.objects(f'sweep/trials/{killed_trial}/')
        prefix = f'sweep/trials/{killed_trial}/'
        steps = [json.loads(line)['step'] for line in
                 trial_files[prefix + 'metrics.jsonl'].decode().splitlines()]
        # One continuous step count: the evaluations before the kill, then the rest, none twice.
        self.assertEqual(steps[:len(steps_at_kill)], steps_at_kill)
        self.assertEqual(steps, sorted(set(steps)))
        self.assertEqual(steps[-1], BUDGET)
        train_log = trial_files[prefix + 'train.log'].decode()
        self.assertRegex(train_log, r'Resumed from \S+ckpt-\d+ at step [1-9]\d*\.')
        self.assertEqual(json.loads(trial_files[prefix + 'result.json'])['status'], 'ok')
        self.assertNotIn(prefix + '.lease', trial_files)  # Released by the finished trainer.

        report, report_log = self.command(
            'batchppo-report', f'--input={SWEEP}', f'--output_dir=gs://{BUCKET}/report',
            '--video_max_steps=50')
        returncode = report.wait(timeout=600)
        with open(report_log) as f:
            self.assertEqual(returncode, 0, f.read()[-6000:])
        self.check_report(self.objects('report/'))

    def check_report(self, objects):
        """The report in the bucket, copied down, is complete and self-contained."""
        local = os.path.join(self.dir, 'report')
        for name, data in objects.items():
            path = os.path.join(local, *name.split('/')[1:])
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, 'wb') as f:
                f.write(data)
        for name in ('index.html', 'report.json'):
            self.assertTrue(os.path.isfile(os.path.join(local, name)), name)
        with open(os.path.join(local, 'report.json')) as f:
            report = json.load(f)
        self.assertLen(report['runs'], 2)
        self.assertTrue(any(name.endswith('.mp4') for name in objects), sorted(objects))
        with mock.patch.dict(os.environ, REPORT_DIR=local):
            result = unittest.TextTestRunner(stream=io.StringIO(), verbosity=2).run(
                unittest.defaultTestLoader.loadTestsFromTestCase(
                    report_browser_test.ReportBrowserTest))
        self.assertTrue(result.wasSuccessful() and not result.skipped,
                        f'{result.errors}{result.failures}{result.skipped}')

if __name__ == '__main__':
    absltest.main()
