"""Where a run's files live and what they are called: local paths or object-storage URLs.

Every binary takes its directories through `resolve`: local paths are taken from the directory
the user ran the command from, URLs (`gs://...` and any scheme Beam's filesystems know) stay as
they are. Files behind a URL are read and written through Beam's `FileSystems`, imported only
when a URL is used, so local runs never load it.

A run directory holds:

    config.gin             the configuration the run was started with (a rerun must match it)
    operative_config.gin   every parameter the run used
    metrics.jsonl          a line per evaluation: step, mean_return, ...
    events.out.tfevents.*  TensorBoard summaries
    metrics.orphaned.jsonl evaluations past the checkpoint a resumed run restored (recovery.py)
    checkpoints/           the latest checkpoints: ckpt-<step>.*, and corrupt/ for broken ones
    policy/<step>/         the exported policy (SavedModel) of each kept checkpoint
    train.log, result.json a sweep trial's trainer output and its result (written last)

Beside the names, what every reader and writer of these files shares: `open_regular` (a FIFO in
place of a file blocks no reader), `unwritable_ancestor` (can a local path be created), and
`first_line` / `one_line` (an error's message in a sentence). agents/runs/metrics.py reads
`metrics.jsonl`.
"""

import contextlib
import os
import re
import shutil
import stat

CONFIG_FILE = 'config.gin'
OPERATIVE_CONFIG_FILE = 'operative_config.gin'
# A population's logdir (`train.population`) holds its configuration here, next to the runs of
# its members (`member-<k>/`), and no run file of its own: tools that look for runs find those.
POPULATION_CONFIG_FILE = 'population.gin'
MEMBER_DIR = 'member-{}'
METRICS_FILE = 'metrics.jsonl'
ORPHANED_METRICS_FILE = 'metrics.orphaned.jsonl'
CHECKPOINT_DIR = 'checkpoints'
CHECKPOINT_PREFIX = 'ckpt'  # tf.train.CheckpointManager's: checkpoints/ckpt-<step>.index, ...
CORRUPT_DIR = 'corrupt'  # In CHECKPOINT_DIR: checkpoints that did not read back.
POLICY_DIR = 'policy'
LOG_FILE = 'train.log'
RESULT_FILE = 'result.json'
LOCK_FILE = '.lock'  # A local run's flock (run_config.LogdirLock).
LEASE_FILE = '.lease'  # A remote run's lease object (lease.py).
EVENTS_PREFIX = 'events.out.tfevents.'
PROBE_PREFIX = '.batchppo-probe-'  # Written and deleted by `check_writable`.
# Files a sweep's trial writes beside the trainer's: the trainer leaves them alone.
TRIAL_FILES = (LOG_FILE, RESULT_FILE)

_URL = re.compile(r'^([a-zA-Z][a-zA-Z0-9+.-]*)://')
GCP_EXTRA = "pip install 'apache-beam[gcp]'"


class StorageError(Exception):
    """A path that cannot be used (unknown scheme, no access, missing library), in one sentence."""


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


def filesystems(path):
    """Beam's FileSystems, checked to know the scheme of URL `path`."""
    try:
        from apache_beam.io.filesystems import FileSystems
    except ImportError:
        raise StorageError(f'{path} needs Apache Beam\'s filesystems: {GCP_EXTRA}') from None
    try:
        FileSystems.get_filesystem(path)
    except ValueError:
        extra = f': {GCP_EXTRA}' if scheme(path) == 'gs' else ''
        raise StorageError(f'no filesystem for {scheme(path)}:// paths ({path}) is installed'
                           f'{extra}') from None
    if scheme(path) == 'gs':
        _use_emulator_credentials()
    return FileSystems


def _use_emulator_credentials():
    """Against a GCS emulator (STORAGE_EMULATOR_HOST, as google-cloud-storage honours it), Beam
    connects anonymously at once instead of looking for credentials with retries (~40 s)."""
    if not os.environ.get('STORAGE_EMULATOR_HOST'):
        return
    from apache_beam.internal.gcp import auth
    with auth._Credentials._credentials_lock:
        auth._Credentials._credentials_init = True
        auth._Credentials._credentials = None


def exists(path):
    if not is_remote(path):
        return os.path.exists(path)
    return filesystems(path).exists(path)


def read_bytes(path):
    """The bytes of file `path`; FileNotFoundError if there is none."""
    if not is_remote(path):
        with open(path, 'rb') as f:
            return f.read()
    from apache_beam.io.filesystem import CompressionTypes
    file_systems = filesystems(path)
    if not file_systems.exists(path):
        raise FileNotFoundError(f'no such file: {path}')
    with file_systems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as f:
        return f.read()


def read_text(path):
    return read_bytes(path).decode('utf-8')


def open_regular(path, text=False):
    """Local file `path` opened for reading (binary, or with `text` UTF-8 text whose
    undecodable bytes become U+FFFD); OSError unless it is a regular file.

    O_NONBLOCK: opening a FIFO must not block until some writer comes.
    """
    descriptor = os.open(path, os.O_RDONLY | getattr(os, 'O_NONBLOCK', 0))
    try:
        if not stat.S_ISREG(os.fstat(descriptor).st_mode):
            raise OSError(f'{path} is not a regular file')
        if text:
            return open(descriptor, encoding='utf-8', errors='replace')
        return open(descriptor, 'rb')
    except BaseException:
        os.close(descriptor)
        raise


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


def write_bytes(path, data, mime_type='application/octet-stream'):
    """Writes `data` so that readers see the old file or the new one, never a part: locally a
    temporary file and a rename, on object stores because an object appears whole when its
    upload closes."""
    if not is_remote(path):
        os.makedirs(os.path.dirname(path) or '.', exist_ok=True)
        temporary = f'{path}.tmp-{os.getpid()}'
        try:
            with open(temporary, 'wb') as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(temporary, path)
        finally:
            if os.path.exists(temporary):
                os.remove(temporary)
        return
    with _created(path, mime_type) as f:
        f.write(data)


def write_text(path, text):
    write_bytes(path, text.encode('utf-8'), mime_type='text/plain')


def list_files(directory):
    """{path relative to `directory` ('/'-separated): size in bytes} of every file under it."""
    if not is_remote(directory):
        files = {}
        for parent, _, names in os.walk(directory):
            for name in names:
                path = os.path.join(parent, name)
                relative = os.path.relpath(path, directory).replace(os.sep, '/')
                files[relative] = os.path.getsize(path)
        return files
    prefix = directory.rstrip('/') + '/'
    result = filesystems(directory).match([prefix + '**'])[0]
    # A probe of `check_writable` left by a process killed at that moment is no content.
    return {metadata.path[len(prefix):]: metadata.size_in_bytes
            for metadata in result.metadata_list if metadata.path.startswith(prefix) and
            not basename(metadata.path).startswith(PROBE_PREFIX)}


def exported_steps(policy_dir):
    """Steps of the policies exported under a local `policy_dir` (named by step), ascending."""
    if not os.path.isdir(policy_dir):
        return []
    return sorted(int(name) for name in os.listdir(policy_dir)
                  if re.fullmatch(r'\d+', name) and os.path.isdir(os.path.join(policy_dir, name)))


def is_empty_directory(path):
    """Whether nothing is stored under `path` (a missing directory is empty)."""
    if not is_remote(path):
        return not os.path.exists(path) or (os.path.isdir(path) and not os.listdir(path))
    return not list_files(path)


def delete(paths):
    """Deletes files one by one in the order given; missing ones are no error."""
    paths = list(paths)
    if not paths:
        return
    if not is_remote(paths[0]):
        for path in paths:
            if os.path.exists(path):
                os.remove(path)
        return
    if scheme(paths[0]) == 'gs':
        # One request per object: Beam's GCS delete sends batch requests, which GCS emulators
        # do not answer.
        from google.api_core import exceptions
        client = gcs_client(paths[0])
        for path in paths:
            bucket, name = split_gcs_path(path)
            try:
                client.bucket(bucket).blob(name).delete()
            except exceptions.NotFound:
                pass
        return
    file_systems = filesystems(paths[0])
    for path in paths:
        if file_systems.exists(path):
            file_systems.delete([path])


def split_gcs_path(path):
    """('bucket', 'object/name') of a gs:// URL."""
    bucket, _, name = path[len('gs://'):].partition('/')
    return bucket, name


_gcs_clients = {}


def gcs_client(path):
    """A google-cloud-storage client with the credentials Beam's gs:// filesystem uses."""
    filesystems(path)
    # Clients hold connections (not shared with forked children) and read the endpoint
    # (STORAGE_EMULATOR_HOST) when made.
    key = os.getpid(), os.environ.get('STORAGE_EMULATOR_HOST')
    if key not in _gcs_clients:
        from apache_beam.io.gcp import gcsio
        from apache_beam.options.pipeline_options import PipelineOptions
        _gcs_clients[key] = gcsio.create_storage_client(PipelineOptions([]))
    return _gcs_clients[key]


def upload(local_path, url):
    """Copies local file `local_path` to `url`, a URL or a local path (whole or not at all)."""
    if not is_remote(url):
        download(local_path, url)
        return
    with open(local_path, 'rb') as source, _created(url) as destination:
        shutil.copyfileobj(source, destination, 1 << 20)


@contextlib.contextmanager
def _created(url, mime_type='application/octet-stream'):
    """A writer of a new file at URL `url`, stored when the block ends. A writer whose upload
    failed is dropped: left open, the garbage collector would close it, which tries the upload
    again (for minutes, against a server out of reach)."""
    from apache_beam.io.filesystem import CompressionTypes
    writer = filesystems(url).create(url, mime_type=mime_type,
                                     compression_type=CompressionTypes.UNCOMPRESSED)
    try:
        with writer:
            yield writer
    finally:
        buffer = getattr(writer, '_buffer', None)  # google-cloud-storage's BlobWriter.
        if not writer.closed and buffer is not None:
            buffer.close()


def download(url, local_path):
    """Copies the file at `url` (a URL or a local path) to `local_path`, through a temporary
    file and a rename."""
    os.makedirs(os.path.dirname(local_path) or '.', exist_ok=True)
    temporary = f'{local_path}.download-{os.getpid()}'
    try:
        if is_remote(url):
            from apache_beam.io.filesystem import CompressionTypes
            source = filesystems(url).open(url, compression_type=CompressionTypes.UNCOMPRESSED)
        else:
            source = open(url, 'rb')
        with source, open(temporary, 'wb') as destination:
            shutil.copyfileobj(source, destination, 1 << 20)
        os.replace(temporary, local_path)
    finally:
        if os.path.exists(temporary):
            os.remove(temporary)


def download_tree(url, local_directory, skip=()):
    """Copies every file under `url` into `local_directory`, keeping relative paths; files whose
    relative path is in `skip` stay behind. Returns the relative paths copied."""
    copied = []
    for relative in sorted(list_files(url)):
        if relative in skip:
            continue
        download(join(url, relative), os.path.join(local_directory, *relative.split('/')))
        copied.append(relative)
    return copied


def upload_tree(local_directory, url):
    """Copies every file under `local_directory` to `url`, keeping relative paths."""
    for relative in sorted(list_files(local_directory)):
        upload(os.path.join(local_directory, *relative.split('/')), join(url, relative))


def describe_error(path, error):
    """One sentence for a failed access to URL `path`: what is wrong and what to do."""
    error = _beam_cause(error)
    text = f'{type(error).__name__}: {error}'
    chain = [error]
    while chain[-1].__cause__ or chain[-1].__context__:
        chain.append(chain[-1].__cause__ or chain[-1].__context__)
        if len(chain) > 10:
            break
    codes = {getattr(e, 'code', None) for e in chain} | {
        getattr(getattr(e, 'response', None), 'status_code', None) for e in chain}
    names = {type(e).__name__ for e in chain}
    joined = ' '.join(str(e) for e in chain)
    bucket = path.split('/')[2] if path.count('/') >= 2 else path
    summary = first_line(text, limit=300)
    if ('DefaultCredentialsError' in names or 401 in codes or 'Unauthorized' in names or
            'anonymous credentials' in joined.lower()):
        return (f'no credentials to access {path} ({summary}); run `gcloud auth '
                'application-default login` or set GOOGLE_APPLICATION_CREDENTIALS')
    if 403 in codes or 'Forbidden' in names:
        return (f'permission denied on {path}: the credentials in use may not read and write '
                f'bucket {bucket} ({summary})')
    if 404 in codes or 'NotFound' in names or 'bucket does not exist' in joined.lower():
        return f'bucket {bucket} of {path} does not exist ({summary})'
    return f'cannot access {path}: {summary}'


def check_writable(directory):
    """Raises StorageError unless files can be written and deleted under URL `directory`: a
    probe object is written and removed, so no credentials, an unknown bucket or a denied
    permission are told before any work starts."""
    if not is_remote(directory):
        return
    filesystems(directory)  # An unknown scheme or a missing library, named by `directory`.
    import uuid
    probe = join(directory, f'{PROBE_PREFIX}{uuid.uuid4().hex}')
    try:
        write_bytes(probe, b'')
        delete([probe])
    except StorageError:
        raise
    except Exception as error:  # Each client library raises its own types.
        raise StorageError(describe_error(directory, error)) from error


def first_line(error, limit=None):
    """The first line of an error's message (of a TensorFlow error's `message`, without the
    traceback it appends; without the context lines gin appends), or the error's type; cut to
    `limit` characters. Also takes a message as text."""
    message = getattr(error, 'message', None) or str(error)
    lines = message.strip().splitlines()
    line = lines[0] if lines else type(error).__name__
    return line[:limit]


def one_line(error, limit=None):
    """An error's whole message (a TensorFlow error's `message`) on one line, each run of
    whitespace a single space, or the error's type; cut to `limit` characters. For messages
    whose later lines matter (gin's tell where the mistake is)."""
    message = getattr(error, 'message', None) or str(error)
    return ' '.join(message.split())[:limit] or type(error).__name__


def _beam_cause(error):
    """The first error a BeamIOError holds (in a dict, not as its cause), or `error`."""
    details = getattr(error, 'exception_details', None)
    inner = next(iter(details.values()), None) if isinstance(details, dict) else None
    return _beam_cause(inner) if isinstance(inner, Exception) else error


@contextlib.contextmanager
def storage_errors(url, keep=()):
    """Raises a failure to use URL `url` (its client library's own exception types) as a
    StorageError that tells it in one sentence; StorageErrors and the types in `keep` pass
    unchanged."""
    try:
        yield
    except (StorageError, *keep):
        raise
    except Exception as error:  # Each client library raises its own types.
        raise StorageError(describe_error(url, error)) from error


def in_use_message(logdir, holder, how=''):
    """Why `logdir` is refused while another trainer holds it (`holder`: the pid, host,
    start time and command line its lock or lease records; `how`: how it holds it)."""
    who = f'pid {holder.get("pid", "?")}'
    if holder.get('host'):
        who += f' on {holder["host"]}'
    if holder.get('started'):
        who += f' since {holder["started"]}'
    if holder.get('command'):
        who += f' ({holder["command"]})'
    return (f'logdir {logdir} is in use by another trainer: {who}{how}. Wait for it to finish '
            'or stop it, or choose another --logdir.')
