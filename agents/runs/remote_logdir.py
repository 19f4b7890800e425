"""A run whose logdir is in a bucket: trained in a local staging directory kept in sync with it.

TensorFlow writes checkpoints, SavedModels and summaries to local files; object stores take
whole objects. So, as Ray Tune's syncer does, the trainer works in a local staging directory
that starts as a copy of the bucket's run (so a rerun on a machine that never saw the run
resumes it), and every save (`sync`, at each evaluation and checkpoint) goes up in a background
thread (agents/storage/upload_queue.py): training never waits for the bucket, and goes on
through an outage up to `max_outage_s`.

A save is frozen when handed over (hard links to the files TensorFlow writes once, copies of
those appended to), so the upload is of one consistent save however far training has gone on.
Uploads keep the bucket's run resumable at every moment: checkpoint data before the index that
names it, a policy's variables before its `saved_model.pb`, `metrics.jsonl` after both (nothing
the run logs leads its checkpoints), and files the trainer removed (older checkpoints and
policies) are deleted only after that, in the reverse order. A sync cut at any object thus
leaves what resuming repairs (recovery.py). A lease (lease.py) keeps a second trainer out.

The staging directory is named by the URL (under $BATCHPPO_STAGING_DIR, default
~/.cache/batchppo/staging) and outlives a run whose saves did not all reach the bucket: a rerun
on the same machine resumes from it when it is at least as new as the bucket's run, and uploads
what is pending.
"""

import contextlib
import dataclasses
import hashlib
import itertools
import json
import os
import re
import shutil
import tempfile
import time

import gin
from absl import logging

from agents.runs import lease as lease_lib
from agents.runs import run_config, run_dir
from agents.storage import failures, file_io, locations, upload_queue

STAGING_ENV = 'BATCHPPO_STAGING_DIR'

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
    elif _written_once(ranked):
        rank = 0
    else:
        rank = 2
    return rank, relative


def _written_once(relative):
    """Whether TensorFlow writes the file whole and never changes it (checkpoints and policies
    are written aside and renamed into place), so that a hard link freezes it."""
    return _MEMBER.sub('', relative).startswith(
        (run_dir.CHECKPOINT_DIR + '/', run_dir.POLICY_DIR + '/'))


def newest_checkpoint_step(relatives):
    """The step of the newest checkpoint among relative paths (of any member), or None."""
    steps = [run_dir.checkpoint_index_step(name) for folder, name in
             (relative.rpartition('/')[::2] for relative in relatives)
             if folder.rpartition('/')[2] == run_dir.CHECKPOINT_DIR]
    steps = [step for step in steps if step is not None]
    return max(steps) if steps else None


def staging_directory(url):
    """The local staging directory of bucket run `url` on this machine: under
    $BATCHPPO_STAGING_DIR, else ~/.cache/batchppo/staging, else (a home one cannot write to) the
    system's temporary directory."""
    root = os.environ.get(STAGING_ENV)
    if not root:
        root = os.path.join(os.path.expanduser('~'), '.cache', 'batchppo', 'staging')
        try:
            os.makedirs(root, exist_ok=True)
            writable = os.access(root, os.W_OK | os.X_OK)  # False on a read-only mount too.
        except OSError:
            writable = False
        if not writable:
            root = os.path.join(tempfile.gettempdir(), f'batchppo-staging-{os.getuid()}')
    readable = re.sub(r'[^A-Za-z0-9._-]+', '_', url.split('://', 1)[-1]).strip('_')[-80:]
    return os.path.join(root, f'{readable}-{hashlib.sha256(url.encode()).hexdigest()[:12]}')


def _new_directory(path):
    try:
        os.makedirs(path)
    except OSError as error:
        raise failures.StorageError(
            f'cannot create the staging directory {path}: {error.strerror or error}; set '
            f'{STAGING_ENV} to a writable directory') from None
    return path


class _FrozenSave:
    """One save's files, frozen in `directory` ({relative path: (size, mtime_ns)})."""

    def __init__(self, directory, files, step):
        self.directory = directory
        self.files = files
        self.step = step

    def discard(self):
        shutil.rmtree(self.directory, ignore_errors=True)


@dataclasses.dataclass(frozen=True)
class StagingSettings:
    """How a bucket run rides out an outage (`staging.*` in gin).

    Args:
      max_outage_s: how long uploads may fail in a row before the run stops (with the saves
        kept locally).
      max_pending_saves: how many saves may be only local before training waits for the
        bucket: the work a lost machine would take with it.
    """
    max_outage_s: float = 1800.0
    max_pending_saves: int = 20


# The binding that sets how long a bucket run rides out an outage (a sweep passes its own).
MAX_OUTAGE_BINDING = 'staging.max_outage_s'


@gin.configurable('staging')
def _bound_staging_settings(max_outage_s=StagingSettings.max_outage_s,
                            max_pending_saves=StagingSettings.max_pending_saves):
    return max_outage_s, max_pending_saves


def staging_settings():
    """The StagingSettings gin binds; raises ConfigError naming a bad one (checked by every run,
    local or not, so that a mistake never waits for the first bucket run)."""
    max_outage_s, max_pending_saves = _bound_staging_settings()
    if isinstance(max_outage_s, bool) or not (isinstance(max_outage_s, (int, float))
                                              and max_outage_s > 0):
        raise run_config.ConfigError(f'staging.max_outage_s must be a positive number of '
                                     f'seconds, got {max_outage_s!r}')
    if isinstance(max_pending_saves, bool) or not (isinstance(max_pending_saves, int)
                                                   and max_pending_saves >= 1):
        raise run_config.ConfigError(f'staging.max_pending_saves must be a positive integer, '
                                     f'got {max_pending_saves!r}')
    return StagingSettings(float(max_outage_s), max_pending_saves)


class StagedLogdir:
    """The local staging directory of remote logdir `url`.

    `open()` checks access, takes the lease and finds the run (the local copy left by an
    earlier trainer if it is not older than the bucket's, else a download); `sync()` hands the
    current save to the background uploads; `close()` waits for them (up to a deadline),
    releases the lease and removes the staging directory once the bucket holds everything.
    Files a sweep's trial owns (`train.log`, `result.json`) and the lease are neither downloaded
    nor touched. `settings`: StagingSettings (default: gin's).
    """

    def __init__(self, url, lease_ttl_s=lease_lib.DEFAULT_TTL_S, read_only=False,
                 settings=None):
        settings = settings or staging_settings()
        self.max_outage_s = settings.max_outage_s
        self.max_pending_saves = settings.max_pending_saves
        self.url = url.rstrip('/')
        self.read_only = read_only
        self.local = None  # The run's local copy, in the staging directory.
        self._staging = None
        self._lease = None
        if not read_only and locations.scheme(url) == 'gs':
            self._lease = lease_lib.Lease(self.url, ttl_s=lease_ttl_s)
        elif not read_only:
            logging.warning('%s:// has no lease: nothing keeps a second trainer from writing %s '
                            'at the same time.', locations.scheme(url), url)
        self._uploaded = {}  # Relative path: (size, mtime_ns) of what the bucket holds.
        self._ignored = set(run_dir.TRIAL_FILES) | {run_dir.LEASE_FILE, run_dir.LOCK_FILE}
        self._queue = None
        self._numbers = itertools.count()

    def open(self):
        """Returns the local directory holding the run (empty for a new run)."""
        if not self.read_only:
            file_io.check_writable(self.url)
        try:
            if self._lease is not None:
                _told_as_storage_error(self.url, self._lease.acquire)
            remote = {relative for relative in stored_files(self.url)
                      if relative not in self._ignored}
            self._staging = self._earlier_staging(remote)
            if self._staging is None:
                self._staging = (tempfile.mkdtemp(prefix='batchppo-run-') if self.read_only
                                 else _new_directory(staging_directory(self.url)))
                self.local = os.path.join(self._staging, run_dir.STAGING_RUN_DIR)
                os.mkdir(self.local)
                copied = _told_as_storage_error(self.url, file_io.download_tree, self.url,
                                                self.local, skip=self._ignored)
                for relative in copied:
                    self._uploaded[relative] = self._stat(relative)
                if not self.read_only:
                    self._write_uploaded()
                if copied:
                    logging.info('Copied %d files of %s to %s.', len(copied), self.url,
                                 self.local)
        except BaseException:
            self.close(sync=False)
            raise
        if not self.read_only:
            logging.info('Staging %s in %s.', self.url, self.local)
            local = self.local
            self._queue = upload_queue.UploadQueue(
                self.url, self._upload, lambda: local, self.max_outage_s,
                self.max_pending_saves, fatal=(lease_lib.LeaseHeld,))
        return self.local

    def _earlier_staging(self, remote):
        """The staging directory an earlier trainer left, if its run is not older than the
        bucket's (else it goes; self.local is then its run); None when there is none to use."""
        if self.read_only:
            return None
        directory = staging_directory(self.url)
        uploaded_path = os.path.join(directory, run_dir.STAGING_UPLOADED_FILE)
        run = os.path.join(directory, run_dir.STAGING_RUN_DIR)
        if not (os.path.isfile(uploaded_path) and os.path.isdir(run)):
            if os.path.exists(directory):  # Not a staging directory this code left whole.
                shutil.rmtree(directory)
            return None
        local_files = self._local_files(run)
        local_step = newest_checkpoint_step(local_files)
        remote_step = newest_checkpoint_step(remote)
        if remote_step is not None and (local_step is None or local_step < remote_step):
            logging.warning('The bucket holds a newer save of %s (step %d) than the local copy '
                            'an earlier trainer left in %s (step %s): resuming from the bucket.',
                            self.url, remote_step, directory, local_step)
            shutil.rmtree(directory)
            return None
        try:
            with open(uploaded_path, encoding='utf-8') as f:
                self._uploaded = {relative: tuple(stat) for relative, stat in json.load(f).items()
                                  if relative in remote}
        except (OSError, ValueError, AttributeError, TypeError):
            self._uploaded = {}  # Uploaded again, at worst.
        shutil.rmtree(os.path.join(directory, run_dir.STAGING_PENDING_DIR), ignore_errors=True)
        pending = sum(self._uploaded.get(relative) != self._stat(relative, run)
                      for relative in local_files)
        logging.warning('Resuming %s from the local copy an earlier trainer left in %s (step %s; '
                        'the bucket has step %s); %d files not in the bucket go up in the '
                        'background.', self.url, directory, local_step, remote_step, pending)
        self.local = run
        return directory

    def _local_files(self, directory=None):
        """The run's files in the staging directory (relative paths), bookkeeping aside."""
        return [relative for relative in file_io.list_files(directory or self.local)
                if relative not in self._ignored and '.tmp-' not in relative]

    def _stat(self, relative, directory=None):
        stat = os.stat(os.path.join(directory or self.local, *relative.split('/')))
        return stat.st_size, stat.st_mtime_ns

    def _write_uploaded(self):
        path = os.path.join(self._staging, run_dir.STAGING_UPLOADED_FILE)
        with open(path + '.tmp', 'w', encoding='utf-8') as f:
            json.dump(self._uploaded, f)
        os.replace(path + '.tmp', path)

    def sync(self, should_stop=lambda: False):
        """Hands the current save to the background uploads and returns; waits while more than
        `max_pending_saves` saves are only local (or until `should_stop()`). Raises
        StorageError once uploads failed for longer than `max_outage_s` (or the lease was
        lost)."""
        if self.read_only or self.local is None:
            return
        self._queue.submit(self._freeze())
        self._queue.wait_for_room(should_stop,
                                  report=lambda phrase: logging.warning('%s', phrase))

    def describe(self):
        """What reached the bucket and what is only local, in one sentence."""
        if self._queue is None:
            return f'the run is in {self.url}'
        return self._queue.describe()

    def _freeze(self):
        """The current save, frozen under the pending directory."""
        directory = os.path.join(self._staging, run_dir.STAGING_PENDING_DIR,
                                 str(next(self._numbers)))
        files = {}
        for relative in self._local_files():
            source = os.path.join(self.local, *relative.split('/'))
            target = os.path.join(directory, *relative.split('/'))
            os.makedirs(os.path.dirname(target), exist_ok=True)
            if _written_once(relative):
                try:
                    os.link(source, target)
                except OSError:  # A file system without hard links.
                    shutil.copy2(source, target)
            else:
                shutil.copy2(source, target)
            stat = os.stat(target)
            files[relative] = (stat.st_size, stat.st_mtime_ns)
        return _FrozenSave(directory, files, newest_checkpoint_step(files))

    def _upload(self, save):
        """Uploads what the bucket lacks of `save`, then deletes what it no longer has (in the
        background thread, whose queue tells the client library's errors)."""
        if self._lease is not None:
            self._lease.check()
        changed = [relative for relative, stat in save.files.items()
                   if self._uploaded.get(relative) != stat]
        for relative in sorted(changed, key=_upload_order):
            file_io.upload(os.path.join(save.directory, *relative.split('/')),
                           locations.join(self.url, relative))
            self._uploaded[relative] = save.files[relative]
        # Referring files go first, so that a cut leaves what recovery removes (data without its
        # index, variables without their program), never a reference to nothing.
        removed = sorted(set(self._uploaded) - set(save.files), key=_upload_order, reverse=True)
        file_io.delete([locations.join(self.url, relative) for relative in removed])
        for relative in removed:
            del self._uploaded[relative]
        self._write_uploaded()

    def status(self):
        """A phrase for progress lines while uploads fail, else None."""
        return None if self._queue is None else self._queue.status()

    def flush(self, timeout_s=None):
        """Syncs and waits until the bucket holds the save (at most `timeout_s`, default
        `max_outage_s`); raises StorageError naming what is only local if it does not."""
        if self.read_only or self.local is None:
            return
        self.sync()
        if not self._queue.drain(self.max_outage_s if timeout_s is None else timeout_s):
            if self._queue.error is not None:
                raise self._queue.error
            raise failures.StorageError(f'cannot store the run: {self._queue.describe()}'
                                        + (f' ({self._queue.last_failure})'
                                           if self._queue.last_failure else ''))

    def close(self, sync=True, timeout_s=None, should_stop=lambda: False):
        """Uploads the last save (with `sync`: waits up to `timeout_s`, default `max_outage_s`,
        or until `should_stop()`), releases the lease and removes the staging directory if the
        bucket then holds everything. Otherwise the directory stays for a rerun (which uploads
        it and resumes), and with `sync` a StorageError says what reached the bucket and what
        is only local."""
        if self.local is None:
            return
        queue, self._queue = self._queue, None
        complete, failure = True, None
        try:
            if queue is not None and sync:
                with contextlib.suppress(failures.StorageError):  # The queue gave up: below.
                    queue.submit(self._freeze())
                complete = self._drain(queue, self.max_outage_s if timeout_s is None
                                       else timeout_s, should_stop)
                if not complete:  # Told before closing the queue forgets the waiting save.
                    failure = queue.error or failures.StorageError(
                        queue.describe() + (f'; the last upload failed: {queue.last_failure}'
                                            if queue.last_failure else ''))
            elif queue is not None:
                complete = queue.idle() and not self._unsaved()
        finally:
            if queue is not None:
                queue.close()
            if self._lease is not None and complete:
                with contextlib.suppress(Exception):  # Its expiry frees it anyway.
                    self._lease.release()
            elif self._lease is not None:
                # The bucket may be out of reach, where a release would wait on the client's
                # retries. The lease expires; a rerun here takes it over at once (this process
                # is gone), elsewhere after its ttl.
                self._lease.abandon()
            staging, self.local, self._staging = self._staging, None, None
            if complete:
                shutil.rmtree(staging, ignore_errors=True)
        if failure is not None:
            raise failure

    def _drain(self, queue, timeout_s, should_stop):
        """queue.drain, telling every 10 s what it waits for."""
        deadline = time.monotonic() + timeout_s
        while True:
            complete = queue.drain(min(10.0, max(0.0, deadline - time.monotonic())),
                                   should_stop)
            if (complete or queue.error is not None or should_stop()
                    or time.monotonic() >= deadline):
                return complete
            logging.warning('Waiting for the last saves to reach %s: %s', self.url,
                            queue.status() or 'uploading')

    def _unsaved(self):
        """Whether the staging directory holds files the bucket does not."""
        return any(self._uploaded.get(relative) != self._stat(relative)
                   for relative in self._local_files())


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
