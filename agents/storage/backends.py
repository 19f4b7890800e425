"""The libraries behind URLs: Beam's FileSystems for any scheme, google-cloud-storage for gs://.

Both are imported only when a URL is used, so local runs never load them.
"""

import os

from agents.storage import failures, locations

GCP_EXTRA = "pip install 'apache-beam[gcp]'"


def filesystems(path):
    """Beam's FileSystems, checked to know the scheme of URL `path`."""
    try:
        from apache_beam.io.filesystems import FileSystems
    except ImportError:
        raise failures.StorageError(
            f'{path} needs Apache Beam\'s filesystems: {GCP_EXTRA}') from None
    try:
        FileSystems.get_filesystem(path)
    except ValueError:
        scheme = locations.scheme(path)
        extra = f': {GCP_EXTRA}' if scheme == 'gs' else ''
        raise failures.StorageError(f'no filesystem for {scheme}:// paths ({path}) is installed'
                                    f'{extra}') from None
    if locations.scheme(path) == 'gs':
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
