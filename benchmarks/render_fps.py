"""Frames per second of headless MuJoCo rendering, by render settings, and into an mp4.

Steps an environment with random actions and renders a frame after every step, as
`//agents:visualize` does. Settings compared:

  mujoco_default   MuJoCo's own quality (4096 shadow map, multisampling, shadows, reflections);
  notes_1024       shadow map 1024 and no multisampling (shadows and reflections kept);
  fast             `rendering.configure_fast_rendering`'s defaults (also no shadows and no
                   reflections), what visualize uses;
  fast_to_mp4      `fast`, stepped in a worker process (`ProcessEnv`) and encoded to H.264
                   (`VideoWriter`): visualize's whole pipeline without the policy.

Each setting is timed `--repeats` times and the median is shown.

    python -m benchmarks.render_fps --env_id=HalfCheetah-v5 --frames=200
"""

import functools
import os
import statistics
import tempfile
import time

import gymnasium as gym
import numpy as np
from absl import app, flags

from agents.tools import batch_env, process_env, rendering, video

flags.DEFINE_string('env_id', 'HalfCheetah-v5', 'A MuJoCo environment id.')
flags.DEFINE_integer('frames', 200, 'Rendered frames per timed run.')
flags.DEFINE_integer('repeats', 3, 'Timed runs per setting; the median is reported.')
flags.DEFINE_list('settings', ['mujoco_default', 'notes_1024', 'fast', 'fast_to_mp4'],
                  'Settings to time.')
FLAGS = flags.FLAGS


def notes_1024(env):
    quality = env.unwrapped.model.vis.quality
    quality.shadowsize, quality.offsamples = 1024, 0
    return env


SETTINGS = {
    'mujoco_default': lambda env: env,
    'notes_1024': notes_1024,
    'fast': rendering.configure_fast_rendering,
}


def time_in_process(env_id, configure, frames, seed):
    env = configure(gym.make(env_id, render_mode='rgb_array'))
    try:
        env.reset(seed=seed)
        env.render()  # Creates the render context, untimed.
        actions = np.random.default_rng(seed).uniform(-1, 1, (frames, *env.action_space.shape))
        start = time.perf_counter()
        for action in actions:
            if any(env.step(action)[2:4]):
                env.reset()
            env.render()
        return frames / (time.perf_counter() - start)
    finally:
        env.close()


def time_to_mp4(env_id, frames, seed):
    env = process_env.ProcessEnv(functools.partial(
        batch_env.make_env, env_id, {'render_mode': 'rgb_array'},
        (rendering.configure_fast_rendering,)))
    try:
        env.reset(seed=seed)
        actions = np.random.default_rng(seed).uniform(-1, 1, (frames, *env.action_space.shape))
        with tempfile.TemporaryDirectory() as directory:
            start = time.perf_counter()
            with video.VideoWriter(os.path.join(directory, 'bench.mp4'),
                                   fps=env.metadata.get('render_fps', 30)) as writer:
                writer.append(env.render())
                for action in actions[1:]:
                    if any(env.step(action)[2:4]):
                        env.reset()
                    writer.append(env.render())
            return frames / (time.perf_counter() - start)
    finally:
        env.close()


def main(argv):
    del argv
    print(f'{FLAGS.env_id}, {FLAGS.frames} frames per run, median of {FLAGS.repeats} runs '
          f'(MUJOCO_GL={os.environ.get("MUJOCO_GL")}, {os.cpu_count()} cores)')
    for name in FLAGS.settings:
        rates = []
        for repeat in range(FLAGS.repeats):
            if name == 'fast_to_mp4':
                rates.append(time_to_mp4(FLAGS.env_id, FLAGS.frames, repeat))
            else:
                rates.append(time_in_process(FLAGS.env_id, SETTINGS[name], FLAGS.frames, repeat))
        runs = ', '.join(f'{rate:.0f}' for rate in rates)
        print(f'{name:>15}: {statistics.median(rates):6.1f} frames/s  (runs: {runs})')


if __name__ == '__main__':
    app.run(main)
