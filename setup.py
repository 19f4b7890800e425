"""What pyproject.toml cannot declare for every setuptools from 65 on (see its header).

- Tests and the modules only tests use stay out of the sdist and the wheel: setuptools packages
  whole packages, so `build_py` drops them by file name (the sdist lists its Python files
  through `build_py` too).
- The license: an SPDX expression for setuptools >= 77, which rejects the old form in
  `pyproject.toml`, the plain `License:` field for older ones, which reject the new one.
"""

import fnmatch
import os

import setuptools
from setuptools.command.build_py import build_py

# Test modules, shared test helpers (`agents/envs/testing.py`,
# `pipelines/report/report_fixtures.py`, `agents/tools/mock_vector_env.py`, ...) and benchmarks.
TEST_ONLY = ('*_test.py', '*testing*.py', '*_fixtures.py', 'mock_*.py', '*_benchmark.py')


def is_test_only(path):
    """Whether the module at `path` is a test, a test helper or a benchmark."""
    return any(fnmatch.fnmatch(os.path.basename(path), pattern) for pattern in TEST_ONLY)


class BuildPy(build_py):
    """build_py without the test-only modules."""

    def find_package_modules(self, package, package_dir):
        return [(package_, module, path) for package_, module, path
                in super().find_package_modules(package, package_dir)
                if not is_test_only(path)]


def license_metadata():
    major = int(setuptools.__version__.split('.')[0])
    return {'license_expression': 'Apache-2.0'} if major >= 77 else {'license': 'Apache-2.0'}


setuptools.setup(cmdclass={'build_py': BuildPy}, **license_metadata())
