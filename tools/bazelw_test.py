"""Runs ./bazelw in throwaway repos with a fake `bazel` on PATH.

Covers: arguments pass through unchanged once set up; a corrupt lock and an
unreachable package registry fail naming the step, and leave the repo (and an
existing venv) exactly as they were; BATCHPPO_PYTHON chooses the version, its
lock and venv, and a version without a lock or an interpreter stops in one line.
"""

import glob
import hashlib
import os
import shutil
import stat
import subprocess
import sys

from absl.testing import absltest

from tools import source_tree

FAKE_BAZEL = """#!/bin/sh
printf '%s\\n' "$@" > "$FAKE_BAZEL_ARGS"
echo "${BATCHPPO_VENV-unset}" > "$FAKE_BAZEL_ARGS.venv"
"""
# ./bazelw's default version: its venv is .venv, the others' .venv-<version>.
DEFAULT_VERSION = '3.11'
# `-m venv DIR` makes a venv whose python3 fails `-m pip install` with pip's message for a full
# disk; anything else runs on the real interpreter.
FULL_DISK_PYTHON = """#!/bin/sh
if [ "$1" = -m ] && [ "$2" = venv ]; then
  mkdir -p "$3/bin"
  cat > "$3/bin/python3" <<'END'
#!/bin/sh
echo 'ERROR: Could not install packages due to an OSError: [Errno 28] No space left on device'
exit 1
END
  chmod +x "$3/bin/python3"
  exit 0
fi
exec {python} "$@"
"""
RUNNING_VERSION = '{}.{}'.format(*sys.version_info[:2])


def venv_name(version):
    return '.venv' if version == DEFAULT_VERSION else f'.venv-{version}'


def runfile(path):
    return os.path.join(source_tree.workspace_root(anchor='bazelw'), path)


def tree_snapshot(root):
    """Maps every file below root to its content hash."""
    snapshot = {}
    for directory, _, files in os.walk(root):
        for name in files:
            path = os.path.join(directory, name)
            if os.path.islink(path):
                snapshot[os.path.relpath(path, root)] = 'link:' + os.readlink(path)
            else:
                with open(path, 'rb') as f:
                    snapshot[os.path.relpath(path, root)] = hashlib.sha256(f.read()).hexdigest()
    return snapshot


class BazelwTest(absltest.TestCase):

    def setUp(self):
        super().setUp()
        self.repo = self.create_tempdir('repo').full_path
        shutil.copy(runfile('bazelw'), self.repo)
        os.chmod(os.path.join(self.repo, 'bazelw'), 0o755)
        os.makedirs(os.path.join(self.repo, 'third_party', 'py'))
        locks = glob.glob(runfile('third_party/py/requirements-*.lock'))
        self.assertLen(locks, 3)
        for lock in locks:
            shutil.copy(lock, os.path.join(self.repo, 'third_party', 'py'))
        self.lock = self.lock_of(RUNNING_VERSION)
        bin_dir = self.bin_dir = self.create_tempdir('bin').full_path
        fake_bazel = os.path.join(bin_dir, 'bazel')
        with open(fake_bazel, 'w') as f:
            f.write(FAKE_BAZEL)
        os.chmod(fake_bazel, stat.S_IRWXU)
        self.args_file = os.path.join(self.create_tempdir('out').full_path, 'args')
        self.env = dict(os.environ)
        self.env.update({
            # No pyenv: an interpreter is found on PATH or named by BATCHPPO_PYTHON.
            'PATH': os.pathsep.join((bin_dir, '/usr/bin', '/bin')),
            'FAKE_BAZEL_ARGS': self.args_file,
            'TMPDIR': self.create_tempdir('tmp').full_path,
            # An unreachable registry: pip fails at once instead of installing.
            'PIP_INDEX_URL': 'http://127.0.0.1:9/simple',
            'PIP_RETRIES': '0',
            'PIP_TIMEOUT': '2',
            'PIP_CONFIG_FILE': os.devnull,
            'BATCHPPO_PYTHON': sys.executable,
        })
        for name in ('PIP_EXTRA_INDEX_URL', 'PIP_FIND_LINKS', 'PIP_CONSTRAINT'):
            self.env.pop(name, None)

    def lock_of(self, version):
        return os.path.join(self.repo, 'third_party', 'py', f'requirements-{version}.lock')

    def make_venv(self, stamp, version=RUNNING_VERSION):
        """A stand-in venv of `version`: python3 linked to this interpreter, plus a stamp."""
        venv = os.path.join(self.repo, venv_name(version))
        os.makedirs(os.path.join(venv, 'bin'))
        os.symlink(sys.executable, os.path.join(venv, 'bin', 'python3'))
        with open(os.path.join(venv, 'marker'), 'w') as f:
            f.write('keep me')
        with open(os.path.join(venv, '.batchppo-lock-sha256'), 'w') as f:
            f.write(stamp + '\n')

    def run_bazelw(self, *args):
        return subprocess.run([os.path.join(self.repo, 'bazelw'), *args], env=self.env,
                              capture_output=True, text=True, timeout=300, check=False)

    def lock_sha256(self, lock=None):
        with open(lock or self.lock, 'rb') as f:
            return hashlib.sha256(f.read()).hexdigest()

    def bazel_args(self):
        with open(self.args_file) as f:
            args = f.read().splitlines()
        with open(self.args_file + '.venv') as f:
            return args, f.read().strip()

    def test_passes_arguments_unchanged_when_set_up(self):
        self.make_venv(self.lock_sha256())
        before = tree_snapshot(self.repo)
        args = ['run', '//agents:train', '--', '--gin_file=configs/a b.gin', '--x=""']
        result = self.run_bazelw(*args)
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertEqual(result.stderr, '')  # Nothing to install, nothing said.
        expected_venv = 'unset' if RUNNING_VERSION == DEFAULT_VERSION else venv_name(
            RUNNING_VERSION)
        self.assertEqual(self.bazel_args(), (args, expected_venv))
        self.assertEqual(tree_snapshot(self.repo), before)

    def test_another_version_runs_on_its_own_venv(self):
        """BATCHPPO_PYTHON=3.12 with .venv-3.12 built from the 3.12 lock (no interpreter looked
        up: nothing is to be built), and the Python targets told so (tests through --test_env,
        so results are cached per version)."""
        self.env['BATCHPPO_PYTHON'] = '3.12'
        self.make_venv(self.lock_sha256(self.lock_of('3.12')), version='3.12')
        before = tree_snapshot(self.repo)
        result = self.run_bazelw('test', '--config=x', '//...')
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertEqual(result.stderr, '')
        self.assertEqual(self.bazel_args(), (
            ['test', '--test_env=BATCHPPO_VENV=.venv-3.12', '--config=x', '//...'],
            '.venv-3.12'))
        result = self.run_bazelw('run', '//agents:train')
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertEqual(self.bazel_args(), (['run', '//agents:train'], '.venv-3.12'))
        self.assertEqual(tree_snapshot(self.repo), before)

    def test_the_default_version_ignores_a_stray_venv_variable(self):
        self.env['BATCHPPO_PYTHON'] = DEFAULT_VERSION
        self.env['BATCHPPO_VENV'] = '.venv-3.12'
        self.make_venv(self.lock_sha256(self.lock_of(DEFAULT_VERSION)), version=DEFAULT_VERSION)
        result = self.run_bazelw('test', '//...')
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertEqual(self.bazel_args(), (['test', '//...'], 'unset'))

    def test_a_version_without_a_lock_stops_in_one_line(self):
        self.env['BATCHPPO_PYTHON'] = '3.14'
        before = tree_snapshot(self.repo)
        result = self.run_bazelw('run', '//agents:train')
        self.assertEqual(result.returncode, 1)
        self.assertEqual(result.stderr.strip().splitlines(), [
            'bazelw: error: BATCHPPO_PYTHON=3.14: BatchPPO has no lock for Python 3.14 '
            '(supported: 3.11, 3.12, 3.13; third_party/py/requirements-<version>.lock).'])
        self.assertFalse(os.path.exists(self.args_file), 'bazel must not run')
        self.assertEqual(tree_snapshot(self.repo), before)

    def test_a_version_not_installed_stops_in_one_line_saying_where_it_looked(self):
        self.env['BATCHPPO_PYTHON'] = '3.13'
        if shutil.which('python3.13', path=self.env['PATH']):
            self.skipTest('python3.13 is installed system-wide')
        before = tree_snapshot(self.repo)
        result = self.run_bazelw('run', '//agents:train')
        self.assertEqual(result.returncode, 1)
        line, = result.stderr.strip().splitlines()
        self.assertIn('Python 3.13 not found (looked for python3.13 on PATH and for 3.13.x in '
                      'pyenv)', line)
        self.assertIn('pyenv install 3.13', line)
        self.assertFalse(os.path.exists(self.args_file), 'bazel must not run')
        self.assertEqual(tree_snapshot(self.repo), before)

    def test_bazel_ignores_every_versions_venv(self):
        """Each venv holds BUILD files (TensorFlow's headers): a `//...` that walked into one
        would fail to load. .bazelignore takes no patterns, so it names every version's venv
        and its backup; .gitignore keeps them out of git."""
        with open(runfile('.bazelignore')) as f:
            ignored = set(f.read().split())
        versions = [os.path.basename(lock)[len('requirements-'):-len('.lock')]
                    for lock in glob.glob(runfile('third_party/py/requirements-*.lock'))]
        self.assertIn(DEFAULT_VERSION, versions)
        for version in versions:
            self.assertContainsSubset(
                {venv_name(version), venv_name(version) + '.previous'}, ignored)

    def test_an_interpreter_that_does_not_run_stops_in_one_line(self):
        self.env['BATCHPPO_PYTHON'] = os.path.join(self.bin_dir, 'no-such-python')
        result = self.run_bazelw('test', '//...')
        self.assertEqual(result.returncode, 1)
        line, = result.stderr.strip().splitlines()
        self.assertIn('is neither a version (e.g. 3.12) nor a Python interpreter', line)
        self.assertFalse(os.path.exists(self.args_file), 'bazel must not run')

    def test_corrupt_lock_fails_before_touching_anything(self):
        self.make_venv('stale')
        with open(self.lock, 'a') as f:
            f.write('this is not a requirement\n')
        before = tree_snapshot(self.repo)
        result = self.run_bazelw('test', '//...')
        self.assertEqual(result.returncode, 1)
        self.assertIn("step 'validate", result.stderr)
        self.assertIn('not a pinned requirement', result.stderr)
        self.assertFalse(os.path.exists(self.args_file), 'bazel must not run')
        self.assertEqual(tree_snapshot(self.repo), before)

    def test_unreachable_registry_keeps_the_previous_venv(self):
        self.make_venv('stale')
        before = tree_snapshot(self.repo)
        result = self.run_bazelw('test', '//...')
        self.assertEqual(result.returncode, 1, result.stderr)
        self.assertIn("step 'install Python packages", result.stderr)
        self.assertIn(f'previous {venv_name(RUNNING_VERSION)} was kept', result.stderr)
        self.assertFalse(os.path.exists(self.args_file), 'bazel must not run')
        self.assertEqual(tree_snapshot(self.repo), before)

    def test_unreachable_registry_without_venv_leaves_none(self):
        before = tree_snapshot(self.repo)
        result = self.run_bazelw('build', '//...')
        self.assertEqual(result.returncode, 1, result.stderr)
        self.assertIn('registry', result.stderr)
        self.assertFalse(os.path.exists(os.path.join(self.repo, venv_name(RUNNING_VERSION))))
        self.assertEqual(tree_snapshot(self.repo), before)

    def test_a_full_disk_is_named_as_such(self):
        # A stand-in interpreter: it answers the version question as this one does, and its
        # venv's pip fails as pip does when the disk fills while installing.
        fake_python = os.path.join(self.bin_dir, 'full-disk-python')
        with open(fake_python, 'w') as f:
            f.write(FULL_DISK_PYTHON.format(python=sys.executable))
        os.chmod(fake_python, stat.S_IRWXU)
        self.env['BATCHPPO_PYTHON'] = fake_python
        self.make_venv('stale')
        before = tree_snapshot(self.repo)
        result = self.run_bazelw('build', '//...')
        self.assertEqual(result.returncode, 1, result.stderr)
        self.assertIn("step 'install Python packages", result.stderr)
        self.assertIn('The disk is full:', result.stderr)
        self.assertIn('free where', result.stderr)
        self.assertNotIn('registry', result.stderr)
        self.assertIn(f'previous {venv_name(RUNNING_VERSION)} was kept', result.stderr)
        self.assertFalse(os.path.exists(self.args_file), 'bazel must not run')
        self.assertEqual(tree_snapshot(self.repo), before)


if __name__ == '__main__':
    absltest.main()
