"""XLA's persistent compilation cache: compiled programs kept on disk across runs.

Compiling a native run's programs with XLA takes seconds (most of a short run's start); a later
run of the same program (a rerun, a resumed run, another seed of the same configuration, a
sweep's trials that differ in their seed) loads it from the cache instead. TensorFlow writes each
program as one file, named by a fingerprint of the program, atomically (a write goes to a
temporary file that is renamed). The cache is a process-wide setting that TensorFlow reads when
it first looks at its devices, so `enable` must come before that; the trainer calls
`enable_from_environment` before it loads TensorFlow. A machine's setting rather than a run's,
like JAX's JAX_COMPILATION_CACHE_DIR: the variable BATCHPPO_XLA_CACHE_DIR names the directory.

A damaged entry (a truncated or altered file) makes TensorFlow fail the call that loads it, and
it keeps that failure for the rest of the process. `damaged` recognizes such an error;
`quarantine` moves the cache's entries aside, so that the next run compiles afresh.
"""

import os
import re
import time

# The variable that names the cache directory; unset or empty: no cache.
ENV_VAR = 'BATCHPPO_XLA_CACHE_DIR'
# TensorFlow's flag, appended to TF_XLA_FLAGS.
_FLAG = '--tf_xla_persistent_cache_directory'
# The files of the cache (TensorFlow's naming).
_ENTRY = re.compile(r'^xla_compile_cache__.*\.pb$')
# What TensorFlow says when it cannot load an entry, seen for truncated, emptied, overwritten
# and bit-flipped files.
_DAMAGE = re.compile(
    r"Can't parse .*xla_compile_cache__.* as binary proto|Read less bytes than requested|"
    r'Failed to parse serialized \w*CompilationResult|Serialized cache key does not match')
# Older entries are deleted beyond this many bytes (each program is a few MB).
MAX_BYTES = 1 << 30

_directory = None  # The directory `enable` set, in this process.


class CacheError(Exception):
    """The cache directory cannot be used; the message names it and why."""


def enable(directory, max_bytes=MAX_BYTES):
    """Keeps XLA's compiled programs in `directory` (created if missing), deleting the oldest
    entries beyond `max_bytes`. Raises CacheError if the directory cannot be used."""
    global _directory
    directory = os.path.abspath(os.path.expanduser(directory))
    flags = os.environ.get('TF_XLA_FLAGS', '')
    if _FLAG in flags:
        raise CacheError(f'TF_XLA_FLAGS sets {_FLAG} already; unset it or pass the same '
                         'directory as the cache')
    try:
        os.makedirs(directory, exist_ok=True)
        if not os.access(directory, os.W_OK | os.X_OK):
            raise PermissionError(13, 'Permission denied', directory)
        _prune(directory, max_bytes)
    except OSError as error:
        raise CacheError(f'cannot use {directory} as the XLA compilation cache: '
                         f'{error.strerror or error}') from error
    os.environ['TF_XLA_FLAGS'] = f'{flags} {_FLAG}={directory}'.strip()
    _directory = directory


def enable_from_environment():
    """`enable`s the directory that BATCHPPO_XLA_CACHE_DIR names, if it names one."""
    if os.environ.get(ENV_VAR):
        enable(os.environ[ENV_VAR])


def directory():
    """The cache directory of this process, or None."""
    return _directory


def damaged(error):
    """Whether `error` (a TensorFlow OpError) is the failure to load a cache entry."""
    return _directory is not None and bool(_DAMAGE.search(getattr(error, 'message', '')))


def quarantine():
    """Moves every entry of the cache to a new `damaged-<time>/` beside them; returns it.

    TensorFlow's error does not always name the entry, so all of them go: the next run
    compiles what it needs again.
    """
    target = os.path.join(_directory, time.strftime('damaged-%Y%m%d-%H%M%S'))
    os.makedirs(target, exist_ok=True)
    for name in os.listdir(_directory):
        if _ENTRY.match(name):
            os.replace(os.path.join(_directory, name), os.path.join(target, name))
    return target


def _prune(directory, max_bytes):
    """Deletes the oldest entries until the rest fit in `max_bytes`."""
    entries = []
    for name in os.listdir(directory):
        if _ENTRY.match(name):
            stat = os.stat(os.path.join(directory, name))
            entries.append((stat.st_mtime, stat.st_size, name))
    total = sum(size for _, size, _ in entries)
    for _, size, name in sorted(entries):
        if total <= max_bytes:
            break
        os.remove(os.path.join(directory, name))
        total -= size
