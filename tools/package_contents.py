"""What BatchPPO's package (sdist and wheel) holds, for the tests that build it."""

import fnmatch
import os

PACKAGED = ('agents', 'pipelines', 'configs')
# Tests, the modules only tests use, and benchmarks: never packaged (setup.py drops them).
TEST_ONLY = ('*_test.py', '*testing*.py', '*_fixtures.py', 'mock_*.py', '*_benchmark.py')
CONSOLE_SCRIPTS = {
    'batchppo-train': 'agents.scripts.train:run',
    'batchppo-evaluate': 'agents.scripts.evaluate:run',
    'batchppo-visualize': 'agents.scripts.visualize:run',
    'batchppo-export': 'agents.scripts.export:run',
    'batchppo-sweep': 'pipelines.sweep.sweep:run',
    'batchppo-report': 'pipelines.report.report:run',
}


def is_test_only(path):
    """Whether `path` (relative to the tree's root) is left out of the package."""
    return any(fnmatch.fnmatch(os.path.basename(path), p) for p in TEST_ONLY)
