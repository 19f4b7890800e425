r"""Renders episodes of a trained policy to mp4: `bazel run //agents:visualize -- --logdir=...`.

Rebuilds the run's environment from its operative config, restores the latest (or the given)
checkpoint and runs the deterministic policy, writing one H.264 video per episode and
`episodes.jsonl` (episode, seed, return, length, video) into --outdir. Episode `i` starts from
seed `--seed + i`, as in `//agents:evaluate`, so the returns of both tools agree. Renders
headless in a worker process (see agents/tools/process_env.py): classic control through pygame,
MuJoCo through EGL with fast render settings (agents/tools/rendering.py), and an Atari game of a
run on EnvPool as EnvPool draws its screen, in real time at 15 frames/s (a step is 4 of the
Atari's 60 frames a second; agents/tools/envpool_atari.py). --logdir and --outdir may be bucket
URLs (gs://...): the run's checkpoints are read from a local copy, the videos are rendered locally
and uploaded.
"""

import json
import os
import sys
import time

from absl import app, flags, logging

from agents.scripts import lean_start, log_noise  # import no TensorFlow

# TensorFlow's start-up lines only when asked for; matplotlib, which Keras would load, not at all.
with log_noise.tensorflow_start(), lean_start.without_matplotlib():
    from agents.algorithms import registry  # noqa: F401 (registers the algorithms)
    from agents.runs import remote_logdir, restore, run_config
    from agents.storage import failures, file_io, locations
    from agents.tools import evaluation, process_env, rendering, video

EPISODES_FILE = 'episodes.jsonl'

flags.DEFINE_string('logdir', None, 'Log directory of a training run.')
flags.DEFINE_string('checkpoint', None, 'Checkpoint to restore: a step number of the run or a '
                    'checkpoint path; default the latest that reads back.')
flags.DEFINE_string('outdir', None, 'Directory for the videos and episodes.jsonl; default '
                    '<logdir>/videos/<step>.')
flags.DEFINE_integer('num_episodes', 3, 'Episodes to render.')
flags.DEFINE_integer('seed', 0, 'Episode i resets the environment with seed seed + i.')

FLAGS = flags.FLAGS

PROGRESS_EVERY_SECS = 2.0


def check_outdir(outdir):
    """Fails unless `outdir` is a directory or can become one (checked before writing)."""
    if locations.is_remote(outdir):
        file_io.check_writable(outdir)
        return
    if os.path.exists(outdir) and not os.path.isdir(outdir):
        raise run_config.ConfigError(f'outdir {outdir} exists and is not a directory')
    unwritable = locations.unwritable_ancestor(outdir)
    if unwritable:
        raise run_config.ConfigError(f'cannot write to outdir {outdir}: {unwritable} is not a '
                                     'writable directory')


class EpisodeRecorder:
    """Renders a frame after every step into one video per episode, logging progress."""

    def __init__(self, env, outdir, num_episodes):
        self._env = env
        self._outdir = outdir
        self._num_episodes = num_episodes
        self._fps = env.metadata.get('render_fps') or 30
        self.writer = None
        self._started = self._last_log = 0.0

    @staticmethod
    def video_name(index):
        return f'episode-{index:03d}.mp4'

    def __call__(self, index, step):
        if step == 0:
            self.writer = video.VideoWriter(
                os.path.join(self._outdir, self.video_name(index)), fps=self._fps)
            self._started = self._last_log = time.time()
        self.writer.append(self._env.render())
        if time.time() - self._last_log >= PROGRESS_EVERY_SECS:
            self._last_log = time.time()
            logging.info('Episode %d/%d: %d frames (%.0f frames/s)', index + 1,
                         self._num_episodes, self.writer.num_frames, self.frames_per_sec)

    @property
    def frames_per_sec(self):
        return self.writer.num_frames / max(time.time() - self._started, 1e-9)

    def finish_episode(self):
        frames_per_sec = self.frames_per_sec
        self.writer.close()
        writer, self.writer = self.writer, None
        return writer, frames_per_sec

    def abort(self):
        if self.writer is not None:
            self.writer.abort()


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f'Unexpected arguments: {" ".join(argv[1:])}')
    log_noise.quiet()
    with remote_logdir.LocalCopies() as copies:
        render(copies)


def render(copies):
    """Renders the episodes and writes them out; remote inputs and outputs go through
    `copies`."""
    try:
        if not FLAGS.logdir:
            raise run_config.ConfigError('--logdir is required')
        if FLAGS.num_episodes < 1:
            raise run_config.ConfigError(
                f'--num_episodes must be positive, got {FLAGS.num_episodes}')
        logdir = locations.resolve(FLAGS.logdir)
        outdir = locations.resolve(FLAGS.outdir) if FLAGS.outdir else None
        if outdir:
            check_outdir(outdir)
        run = restore.restore_agent(copies.input(logdir, remote_logdir.RESTORE_FILES),
                                    FLAGS.checkpoint)
        if run.fallback_warning:
            logging.warning('%s', copies.named(run.fallback_warning))
        if outdir is None:
            outdir = locations.join(logdir, 'videos', str(run.step))
            check_outdir(outdir)
        local_outdir = copies.output(outdir)
        # In a worker process: MuJoCo's renderer and TensorFlow cannot share one.
        env = process_env.ProcessEnv(run.environment.factory(
            extra_wrappers=[rendering.configure_fast_rendering], render_mode='rgb_array'))
    except (run_config.ConfigError, failures.StorageError) as error:
        sys.exit(f'visualize: error: {copies.named(error)}')
    logging.info('Restored %s (step %d); rendering %d episodes of %s into %s.',
                 copies.named(run.checkpoint), run.step, FLAGS.num_episodes,
                 run.environment.env_id, outdir)
    os.makedirs(local_outdir, exist_ok=True)
    recorder = EpisodeRecorder(env, local_outdir, FLAGS.num_episodes)
    records = []
    try:
        for episode in evaluation.iterate_episodes(
                env, restore.AgentPolicy(run.agent), FLAGS.num_episodes, FLAGS.seed,
                on_step=recorder):
            writer, frames_per_sec = recorder.finish_episode()
            records.append({'episode': episode.index, 'seed': episode.seed,
                            'return': episode.episode_return, 'length': episode.length,
                            'video': os.path.basename(writer.path)})
            logging.info('Episode %d/%d: return %.2f, %d steps, %d frames at %.0f frames/s -> %s',
                         episode.index + 1, FLAGS.num_episodes, episode.episode_return,
                         episode.length, writer.num_frames, frames_per_sec,
                         copies.named(writer.path))
    except BaseException:
        recorder.abort()
        raise
    finally:
        env.close()
    run_config.write_atomic(os.path.join(local_outdir, EPISODES_FILE),
                            ''.join(json.dumps(record) + '\n' for record in records))
    try:
        copies.upload()
    except failures.StorageError as error:
        sys.exit(f'visualize: error: {error}')
    logging.info('Wrote %d videos and %s to %s.', len(records), EPISODES_FILE, outdir)


def run():
    """The console script's entry point."""
    # `--helpshort` lists the flags of the program's own file, not this module's, when the
    # program is a console script.
    for flag in FLAGS.get_key_flags_for_module(sys.modules[__name__]):
        FLAGS.register_key_flag_for_module(sys.argv[0], flag)
    app.run(main)


if __name__ == '__main__':
    run()
