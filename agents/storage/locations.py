"""Where a file is: a local path or an object-storage URL, named as the user gave it.

Every binary takes its directories through `resolve`: local paths are taken from the directory
the user ran the command from, URLs (`gs://...` and any scheme Beam's filesystems know) stay as
they are. Nothing here touches storage but `unwritable_ancestor`, which looks at local
directories.
"""

import os
import re

_URL = re.compile(r'^([a-zA-Z][a-zA-Z0-9+.-]*)://')


def scheme(path):
    """The URL scheme of `path` in lower case ('gs', 's3', 'file'), or None for a plain path."""
    match = _URL.match(path)
    return match.group(1).lower() if match else None


def is_remote(path):
    """Whether `path` is a URL of a filesystem other than the local one."""
    return scheme(path) not in (None, 'file')


def caller_directory():
    """Where the user ran the command (`bazel run` changes the working directory)."""
    return os.environ.get('BUILD_WORKING_DIRECTORY') or os.getcwd()


def resolve(path):
    """A user-given path: URLs unchanged, local ones (also `file://`) from the caller's
    directory."""
    if is_remote(path):
        return path
    if scheme(path) == 'file':
        path = path[len('file://'):]
    return os.path.normpath(os.path.join(caller_directory(), os.path.expanduser(path)))


def join(path, *parts):
    if is_remote(path):
        return '/'.join([path.rstrip('/'), *(part.strip('/') for part in parts)])
    return os.path.join(path, *parts)


def basename(path):
    return path.rstrip('/').rsplit('/', 1)[-1] if is_remote(path) else os.path.basename(path)


def split_gcs_path(path):
    """('bucket', 'object/name') of a gs:// URL."""
    bucket, _, name = path[len('gs://'):].partition('/')
    return bucket, name


def unwritable_ancestor(path):
    """None if local `path` can be written or created: its nearest existing ancestor (`path`
    itself if it exists) is a directory this process may write to and enter. Otherwise that
    ancestor, to name in a message ('cannot write to X: <it> is not a writable directory')."""
    existing = os.path.abspath(path)
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if os.path.isdir(existing) and os.access(existing, os.W_OK | os.X_OK):
        return None
    return existing
