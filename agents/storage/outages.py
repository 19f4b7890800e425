"""Storage calls that ride out an outage: retried while the storage is out of reach.

A sweep's launcher and its workers, and a report, write their records straight to the bucket;
a trainer instead hands its saves to a background queue (upload_queue.py). For the former,
`set_limit(max_outage_s)` makes every remote call of file_io in this process retry a transient
failure (no connection, a timeout, a 5xx or 429 answer) with exponential backoff and jitter,
saying every 10 s that the storage is out of reach, until it succeeds or the outage lasts
`max_outage_s`; then one sentence names the URL, the limit and the last failure. Failures that
waiting cannot mend (no credentials, permission denied, no such bucket or object, a failed
precondition) are raised at once. The default limit, 0, leaves the client library's own retries
alone.
"""

import time

from absl import logging

from agents.storage import failures

TELL_EVERY_S = 10.0

_limit_s = 0.0


def set_limit(max_outage_s):
    """How long this process's remote calls ride out an outage (0: not at all)."""
    global _limit_s
    if isinstance(max_outage_s, bool) or not isinstance(max_outage_s, (int, float)) or (
            max_outage_s < 0):
        raise ValueError(f'max_outage_s must be a non-negative number of seconds, got '
                         f'{max_outage_s!r}')
    _limit_s = float(max_outage_s)


def ride_out(url, call, clock=time.monotonic, sleep=time.sleep, initial_backoff_s=1.0,
             max_backoff_s=30.0):
    """`call()`, retried through an outage of the storage of `url` up to the limit."""
    if not _limit_s:
        return call()
    began = told = None
    delays = failures.backoff_delays(initial_backoff_s, max_backoff_s)
    while True:
        try:
            result = call()
        except Exception as error:  # Each client library raises its own types.
            if not failures.is_transient(error):
                raise
            now = clock()
            began = now if began is None else began
            sentence = failures.first_line(failures.describe_error(url, error), limit=200)
            if now - began > _limit_s:
                raise failures.StorageError(
                    f'{url}: storage unreachable for {now - began:.0f} s, longer than '
                    f'max_outage_s = {_limit_s:g} ({sentence})') from error
            if told is None or now - told >= TELL_EVERY_S:
                told = now
                logging.warning('Storage unreachable for %.0f s (%s); retrying up to '
                                'max_outage_s = %g.', now - began, sentence, _limit_s)
            sleep(next(delays))
            continue
        if began is not None:
            logging.info('Storage reachable again after %.0f s (%s).', clock() - began, url)
        return result
