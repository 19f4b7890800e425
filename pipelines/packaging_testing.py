"""Test helpers for BatchPPO as a package: a copy of the checkout as a user has it, Beam's
staging of it, and commands run in an environment that points at no venv or runfiles."""

import fnmatch
import os
import shutil
import subprocess

from apache_beam.runners.portability.stager import Stager

# Not copied with the tree: version control, venvs, Bazel's output, build output.
NOT_COPIED = ('.git', '.venv*', 'bazel-*', 'build', 'dist', '.setuptools-build', '*.egg-info',
              'logs', '.ruff_cache')


def staged(resources):
    """{staged name: local file} of Beam's job resources."""
    return {name: path for path, name, _ in Stager.extract_staging_tuple_iter(resources)}


def copy_tree(root, dest):
    """Copies the checkout at `root` as a user has it, without its build output."""
    def ignore(directory, names):
        skip = {n for n in names if n in ('__pycache__', 'MUJOCO_LOG.TXT') or n.endswith('.pyc')}
        if os.path.samefile(directory, root):
            skip |= {n for n in names if any(fnmatch.fnmatch(n, p) for p in NOT_COPIED)}
        return skip
    shutil.copytree(root, dest, ignore=ignore, symlinks=True)
    return dest


def clean_env(**extra):
    """This process's environment without what points Python at this venv or the runfiles."""
    env = {k: v for k, v in os.environ.items() if k not in ('PYTHONPATH', 'PYTHONHOME')}
    env.update(PIP_DISABLE_PIP_VERSION_CHECK='1', PIP_NO_INDEX='1', PIP_NO_CACHE_DIR='1',
               **extra)
    return env


def run(args, **kwargs):
    result = subprocess.run(args, capture_output=True, text=True, check=False, **kwargs)
    if result.returncode:
        raise AssertionError(f'{args} failed ({result.returncode}):\n'
                             f'{result.stdout[-3000:]}\n{result.stderr[-3000:]}')
    return result.stdout
