"""Finds the checked-out source tree from inside a Bazel test.

Tests such as the linter must see the whole tree, not only declared inputs.
A data file's runfiles symlink resolves to the real workspace file, whose
directory is the tree's root.
"""

import os


def workspace_root(anchor='ruff.toml'):
    """Returns the absolute path of the workspace that holds `anchor`."""
    candidates = []
    if 'TEST_SRCDIR' in os.environ:
        workspace = os.environ.get('TEST_WORKSPACE', 'batchppo')
        candidates.append(os.path.join(os.environ['TEST_SRCDIR'], workspace, anchor))
    candidates.append(os.path.join(os.path.dirname(__file__), '..', anchor))
    for candidate in candidates:
        if os.path.exists(candidate):
            return os.path.dirname(os.path.realpath(candidate))
    raise FileNotFoundError(f'cannot locate the workspace: none of {candidates} exists')
