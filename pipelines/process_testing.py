"""Test helpers for the pipelines' subprocesses: waiting on a condition, telling a process gone."""

import time


def wait_for(condition, timeout=30.0, what='condition', interval=0.05):
    """Polls `condition()` until it is true, or raises AssertionError after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f'timed out after {timeout} s waiting for {what}')
        time.sleep(interval)


def process_gone(pid):
    """Whether process `pid` has exited (it no longer exists, or is a zombie)."""
    try:
        with open(f'/proc/{pid}/stat') as f:
            return f.read().split(')')[-1].split()[0] == 'Z'
    except FileNotFoundError:
        return True
