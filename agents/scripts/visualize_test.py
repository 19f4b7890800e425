"""Tests of the visualize binary: decodable videos, returns equal to evaluate's, bad input."""

import json
import os
import tempfile

import imageio.v2 as imageio
import numpy as np
from absl.testing import absltest, flagsaver

from agents.scripts import testing_utils, visualize
from agents.storage import file_io, gcs_testing


def count_frames(path):
    reader = imageio.get_reader(path, format='FFMPEG')
    try:
        shapes = {frame.shape for frame in reader.iter_data()}
        return reader.count_frames(), shapes, reader.get_meta_data()
    finally:
        reader.close()


def read_jsonl(path):
    with open(path) as f:
        return [json.loads(line) for line in f]


def run_with_bucket(emulator, *args):
    """Runs the visualize binary against `emulator`. Its temporary directory stays the test's:
    the environment worker's forkserver puts a socket there, whose path must be short."""
    return testing_utils.run_script('visualize', *args, env=emulator.environment())


class VisualizeTest(absltest.TestCase):

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        root = tempfile.mkdtemp(dir=absltest.TEST_TMPDIR.value)
        # Short episodes keep the rendering tests quick: Pendulum's are 50 steps, not 200.
        cls.pendulum = testing_utils.train_tiny_run(
            os.path.join(root, 'pendulum'),
            bindings="train.env_kwargs = {'max_episode_steps': 50}\n" + testing_utils.UNCOMPILED)
        cls.cheetah = testing_utils.train_tiny_run(
            os.path.join(root, 'cheetah'), 'HalfCheetah-v5',
            "train.env_kwargs = {'max_episode_steps': 40}\ntrain.total_steps = 256\n"
            + testing_utils.UNCOMPILED)

    def test_pendulum_videos_decode_and_returns_match_evaluate(self):
        outdir = os.path.join(self.create_tempdir().full_path, 'videos')
        result = testing_utils.run_script(
            'visualize', f'--logdir={self.pendulum}', f'--outdir={outdir}', '--num_episodes=2',
            '--seed=5')
        self.assertEqual(result.returncode, 0, result.stderr[-3000:])
        self.assertIn('Episode 2/2: return', result.stderr)  # Progress is shown.
        self.assertEqual(sorted(os.listdir(outdir)),
                         ['episode-000.mp4', 'episode-001.mp4', 'episodes.jsonl'])
        episodes = read_jsonl(os.path.join(outdir, 'episodes.jsonl'))
        self.assertEqual([(e['episode'], e['seed'], e['length'], e['video']) for e in episodes],
                         [(0, 5, 50, 'episode-000.mp4'), (1, 6, 50, 'episode-001.mp4')])
        for episode in episodes:
            # One frame after the reset and one after each step.
            frames, shapes, meta = count_frames(os.path.join(outdir, episode['video']))
            self.assertEqual(frames, episode['length'] + 1)
            self.assertEqual(shapes, {(500, 500, 3)})
            self.assertEqual((meta['codec'], meta['fps']), ('h264', 30.0))
            self.assertStartsWith(meta['pix_fmt'], 'yuv420p')
        returns = [episode['return'] for episode in episodes]
        self.assertNotEqual(returns[0], returns[1])

        output = os.path.join(outdir, 'metrics.json')
        evaluated = testing_utils.run_script(
            'evaluate', f'--logdir={self.pendulum}', '--num_episodes=2', '--seed=5',
            f'--output={output}')
        self.assertEqual(evaluated.returncode, 0, evaluated.stderr[-3000:])
        with open(output) as f:
            self.assertEqual(json.load(f)['returns'], returns)  # The same episodes exactly.

    def test_mujoco_renders_headless(self):
        outdir = self.create_tempdir().full_path
        result = testing_utils.run_script(
            'visualize', f'--logdir={self.cheetah}', f'--outdir={outdir}', '--num_episodes=1')
        self.assertEqual(result.returncode, 0, result.stderr[-3000:])
        [episode] = read_jsonl(os.path.join(outdir, 'episodes.jsonl'))
        self.assertEqual(episode['length'], 40)
        frames, shapes, meta = count_frames(os.path.join(outdir, episode['video']))
        self.assertEqual((frames, shapes, meta['fps']), (41, {(480, 480, 3)}, 20.0))
        reader = imageio.get_reader(os.path.join(outdir, episode['video']), format='FFMPEG')
        self.assertGreater(np.std(reader.get_data(10)), 10)  # A rendered scene, not blank.
        reader.close()

    def test_default_outdir_is_in_the_logdir_and_the_checkpoint_selectable(self):
        with flagsaver.flagsaver(logdir=self.pendulum, checkpoint='256', num_episodes=1):
            visualize.main(['visualize'])
        outdir = os.path.join(self.pendulum, 'videos', '256')
        self.assertEqual(sorted(os.listdir(outdir)), ['episode-000.mp4', 'episodes.jsonl'])

    def assert_fails(self, message, **flags):
        with flagsaver.flagsaver(**flags):
            with self.assertRaises(SystemExit) as raised:
                visualize.main(['visualize'])
        self.assertIn('visualize: error: ', str(raised.exception.code))
        self.assertRegex(str(raised.exception.code), message)

    def test_bad_input_fails_clearly_and_writes_nothing(self):
        directory = self.create_tempdir()
        outdir = os.path.join(directory.full_path, 'out')
        fresh = directory.mkdir('fresh')
        fresh.create_file('config.gin', content="train.env_id = 'Pendulum-v1'\n")
        self.assert_fails('holds no checkpoint yet', logdir=fresh.full_path, outdir=outdir)
        self.assert_fails('does not exist', logdir=os.path.join(directory.full_path, 'nope'),
                          outdir=outdir)
        self.assert_fails('--logdir is required', logdir=None, outdir=outdir)
        self.assert_fails('not a training run', logdir=directory.mkdir('empty').full_path,
                          outdir=outdir)
        self.assert_fails('--num_episodes must be positive', logdir=self.pendulum,
                          outdir=outdir, num_episodes=0)
        self.assert_fails(r"belongs to the run .*cheetah, of a different configuration than "
                          r"logdir (.|\n)*\+train.env_id = 'HalfCheetah-v5'", logdir=self.pendulum,
                          outdir=outdir,
                          checkpoint=os.path.join(self.cheetah, 'checkpoints', 'ckpt-256'))
        self.assert_fails('checkpoint 3 not found', logdir=self.pendulum, outdir=outdir,
                          checkpoint='3')
        blocker = directory.create_file('file', content='keep')
        self.assert_fails('exists and is not a directory', logdir=self.pendulum,
                          outdir=blocker.full_path)
        self.assert_fails('cannot write to outdir', logdir=self.pendulum,
                          outdir=os.path.join(blocker.full_path, 'below'))
        self.assertEqual(sorted(os.listdir(directory.full_path)), ['empty', 'file', 'fresh'])
        self.assertEqual(os.listdir(os.path.join(directory.full_path, 'empty')), [])
        self.assertEqual(blocker.read_text(), 'keep')
        self.assertEqual(os.listdir(fresh.full_path), ['config.gin'])

    def test_run_in_a_bucket_renders_into_it(self):
        emulator = self.enter_context(gcs_testing.GcsEmulator(buckets=('runs',)))
        copies = testing_utils.local_copies()
        file_io.upload_tree(self.pendulum, 'gs://runs/run')
        result = run_with_bucket(emulator, '--logdir=gs://runs/run', '--num_episodes=1',
                                 '--seed=5')
        self.assertEqual(result.returncode, 0, result.stderr[-3000:])
        videos = emulator.objects('runs', 'run/videos/512/')  # The default outdir, in the bucket.
        self.assertEqual(sorted(videos),
                         ['run/videos/512/episode-000.mp4', 'run/videos/512/episodes.jsonl'])
        [episode] = [json.loads(line) for line in videos['run/videos/512/episodes.jsonl'].decode()
                     .splitlines()]
        self.assertEqual((episode['seed'], episode['length'], episode['video']),
                         (5, 50, 'episode-000.mp4'))
        local = os.path.join(self.create_tempdir().full_path, 'episode-000.mp4')
        file_io.download('gs://runs/run/videos/512/episode-000.mp4', local)
        self.assertEqual(count_frames(local)[0], 51)
        self.assertIn('-> gs://runs/run/videos/512/episode-000.mp4', result.stderr)
        self.assertNotIn('batchppo-copy-', result.stderr)  # URLs, never the local copies.
        self.assertEqual(testing_utils.local_copies(), copies)  # They are gone.

    def test_missing_bucket_fails_in_one_line(self):
        emulator = self.enter_context(gcs_testing.GcsEmulator(buckets=('runs',)))
        copies = testing_utils.local_copies()
        before = testing_utils.snapshot(self.pendulum)
        result = run_with_bucket(emulator, f'--logdir={self.pendulum}',
                                 '--outdir=gs://missing-bucket/videos')
        self.assertNotEqual(result.returncode, 0)
        errors = testing_utils.error_lines(result.stderr)
        self.assertLen(errors, 1, result.stderr[-3000:])
        self.assertRegex(errors[0], r'^visualize: error: bucket missing-bucket of '
                         r'gs://missing-bucket/videos does not exist')
        self.assertNotIn('Traceback', result.stderr)
        self.assertNotIn('Restored', result.stderr)  # Refused before any work.
        self.assertEqual(testing_utils.snapshot(self.pendulum), before)
        self.assertEqual(testing_utils.local_copies(), copies)
        self.assertEqual(emulator.objects('runs'), {})


if __name__ == '__main__':
    absltest.main()
