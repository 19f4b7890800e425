"""A run's configuration: gin files and bindings in, a checked log directory out.

The binaries take user paths relative to where the user ran them (also under `bazel run`, whose
working directory is the runfiles tree), turn every gin mistake into a `ConfigError` naming the
problem, and store the parsed configuration in the logdir so that a rerun resumes only the run it
belongs to.
"""

import difflib
import os

import gin

CONFIG_FILE = 'config.gin'
OPERATIVE_CONFIG_FILE = 'operative_config.gin'
PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUNDLED_CONFIGS = os.path.join(PACKAGE_ROOT, 'configs')


class ConfigError(Exception):
    """A mistake in the user's flags, gin files or logdir, told in one sentence."""


def caller_directory():
    """Where the user ran the command (`bazel run` changes the working directory)."""
    return os.environ.get('BUILD_WORKING_DIRECTORY') or os.getcwd()


def resolve_path(path):
    """A user-given path, relative ones taken from the caller's directory."""
    return os.path.normpath(os.path.join(caller_directory(), os.path.expanduser(path)))


def find_gin_file(path):
    """Resolves a gin file against the caller's directory, then the bundled configs."""
    candidates = [resolve_path(path)]
    if not os.path.isabs(path):
        candidates += [os.path.join(PACKAGE_ROOT, path), os.path.join(BUNDLED_CONFIGS, path)]
    for candidate in candidates:
        if os.path.isfile(candidate):
            return candidate
    raise ConfigError(f'gin file {path!r} not found (looked at {", ".join(candidates)})')


def load(gin_files, gin_bindings, seed=None, seed_binding='train.seed'):
    """Parses the gin files and bindings; returns the parsed configuration as text.

    Modules whose configurables the files name must be imported before calling this.
    """
    if not gin_files:
        raise ConfigError('no --gin_file given; e.g. --gin_file=configs/pendulum.gin')
    paths = [find_gin_file(path) for path in gin_files]
    gin.clear_config()
    for directory in dict.fromkeys([os.path.dirname(path) for path in paths] + [BUNDLED_CONFIGS]):
        gin.add_config_file_search_path(directory)
    try:
        gin.parse_config_files_and_bindings(paths, gin_bindings, finalize_config=False)
        if seed is not None:
            gin.bind_parameter(seed_binding, seed)
    except Exception as error:  # Gin raises many types; all of them are user errors here.
        raise ConfigError(f'invalid gin configuration: {_one_line(error)}') from error
    return gin.config_str()


def prepare_logdir(logdir, config):
    """Creates `logdir` or checks that it holds a run of this configuration.

    A new logdir gets `config.gin`. An existing one must hold the same configuration (the run is
    then resumed) or be empty; anything else is refused and left untouched.
    """
    config_path = os.path.join(logdir, CONFIG_FILE)
    if os.path.exists(logdir) and not os.path.isdir(logdir):
        raise ConfigError(f'logdir {logdir} exists and is not a directory')
    if os.path.isfile(config_path):
        with open(config_path, encoding='utf-8') as f:
            stored = f.read()
        if stored != config:
            diff = ''.join(difflib.unified_diff(
                stored.splitlines(True), config.splitlines(True), 'logdir config', 'this run'))
            raise ConfigError(
                f'logdir {logdir} holds a run of a different configuration; use another '
                f'--logdir or the same flags. Difference:\n{diff}')
        if not os.access(logdir, os.W_OK):
            raise ConfigError(f'logdir {logdir} is not writable')
        return logdir
    if os.path.isdir(logdir) and os.listdir(logdir):
        raise ConfigError(f'logdir {logdir} is not empty and holds no {CONFIG_FILE}: not a '
                          'BatchPPO run; choose another --logdir')
    try:
        os.makedirs(logdir, exist_ok=True)
        write_atomic(config_path, config)
    except OSError as error:
        raise ConfigError(f'cannot write to logdir {logdir}: {error.strerror or error}') from error
    return logdir


def write_atomic(path, text):
    """Writes `text` so that readers see the old file or the new one, never a part."""
    temporary = f'{path}.tmp-{os.getpid()}'
    try:
        with open(temporary, 'w', encoding='utf-8') as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temporary, path)
    finally:
        if os.path.exists(temporary):
            os.remove(temporary)


def _one_line(error):
    text = str(error).strip() or type(error).__name__
    return ' '.join(text.split()) if len(text) < 2000 else text
