"""Builds BatchPPO's wheel offline and checks what Dataflow workers and pip users would get."""

import ast
import configparser
import glob
import os
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile

from absl.testing import absltest
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from tools import source_tree
from tools.package_contents import CONSOLE_SCRIPTS, PACKAGED, is_test_only

# The files at the tree's root that the build reads.
BUILD_FILES = ('pyproject.toml', 'README.md', 'setup.py', 'setup.cfg', 'MANIFEST.in')
# Oldest setuptools the build must work with: what ensurepip puts into a Python 3.11 venv.
ENSUREPIP_SETUPTOOLS = '65.5.0'


def requirement_sections(requirements_in):
    """{section: [requirement]} of requirements.in: '' for the runtime section at the top, the
    extra's name for each `# Optional: the <name> extra ...` section after it; the build and
    test tools at the end are left out."""
    sections, section = {'': []}, ''
    with open(requirements_in, encoding='utf-8') as lines:
        for line in lines:
            if line.startswith('# Build and test tools'):
                break
            optional = re.match(r'# Optional: the (\S+) extra', line)
            if optional:
                section = optional.group(1)
                sections[section] = []
            line = line.split('#', 1)[0].strip()
            if line:
                sections[section].append(line)
    return sections


def runtime_requirements(requirements_in):
    """The runtime section of requirements.in (before the extras and the tools)."""
    return requirement_sections(requirements_in)['']


def lock_pins(lock):
    """{normalized name: pinned version} of a requirements lock."""
    pins = {}
    with open(lock, encoding='utf-8') as lines:
        for line in lines:
            match = re.match(r'([A-Za-z0-9._-]+)(?:\[[^\]]*\])?==([^ \\]+)', line)
            if match:
                pins[match.group(1).lower().replace('_', '-')] = match.group(2)
    return pins


def locked_versions(root):
    """{'3.11': path, ...}: the Python versions with a lock (tools/relock writes them)."""
    locks = glob.glob(os.path.join(root, 'third_party', 'py', 'requirements-*.lock'))
    return {re.search(r'requirements-(.+)\.lock$', lock).group(1): lock for lock in locks}


def normalize(requirement):
    """(name, sorted extras, version specifier) of a requirement string."""
    requirement = requirement.replace(' ', '')
    match = re.match(r'([A-Za-z0-9._-]+)(?:\[(.*)\])?(.*)', requirement)
    name, extras, rest = match.groups()
    extras = ','.join(sorted(extras.split(','))) if extras else ''
    return name.lower().replace('_', '-'), extras, rest


def requires_dist(metadata):
    """{extra ('' for none): {normalized requirement}} of a METADATA text."""
    by_extra = {}
    for line in metadata.splitlines():
        if line.startswith('Requires-Dist:'):
            requirement, _, marker = line.split(':', 1)[1].partition(';')
            extra = re.search(r'extra\s*==\s*[\'"]([^\'"]+)[\'"]', marker)
            by_extra.setdefault(extra.group(1) if extra else '', set()).add(
                normalize(requirement))
    return by_extra


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
        for name in BUILD_FILES:
            if os.path.exists(os.path.join(cls.root, name)):
                shutil.copy(os.path.join(cls.root, name), src)
        dist = os.path.join(absltest.get_default_test_tmpdir(), 'dist')
        shutil.rmtree(dist, ignore_errors=True)
        result = subprocess.run(
            [sys.executable, '-m', 'build', '--wheel', '--no-isolation', '--outdir', dist, src],
            capture_output=True, text=True, check=False)
        if result.returncode:
            raise AssertionError(f'wheel build failed:\n{result.stdout}\n{result.stderr}')
        wheels = glob.glob(os.path.join(dist, 'batchppo-*.whl'))
        assert len(wheels) == 1, wheels
        cls.wheel = zipfile.ZipFile(wheels[0])
        cls.names = set(cls.wheel.namelist())
        dist_info, = {n.split('/')[0] for n in cls.names if '.dist-info/' in n}
        cls.metadata = cls.wheel.read(f'{dist_info}/METADATA').decode()
        cls.entry_points = configparser.ConfigParser()
        cls.entry_points.read_string(cls.wheel.read(f'{dist_info}/entry_points.txt').decode())
        with open(os.path.join(cls.root, 'pyproject.toml'), 'rb') as f:
            cls.pyproject = tomllib.load(f)

    def test_contains_every_python_module_but_tests_and_their_helpers(self):
        modules = set()
        for package in ('agents', 'pipelines'):
            for path in glob.glob(os.path.join(self.root, package, '**', '*.py'), recursive=True):
                modules.add(os.path.relpath(path, self.root))
        self.assertIn('agents/__init__.py', modules)
        test_only = {module for module in modules if is_test_only(module)}
        self.assertContainsSubset(
            {'agents/tools/batch_env_test.py', 'agents/scripts/testing_utils.py',
             'agents/envs/testing.py', 'pipelines/report/report_fixtures.py'}, test_only)
        self.assertEmpty(modules - test_only - self.names)
        self.assertEmpty(sorted(name for name in self.names if is_test_only(name)))

    def test_holds_only_the_packages(self):
        top_level = {name.split('/')[0] for name in self.names}
        self.assertEmpty({n for n in top_level if not n.endswith('.dist-info')} - set(PACKAGED))

    def test_packaged_modules_import_only_packaged_modules(self):
        """A test helper left out of the wheel must not be needed by what is in it."""
        def files(module):
            path = module.replace('.', '/')
            return f'{path}.py', f'{path}/__init__.py'

        def packaged(module):
            return any(file in self.names for file in files(module))

        def in_tree(module):
            return any(os.path.exists(os.path.join(self.root, file)) for file in files(module))

        missing = set()
        for name in sorted(self.names):
            if not name.endswith('.py'):
                continue
            for node in ast.walk(ast.parse(self.wheel.read(name), name)):
                if isinstance(node, ast.Import):
                    modules = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                    # `from package import name`: `name` is a module if the tree has one.
                    modules = [node.module] + [
                        f'{node.module}.{alias.name}' for alias in node.names
                        if in_tree(f'{node.module}.{alias.name}')]
                else:
                    continue
                missing |= {f'{name}: {module}' for module in modules
                            if module.split('.')[0] in PACKAGED and not packaged(module)}
        self.assertEmpty(sorted(missing))

    def test_contains_every_config(self):
        configs = {os.path.relpath(path, self.root) for path in glob.glob(
            os.path.join(self.root, 'configs', '**', '*.gin'), recursive=True)}
        self.assertNotEmpty(configs)
        self.assertEmpty(configs - self.names)

    def test_console_scripts_run_the_binaries(self):
        self.assertEqual(dict(self.entry_points['console_scripts']), CONSOLE_SCRIPTS)
        for target in CONSOLE_SCRIPTS.values():
            module, function = target.split(':')
            tree = ast.parse(self.wheel.read(module.replace('.', '/') + '.py'))
            self.assertIn(function, {node.name for node in tree.body
                                     if isinstance(node, ast.FunctionDef)}, target)

    def test_requires_the_runtime_dependencies_of_requirements_in(self):
        """The runtime section of requirements.in, with the extras the `gcp` extra brings
        (Dataflow's) moved to it."""
        required = requires_dist(self.metadata)
        gcp = required.get('gcp', set())
        runtime = {normalize(r) for r in runtime_requirements(
            os.path.join(self.root, 'third_party', 'py', 'requirements.in'))}
        self.assertNotEmpty(runtime)
        self.assertIn(('apache-beam', 'gcp', '>=2.77.0'), runtime)
        expected = {(name, '', version) if (name, extras, version) in gcp
                    else (name, extras, version) for name, extras, version in runtime}
        self.assertEqual(required[''], expected,
                         'pyproject.toml dependencies differ from requirements.in')

    def test_dependencies_are_ranges_from_what_the_locks_pin(self):
        """No `==` (BatchPPO installs next to other libraries); each lower bound is a version
        the tests ran against (pinned in a lock), and every lock's pin is inside the range."""
        locks = {version: lock_pins(lock) for version, lock in locked_versions(self.root).items()}
        self.assertNotEmpty(locks)
        required = requires_dist(self.metadata)
        for extra, requirements in required.items():
            for name, _, specifier in requirements:
                if name in ('build', 'setuptools'):  # The gcp extra's launcher tools.
                    continue
                with self.subTest(extra=extra, name=name):
                    self.assertNotIn('==', specifier)
                    lower, = [s.version for s in SpecifierSet(specifier) if s.operator == '>=']
                    pins = {version: pins[name] for version, pins in locks.items()}
                    self.assertIn(lower, pins.values(), f'{name}: no lock pins {lower}')
                    for version, pin in pins.items():
                        self.assertIn(pin, SpecifierSet(specifier), f'{name} in {version} lock')

    def test_requires_python_allows_exactly_the_locked_versions(self):
        allowed = SpecifierSet(self.pyproject['project']['requires-python'])
        versions = sorted(locked_versions(self.root), key=Version)
        self.assertEqual(versions, ['3.11', '3.12', '3.13'])
        self.assertEqual([f'3.{minor}' for minor in range(30) if f'3.{minor}' in allowed],
                         versions)
        # What pip reads from the wheel.
        self.assertEqual(SpecifierSet(re.search(r'^Requires-Python: (.*)$', self.metadata,
                                                re.MULTILINE).group(1)), allowed)

    def test_gcp_extra_brings_dataflow_and_what_staging_needs(self):
        gcp = requires_dist(self.metadata)['gcp']
        self.assertIn(('apache-beam', 'gcp', '>=2.77.0'), gcp)
        self.assertEqual({name for name, _, _ in gcp}, {'apache-beam', 'build', 'setuptools'})

    def test_optional_sections_of_requirements_in_are_the_extras(self):
        """Each optional section of requirements.in is the extra of its name (but gcp, which
        is Dataflow's: see above), as required there: `pip install 'batchppo[envpool]'`."""
        required = requires_dist(self.metadata)
        sections = requirement_sections(
            os.path.join(self.root, 'third_party', 'py', 'requirements.in'))
        extras = {name: {normalize(r) for r in requirements}
                  for name, requirements in sections.items() if name}
        self.assertEqual(extras, {'envpool': {('envpool', '', '>=1.2.5')}})
        self.assertEqual(set(required) - {'', 'gcp'}, set(extras))
        for name, requirements in extras.items():
            self.assertEqual(required[name], requirements, f'the {name} extra')
            # Optional: not among the dependencies of every install.
            self.assertEmpty({r[0] for r in requirements} & {r[0] for r in required['']})

    def test_build_requirements_admit_a_fresh_venvs_setuptools(self):
        """Beam builds without isolation, with the venv's setuptools: the build requirements
        must hold in a venv as ensurepip makes it (the gcp extra keeps the same floor)."""
        build_system = self.pyproject['build-system']
        self.assertEqual(build_system['build-backend'], 'setuptools.build_meta')
        requires = [normalize(r) for r in build_system['requires']]
        self.assertEqual([name for name, _, _ in requires], ['setuptools'])
        self.assertIn(ENSUREPIP_SETUPTOOLS, SpecifierSet(requires[0][2]))
        gcp_setuptools, = [r for r in requires_dist(self.metadata)['gcp']
                           if r[0] == 'setuptools']
        self.assertEqual(gcp_setuptools, requires[0])


if __name__ == '__main__':
    absltest.main()
