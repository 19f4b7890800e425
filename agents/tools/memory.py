"""This machine's memory, against which sizes that cannot fit are refused before they are built
(agents/runs/memory_bound.py for a run's iterations, the replay buffer for its ring)."""

import os


def physical_bytes():
    """This machine's physical memory in bytes."""
    return os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES')


def describe(num_bytes):
    """`num_bytes` in GiB, for messages."""
    return f'{num_bytes / 2**30:.1f} GiB'
