"""Failures told in one sentence: storage that cannot be used, and any error's message.

`StorageError` is what every user of storage catches: the client libraries raise their own
types, which `storage_errors` and `describe_error` turn into a sentence saying what is wrong
and what to do. `first_line` and `one_line` give any error's message on one line, for the
messages of the binaries.
"""

import contextlib
import random


class StorageError(Exception):
    """A path that cannot be used (unknown scheme, no access, missing library), in one sentence."""


class OutageError(StorageError):
    """Storage that stayed out of reach longer than the outage limit (max_outage_s): a failure
    of the moment, where other StorageErrors are mistakes of the user's to correct."""


def outage_in(error):
    """The sentence of the OutageError that `error` is, was raised from, or (a pipeline's
    failure in another process, which carries only its text) names; else None."""
    for link in _chain(error):
        if isinstance(link, OutageError):
            return str(link)
    marker = f'{OutageError.__name__}: '
    for line in str(error).splitlines():
        if marker in line:
            return line.split(marker, 1)[1].split(' [while running', 1)[0].strip()
    return None


def describe_error(path, error):
    """One sentence for a failed access to URL `path`: what is wrong and what to do."""
    error = _beam_cause(error)
    text = f'{type(error).__name__}: {error}'
    chain = _chain(error)
    codes, names = _statuses(chain), {type(e).__name__ for e in chain}
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
    if _lost_upload_session(chain):
        return (f'cannot access {path}: the storage forgot an interrupted upload ({summary}); '
                'it starts again')
    if 404 in codes or 'NotFound' in names or 'bucket does not exist' in joined.lower():
        return f'bucket {bucket} of {path} does not exist ({summary})'
    return f'cannot access {path}: {summary}'


# HTTP statuses and error types that waiting does not mend (no credentials, permission denied,
# no such bucket or object, a failed precondition).
_PERMANENT_STATUSES = frozenset({400, 401, 403, 404, 409, 412})
_PERMANENT_NAMES = frozenset({'DefaultCredentialsError', 'Forbidden', 'Unauthorized', 'NotFound',
                              'PreconditionFailed'})
# Raised before any request: a missing library, an unknown scheme, a path that is not there.
_PERMANENT_TYPES = (StorageError, FileNotFoundError, FileExistsError, PermissionError,
                    ImportError, NotImplementedError, ValueError, TypeError, KeyError)


def is_transient(error):
    """Whether `error` (of any client library) may pass once the storage is reachable again: no
    connection, a timeout, a 5xx or 429 answer."""
    if isinstance(error, _PERMANENT_TYPES):
        return False
    chain = _chain(_beam_cause(error))
    if _lost_upload_session(chain):
        return True
    return not (_statuses(chain) & _PERMANENT_STATUSES
                or {type(e).__name__ for e in chain} & _PERMANENT_NAMES)


def _chain(error):
    """`error` and the errors it was raised from (at most 11)."""
    chain = [error]
    while chain[-1].__cause__ or chain[-1].__context__:
        chain.append(chain[-1].__cause__ or chain[-1].__context__)
        if len(chain) > 10:
            break
    return chain


def _statuses(chain):
    """The HTTP statuses the errors of `chain` carry."""
    return {getattr(e, 'code', None) for e in chain} | {
        getattr(getattr(e, 'response', None), 'status_code', None) for e in chain}


def _lost_upload_session(chain):
    """Whether `chain` holds a 404 answer to a resumable upload's session URL: the session
    (not the bucket) is gone, as after a connection cut mid-upload, and a new upload passes."""
    for error in chain:
        response = getattr(error, 'response', None)
        if getattr(response, 'status_code', None) == 404 and 'upload_id=' in str(
                getattr(response, 'url', '')):
            return True
    return False


def backoff_delays(initial_s, maximum_s):
    """Waits between retries: doubling from `initial_s` up to `maximum_s`, each jittered to
    between half and all of it."""
    delay = initial_s
    while True:
        yield delay * random.uniform(0.5, 1.0)
        delay = min(maximum_s, delay * 2)


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
