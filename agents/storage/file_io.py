"""Files read, written, listed, copied and deleted alike on local disk and behind URLs.

Local files go through the operating system; files behind a URL through Beam's `FileSystems`
(one request per object for gs:// deletes). Writes are whole or not at all, so a reader sees
the old file or the new one.
"""

import contextlib
import os
import shutil
import stat

from agents.storage import backends, failures, locations, outages

PROBE_PREFIX = '.batchppo-probe-'  # Written and deleted by `check_writable`.


def exists(path):
    if not locations.is_remote(path):
        return os.path.exists(path)
    return outages.ride_out(path, lambda: backends.filesystems(path).exists(path))


def read_bytes(path):
    """The bytes of file `path`; FileNotFoundError if there is none."""
    if not locations.is_remote(path):
        with open(path, 'rb') as f:
            return f.read()
    return outages.ride_out(path, lambda: _read_remote(path))


def _read_remote(path):
    from apache_beam.io.filesystem import CompressionTypes
    file_systems = backends.filesystems(path)
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


def write_bytes(path, data, mime_type='application/octet-stream'):
    """Writes `data` so that readers see the old file or the new one, never a part: locally a
    temporary file and a rename, on object stores because an object appears whole when its
    upload closes."""
    if not locations.is_remote(path):
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

    def write():
        with _created(path, mime_type) as f:
            f.write(data)
    outages.ride_out(path, write)


def write_text(path, text):
    write_bytes(path, text.encode('utf-8'), mime_type='text/plain')


def list_files(directory):
    """{path relative to `directory` ('/'-separated): size in bytes} of every file under it."""
    if not locations.is_remote(directory):
        files = {}
        for parent, _, names in os.walk(directory):
            for name in names:
                path = os.path.join(parent, name)
                relative = os.path.relpath(path, directory).replace(os.sep, '/')
                files[relative] = os.path.getsize(path)
        return files
    prefix = directory.rstrip('/') + '/'
    result = outages.ride_out(
        directory, lambda: backends.filesystems(directory).match([prefix + '**'])[0])
    # A probe of `check_writable` left by a process killed at that moment is no content.
    return {metadata.path[len(prefix):]: metadata.size_in_bytes
            for metadata in result.metadata_list if metadata.path.startswith(prefix) and
            not locations.basename(metadata.path).startswith(PROBE_PREFIX)}


def is_empty_directory(path, ignore=()):
    """Whether nothing is stored under `path` but files at its top named in `ignore` (a missing
    directory is empty)."""
    if not locations.is_remote(path):
        return not os.path.exists(path) or (
            os.path.isdir(path) and not set(os.listdir(path)) - set(ignore))
    return not set(list_files(path)) - set(ignore)


def delete(paths):
    """Deletes files one by one in the order given; missing ones are no error."""
    paths = list(paths)
    if not paths:
        return
    if not locations.is_remote(paths[0]):
        for path in paths:
            if os.path.exists(path):
                os.remove(path)
        return
    if locations.scheme(paths[0]) == 'gs':
        # One request per object: Beam's GCS delete sends batch requests, which GCS emulators
        # do not answer.
        from google.api_core import exceptions
        client = backends.gcs_client(paths[0])
        for path in paths:
            bucket, name = locations.split_gcs_path(path)

            def delete_one(bucket=bucket, name=name):
                with contextlib.suppress(exceptions.NotFound):
                    client.bucket(bucket).blob(name).delete()
            outages.ride_out(path, delete_one)
        return
    file_systems = backends.filesystems(paths[0])

    def delete_if_there(path):
        if file_systems.exists(path):
            file_systems.delete([path])
    for path in paths:
        outages.ride_out(path, lambda path=path: delete_if_there(path))


def upload(local_path, url):
    """Copies local file `local_path` to `url`, a URL or a local path (whole or not at all)."""
    if not locations.is_remote(url):
        download(local_path, url)
        return
    def copy():
        with open(local_path, 'rb') as source, _created(url) as destination:
            shutil.copyfileobj(source, destination, 1 << 20)
    outages.ride_out(url, copy)


@contextlib.contextmanager
def _created(url, mime_type='application/octet-stream'):
    """A writer of a new file at URL `url`, stored when the block ends. A writer whose upload
    failed is dropped: left open, the garbage collector would close it, which tries the upload
    again (for minutes, against a server out of reach)."""
    from apache_beam.io.filesystem import CompressionTypes
    writer = backends.filesystems(url).create(url, mime_type=mime_type,
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
    def copy():
        if locations.is_remote(url):
            from apache_beam.io.filesystem import CompressionTypes
            source = backends.filesystems(url).open(
                url, compression_type=CompressionTypes.UNCOMPRESSED)
        else:
            source = open(url, 'rb')
        with source, open(temporary, 'wb') as destination:
            shutil.copyfileobj(source, destination, 1 << 20)

    try:
        if locations.is_remote(url):
            outages.ride_out(url, copy)
        else:
            copy()
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
        download(locations.join(url, relative),
                 os.path.join(local_directory, *relative.split('/')))
        copied.append(relative)
    return copied


def upload_tree(local_directory, url):
    """Copies every file under `local_directory` to `url`, keeping relative paths."""
    for relative in sorted(list_files(local_directory)):
        upload(os.path.join(local_directory, *relative.split('/')), locations.join(url, relative))


def check_writable(directory):
    """Raises StorageError unless files can be written and deleted under URL `directory`: a
    probe object is written and removed, so no credentials, an unknown bucket or a denied
    permission are told before any work starts."""
    if not locations.is_remote(directory):
        return
    backends.filesystems(directory)  # An unknown scheme or a missing library, named by it.
    import uuid
    probe = locations.join(directory, f'{PROBE_PREFIX}{uuid.uuid4().hex}')
    try:
        write_bytes(probe, b'')
        delete([probe])
    except failures.StorageError:
        raise
    except Exception as error:  # Each client library raises its own types.
        raise failures.StorageError(failures.describe_error(directory, error)) from error
