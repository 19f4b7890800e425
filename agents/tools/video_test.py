"""Tests for VideoWriter: decodable browser-friendly mp4s, odd sizes, nothing left on errors."""

import os

import imageio.v2 as imageio
import numpy as np
from absl.testing import absltest

from agents.tools import video


def moving_square(num_frames, height, width):
    """Frames with a bright square moving over a dark background."""
    frames = np.full((num_frames, height, width, 3), 30, np.uint8)
    for index in range(num_frames):
        top, left = (index * 3) % (height - 8), (index * 5) % (width - 8)
        frames[index, top:top + 8, left:left + 8] = (250, 200, 40)
    return frames


def decode(path):
    reader = imageio.get_reader(path, format='FFMPEG')
    try:
        return np.stack(list(reader.iter_data())), reader.get_meta_data()
    finally:
        reader.close()


class VideoWriterTest(absltest.TestCase):

    def setUp(self):
        super().setUp()
        self.directory = self.create_tempdir().full_path

    def test_writes_h264_yuv420p_that_decodes_to_the_frames(self):
        path = os.path.join(self.directory, 'episode.mp4')
        frames = moving_square(25, 64, 96)
        with video.VideoWriter(path, fps=20) as writer:
            for frame in frames:
                writer.append(frame)
        self.assertEqual(writer.num_frames, 25)
        decoded, meta = decode(path)
        self.assertEqual(decoded.shape, frames.shape)
        self.assertEqual(meta['codec'], 'h264')
        self.assertStartsWith(meta['pix_fmt'], 'yuv420p')
        self.assertEqual(meta['fps'], 20.0)
        # Lossy, but close: the square is where it was drawn.
        self.assertLess(np.abs(decoded.astype(float) - frames).mean(), 3.0)
        self.assertEqual(os.listdir(self.directory), ['episode.mp4'])

    def test_odd_frame_size_is_padded_by_one_pixel_not_resized(self):
        path = os.path.join(self.directory, 'odd.mp4')
        frames = moving_square(5, 51, 75)
        with video.VideoWriter(path, fps=10) as writer:
            for frame in frames:
                writer.append(frame)
        decoded, _ = decode(path)
        self.assertEqual(decoded.shape, (5, 52, 76, 3))
        self.assertLess(np.abs(decoded[:, :51, :75].astype(float) - frames).mean(), 3.0)

    def test_error_inside_the_context_leaves_no_file(self):
        path = os.path.join(self.directory, 'broken.mp4')
        with self.assertRaisesRegex(RuntimeError, 'simulated'):
            with video.VideoWriter(path, fps=10) as writer:
                writer.append(moving_square(1, 32, 32)[0])
                raise RuntimeError('simulated failure')
        self.assertEqual(os.listdir(self.directory), [])

    def test_bad_frames_are_rejected_and_nothing_is_written(self):
        path = os.path.join(self.directory, 'bad.mp4')
        for frame, message in ((np.zeros((32, 32, 3), np.float32), 'uint8 RGB'),
                               (np.zeros((32, 32), np.uint8), r'\[height, width, 3\]'),
                               (np.zeros((32, 32, 4), np.uint8), 'got shape')):
            with self.assertRaisesRegex(ValueError, message):
                with video.VideoWriter(path, fps=10) as writer:
                    writer.append(frame)
        with self.assertRaisesRegex(ValueError, 'differs from the first'):
            with video.VideoWriter(path, fps=10) as writer:
                writer.append(np.zeros((32, 32, 3), np.uint8))
                writer.append(np.zeros((32, 34, 3), np.uint8))
        self.assertEqual(os.listdir(self.directory), [])

    def test_no_frames_is_an_error(self):
        path = os.path.join(self.directory, 'empty.mp4')
        with self.assertRaisesRegex(ValueError, 'no frames'):
            with video.VideoWriter(path, fps=10):
                pass
        self.assertEqual(os.listdir(self.directory), [])

    def test_bad_paths_and_fps(self):
        with self.assertRaisesRegex(IsADirectoryError, 'is a directory'):
            video.VideoWriter(self.directory, fps=10)
        with self.assertRaisesRegex(FileNotFoundError, 'does not exist'):
            video.VideoWriter(os.path.join(self.directory, 'missing', 'a.mp4'), fps=10)
        with self.assertRaisesRegex(ValueError, 'fps must be positive'):
            video.VideoWriter(os.path.join(self.directory, 'a.mp4'), fps=0)


if __name__ == '__main__':
    absltest.main()
