"""A run's configuration: gin files and bindings in, a checked log directory out.

The binaries take user paths relative to where the user ran them (also under `bazel run`, whose
working directory is the runfiles tree), turn every gin mistake into a `ConfigError` naming the
problem, and store the parsed configuration in the logdir so that a rerun resumes only the run it
belongs to.
"""

import difflib
import fcntl
import json
import os
import re
import shlex
import shutil
import socket
import sys
import tempfile
import time

import gin
from absl import logging

from agents.runs import gin_text, run_dir
from agents.storage import failures, file_io, locations

# The one binding a rerun may change: the budget, raised (see `check_logdir`).
BUDGET_BINDING = 'train.total_steps'
PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUNDLED_CONFIGS = os.path.join(PACKAGE_ROOT, 'configs')


def python_path(pythonpath):
    """`pythonpath` (a PYTHONPATH value) with this tree first, once: for child processes (the
    trainers of a sweep, Beam's worker processes) that must import it as this process does."""
    return os.pathsep.join(dict.fromkeys(
        [PACKAGE_ROOT, *filter(None, pythonpath.split(os.pathsep))]))


class ConfigError(Exception):
    """A mistake in the user's flags, gin files or logdir, told in one sentence."""


def find_gin_file(path):
    """Resolves a gin file against the caller's directory, then the bundled configs."""
    candidates = [locations.resolve(path)]
    if not os.path.isabs(path):
        candidates += [os.path.join(PACKAGE_ROOT, path), os.path.join(BUNDLED_CONFIGS, path)]
    for candidate in candidates:
        if os.path.isfile(candidate):
            return candidate
    raise ConfigError(f'gin file {path!r} not found (looked at {", ".join(candidates)})')


def load(gin_files, gin_bindings, seed=None, seed_binding=run_dir.SEED_BINDING,
         default_seed=None):
    """Parses the gin files and bindings; returns the parsed configuration as text.

    `seed` (e.g. a --seed flag) binds `seed_binding`; a configuration that binds it to another
    value is refused, naming both. Without `seed`, the configuration's binding stands, or
    `default_seed` is bound if there is none and it is given (so that the configuration's text
    names the seed either way). Modules whose configurables the files name must be imported
    before calling this.
    """
    if not gin_files:
        raise ConfigError('no --gin_file given; e.g. --gin_file=configs/pendulum.gin')
    paths = [find_gin_file(path) for path in gin_files]
    gin.clear_config()
    for directory in dict.fromkeys([os.path.dirname(path) for path in paths] + [BUNDLED_CONFIGS]):
        gin.add_config_file_search_path(directory)
    try:
        gin.parse_config_files_and_bindings(paths, gin_bindings, finalize_config=False)
        _bind_seed(seed_binding, seed, default_seed)
    except ConfigError:
        raise
    except Exception as error:  # Gin raises many types; all of them are user errors here.
        text = failures.one_line(error)
        refused = re.match(r"Configurable '([\w.]+)' has denylisted kwarg '(\w+)'\. ?(.*)", text)
        if refused:
            name, argument, where = refused.groups()
            text = (f'{name}.{argument} cannot be bound: the code that makes {name} passes '
                    f'{argument} itself, so a binding would do nothing (a train.* parameter '
                    f'sets it for a run). {where}')
        raise ConfigError(f'invalid gin configuration: {text}') from error
    return gin.config_str()


def _bind_seed(seed_binding, seed, default_seed):
    """Binds the seed of `load`, refusing a configuration that binds another."""
    try:
        bound = gin.query_parameter(seed_binding)
    except ValueError:  # Not bound.
        bound = None
    if seed is not None and bound is not None and bound != seed:
        raise ConfigError(f'the seed {seed} (--seed) and {seed_binding} = {bound!r} of the '
                          'configuration disagree; give the seed once')
    if seed is None and bound is None:
        seed = default_seed
    if seed is not None:
        gin.bind_parameter(seed_binding, seed)


def check_logdir(logdir, config, config_file=run_dir.CONFIG_FILE):
    """Refuses a logdir where a run of `config` cannot start or resume; changes nothing.

    Returns whether the logdir holds a run to resume. Refused: a file, a run of another
    configuration, a non-empty directory that is no run, an unwritable run, a run that a live
    trainer holds (see `lock_logdir`). A run whose configuration differs from `config` only in a
    smaller `train.total_steps` is resumed: its budget is raised (`prepare_logdir` stores the
    new configuration); a larger stored budget is refused (a run is stopped early with the
    trainer's --stop_at_step instead). `config_file`: where the logdir keeps its configuration
    (a population's: POPULATION_CONFIG_FILE).
    """
    config_path = os.path.join(logdir, config_file)
    if os.path.exists(logdir) and not os.path.isdir(logdir):
        raise ConfigError(f'logdir {logdir} exists and is not a directory')
    if os.path.isdir(logdir):
        check_unlocked(logdir)  # First: what a live trainer is writing may look like anything.
    if os.path.isfile(config_path):
        _check_same_run(logdir, read_text(config_path), config)
        if locations.unwritable_ancestor(logdir):
            raise ConfigError(f'cannot write to logdir {logdir}: it is not writable (a '
                              'read-only file system or missing permissions)')
        return True
    if os.path.isdir(logdir) and set(os.listdir(logdir)) - {run_dir.LOCK_FILE}:
        kind = 'population' if config_file != run_dir.CONFIG_FILE else 'run'
        raise ConfigError(f'logdir {logdir} is not empty and holds no {config_file}: not a '
                          f'BatchPPO {kind}; choose another --logdir')
    unwritable = locations.unwritable_ancestor(logdir)
    if unwritable:
        raise ConfigError(f'cannot write to logdir {logdir}: {unwritable} is not a writable '
                          'directory')
    return False


def read_text(path):
    with open(path, encoding='utf-8') as f:
        return f.read()


def _check_same_run(logdir, stored, config):
    """Refuses `config` for the run of configuration `stored` in `logdir` unless it is the same
    or only raises the budget; returns the (old, new) budgets when it raises it, else None."""
    diff = config_difference(stored, config, 'logdir config', 'this run')
    if not diff:
        return None
    budgets = budget_change(stored, config)
    if budgets is None:
        raise ConfigError(
            f'logdir {logdir} holds a run of a different configuration; use another '
            f'--logdir or the same flags. Difference:\n{diff}')
    old, new = budgets
    if new == old:  # The same budget, written otherwise.
        return None
    if new < old:
        raise ConfigError(
            f'logdir {logdir} holds a run of {BUDGET_BINDING} = {old}, and a budget can only be '
            f'raised, not lowered to {new}; to stop the run early, keep {BUDGET_BINDING} = {old} '
            f'and pass --stop_at_step={new} (rerun without it to continue).')
    return budgets


def budget_change(stored, config):
    """(old, new) `train.total_steps` if the configurations `stored` and `config` (as
    `gin.config_str` writes them) differ in that one binding alone, both integers; else None.

    Compared statement by statement (a binding with its continuation lines), the value parsed
    as a Python literal, so that its formatting (spaces, digit separators) does not matter.
    """
    stored_rest, old = gin_text.split_binding(stored, BUDGET_BINDING)
    config_rest, new = gin_text.split_binding(config, BUDGET_BINDING)
    if stored_rest is None or config_rest is None or stored_rest != config_rest:
        return None
    if not all(isinstance(value, int) and not isinstance(value, bool) for value in (old, new)):
        return None
    return old, new


def config_difference(stored, config, stored_name, config_name):
    """The unified diff from configuration `stored` to `config` ('' when they are the same):
    what a run of another configuration is refused with."""
    if stored == config:
        return ''
    return ''.join(difflib.unified_diff(
        stored.splitlines(True), config.splitlines(True), stored_name, config_name))


def prepare_logdir(logdir, config, config_file=run_dir.CONFIG_FILE):
    """Creates `logdir` or checks that it holds a run of this configuration.

    A new logdir gets `config.gin`. An existing one must hold the same configuration (the run is
    then resumed), or the same but for a smaller `train.total_steps` (the budget is raised,
    with a warning, and `config.gin` rewritten), or be empty; anything else is refused and left
    untouched.
    """
    if check_logdir(logdir, config, config_file):
        config_path = os.path.join(logdir, config_file)
        budgets = _check_same_run(logdir, read_text(config_path), config)
        if budgets is not None:
            old, new = budgets
            logging.warning(
                'Raising the budget of the run in %s from %s = %d to %d: it goes on to step %d, '
                'and its schedules (learning-rate annealing), which were set for %d steps, now '
                'run to %d from the current step on.', logdir, BUDGET_BINDING, old, new, new,
                old, new)
            try:
                write_atomic(config_path, config)
            except OSError as error:
                raise ConfigError(f'cannot write to logdir {logdir}: '
                                  f'{error.strerror or error}') from error
        return logdir
    try:
        os.makedirs(logdir, exist_ok=True)
        write_atomic(os.path.join(logdir, config_file), config)
    except OSError as error:
        raise ConfigError(f'cannot write to logdir {logdir}: {error.strerror or error}') from error
    return logdir


class LogdirLock:
    """An exclusive lock on a logdir for as long as this object (or the process) lives.

    `<logdir>/.lock` is locked with flock, which the kernel releases when the process dies, so a
    lock left by a killed trainer is stale by construction and the next trainer takes it. The
    file tells who holds the lock: pid, host, start time and command line.
    """

    def __init__(self, logdir, user='trainer', flag='--logdir'):
        self.path = os.path.join(logdir, run_dir.LOCK_FILE)
        try:
            os.makedirs(logdir, exist_ok=True)
            self._file = open(self.path, 'a+', encoding='utf-8')  # Held open: it is the lock.
        except OSError as error:
            raise ConfigError(f'cannot write to {flag[2:]} {logdir}: cannot create {self.path}: '
                              f'{error.strerror or error}') from error
        try:
            fcntl.flock(self._file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_holder(self._file)
            self._file.close()
            raise ConfigError(in_use_message(logdir, holder, user=user, flag=flag)) from None
        self.previous_holder = _read_holder(self._file)
        self.holder = {'pid': os.getpid(), 'host': socket.gethostname(),
                       'started': time.strftime('%Y-%m-%d %H:%M:%S %z'),
                       'command': shlex.join(sys.argv)}
        try:
            self._file.seek(0)
            self._file.truncate()
            self._file.write(json.dumps(self.holder) + '\n')
            self._file.flush()
        except OSError as error:
            self.release()
            raise ConfigError(f'cannot write to {flag[2:]} {logdir}: cannot write {self.path}: '
                              f'{error.strerror or error}') from error

    def release(self):
        """Unlocks (the file stays: it tells who held the logdir last)."""
        if not self._file.closed:
            self._file.close()


def lock_logdir(logdir):
    """Locks `logdir` for this process (creating it); a held lock is a ConfigError naming the
    holder. Keep the returned `LogdirLock` as long as the run goes on."""
    return LogdirLock(logdir)


def check_unlocked(logdir, user='trainer', flag='--logdir'):
    """Raises a ConfigError naming the holder (a `user`, told to choose another `flag`) if a live
    process holds the lock of `logdir`, an existing directory; reads only."""
    path = os.path.join(logdir, run_dir.LOCK_FILE)
    try:
        with open(path, encoding='utf-8') as f:
            try:
                fcntl.flock(f, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _read_holder(f)
                if holder.get('pid') != os.getpid():  # Not the lock of this very process.
                    raise ConfigError(in_use_message(logdir, holder, user=user,
                                                     flag=flag)) from None
    except FileNotFoundError:
        pass


def in_use_message(logdir, holder, how='', user='trainer', flag='--logdir'):
    """Why `logdir` is refused while another `user` (a trainer, a sweep launcher) holds it
    (`holder`: the pid, host, start time and command line its lock or lease records; `how`: how
    it holds it; `flag`: the flag that chooses another directory)."""
    who = f'pid {holder.get("pid", "?")}'
    if holder.get('host'):
        who += f' on {holder["host"]}'
    if holder.get('started'):
        who += f' since {holder["started"]}'
    if holder.get('command'):
        who += f' ({holder["command"]})'
    return (f'{flag[2:]} {logdir} is in use by another {user}: {who}{how}. Wait for it to '
            f'finish or stop it, or choose another {flag}.')


def _read_holder(file):
    """The holder record of a lock file (a dict; empty if unreadable)."""
    try:
        file.seek(0)
        holder = json.loads(file.read() or '{}')
    except (OSError, ValueError):
        return {}
    return holder if isinstance(holder, dict) else {}


def replace_directory(source, destination):
    """Moves directory `source` to `destination`; an earlier `destination` is replaced only once
    the move succeeded (it is moved aside first and restored if the move fails)."""
    if not os.path.exists(destination):
        os.rename(source, destination)
        return
    aside = tempfile.mkdtemp(prefix=f'.{os.path.basename(destination)}.old-',
                             dir=os.path.dirname(destination))
    os.rmdir(aside)
    os.rename(destination, aside)
    try:
        os.rename(source, destination)
    except OSError:
        os.rename(aside, destination)
        raise
    shutil.rmtree(aside)


def write_atomic(path, text):
    """Writes `text` so that readers see the old file or the new one, never a part."""
    file_io.write_text(path, text)
