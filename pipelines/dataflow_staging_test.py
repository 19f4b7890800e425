"""Runs Beam's own staging step for Dataflow offline, on a copy of the source tree.

`--setup_file=./pyproject.toml` makes Beam build BatchPPO's source package and stage it as
`workflow.tar.gz`; each Dataflow worker pip-installs it. This checks that the package builds,
that it holds the trainer, the sweep pipeline and the configs a sweep reads but no tests or test
helpers, and that the wheel pip would build from it on a worker holds them too, with the console
scripts. `--extra_package` of a wheel is the alternative: Beam stages the wheel and lists it for
the workers.

Beam's stager builds the package with `python -m build --sdist --no-isolation`, run by the
launcher's Python (`BEAM_PYTHON`, else its own) from the setup file's directory: the build uses
the setuptools of the launcher's venv, and fails without one. The launcher's venv is tried as the
README has a user make it, on the Python running this test (3.11, 3.12 or 3.13): a fresh
`python -m venv`, then what `pip install '.[gcp]'` adds for staging, the gcp extra's `build` and
`setuptools` (pip keeps the setuptools ensurepip put there when it satisfies the extra: Python
3.11's 65.5; from 3.12 on ensurepip ships none and the extra brings a current one); also after a
`pip install .` from the same tree (which leaves setuptools' build directory there); and as the
locked venv (a current setuptools). A venv with `build` but no setuptools (a fresh 3.12 one after
`pip install build`) cannot stage the package.
"""

import configparser
import glob
import importlib.machinery
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from unittest import mock

from absl.testing import absltest
from apache_beam import version as beam_version
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.runners.dataflow.internal import apiclient
from apache_beam.runners.portability.stager import Stager
from apache_beam.transforms.environments import DockerEnvironment
from packaging.requirements import Requirement

from pipelines.packaging_testing import clean_env, copy_tree, run, staged
from tools import source_tree
from tools.package_contents import (
    CONSOLE_SCRIPTS,
    PACKAGED,
    is_test_only,
)

# What a sweep runs on a worker: the sweep and its trials, the trainer binary and its
# configuration loading, the run loop and the algorithms, and the configs and sweep specs.
# Every other module of the packages, config and report template is required too (found in
# the tree).
REQUIRED = (
    'pipelines/sweep/sweep.py', 'pipelines/sweep/__main__.py', 'pipelines/sweep/sweep_spec.py',
    'pipelines/sweep/trial.py', 'pipelines/sweep/supervise.py', 'agents/scripts/train.py',
    'agents/runs/run_config.py', 'agents/runs/loop.py', 'agents/algorithms/registry.py',
    'agents/algorithms/ppo/ppo.py', 'agents/algorithms/a2c/a2c.py', 'agents/tools/batch_env.py',
    'configs/base.gin', 'configs/pendulum.gin', 'configs/sweeps/pendulum.yaml')
PACKAGE_FILES = ('agents/**/*.py', 'pipelines/**/*.py', 'pipelines/report/templates/*.html.j2',
                 'configs/**/*.gin', 'configs/sweeps/*.yaml')
# Test helpers the patterns above must catch.
HELPERS = ('agents/scripts/testing_utils.py', 'agents/envs/testing.py',
           'agents/tools/mock_vector_env.py', 'pipelines/process_testing.py',
           'pipelines/report/report_fixtures.py')
# What staging uses of the launcher's `pip install '.[gcp]'` (the README): the gcp extra but
# Beam, which this test runs itself.
NOT_LAUNCHER_TOOLS = ('apache-beam',)
# The distributions of a launcher venv: pip, and what the gcp extra adds for staging (build with
# its dependencies, and setuptools).
LAUNCHER_DISTRIBUTIONS = ('pip', 'setuptools', 'build', 'packaging', 'pyproject-hooks')


def canonical(name):
    return name.lower().replace('_', '-')


def launcher_tools(pyproject):
    """The requirements of pyproject.toml's gcp extra that staging uses (build, setuptools)."""
    with open(pyproject, 'rb') as f:
        gcp = tomllib.load(f)['project']['optional-dependencies']['gcp']
    return [requirement for requirement in map(Requirement, gcp)
            if canonical(requirement.name) not in NOT_LAUNCHER_TOOLS]


def venv_facts(python):
    """{'version': [major, minor], 'base_prefix': ..., 'distributions': {name: version}} of the
    venv whose interpreter is `python`."""
    return json.loads(run(
        [python, '-c', 'import importlib.metadata as m, json, sys; print(json.dumps({'
         '"version": sys.version_info[:2], "base_prefix": sys.base_prefix, "distributions": '
         '{d.metadata["Name"].lower().replace("_", "-"): d.version for d in m.distributions()}}))'],
        env=clean_env()))


def copy_distributions(names, site_packages):
    """Installs the distributions `names` and their dependencies into `site_packages` by
    copying them from this Python's environment (offline; their scripts are left out)."""
    todo, done = list(names), set()
    while todo:
        dist = importlib.metadata.distribution(todo.pop())
        name = canonical(dist.metadata['Name'])
        if name in done:
            continue
        done.add(name)
        for line in dist.requires or ():
            requirement = Requirement(line)
            if requirement.marker is None or requirement.marker.evaluate({'extra': ''}):
                todo.append(requirement.name)
        for file in dist.files:
            if file.parts[0] == '..' or '__pycache__' in file.parts:
                continue
            target = os.path.join(site_packages, *file.parts)
            os.makedirs(os.path.dirname(target), exist_ok=True)
            shutil.copy2(file.locate(), target)
    return done


def bundled_setuptools_version():
    """The version of setuptools that ensurepip installs into a new venv, if it ships one."""
    import ensurepip
    wheels = glob.glob(os.path.join(os.path.dirname(ensurepip.__file__), '_bundled',
                                    'setuptools-*.whl'))
    return os.path.basename(wheels[0]).split('-')[1] if wheels else None


class DataflowStagingTest(absltest.TestCase):

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.root = source_tree.workspace_root(anchor='pyproject.toml')
        cls.tmp = absltest.get_default_test_tmpdir()
        cls.src = os.path.join(cls.tmp, 'src')
        shutil.rmtree(cls.src, ignore_errors=True)
        copy_tree(cls.root, cls.src)
        cls.expected = set(REQUIRED)
        for pattern in PACKAGE_FILES:
            cls.expected |= {os.path.relpath(path, cls.src) for path in glob.glob(
                os.path.join(cls.src, pattern), recursive=True)}
        cls.test_only = {name for name in cls.expected if is_test_only(name)}
        cls.expected -= cls.test_only
        cls.launcher_tools = launcher_tools(os.path.join(cls.src, 'pyproject.toml'))
        cls.fresh_python = cls.make_launcher_venv(os.path.join(cls.tmp, 'launcher-venv'))
        # Only for `pip install .` without isolation in that venv: setuptools before 70.1
        # builds wheels with the `wheel` package (pip's isolated builds fetch it themselves).
        cls.wheel_path = os.path.join(cls.tmp, 'wheel-package')
        shutil.rmtree(cls.wheel_path, ignore_errors=True)
        copy_distributions(['wheel'], cls.wheel_path)

    @staticmethod
    def new_venv(path, *args):
        """A new venv at `path` of the Python running this test (`python -m venv` from a venv
        makes one of its base interpreter); returns (its python, its site-packages)."""
        shutil.rmtree(path, ignore_errors=True)
        run([sys.executable, '-m', 'venv', *args, path], env=clean_env())
        python = os.path.join(path, 'bin', 'python')
        site_packages = run(
            [python, '-c', 'import sysconfig; print(sysconfig.get_path("purelib"))'],
            env=clean_env()).strip()
        return python, site_packages

    @classmethod
    def make_launcher_venv(cls, path):
        """A fresh venv as the README has a Dataflow launcher make it; returns its python.

        Of `pip install '.[gcp]'`, staging uses the extra's tools: as pip does, one the venv
        already holds in a version the extra allows is kept, any other is installed (copied from
        this environment, offline)."""
        python, site_packages = cls.new_venv(path)
        installed = venv_facts(python)['distributions']
        missing = [requirement for requirement in cls.launcher_tools
                   if canonical(requirement.name) not in installed or not requirement.specifier
                   .contains(installed[canonical(requirement.name)], prereleases=True)]
        for requirement in missing:
            version = importlib.metadata.version(requirement.name)
            if not requirement.specifier.contains(version, prereleases=True):
                raise AssertionError(f'{requirement.name} {version} of this environment does not '
                                     f'satisfy the gcp extra\'s {requirement}: relock')
        copy_distributions([requirement.name for requirement in missing], site_packages)
        return python

    def test_launcher_tools_are_the_gcp_extras_build_and_setuptools(self):
        self.assertCountEqual([canonical(r.name) for r in self.launcher_tools],
                              ['build', 'setuptools'])

    def test_launcher_venv_is_fresh_and_of_this_python(self):
        facts = venv_facts(self.fresh_python)
        self.assertEqual(tuple(facts['version']), sys.version_info[:2],
                         'the launcher venv runs another Python version than this test')
        self.assertEqual(os.path.realpath(facts['base_prefix']), os.path.realpath(sys.base_prefix),
                         'the launcher venv has another base interpreter than this test')
        installed = facts['distributions']
        self.assertCountEqual(installed, LAUNCHER_DISTRIBUTIONS,
                              'the launcher venv holds other than pip and the gcp extra\'s tools')
        # Python 3.11's ensurepip puts setuptools 65.5 into a venv, which the gcp extra's
        # `setuptools>=65` keeps: the oldest setuptools the build must work with. From 3.12 on
        # it ships none, and the extra brings the current one (this environment's).
        bundled = bundled_setuptools_version()
        if sys.version_info >= (3, 12):
            self.assertIsNone(bundled)
        setuptools, = (r for r in self.launcher_tools if canonical(r.name) == 'setuptools')
        if bundled and setuptools.specifier.contains(bundled):
            self.assertEqual(installed['setuptools'], bundled,
                             'pip keeps the setuptools ensurepip installed, which the extra allows')
        else:
            self.assertEqual(installed['setuptools'], importlib.metadata.version('setuptools'),
                             'the gcp extra brings a current setuptools')

    def test_launcher_venv_without_setuptools_cannot_stage(self):
        """A launcher venv with `build` but no setuptools, as a fresh 3.12 venv is after `pip
        install build`: `build` cannot import the build backend, and Beam's stager fails, its
        message naming only the `build` module. Hence setuptools in the gcp extra (TensorFlow
        happens to require it too, which the extra does not rely on)."""
        python, site_packages = self.new_venv(
            os.path.join(self.create_tempdir().full_path, 'venv'), '--without-pip')
        copy_distributions(['build'], site_packages)
        self.assertNotIn('setuptools', venv_facts(python)['distributions'],
                         'a venv made --without-pip holds setuptools')
        tree = copy_tree(self.src, os.path.join(self.create_tempdir().full_path, 'tree'))
        with mock.patch.dict(os.environ, clean_env(BEAM_PYTHON=python), clear=True):
            with self.assertRaisesRegex(RuntimeError, 'Failed to build package'):
                self.stage(f'--setup_file={os.path.join(tree, "pyproject.toml")}')
        result = self.build_sdist(tree, python, clean_env())
        self.assertNotEqual(result.returncode, 0)
        self.assertIn("Backend 'setuptools.build_meta' is not available", result.stderr)

    def test_workers_run_the_launchers_python_version(self):
        """The README: Dataflow's workers run the container of Beam's SDK for the launcher's
        Python minor version, unless --sdk_container_image names another."""
        python = '{}.{}'.format(*sys.version_info[:2])
        beam = beam_version.__version__
        self.assertEqual(apiclient.get_container_image_from_options(PipelineOptions([])),
                         f'gcr.io/cloud-dataflow/v1beta3/beam_python{python}_sdk:{beam}')
        self.assertEqual(DockerEnvironment.default_docker_image(),
                         f'apache/beam_python{python}_sdk:{beam}')
        image = 'us-central1-docker.pkg.dev/PROJECT/REPO/batchppo:TAG'
        self.assertEqual(apiclient.get_container_image_from_options(
            PipelineOptions([f'--sdk_container_image={image}'])), image)
        # Dataflow takes a launcher of this version (it raises for the versions it does not).
        apiclient._verify_interpreter_version_is_supported(PipelineOptions([]))

    def test_test_only_patterns_catch_the_helpers(self):
        for helper in HELPERS:
            if os.path.exists(os.path.join(self.src, helper)):
                self.assertIn(helper, self.test_only)
        self.assertIn('agents/tools/batch_env_test.py', self.test_only)
        self.assertFalse(set(REQUIRED) & self.test_only)

    def stage(self, *args):
        temp_dir = os.path.join(self.create_tempdir().full_path)
        resources = Stager.create_job_resources(
            PipelineOptions(list(args)), temp_dir, log_submission_env_dependencies=False)
        return staged(resources)

    def stage_setup_file(self, tree, python=None):
        """Beam's staging of `tree` with --setup_file, the launcher's Python being `python`."""
        setup_file = os.path.join(tree, 'pyproject.toml')
        env = clean_env(BEAM_PYTHON=python) if python else clean_env()
        with mock.patch.dict(os.environ, env, clear=True):
            try:
                return self.stage(f'--setup_file={setup_file}')
            except RuntimeError as error:
                # Beam's message hides the build's output: show it.
                result = self.build_sdist(tree, python or sys.executable, env)
                raise AssertionError(
                    f'{error}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}') from error

    def build_sdist(self, tree, python, env):
        """The build Beam's stager runs for `--setup_file`, by hand (its output kept)."""
        return subprocess.run(
            [python, '-m', 'build', '--no-isolation', '--sdist', '--outdir',
             self.create_tempdir().full_path, tree], cwd=tree, env=env, capture_output=True,
            text=True, check=False)

    def assert_package(self, names, top_level, where):
        """`names`: the package's files, relative to its root."""
        self.assertEmpty(self.expected - names, f'missing from the {where}')
        self.assertEmpty(sorted(n for n in names if is_test_only(n)),
                         f'tests or test helpers in the {where}')
        self.assertEmpty(sorted({n.split('/')[0] for n in names} - set(PACKAGED) - top_level),
                         f'unexpected top-level entries in the {where}')

    def assert_sdist(self, path):
        """Checks the sdist at `path`; returns its top directory's name."""
        with tarfile.open(path) as sdist:
            names = [name for name in sdist.getnames() if '/' in name]
        prefix = names[0].split('/')[0]
        self.assertStartsWith(prefix, 'batchppo-')
        self.assert_package(
            {name.partition('/')[2] for name in names},
            {'', 'PKG-INFO', 'README.md', 'pyproject.toml', 'setup.py', 'setup.cfg',
             'batchppo.egg-info'}, 'sdist')
        return prefix

    def assert_wheel(self, path):
        names = set(zipfile.ZipFile(path).namelist())
        dist_info = {n.split('/')[0] for n in names if n.split('/')[0].endswith('.dist-info')}
        self.assertLen(dist_info, 1)
        self.assert_package(names, dist_info, 'wheel')
        entry_points = configparser.ConfigParser()
        entry_points.read_string(zipfile.ZipFile(path).read(
            f'{dist_info.pop()}/entry_points.txt').decode())
        self.assertEqual(dict(entry_points['console_scripts']), CONSOLE_SCRIPTS)

    def test_setup_file_stages_a_package_with_the_trainer_and_configs(self):
        files = self.stage_setup_file(self.src)
        self.assertIn('workflow.tar.gz', files)
        prefix = self.assert_sdist(files['workflow.tar.gz'])
        unpacked = self.create_tempdir().full_path
        with tarfile.open(files['workflow.tar.gz']) as sdist:
            sdist.extractall(unpacked, filter='data')
        # What pip does with it on a worker: build a wheel, offline.
        dist = self.create_tempdir().full_path
        run([sys.executable, '-m', 'build', '--wheel', '--no-isolation', '--outdir', dist,
             os.path.join(unpacked, prefix)], env=clean_env())
        wheel, = glob.glob(os.path.join(dist, 'batchppo-*.whl'))
        self.assert_wheel(wheel)

    def test_extra_package_stages_a_wheel(self):
        dist = self.create_tempdir().full_path
        run([sys.executable, '-m', 'build', '--wheel', '--no-isolation', '--outdir', dist,
             self.src], env=clean_env())
        wheel, = glob.glob(os.path.join(dist, 'batchppo-*.whl'))
        files = self.stage(f'--extra_package={wheel}')
        self.assertIn(os.path.basename(wheel), files)
        with open(files['extra_packages.txt']) as f:
            self.assertEqual(f.read().split(), [os.path.basename(wheel)])
        self.assert_wheel(files[os.path.basename(wheel)])

    def test_fresh_launcher_venv_stages_the_package(self):
        tree = copy_tree(self.src, os.path.join(self.create_tempdir().full_path, 'tree'))
        files = self.stage_setup_file(tree, python=self.fresh_python)
        self.assert_sdist(files['workflow.tar.gz'])

    def pip_install_then_stage(self, python, env):
        """`pip install .` from a copy of the tree, then Beam's staging from that tree."""
        tree = copy_tree(self.src, os.path.join(self.create_tempdir().full_path, 'tree'))
        target = self.create_tempdir().full_path
        run([python, '-m', 'pip', 'install', '--no-deps', '--no-build-isolation', '--target',
             target, '.'], cwd=tree, env=env)
        # No `build` in the tree for `python -m build` to import instead of the package.
        self.assertIsNone(importlib.machinery.PathFinder.find_spec('build', [tree]),
                          sorted(os.listdir(tree)))
        installed = {os.path.relpath(os.path.join(directory, name), target)
                     for directory, _, names in os.walk(target) for name in names
                     if '__pycache__' not in directory}
        dist_info = {n.split('/')[0] for n in installed if n.split('/')[0].endswith('.dist-info')}
        self.assert_package(installed, dist_info | {'bin'}, 'installed package')
        self.assertContainsSubset(
            {f'bin/{script}' for script in CONSOLE_SCRIPTS}, installed)
        files = self.stage_setup_file(tree, python=python)
        self.assert_sdist(files['workflow.tar.gz'])

    def test_fresh_launcher_venv_stages_the_package_after_pip_install(self):
        self.pip_install_then_stage(self.fresh_python, clean_env(PYTHONPATH=self.wheel_path))

    def test_locked_venv_stages_the_package_after_pip_install(self):
        self.pip_install_then_stage(sys.executable, clean_env())


if __name__ == '__main__':
    absltest.main()
