"""Builds BatchPPO's wheel offline and checks what Dataflow workers would get."""

import glob
import os
import re
import shutil
import subprocess
import sys
import zipfile

from absl.testing import absltest

from tools import source_tree

PACKAGED = ('agents', 'pipelines', 'configs')


def runtime_requirements(requirements_in):
    """The pinned runtime section of requirements.in (before the tools)."""
    requirements = []
    with open(requirements_in, encoding='utf-8') as lines:
        for line in lines:
            if line.startswith('# Build and test tools'):
                break
            line = line.split('#', 1)[0].strip()
            if line:
                requirements.append(line)
    return requirements


def normalize(requirement):
    name, _, rest = requirement.partition('==') if '==' in requirement else (requirement, '', '')
    extras = re.search(r'\[(.*)\]', name)
    name = re.sub(r'\[.*\]', '', name).strip().lower().replace('_', '-')
    extras = ','.join(sorted(extras.group(1).split(','))) if extras else ''
    return name, extras, rest.strip()


class WheelTest(absltest.TestCase):

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.root = source_tree.workspace_root(anchor='pyproject.toml')
        src = os.path.join(absltest.get_default_test_tmpdir(), 'src')
        shutil.rmtree(src, ignore_errors=True)
        ignore = shutil.ignore_patterns('__pycache__', '*.pyc', '*.egg-info', 'MUJOCO_LOG.TXT')
        for name in PACKAGED:
            shutil.copytree(os.path.join(cls.root, name), os.path.join(src, name), ignore=ignore)
        for name in ('pyproject.toml', 'README.md'):
            shutil.copy(os.path.join(cls.root, name), src)
        dist = os.path.join(absltest.get_default_test_tmpdir(), 'dist')
        result = subprocess.run(
            [sys.executable, '-m', 'build', '--wheel', '--no-isolation', '--outdir', dist, src],
            capture_output=True, text=True, check=False)
        if result.returncode:
            raise AssertionError(f'wheel build failed:\n{result.stdout}\n{result.stderr}')
        wheels = glob.glob(os.path.join(dist, 'batchppo-*.whl'))
        assert len(wheels) == 1, wheels
        cls.names = set(zipfile.ZipFile(wheels[0]).namelist())
        metadata = [n for n in cls.names if n.endswith('.dist-info/METADATA')]
        cls.metadata = zipfile.ZipFile(wheels[0]).read(metadata[0]).decode()

    def test_contains_every_python_module(self):
        expected = set()
        for package in ('agents', 'pipelines'):
            for path in glob.glob(os.path.join(self.root, package, '**', '*.py'), recursive=True):
                expected.add(os.path.relpath(path, self.root))
        self.assertIn('agents/__init__.py', expected)
        self.assertEmpty(expected - self.names)

    def test_contains_every_config(self):
        configs = {os.path.relpath(path, self.root) for path in glob.glob(
            os.path.join(self.root, 'configs', '**', '*.gin'), recursive=True)}
        self.assertNotEmpty(configs)
        self.assertEmpty(configs - self.names)

    def test_requires_the_pinned_runtime_dependencies(self):
        required = {normalize(line.split(':', 1)[1].split(';')[0].strip().replace(' ', ''))
                    for line in self.metadata.splitlines() if line.startswith('Requires-Dist:')}
        pinned = {normalize(r) for r in runtime_requirements(
            os.path.join(self.root, 'third_party', 'py', 'requirements.in'))}
        self.assertNotEmpty(pinned)
        self.assertEqual(required, pinned,
                         'pyproject.toml dependencies differ from requirements.in')


if __name__ == '__main__':
    absltest.main()
