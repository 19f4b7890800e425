"""What a run tells while it trains: progress lines, a heartbeat, TensorBoard scalars."""

import threading
import time

import numpy as np
import tensorflow as tf
from absl import logging
from tensorboard.plugins.scalar import metadata as scalar_metadata
from tensorflow.python import pywrap_tfe

# What marks a summary as a scalar for TensorBoard (as `tf.summary.scalar` writes it).
_SCALAR_METADATA = scalar_metadata.create_summary_metadata(display_name=None, description=None)


def format_return(value):
    return 'n/a' if value is None else f'{value:.1f}'


def format_seconds(seconds):
    if not np.isfinite(seconds):
        return '?'
    minutes, seconds = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f'{hours}:{minutes:02d}:{seconds:02d}'


def log_progress(steps, total_steps, steps_per_sec, episodes, latest, num_members, status=None,
                 train_return='episode_return', games=None):
    """Logs a progress line; `episodes`: (count, summed return) of the training episodes that
    ended since the last one; `latest`: the last evaluation record (of the first member);
    `status`: a phrase to add (e.g. that the bucket is out of reach), or None; `train_return`:
    the summaries' name of a training episode's return (an Atari game's life's, clipped, is
    told as such); `games`: (count, summed score) of the whole Atari games that ended since the
    last line, where training episodes are not games (see envpool_env.GameLog), else None."""
    remaining = max(total_steps - steps, 0)
    eta = remaining / steps_per_sec if steps_per_sec > 0 else float('inf')
    count, return_sum = episodes
    train_value = f'{return_sum / count:.1f}' if count else 'n/a'
    eval_return = format_return(latest['mean_return']) if latest else 'n/a'
    speed = f'{steps_per_sec:.0f} env steps/s'
    if num_members > 1:
        # Steps count per member; the returns are the first member's (eval) and all
        # members' (train).
        speed = (f'{num_members} members x {steps_per_sec:.0f} = '
                 f'{num_members * steps_per_sec:.0f} env steps/s')
    label = 'train return' if train_return == 'episode_return' else (
        'train ' + train_return.replace('_', ' '))
    if games is not None:
        games_ended, score_sum = games
        score = f'{score_sum / games_ended:.1f}' if games_ended else 'n/a'
        label = f'train game score {score} | {label}'
    logging.info('step %d/%d | %s | ETA %s | %s %s | eval return %s%s',
                 steps, total_steps, speed, format_seconds(eta), label, train_value,
                 eval_return, f' | {status}' if status else '')


def log_end(steps, total_steps, start_steps, stop_at_step, latest):
    """Logs how a run that stopped without a fault ended: done, stopped at `stop_at_step`, or
    with nothing to do."""
    if steps < total_steps:  # At or past stop_at_step.
        if steps == start_steps:
            logging.info('Nothing to do: the run is at step %d, at or past --stop_at_step=%d; '
                         'rerun without --stop_at_step, or with a later one, to continue.',
                         steps, stop_at_step)
        else:
            logging.info('Stopped at step %d of %d (--stop_at_step=%d); rerun without '
                         '--stop_at_step, or with a later one, to continue.', steps, total_steps,
                         stop_at_step)
    elif latest is None:
        logging.info('Nothing to do: the run already reached %d steps.', total_steps)
    else:
        logging.info('Done: %d steps in %.1f s, %.0f env steps/s, eval return %s.',
                     latest['step'], latest['wall_time_s'], latest['env_steps_per_sec'],
                     format_return(latest['mean_return']))


def heartbeat_line(step, total_steps, phase, seconds, vector_env, status=None):
    """The progress line of a phase that has lasted `seconds` without one, naming the workers
    of `vector_env` (None for native environments) that the run is waiting for; `status`: a
    phrase to add, or None."""
    line = f'step {step}/{total_steps} | {phase} for {seconds:.0f} s'
    waiting = vector_env.waiting() if vector_env is not None else None
    if waiting:
        waited, workers = waiting
        line += (f' | waiting {waited:.0f} s for {", ".join(workers)} (deemed hung after '
                 'BatchEnv.timeout)')
    return line + (f' | {status}' if status else '')


# The scalars of the whole Atari games that ended in a call, where episodes are not games.
GAME_SCALARS = ('train/game_score', 'train/game_length')


def iteration_scalars(iterations, num_members, steps_per_sec,
                      episodes=('episode_return', 'episode_length'), games=None):
    """The names and values [iterations, members, names] of the TensorBoard scalars of the
    iterations of a call; NaN: not written (an undone update's metrics, the returns of an
    iteration where no episode ended). `episodes`: the names of a training episode's return and
    length (environments.Environments.training_episodes). `games`: None, or (scores, lengths)
    of the whole games that ended in the call (a lone run's: envpool_env.GameLog.take), whose
    means GAME_SCALARS give at the call's last iteration."""
    names = [f'train/{name}' for name in iterations[0].metrics] + [
        f'train/{episodes[0]}', f'train/{episodes[1]}', 'train/env_steps_per_sec']
    if games is not None:
        names += GAME_SCALARS
    values = np.full([len(iterations), num_members, len(names)], np.nan, np.float32)
    returns = len(iterations[0].metrics)  # The column of the episodes' return, then length.
    for index, iteration in enumerate(iterations):
        kept = ~iteration.dropped
        for column, value in enumerate(iteration.metrics.values()):
            values[index, kept, column] = value[kept]
        ended = iteration.episodes > 0
        count = np.maximum(iteration.episodes, 1)
        values[index, ended, returns] = (iteration.return_sum / count)[ended]
        values[index, ended, returns + 1] = (iteration.length_sum / count)[ended]
        values[index, :, returns + 2] = steps_per_sec
    if games is not None and len(games[0]):
        values[-1, :, -2] = np.mean(games[0])
        values[-1, :, -1] = np.mean(games[1])
    return names, values


class ScalarWriter:
    """Writes the scalars `values` [N, len(names)] of N steps to `writer` in one compiled call,
    skipping NaNs: written one by one from Python, a population's scalars took longer than its
    iterations."""

    def __init__(self, writer, names):
        self.names = list(names)
        self._writer = writer
        # Any number of steps, one program.
        self._write = tf.function(self._graph, autograph=False, input_signature=[
            tf.TensorSpec([None], tf.int64), tf.TensorSpec([None, len(names)], tf.float32)])

    def __call__(self, steps, values):
        self._write(steps, values)

    def _graph(self, steps, values):
        names = tf.constant(self.names)
        written = tf.where(~tf.math.is_nan(values))  # [M, 2] (step, column), in that order.
        with self._writer.as_default():
            def body(index):
                row, column = written[index, 0], written[index, 1]
                # `tf.summary.write` keeps the tag as given (`tf.summary.scalar` would prefix
                # the loop's name scope).
                tf.summary.write(tf.gather(names, column), values[row, column],
                                 step=steps[row], metadata=_SCALAR_METADATA)
                return index + 1

            tf.while_loop(lambda index: index < tf.shape(written)[0], body, [tf.constant(0)])


class Heartbeat:
    """Logs a progress line whenever none came for `period` seconds, naming the phase the run
    is in: the first iteration's compilation, a wait for a hung environment worker, a long
    evaluation. The main thread may be inside a compiled call meanwhile, so a thread logs it.
    """

    def __init__(self, period, line):
        """`line(phase, seconds)` is the text of the line."""
        self._period = period
        self._line = line
        self._phase = ('starting', time.monotonic())
        self._last = time.monotonic()
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._beat, name='heartbeat', daemon=True)

    def phase(self, name):
        """Notes that the run now does `name` (e.g. 'an iteration')."""
        self._phase = (name, time.monotonic())

    def beat(self):
        """Notes that a progress line was just logged."""
        self._last = time.monotonic()

    def _beat(self):
        while not self._stopped.wait(min(self._period, 1.0)):
            now = time.monotonic()
            if now - self._last >= self._period:
                name, since = self._phase
                if now - since >= self._period:
                    logging.info('%s', self._line(name, now - since))
                    self._last = now

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *unused_exc_info):
        self._stopped.set()
        self._thread.join()


def clear_scalar_cache():
    """Empties TensorFlow's cache of eager tensors made from Python numbers.

    The cache keeps every distinct number ever turned into an eager tensor (about 750 bytes
    each) and never evicts any; every iteration makes new ones (summary values and steps, the
    wall time), so without this a run's memory grows with every iteration. Tensors already made
    keep their values. A private TensorFlow function: where it is missing, nothing is done.
    """
    clear = getattr(pywrap_tfe, 'TFE_ClearScalarCache', None)
    if clear is not None:
        clear()
