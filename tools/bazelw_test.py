"""Runs ./bazelw in throwaway repos with a fake `bazel` on PATH.

Covers: arguments pass through unchanged once set up; a corrupt lock and an
unreachable package registry fail naming the step, and leave the repo (and an
existing .venv) exactly as they were.
"""

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
"""


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
        self.lock = os.path.join(self.repo, 'third_party', 'py', 'requirements.lock')
        shutil.copy(runfile('third_party/py/requirements.lock'), self.lock)
        bin_dir = self.create_tempdir('bin').full_path
        fake_bazel = os.path.join(bin_dir, 'bazel')
        with open(fake_bazel, 'w') as f:
            f.write(FAKE_BAZEL)
        os.chmod(fake_bazel, stat.S_IRWXU)
        self.args_file = os.path.join(self.create_tempdir('out').full_path, 'args')
        self.env = dict(os.environ)
        self.env.update({
            'PATH': bin_dir + os.pathsep + self.env.get('PATH', '/usr/bin:/bin'),
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

    def make_venv(self, stamp):
        """A stand-in .venv: python3 linked to this interpreter, plus a stamp."""
        venv_bin = os.path.join(self.repo, '.venv', 'bin')
        os.makedirs(venv_bin)
        os.symlink(sys.executable, os.path.join(venv_bin, 'python3'))
        with open(os.path.join(self.repo, '.venv', 'marker'), 'w') as f:
            f.write('keep me')
        with open(os.path.join(self.repo, '.venv', '.batchppo-lock-sha256'), 'w') as f:
            f.write(stamp + '\n')

    def run_bazelw(self, *args):
        return subprocess.run([os.path.join(self.repo, 'bazelw'), *args], env=self.env,
                              capture_output=True, text=True, timeout=300, check=False)

    def lock_sha256(self):
        with open(self.lock, 'rb') as f:
            return hashlib.sha256(f.read()).hexdigest()

    def test_passes_arguments_unchanged_when_set_up(self):
        self.make_venv(self.lock_sha256())
        before = tree_snapshot(self.repo)
        args = ['run', '//agents:train', '--', '--gin_file=configs/a b.gin', '--x=""']
        result = self.run_bazelw(*args)
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertEqual(result.stderr, '')  # Nothing to install, nothing said.
        with open(self.args_file) as f:
            self.assertEqual(f.read().splitlines(), args)
        self.assertEqual(tree_snapshot(self.repo), before)

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
        self.assertIn('previous .venv was kept', result.stderr)
        self.assertFalse(os.path.exists(self.args_file), 'bazel must not run')
        self.assertEqual(tree_snapshot(self.repo), before)

    def test_unreachable_registry_without_venv_leaves_none(self):
        before = tree_snapshot(self.repo)
        result = self.run_bazelw('build', '//...')
        self.assertEqual(result.returncode, 1, result.stderr)
        self.assertIn('registry', result.stderr)
        self.assertFalse(os.path.exists(os.path.join(self.repo, '.venv')))
        self.assertEqual(tree_snapshot(self.repo), before)


if __name__ == '__main__':
    absltest.main()
