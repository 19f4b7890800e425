"""A run whose logdir is in a bucket: trained in a local staging directory kept in sync with it.

TensorFlow writes checkpoints, SavedModels and summaries to local files; object stores take
whole objects. So, as Ray Tune's syncer does, the trainer works in a local staging directory
that starts as a copy of the bucket's run (so a rerun on a machine that never saw the run
resumes it) and is uploaded at every evaluation and checkpoint (`sync`) and at the end.

Uploads keep the bucket's run resumable at every moment: checkpoint data before the index that
names it, a policy's variables before its `saved_model.pb`, `metrics.jsonl` after both (nothing
the run logs leads its checkpoints), and files the trainer removed (older checkpoints and
policies) are deleted only after that, in the reverse order. A sync cut at any object thus
leaves what resuming repairs (recovery.py). A lease (lease.py) keeps a second trainer out.
"""

import os
import re
import shutil
import tempfile

from absl import logging

from agents.runs import lease as lease_lib
from agents.runs import run_dir
from agents.storage import failures, file_io, locations

# Upload order, first to last: what a later file refers to goes up before it.
_LAST = (run_dir.METRICS_FILE,)
# The checkpoint state file names checkpoints; a SavedModel's program and fingerprint name its
# variables.
_REFERRING = (f'{run_dir.CHECKPOINT_DIR}/checkpoint', 'saved_model.pb', 'fingerprint.pb')


# A population's logdir holds a run per member: each ranks as a run of its own.
_MEMBER = re.compile('^' + run_dir.MEMBER_DIR.format(r'\d+') + '/')


def _upload_order(relative):
    """The sort key of `relative` among a sync's uploads."""
    ranked = _MEMBER.sub('', relative)
    if ranked in _LAST:
        rank = 3
    elif ranked.endswith(_REFERRING):
        rank = 1
    elif ranked.startswith((run_dir.CHECKPOINT_DIR + '/', run_dir.POLICY_DIR + '/')):
        rank = 0
    else:
        rank = 2
    return rank, relative


class StagedLogdir:
    """The local staging directory of remote logdir `url`.

    `open()` checks access, takes the lease and downloads the run; `sync()` uploads what changed
    and deletes what the trainer removed; `close()` syncs (unless told not to), releases the
    lease and removes the staging directory. Files a sweep's trial owns (`train.log`,
    `result.json`) and the lease are neither downloaded nor touched.
    """

    def __init__(self, url, lease_ttl_s=lease_lib.DEFAULT_TTL_S, read_only=False):
        self.url = url.rstrip('/')
        self.read_only = read_only
        self.local = None
        self._lease = None
        if not read_only and locations.scheme(url) == 'gs':
            self._lease = lease_lib.Lease(self.url, ttl_s=lease_ttl_s)
        elif not read_only:
            logging.warning('%s:// has no lease: nothing keeps a second trainer from writing %s '
                            'at the same time.', locations.scheme(url), url)
        self._uploaded = {}  # Relative path: (size, mtime_ns) as last uploaded or downloaded.
        self._ignored = set(run_dir.TRIAL_FILES) | {run_dir.LEASE_FILE, run_dir.LOCK_FILE}

    def open(self):
        """Returns the local directory holding the run (empty for a new run)."""
        if not self.read_only:
            file_io.check_writable(self.url)
        try:
            if self._lease is not None:
                _told_as_storage_error(self.url, self._lease.acquire)
            self.local = tempfile.mkdtemp(prefix='batchppo-run-')
            copied = _told_as_storage_error(self.url, file_io.download_tree, self.url,
                                            self.local, skip=self._ignored)
        except BaseException:
            self.close(sync=False)
            raise
        for relative in copied:
            self._uploaded[relative] = self._stat(relative)
        if copied:
            logging.info('Copied %d files of %s to %s.', len(copied), self.url, self.local)
        return self.local

    def _stat(self, relative):
        stat = os.stat(os.path.join(self.local, *relative.split('/')))
        return stat.st_size, stat.st_mtime_ns

    def sync(self):
        """Uploads new and changed files in dependency order, then deletes removed ones; raises
        StorageError (what failed is tried again at the next sync)."""
        if self.read_only or self.local is None:
            return
        _told_as_storage_error(self.url, self._sync)

    def _sync(self):
        if self._lease is not None:
            self._lease.check()
        local = {relative for relative in file_io.list_files(self.local)
                 if relative not in self._ignored and '.tmp-' not in relative}
        changed = [relative for relative in local
                   if self._uploaded.get(relative) != self._stat(relative)]
        for relative in sorted(changed, key=_upload_order):
            stat = self._stat(relative)
            file_io.upload(os.path.join(self.local, *relative.split('/')),
                           locations.join(self.url, relative))
            self._uploaded[relative] = stat
        # Referring files go first, so that a cut leaves what recovery removes (data without
        # its index, variables without their program), never a reference to nothing.
        removed = sorted(set(self._uploaded) - local, key=_upload_order, reverse=True)
        file_io.delete([locations.join(self.url, relative) for relative in removed])
        for relative in removed:
            del self._uploaded[relative]

    def close(self, sync=True):
        """Syncs (with `sync`), releases the lease and removes the staging directory."""
        try:
            if sync:
                self.sync()
        finally:
            if self._lease is not None:
                self._lease.release()
            if self.local is not None:
                shutil.rmtree(self.local, ignore_errors=True)
                self.local = None


def _told_as_storage_error(url, function, *args, **kwargs):
    """`function(*args, **kwargs)`, its failures to reach `url` raised as StorageError."""
    with failures.storage_errors(url):
        return function(*args, **kwargs)


# What restoring a run's agent reads (evaluate, visualize and export of a bucket's run).
RESTORE_FILES = (run_dir.CONFIG_FILE, run_dir.OPERATIVE_CONFIG_FILE, run_dir.CHECKPOINT_DIR)


class LocalCopies:
    """Local stand-ins for the remote directories of a tool that works on local files.

    `input(path)` downloads a remote directory into a temporary one, `output(path)` makes a
    temporary directory for files meant for a remote one, which `upload()` stores there; local
    paths pass through unchanged. `named(text)` puts the URLs back where a message shows a
    temporary path. Leaving the `with` block removes the temporary directories.
    """

    def __init__(self):
        self._urls = {}  # Temporary directory: the URL it stands for.
        self._outputs = []  # (temporary directory, whether its URL's other files go).

    def __enter__(self):
        return self

    def __exit__(self, *unused_exc_info):
        for local in self._urls:
            shutil.rmtree(os.path.dirname(local), ignore_errors=True)

    def _local(self, url):
        local = os.path.join(tempfile.mkdtemp(prefix='batchppo-copy-'), locations.basename(url))
        self._urls[local] = url.rstrip('/')
        return local

    def input(self, path, include=None):
        """`path`, or for a URL a local copy of the files under it whose first path component
        is in `include` (default all). A URL with no such files has no copy: it reads as a
        missing directory."""
        if not locations.is_remote(path):
            return path
        local = self._local(path)
        for relative in sorted(_told_as_storage_error(path, file_io.list_files, path)):
            if include is None or relative.split('/', 1)[0] in include:
                _told_as_storage_error(path, file_io.download, locations.join(path, relative),
                                  os.path.join(local, *relative.split('/')))
        return local

    def output(self, path, replace=False):
        """`path`, or for a URL an empty local directory that `upload()` stores there, deleting
        the URL's other files if `replace`. Check the URL with file_io.check_writable first."""
        if not locations.is_remote(path):
            return path
        local = self._local(path)
        os.mkdir(local)
        self._outputs.append((local, replace))
        return local

    def upload(self):
        """Stores the outputs (a SavedModel's variables before the program that names them);
        raises StorageError."""
        for local, replace in self._outputs:
            url = self._urls[local]
            _told_as_storage_error(url, _upload_directory, local, url, replace)

    def named(self, text):
        """`text` (or an error's) with the URLs in place of their temporary directories."""
        text = str(text)
        for local, url in self._urls.items():
            text = text.replace(local, url)
        return text


def stored_files(url):
    """file_io.list_files(url), its failures raised as StorageError."""
    return _told_as_storage_error(url, file_io.list_files, url)


def _upload_directory(local, url, replace):
    files = file_io.list_files(local)
    for relative in sorted(files, key=lambda relative: (relative.endswith(_REFERRING), relative)):
        file_io.upload(os.path.join(local, *relative.split('/')), locations.join(url, relative))
    if replace:
        file_io.delete([locations.join(url, relative) for relative in file_io.list_files(url)
                        if relative not in files])
