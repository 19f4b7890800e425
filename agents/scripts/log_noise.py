"""Keeps libraries' routine chatter out of the binaries' logs.

TensorFlow logs INFO lines for every checkpoint and SavedModel it writes (the sharding
callback's duration in microseconds, the fingerprint's path, renamed signature inputs, where
assets went): three of the four lines an evaluation of the trainer logged. Gin looks for every
included file among Python packages before its search path finds it, and logs that as an ERROR
("Path not found: base.gin") in every run; a file that is really missing still fails the
configuration with its own error. Beam's GCS client logs an INFO line at every listing of a
bucket. Warnings and errors of these libraries still pass.

Filters, not a lowered log level: levels are process-wide, and the trainer writes its exports
from a thread while the training thread logs.
"""

import logging
import os

from absl import logging as absl_logging

_NOTHING = logging.CRITICAL + 1  # No record reaches this level.

# (a part of the source path of the module that logs, the lowest level that still passes).
_NOISE = (
    ('/tensorflow/python/checkpoint/', logging.WARNING),
    ('/tensorflow/python/saved_model/', logging.WARNING),
    ('/gin/resource_reader.py', _NOTHING),
    # Beam's GCS client: 'Finished listing N files in 0.01 seconds' at every listing of a bucket.
    ('/apache_beam/io/gcp/gcsio.py', logging.WARNING),
)


class NoiseFilter(logging.Filter):
    """Drops the records of `_NOISE`: those below the level given for their module."""

    def filter(self, record):
        path = record.pathname.replace(os.sep, '/')
        return not any(part in path and record.levelno < lowest for part, lowest in _NOISE)


_FILTER = NoiseFilter()


def quiet():
    """Filters the noise out of the binaries' logs: what absl's handler writes, and the
    'tensorflow' logger, which has a handler of its own when TensorFlow is imported first."""
    # Each is added once, however often this is called.
    absl_logging.get_absl_handler().addFilter(_FILTER)
    logging.getLogger('tensorflow').addFilter(_FILTER)
