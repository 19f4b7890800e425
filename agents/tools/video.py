"""MP4 videos that browsers play: H.264 in yuv420p, written with imageio's ffmpeg plugin.

yuv420p subsamples colour by two in both directions, so frames of odd size are padded by one
edge pixel (instead of letting imageio resize them to a multiple of 16). The file is written
under a temporary name and renamed when complete, so a reader never sees half a video and a
failure leaves nothing behind.
"""

import contextlib
import os

import gin
import imageio.v2 as imageio
import numpy as np


@gin.configurable
class VideoWriter:
    """Appends RGB frames to one mp4 file; use as a context manager.

    Args:
      path: the mp4 file to write; its directory must exist.
      fps: frames per second of the video (e.g. the environment's `render_fps`).
      quality: imageio's quality scale from 1 (smallest) to 10 (best).
      preset: libx264's speed preset; 'veryfast' encodes faster than the default 'medium' at a
        similar size for rendered scenes (benchmarks/README.md).
    """

    def __init__(self, path, fps, quality=5, preset='veryfast'):
        if not fps > 0:
            raise ValueError(f'fps must be positive, got {fps!r}')
        if os.path.isdir(path):
            raise IsADirectoryError(f'video path {path} is a directory')
        directory, name = os.path.split(os.path.abspath(path))
        if not os.path.isdir(directory):
            raise FileNotFoundError(f'directory of video path {path} does not exist')
        self.path = path
        self._fps = fps
        self._quality = quality
        self._preset = preset
        self._temporary = os.path.join(directory, f'.{name}.partial-{os.getpid()}.mp4')
        self._writer = None
        self._size = None
        self.num_frames = 0

    def append(self, frame):
        """Adds one `[height, width, 3]` uint8 RGB frame; all frames must have one size."""
        frame = np.asarray(frame)
        if frame.ndim != 3 or frame.shape[-1] != 3 or frame.dtype != np.uint8:
            raise ValueError(f'frames must be [height, width, 3] uint8 RGB arrays, got shape '
                             f'{frame.shape} and dtype {frame.dtype}')
        if self._size is None:
            self._size = frame.shape[:2]
            self._writer = imageio.get_writer(
                self._temporary, format='FFMPEG', mode='I', fps=self._fps, codec='libx264',
                pixelformat='yuv420p', quality=self._quality, macro_block_size=1,
                ffmpeg_log_level='error',
                # faststart puts the index first: browsers can play while downloading.
                ffmpeg_params=['-preset', self._preset, '-movflags', '+faststart'])
        elif frame.shape[:2] != self._size:
            raise ValueError(f'frame of size {frame.shape[:2]} differs from the first frame\'s '
                             f'{self._size}')
        height, width = frame.shape[:2]
        if height % 2 or width % 2:
            frame = np.pad(frame, ((0, height % 2), (0, width % 2), (0, 0)), mode='edge')
        self._writer.append_data(frame)
        self.num_frames += 1

    def close(self):
        """Finishes the video and moves it to `path`; without frames, raises and writes nothing."""
        if self._writer is None:
            raise ValueError(f'no frames were appended to {self.path}')
        writer, self._writer = self._writer, None
        try:
            writer.close()
            os.replace(self._temporary, self.path)
        finally:
            self._remove_temporary()

    def abort(self):
        """Stops writing and removes the partial file."""
        writer, self._writer = self._writer, None
        try:
            if writer is not None:
                # Aborting follows another error, which a failing ffmpeg must not hide.
                with contextlib.suppress(Exception):
                    writer.close()
        finally:
            self._remove_temporary()

    def _remove_temporary(self):
        if os.path.exists(self._temporary):
            os.remove(self._temporary)

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc_value, traceback):
        if exc_type is None:
            self.close()
        else:
            self.abort()
