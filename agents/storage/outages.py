"""Storage calls that ride out an outage: retried while the storage is out of reach.

A sweep's launcher and its workers, and a report, write their records straight to the bucket;
a trainer instead hands its saves to a background queue (upload_queue.py). For the former,
`set_limit(max_outage_s)` makes every remote call of file_io in this process retry a transient
failure (no connection, a timeout, a 5xx or 429 answer) with exponential backoff and jitter,
saying every 10 s that the storage is out of reach, until it succeeds or the outage lasts
`max_outage_s`; then one sentence names the URL, the limit and the last failure. A call that
does not return (the client library retrying a refused or silent connection inside it for up to
its own deadline) counts as part of the outage, so the limit holds whatever the library does:
the call runs in a helper thread, abandoned when the limit passes. Failures that
waiting cannot mend (no credentials, permission denied, no such bucket or object, a failed
precondition) are raised at once. The default limit, 0, leaves the client library's own retries
alone.
"""

import threading
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
        started = clock()
        try:
            result = _answered(url, call, started if began is None else began, clock)
        except _NoAnswer as stuck:
            raise failures.OutageError(
                f'{url}: storage not answering for {stuck.seconds:.0f} s, longer than '
                f'max_outage_s = {_limit_s:g}') from None
        except Exception as error:  # Each client library raises its own types.
            if not failures.is_transient(error):
                raise
            now = clock()
            began = started if began is None else began
            sentence = failures.first_line(failures.describe_error(url, error), limit=200)
            if now - began > _limit_s:
                raise failures.OutageError(
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


class _NoAnswer(Exception):
    """A call that did not return within the outage limit."""

    def __init__(self, seconds):
        super().__init__(seconds)
        self.seconds = seconds


def _answered(url, call, began, clock):
    """`call()`'s result or error, from a helper thread; raises _NoAnswer once the outage that
    began at `began` outlasts the limit with the call still running, and says every
    TELL_EVERY_S that the storage does not answer."""
    outcome = {}
    done = threading.Event()

    def run():
        try:
            outcome['result'] = call()
        except BaseException as error:  # Handed to the caller's thread.
            outcome['error'] = error
        finally:
            done.set()

    threading.Thread(target=run, name='storage call', daemon=True).start()
    while not done.wait(min(TELL_EVERY_S, max(0.0, began + _limit_s - clock()) + 0.01)):
        waited = clock() - began
        if waited > _limit_s:
            raise _NoAnswer(waited)
        logging.warning('Storage not answering for %.0f s (%s); waiting up to max_outage_s = '
                        '%g.', waited, url, _limit_s)
    if 'error' in outcome:
        raise outcome['error']
    return outcome['result']
