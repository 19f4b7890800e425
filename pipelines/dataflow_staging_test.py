"""Runs Beam's own staging step for Dataflow offline, on a copy of the source tree.

`--setup_file=./pyproject.toml` makes Beam build BatchPPO's source package and stage it as
`workflow.tar.gz`; each Dataflow worker pip-installs it. This checks that the package builds,
that it holds the trainer, the sweep pipeline and the configs a sweep reads, and that the wheel
pip would build from it on a worker holds them too. `--extra_package` of a wheel is the
alternative: Beam stages the wheel and lists it for the workers.
"""

import glob
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile

from absl.testing import absltest
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.runners.portability.stager import Stager

from tools import source_tree

PACKAGED = ('agents', 'pipelines', 'configs')
# What a sweep runs on a worker: the sweep and its trials, the trainer binary and its
# configuration loading, the PPO trainer, and the configs and sweep specs.
REQUIRED = (
    'pipelines/sweep.py', 'pipelines/sweep_spec.py', 'pipelines/trial.py',
    'pipelines/supervise.py', 'pipelines/storage.py', 'agents/scripts/train.py',
    'agents/scripts/run_config.py', 'agents/algorithms/ppo/trainer.py',
    'agents/algorithms/ppo/ppo.py', 'agents/tools/batch_env.py', 'configs/base.gin',
    'configs/pendulum.gin', 'configs/sweeps/pendulum.yaml')


def staged(resources):
    """{staged name: local file} of Beam's job resources."""
    return {name: path for path, name, _ in Stager.extract_staging_tuple_iter(resources)}


class DataflowStagingTest(absltest.TestCase):

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.root = source_tree.workspace_root(anchor='pyproject.toml')
        cls.tmp = absltest.get_default_test_tmpdir()
        cls.src = os.path.join(cls.tmp, 'src')
        shutil.rmtree(cls.src, ignore_errors=True)
        ignore = shutil.ignore_patterns('__pycache__', '*.pyc', '*.egg-info', 'MUJOCO_LOG.TXT')
        for name in PACKAGED:
            shutil.copytree(os.path.join(cls.root, name), os.path.join(cls.src, name),
                            ignore=ignore)
        for name in ('pyproject.toml', 'README.md'):
            shutil.copy(os.path.join(cls.root, name), cls.src)
        cls.expected = set(REQUIRED)
        for pattern in ('configs/**/*.gin', 'configs/sweeps/*.yaml'):
            cls.expected |= {os.path.relpath(path, cls.src) for path in glob.glob(
                os.path.join(cls.src, pattern), recursive=True)}

    def stage(self, *args):
        temp_dir = os.path.join(self.create_tempdir().full_path)
        resources = Stager.create_job_resources(
            PipelineOptions(list(args)), temp_dir, log_submission_env_dependencies=False)
        return staged(resources)

    def test_setup_file_stages_a_package_with_the_trainer_and_configs(self):
        files = self.stage(f'--setup_file={os.path.join(self.src, "pyproject.toml")}')
        self.assertIn('workflow.tar.gz', files)
        with tarfile.open(files['workflow.tar.gz']) as sdist:
            names = sdist.getnames()
            prefix = names[0].split('/')[0]
            self.assertStartsWith(prefix, 'batchppo-')
            self.assertEmpty(self.expected - {name.partition('/')[2] for name in names})
            unpacked = self.create_tempdir().full_path
            sdist.extractall(unpacked, filter='data')
        # What pip does with it on a worker: build a wheel, offline.
        dist = self.create_tempdir().full_path
        result = subprocess.run(
            [sys.executable, '-m', 'build', '--wheel', '--no-isolation', '--outdir', dist,
             os.path.join(unpacked, prefix)], capture_output=True, text=True, check=False)
        self.assertEqual(result.returncode, 0, result.stdout[-3000:] + result.stderr[-3000:])
        wheel, = glob.glob(os.path.join(dist, 'batchppo-*.whl'))
        self.assertEmpty(self.expected - set(zipfile.ZipFile(wheel).namelist()))

    def test_extra_package_stages_a_wheel(self):
        dist = self.create_tempdir().full_path
        result = subprocess.run(
            [sys.executable, '-m', 'build', '--wheel', '--no-isolation', '--outdir', dist,
             self.src], capture_output=True, text=True, check=False)
        self.assertEqual(result.returncode, 0, result.stdout[-3000:] + result.stderr[-3000:])
        wheel, = glob.glob(os.path.join(dist, 'batchppo-*.whl'))
        files = self.stage(f'--extra_package={wheel}')
        self.assertIn(os.path.basename(wheel), files)
        with open(files['extra_packages.txt']) as f:
            self.assertEqual(f.read().split(), [os.path.basename(wheel)])
        self.assertEmpty(self.expected - set(zipfile.ZipFile(
            files[os.path.basename(wheel)]).namelist()))


if __name__ == '__main__':
    absltest.main()
