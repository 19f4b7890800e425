"""Test helpers for the pipelines' subprocesses: waiting on a condition, telling a process gone,
telling a trial's logdir unlocked."""

import fcntl
import os
import time

import psutil


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
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def lock_is_free(path):
    """Whether no process holds the flock on `path`, as trial.py takes it on a trial's logdir
    (taken and released at once to find out)."""
    descriptor = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(descriptor)
