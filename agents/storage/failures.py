"""Failures told in one sentence: storage that cannot be used, and any error's message.

`StorageError` is what every user of storage catches: the client libraries raise their own
types, which `storage_errors` and `describe_error` turn into a sentence saying what is wrong
and what to do. `first_line` and `one_line` give any error's message on one line, for the
messages of the binaries.
"""

import contextlib


class StorageError(Exception):
    """A path that cannot be used (unknown scheme, no access, missing library), in one sentence."""


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
