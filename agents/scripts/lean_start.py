"""Keeps a library the binaries never use out of their start-up.

Keras, which TensorFlow loads, imports matplotlib.pyplot whenever matplotlib is installed, for
its image-gallery plots alone; pyplot is among the largest parts of loading TensorFlow
(benchmarks/README.md, "Start-up"). BatchPPO installs matplotlib for the report's figures
(pipelines/report/plots.py), which the binaries do not draw. `without_matplotlib()` makes matplotlib
look absent while its block imports (Keras checks, and leaves its gallery without pyplot), then
present again: a later `import matplotlib` in the same process loads it as usual.
"""

import contextlib
import sys


@contextlib.contextmanager
def without_matplotlib():
    """Imports of matplotlib in the block raise ImportError, unless it was loaded before."""
    if 'matplotlib' in sys.modules:
        yield
        return
    sys.modules['matplotlib'] = None  # How the import system marks a module as missing.
    try:
        yield
    finally:
        if 'matplotlib' in sys.modules and sys.modules['matplotlib'] is None:
            del sys.modules['matplotlib']
