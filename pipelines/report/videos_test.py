"""Tests of the evaluation videos, on the policy of a tiny real training run."""

import os

import imageio.v2 as imageio
import numpy as np
from absl.testing import absltest

from pipelines.report import report_fixtures, videos


class ShrinkTest(absltest.TestCase):

    def test_averages_blocks(self):
        frame = np.arange(4 * 6 * 3, dtype=np.uint8).reshape(4, 6, 3)
        small = videos.shrink(frame, 3)
        self.assertEqual(small.shape, (2, 3, 3))
        self.assertEqual(small.dtype, np.uint8)
        np.testing.assert_array_equal(
            small[0, 0], np.round(frame[:2, :2].reshape(-1, 3).mean(axis=0)))

    def test_keeps_small_frames_and_crops_remainders(self):
        frame = np.zeros((500, 500, 3), np.uint8)
        self.assertIs(videos.shrink(frame, 500), frame)
        self.assertEqual(videos.shrink(frame, 256).shape, (250, 250, 3))
        self.assertEqual(videos.shrink(np.zeros((501, 333, 3), np.uint8), 100).shape,
                         (83, 55, 3))


class RenderPolicyTest(absltest.TestCase):

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.policy = report_fixtures.train_tiny_policy(
            os.path.join(absltest.get_default_test_tmpdir(), 'tiny'))

    def test_video_of_one_episode(self):
        from agents.runs import policy_export, restore
        from agents.tools import evaluation

        path = os.path.join(self.create_tempdir().full_path, 'video.mp4')
        info = videos.render_policy(self.policy, path, seed=5, max_steps=40, max_size=128)
        self.assertEqual(info['length'], 40)
        self.assertEqual(info['frames'], 41)  # The reset's frame and one per step.
        self.assertEqual((info['width'], info['height']), (126, 126))  # 500 / 4, padded even.
        reader = imageio.get_reader(path, format='FFMPEG')
        try:
            frames = [frame for frame in reader]
            self.assertEqual(reader.get_meta_data()['codec'], 'h264')
        finally:
            reader.close()
        self.assertLen(frames, 41)
        self.assertEqual(frames[0].shape, (126, 126, 3))
        # The same episode without rendering: //agents:evaluate's return for this seed.
        policy = policy_export.SavedPolicy(self.policy)
        env = restore.environment_from_config(policy.config).make()
        try:
            episode, = evaluation.run_episodes(env, policy, 1, seed=5, max_steps=40)
        finally:
            env.close()
        self.assertAlmostEqual(info['return'], episode.episode_return, places=3)

    def test_not_a_policy(self):
        directory = self.create_tempdir().full_path
        path = os.path.join(directory, 'video.mp4')
        with self.assertRaisesRegex(videos.VideoError, 'holds no exported policy'):
            videos.render_policy(directory, path)
        self.assertFalse(os.path.exists(path))


if __name__ == '__main__':
    absltest.main()
