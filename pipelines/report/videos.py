"""An evaluation video of an exported policy, as `//agents:visualize` renders one.

The policy is the SavedModel a run exported (`policy/<step>/`); the environment is rebuilt from
the operative configuration the export records, with the run's wrappers, and stepped in a
worker process (`ProcessEnv`: MuJoCo's software renderer and TensorFlow cannot share one). The
episode starts from `reset(seed=seed)`, so `//agents:evaluate --seed=seed` gets the same
return. Frames are shrunk by an integer factor to at most `max_size` pixels a side, which keeps
reports light; the mp4 is H.264 in yuv420p, which Chromium and Firefox play.
"""

import math
import threading

import numpy as np

from agents.tools import evaluation, process_env, rendering, video

# `restore.environment_from_config` replaces the process's gin configuration.
_GIN_LOCK = threading.Lock()


class VideoError(Exception):
    """The policy cannot be rendered: not an exported policy, unknown environment..."""


def shrink(frame, max_size):
    """`frame` averaged over blocks of k x k pixels, the smallest k that fits `max_size`."""
    height, width = frame.shape[:2]
    factor = math.ceil(max(height, width) / max_size)
    if factor <= 1:
        return frame
    height, width = height // factor * factor, width // factor * factor
    blocks = frame[:height, :width].reshape(height // factor, factor, width // factor, factor, -1)
    return blocks.mean(axis=(1, 3)).round().astype(np.uint8)


def render_policy(policy_dir, path, seed=0, max_steps=200, max_size=256):
    """Renders one episode of the deterministic policy in `policy_dir` to the mp4 `path`.

    Returns:
      {'return', 'length', 'frames', 'width', 'height'} of the episode.

    Raises:
      VideoError: the directory holds no usable policy or its environment cannot be made.
    """
    # TensorFlow and the trainer load only when a video is made.
    from agents.runs import policy_export, restore

    try:
        policy = policy_export.SavedPolicy(policy_dir)
    except policy_export.PolicyLoadError as error:
        raise VideoError(str(error)) from error
    if not policy.config:
        raise VideoError(f'policy {policy_dir} does not record the configuration of its run')
    try:
        with _GIN_LOCK:
            environment = restore.environment_from_config(policy.config)
        env = process_env.ProcessEnv(environment.factory(
            extra_wrappers=[rendering.configure_fast_rendering], render_mode='rgb_array'))
    except Exception as error:  # Any failure to make the environment: the run's config is off.
        raise VideoError(f'cannot make the environment of policy {policy_dir}: '
                         f'{type(error).__name__}: {error}') from error
    try:
        try:
            evaluation.check_spaces(env, policy.observation_space, policy.action_space)
        except ValueError as error:
            raise VideoError(str(error)) from error
        fps = env.metadata.get('render_fps') or 30
        with video.VideoWriter(path, fps=fps) as writer:
            shape = []

            def record(index, step):
                frame = shrink(np.asarray(env.render()), max_size)
                shape[:] = frame.shape[:2]
                writer.append(frame)

            episode, = evaluation.run_episodes(env, policy, 1, seed, on_step=record,
                                               max_steps=max_steps)
    finally:
        env.close()
    return {'return': episode.episode_return, 'length': episode.length,
            # The writer pads odd sizes by a pixel (yuv420p).
            'frames': writer.num_frames, 'height': shape[0] + shape[0] % 2,
            'width': shape[1] + shape[1] % 2}
