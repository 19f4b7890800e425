"""What ends or interrupts a run, and the sentences that say so.

Faults end in a `TrainingError` that names the problem and what was kept, never with a
checkpoint of a broken state (docs/run_loop.md lists them). `kept` is the one sentence that says
what a stopped run kept; `EnvironmentRestarts` decides whether failed training environments are
rebuilt; `NonFiniteBatches` whether a non-finite batch stops the run or is dropped.
"""

import contextlib
import re

from absl import logging

from agents.runs import xla_cache
from agents.storage import failures

ENV_FAILURE_POLICIES = ('restart', 'stop')
NONFINITE_POLICIES = ('stop', 'skip')
# In 'skip' mode, this many dropped batches in a row stop the run: the fault is not passing.
MAX_DROPPED_IN_A_ROW = 10
# Seeds of rebuilt training environments: far from the seeds of the first ones.
RESTART_SEED_STRIDE = 7919


class TrainingError(Exception):
    """Training cannot go on; the message names the problem and what was kept."""


class EnvironmentFailure(TrainingError):
    """The training environments failed and were not (or no more) restarted."""


class NonFiniteError(TrainingError):
    """A rollout or an update produced a NaN or an infinity."""


class WriteError(TrainingError):
    """A file of the run could not be written (e.g. the disk is full or read-only)."""


class Interrupted(TrainingError):
    """SIGTERM or SIGINT stopped the run (after saving a checkpoint).

    Attributes:
      signum: the signal's number; a binary exits with 128 + signum, as shells do.
      step: the environment step of the checkpoint.
    """

    def __init__(self, signum, step, message):
        super().__init__(message)
        self.signum = signum
        self.step = step


class WriteFailed(Exception):
    """A write of a save failed: `what` it wrote, the `error`, and whether the save's
    checkpoint (its first write) was `checkpointed` before."""

    def __init__(self, what, error, checkpointed):
        super().__init__(what, error)
        self.what, self.error, self.checkpointed = what, error, checkpointed


def kept(saved_step, stays_latest=False):
    """What a stopped run kept: its last checkpoint (of `saved_step`, None: none yet)."""
    if saved_step is None:
        return 'no checkpoint was saved yet'
    return (f'the last checkpoint (step {saved_step}) is intact'
            + (' and stays the latest' if stays_latest else ''))


def tf_reason(error):
    """The gist of a TensorFlow error: its first line without the op's decorations."""
    text = re.sub(r'\{\{[^}]*\}\}\s*', '', failures.first_line(error))
    return re.sub(r'\s*\[Op:\w+\]', '', text).strip()


def describe_env_failure(error):
    """'Environment 3 failed in step: ...' or 'BatchEnv worker process 1 (pid 9) hosting envs
    [4, 5] died unexpectedly (killed by SIGKILL)': the first line of the error, no advice."""
    text = failures.first_line(error).split('; the batch is closed')[0].rstrip('.')
    return f'Training environment failure: {text}'


def damaged_cache(error, saved_step):
    """The TrainingError of a compiled program that XLA's cache failed to load, whose entries
    are moved aside first: TensorFlow keeps the failure for the process, and the next run
    compiles afresh."""
    try:
        moved = f'its entries were moved to {xla_cache.quarantine()}'
    except OSError as move_error:
        moved = (f'moving its entries aside failed ({move_error}); delete '
                 f'{xla_cache.directory()}')
    return TrainingError(
        f'XLA\'s compilation cache in {xla_cache.directory()} holds a damaged entry '
        f'({tf_reason(error)}); {moved}. The run stopped; {kept(saved_step)}. Rerun the same '
        'command to resume: it compiles again.')


class EnvironmentRestarts:
    """Rebuilds failed training environments (`on_env_failure='restart'`, at most
    `max_env_restarts` times between two checkpoints) or stops the run."""

    def __init__(self, train_env, make_train_env, on_env_failure, max_env_restarts, seed):
        self._train_env = train_env
        self._make_train_env = make_train_env
        self._on_env_failure = on_env_failure
        self._max_env_restarts = max_env_restarts
        self._seed = seed
        self._since_checkpoint = 0
        self._total = 0

    def checkpointed(self):
        """Notes a checkpoint: restarts count from here."""
        self._since_checkpoint = 0

    def restart(self, failure, steps, saved_step):
        """Rebuilds the training environments after `failure` in the iteration after `steps`,
        or raises EnvironmentFailure."""
        what = f'{describe_env_failure(failure)} (in the iteration after step {steps})'
        if self._on_env_failure == 'stop':
            raise EnvironmentFailure(
                f'{what}; the run stopped (train.on_env_failure = \'stop\'); '
                f'{kept(saved_step)}. Rerun the same command to resume.') from failure
        if self._since_checkpoint >= self._max_env_restarts:
            raise EnvironmentFailure(
                f'{what}, after {self._since_checkpoint} restarts of the training environments '
                f'since the last checkpoint (train.max_env_restarts = {self._max_env_restarts}); '
                f'the run stopped; {kept(saved_step)}.') from failure
        self._since_checkpoint += 1
        self._total += 1
        seed = self._seed + RESTART_SEED_STRIDE * self._total
        logging.warning(
            '%s. Restarting all %d training environments with seed %d (restart %d of at most %d '
            'between checkpoints); the episodes in flight were dropped and the iteration is '
            'redone.', what, len(self._train_env), seed, self._since_checkpoint,
            self._max_env_restarts)
        with contextlib.suppress(Exception):  # It is broken: closing is only tidying up.
            self._train_env.vector_env.close(terminate=True)
        try:
            new = self._make_train_env()
        except Exception as error:
            raise EnvironmentFailure(
                f'{what}, and rebuilding the training environments failed: '
                f'{failures.first_line(error)}; {kept(saved_step)}.') from error
        self._train_env.replace_vector_env(new, seed=seed)


class NonFiniteBatches:
    """Stops the run on a non-finite batch (`on_nonfinite='stop'`) or counts it as dropped."""

    def __init__(self, on_nonfinite):
        self._on_nonfinite = on_nonfinite
        self.skipped = 0
        self._in_a_row = 0

    def passed(self):
        """Notes a batch that was not dropped."""
        self._in_a_row = 0

    def dropped(self, problem, saved_step):
        """Raises NonFiniteError for `problem` (a sentence), or logs the batch as dropped."""
        if self._on_nonfinite == 'stop':
            raise NonFiniteError(
                f'{problem} and the run stopped; {kept(saved_step, stays_latest=True)}. To drop '
                'such batches and go on, set train.on_nonfinite = \'skip\'.')
        self.skipped += 1
        self._in_a_row += 1
        if self._in_a_row >= MAX_DROPPED_IN_A_ROW:
            raise NonFiniteError(
                f'{problem}; {self._in_a_row} batches in a row were dropped '
                f'(train.on_nonfinite = \'skip\'), so the run stopped: the fault does not pass.')
        logging.warning('%s; the batch was dropped (train.on_nonfinite = \'skip\'; %d so far).',
                        problem[0].upper() + problem[1:], self.skipped)
