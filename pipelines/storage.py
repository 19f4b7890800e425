"""A sweep's files on a local disk or on any filesystem Beam knows (gs://, s3://, hdfs://).

Local runs write into the output directory directly; on a cluster the output directory is a
bucket every worker can reach. Writes are atomic either way: locally a temporary file and
`os.replace`, on object stores because an object appears whole when its upload closes.
"""

import os
import shutil

from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from agents.scripts import run_config


def is_local(path):
    return FileSystems.get_scheme(path) in (None, 'file')


def resolve(path):
    """A user-given path: local ones against the caller's directory, URLs unchanged."""
    if is_local(path):
        return run_config.resolve_path(path.removeprefix('file://'))
    return path


def join(path, *parts):
    return FileSystems.join(path, *parts)


def exists(path):
    return FileSystems.exists(path)


def read_text(path):
    with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as f:
        return f.read().decode('utf-8')


def write_text(path, text):
    """Writes `text` so that readers see the old file or the new one, never a part."""
    if is_local(path):
        os.makedirs(os.path.dirname(path) or '.', exist_ok=True)
        run_config.write_atomic(path, text)
        return
    with FileSystems.create(path, mime_type='text/plain',
                            compression_type=CompressionTypes.UNCOMPRESSED) as f:
        f.write(text.encode('utf-8'))


def glob(pattern):
    """The paths matching `pattern`, sorted; none is an empty list."""
    return sorted(metadata.path for metadata in FileSystems.match([pattern])[0].metadata_list)


def is_empty_directory(path):
    """Whether nothing is stored under `path` (a missing directory is empty)."""
    if is_local(path):
        return not os.path.exists(path) or (os.path.isdir(path) and not os.listdir(path))
    return not glob(join(path, '**'))


def upload_tree(local_directory, destination):
    """Copies every file under `local_directory` to `destination`, keeping relative paths."""
    for parent, _, names in os.walk(local_directory):
        for name in names:
            source = os.path.join(parent, name)
            relative = os.path.relpath(source, local_directory).split(os.sep)
            with open(source, 'rb') as src, FileSystems.create(
                    join(destination, *relative),
                    compression_type=CompressionTypes.UNCOMPRESSED) as dst:
                shutil.copyfileobj(src, dst)
