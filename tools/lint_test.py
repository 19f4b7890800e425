"""Lints the whole source tree with ruff and the checked-in ruff.toml."""

import os
import subprocess
import sys

from absl.testing import absltest

from tools import source_tree


def run_ruff(*args, cwd):
    return subprocess.run(
        [sys.executable, '-m', 'ruff', 'check', '--no-cache', *args],
        cwd=cwd, capture_output=True, text=True, check=False)


class LintTest(absltest.TestCase):

    def test_tree_is_clean(self):
        root = source_tree.workspace_root()
        result = run_ruff('--config', os.path.join(root, 'ruff.toml'), root, cwd=root)
        self.assertEqual(result.returncode, 0, f'ruff found problems:\n{result.stdout}\n'
                         f'{result.stderr}\nFix them, or run `.venv/bin/ruff check --fix .`.')

    def test_config_catches_a_violation(self):
        # Guards against a config that silently checks nothing.
        root = source_tree.workspace_root()
        tmp = self.create_tempdir()
        tmp.create_file('bad.py', 'import os\n')
        result = run_ruff('--config', os.path.join(root, 'ruff.toml'), tmp.full_path,
                          cwd=tmp.full_path)
        self.assertNotEqual(result.returncode, 0)
        self.assertIn('F401', result.stdout)


if __name__ == '__main__':
    absltest.main()
