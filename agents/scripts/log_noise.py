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

TensorFlow's C++ start-up lines are another matter: its libraries write them to file
descriptor 2 while they load, before anything reads a log level (even TF_CPP_MIN_LOG_LEVEL=3
leaves most of them, measured with TensorFlow 2.21), two copies of each (two libraries bundle
absl's logging): the warning that absl::InitializeLog() was not called, oneDNN's note, "Could
not find cuda drivers", the CPU instructions the binary was not built for; then, at the first
look at the devices, an ERROR "failed call to cuInit" on every machine without an NVIDIA GPU
(CUDA_VISIBLE_DEVICES='' or -1 does not prevent it). `tensorflow_start` runs what loads
TensorFlow with file descriptor 2 going through a filter process that drops exactly these lines
(the CUDA ones only on a machine without a GPU device) and passes everything else at once; a
crash while loading still shows its last lines, since the filter drains the pipe after the
process died. The INFO lines TensorFlow logs later (XLA's service and compilation notes, a
TFRecord reader's buffer size) are left out by TF_CPP_MIN_LOG_LEVEL=1, which it sets unless you
did; warnings and errors still show. `--verbosity=1` (or higher) or TF_CPP_MIN_LOG_LEVEL=0
shows everything.
"""

import contextlib
import glob
import logging
import os
import subprocess
import sys

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


# What TensorFlow's libraries write while they load and at the first look at the devices, on a
# healthy machine: regular expressions of whole lines (bytes). absl's lines before its
# InitializeLog() start "I0000 00:00:<seconds> <thread> <file>:<line>] ".
_ABSL_PREFIX = r'[IWE]\d{4} \S+ +\d+ '
_START_UP_LINES = (
    r'WARNING: All log messages before absl::InitializeLog\(\) is called are written to STDERR',
    _ABSL_PREFIX + r'port\.cc:\d+\] oneDNN custom operations are on\. .*',
    _ABSL_PREFIX + r'cpu_feature_guard\.cc:\d+\] This TensorFlow binary is optimized to use '
    r'available CPU instructions .*',
    r'To enable the following instructions: .* rebuild TensorFlow with the appropriate compiler '
    r'flags\.',
)
# Only where there is no GPU to find: on a machine with one they tell why it is not used.
_NO_GPU_LINES = (
    _ABSL_PREFIX + r'cudart_stub\.cc:\d+\] Could not find cuda drivers on your machine, GPU will '
    r'not be used\.',
    _ABSL_PREFIX + r'\S+:\d+\] failed call to cuInit: .*',
)

# The filter process: copies its input to its output line by line, without the lines matching
# argv[1]; ignores Ctrl-C and SIGTERM (sent to the process group, they are the program's to
# handle: its last words still pass) and ends when every writer has closed the pipe.
_FILTER_PROGRAM = r"""
import os, re, signal, sys
signal.signal(signal.SIGINT, signal.SIG_IGN)
signal.signal(signal.SIGTERM, signal.SIG_IGN)
noise = re.compile(os.fsencode(sys.argv[1]))
source = open(0, 'rb')
sink = open(1, 'wb', buffering=0)
try:
    for line in iter(source.readline, b''):
        if not noise.fullmatch(line.rstrip(b'\r\n')):
            view = memoryview(line)
            while view:
                view = view[sink.write(view):]
except OSError:  # The reader is gone: nothing more to pass on.
    pass
"""

_VERBOSE_LOG_LEVEL = '0'


def has_gpu_device():
    """Whether the machine has a GPU device TensorFlow could use: an NVIDIA device file
    (/dev/nvidia0...) or WSL's GPU (/dev/dxg)."""
    return bool(glob.glob('/dev/nvidia[0-9]*')) or os.path.exists('/dev/dxg')


def start_up_noise(gpu=None):
    """The regular expression of the lines `tensorflow_start` drops (whole lines)."""
    gpu = has_gpu_device() if gpu is None else gpu
    lines = _START_UP_LINES + (() if gpu else _NO_GPU_LINES)
    return '|'.join(f'(?:{line})' for line in lines)


def verbose_requested(argv=None, environ=None):
    """Whether the command asked for everything: `--verbosity` / `-v` of 1 or more (absl's
    flag, read here before absl parses the flags), or TF_CPP_MIN_LOG_LEVEL=0."""
    argv = sys.argv[1:] if argv is None else argv
    environ = os.environ if environ is None else environ
    if environ.get('TF_CPP_MIN_LOG_LEVEL', '').strip() == _VERBOSE_LOG_LEVEL:
        return True
    verbosity = None
    for index, arg in enumerate(argv):
        if arg == '--':
            break
        name, equals, value = arg.partition('=')
        if name not in ('-v', '--v', '-verbosity', '--verbosity'):
            continue
        if not equals:
            value = argv[index + 1] if index + 1 < len(argv) else ''
        try:
            verbosity = int(value)  # The last one counts, as for absl.
        except ValueError:
            pass  # absl refuses it.
    return verbosity is not None and verbosity >= 1


@contextlib.contextmanager
def tensorflow_start():
    """Runs its body, which imports TensorFlow, without TensorFlow's start-up lines.

    Use it before anything imported TensorFlow, around what loads it: the imports, or a whole
    run whose worker processes load it (they inherit file descriptor 2). File descriptor 2 goes
    through a filter process until the body ended and TensorFlow (if imported here) looked at
    the devices (what prints the cuInit error; it would look at the first operation anyway, and
    this changes nothing TensorFlow computes). Sets TF_CPP_MIN_LOG_LEVEL=1 unless set, for this
    process and the processes it starts. Does nothing when TensorFlow is already loaded or the
    command asked for verbose logs (`verbose_requested`).
    """
    if 'tensorflow' in sys.modules or os.name != 'posix' or verbose_requested():
        yield
        return
    os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '1')
    try:
        stderr = os.dup(2)
    except OSError:  # No file descriptor 2: nothing to filter.
        yield
        return
    try:
        filter_process = subprocess.Popen(
            [sys.executable, '-I', '-S', '-c', _FILTER_PROGRAM, start_up_noise()],
            stdin=subprocess.PIPE, stdout=stderr, stderr=stderr)
    except OSError:
        os.close(stderr)
        yield
        return
    _flush_stderr()
    os.dup2(filter_process.stdin.fileno(), 2)
    try:
        yield
        tensorflow = sys.modules.get('tensorflow')
        if tensorflow is not None:
            try:
                tensorflow.config.list_physical_devices()
            except Exception:  # noqa: BLE001 (the program meets it at its first operation)
                pass
    finally:
        _flush_stderr()
        os.dup2(stderr, 2)
        os.close(stderr)
        filter_process.stdin.close()
        try:
            # At once, unless a process started meanwhile still holds the pipe (Beam's workers
            # in a report): the filter then goes on for it.
            filter_process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass


def _flush_stderr():
    for stream in {sys.stderr, sys.__stderr__}:
        if stream is not None:
            with contextlib.suppress(Exception):
                stream.flush()
