"""tools/fresh_install.py on a package index that cannot be reached: it stops at `pip install .`
naming the step, keeps its work for inspection and writes nothing into the source tree. (CI runs
its passing path on Python 3.12 and 3.13: .ci/run.)"""

import os
import subprocess
import sys

from absl.testing import absltest

from tools import source_tree


class FreshInstallTest(absltest.TestCase):

    def test_an_unreachable_index_fails_at_pip_install_naming_the_step(self):
        script = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'fresh_install.py')
        source = source_tree.workspace_root(anchor='pyproject.toml')
        before = sorted(os.listdir(source))
        tmp = self.create_tempdir('tmp').full_path
        env = {key: value for key, value in os.environ.items()
               if not key.startswith(('PIP_', 'PYTHON'))}
        env.update({'TMPDIR': tmp, 'PIP_INDEX_URL': 'http://127.0.0.1:9/simple',
                    'PIP_RETRIES': '0', 'PIP_TIMEOUT': '2', 'PIP_CONFIG_FILE': os.devnull,
                    'PIP_NO_CACHE_DIR': '1'})
        result = subprocess.run([sys.executable, script, f'--source={source}'], env=env,
                                capture_output=True, text=True, timeout=600, check=False)
        self.assertEqual(result.returncode, 1, result.stdout + result.stderr)
        version = '.'.join(map(str, sys.version_info[:3]))
        self.assertIn(f"fresh_install: Python {version}: FAILED: step 'pip install .' exited "
                      'with', result.stderr)
        self.assertIn(f'create a venv (python{sys.version_info[0]}.{sys.version_info[1]} -m '
                      'venv): done', result.stdout)
        self.assertNotIn('batchppo-train', result.stdout)  # Never reached.
        kept, = [line.split('kept ', 1)[1] for line in result.stdout.splitlines()
                 if line.startswith('fresh_install: kept ')]
        self.assertTrue(kept.startswith(tmp), kept)
        with open(os.path.join(kept, 'fresh_install.log')) as log:
            self.assertIn('pip install', log.read())
        self.assertTrue(os.path.exists(os.path.join(kept, 'src', 'pyproject.toml')))
        self.assertEqual(sorted(os.listdir(source)), before)  # Nothing built in the tree.


if __name__ == '__main__':
    absltest.main()
