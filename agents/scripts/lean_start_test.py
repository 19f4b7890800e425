"""TensorFlow loads without matplotlib, which stays importable afterwards."""

import json
import subprocess
import sys
import textwrap

from absl.testing import absltest

from agents.scripts import lean_start

PROBE = textwrap.dedent('''
    import json, sys
    from agents.scripts import lean_start
    {before}
    with lean_start.without_matplotlib():
        import tensorflow as tf
        try:
            import matplotlib.pyplot
            inside = 'imported'
        except ImportError as error:
            inside = type(error).__name__
    loaded = 'matplotlib' in sys.modules
    import matplotlib.pyplot as plt
    print(json.dumps({{'inside': inside, 'loaded_with_tensorflow': loaded,
                      'afterwards': plt.__name__, 'keras_ok': tf.keras.layers.Dense(2).units}}))
''')


def probe(before=''):
    result = subprocess.run([sys.executable, '-c', PROBE.format(before=before)],
                            capture_output=True, text=True, check=False, timeout=300)
    if result.returncode:
        raise AssertionError(result.stderr[-3000:])
    return json.loads(result.stdout.strip().splitlines()[-1])


class WithoutMatplotlibTest(absltest.TestCase):

    def test_tensorflow_loads_without_it_and_it_imports_afterwards(self):
        self.assertEqual(probe(), {'inside': 'ModuleNotFoundError',
                                   'loaded_with_tensorflow': False,
                                   'afterwards': 'matplotlib.pyplot', 'keras_ok': 2})

    def test_loaded_before_it_stays(self):
        self.assertEqual(probe(before='import matplotlib'), {
            'inside': 'imported', 'loaded_with_tensorflow': True,
            'afterwards': 'matplotlib.pyplot', 'keras_ok': 2})

    def test_restored_after_an_error_in_the_block(self):
        self.assertNotIn('matplotlib', sys.modules)  # Else the block would hide nothing.
        with self.assertRaises(RuntimeError):
            with lean_start.without_matplotlib():
                with self.assertRaises(ImportError):
                    import matplotlib  # noqa: F401
                raise RuntimeError('boom')
        self.assertNotIn('matplotlib', sys.modules)


if __name__ == '__main__':
    absltest.main()
