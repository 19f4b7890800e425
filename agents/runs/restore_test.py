"""Tests for restoring a run's agent, and the trainer's policy exports that mirror checkpoints."""

import os
import pickle
import shutil
import tempfile

import gin
import gymnasium as gym
import numpy as np
import tensorflow as tf
from absl.testing import absltest

from agents.algorithms import networks
from agents.algorithms.ppo import ppo
from agents.runs import loop, policy_export, restore, run_config, run_dir
from agents.tools import envpool_atari, rendering

# A tiny Pendulum run: three evaluations (256, 512, 768), two checkpoints kept; the update in
# graph mode (these tests are not about XLA, whose compilation costs seconds).
TINY_RUN = """
train.algorithm = @PPO
train.env_id = 'Pendulum-v1'
train.total_steps = 768
train.num_envs = 4
train.rollout_length = 64
train.env_mode = 'in_process'
train.eval_every_steps = 256
train.eval_episodes = 1
train.checkpoints_to_keep = 2
PPO.num_minibatches = 4
PPO.jit_compile = False
"""


def observations(count):
    return np.random.default_rng(0).uniform(-1, 1, (count, 3)).astype(np.float32)


_TRAINED = []


def trained_run():
    """The logdir of TINY_RUN, trained once for all tests (which must not change it)."""
    if not _TRAINED:
        logdir = tempfile.mkdtemp(dir=absltest.TEST_TMPDIR.value)
        gin.clear_config()
        try:
            gin.parse_config(TINY_RUN)
            loop.train(logdir)
        finally:
            gin.clear_config()
        _TRAINED.append(logdir)
    return _TRAINED[0]


def snapshot(directory):
    """Every file under `directory` with its bytes, to show that nothing changed."""
    files = {}
    for parent, _, names in os.walk(directory):
        for name in names:
            with open(os.path.join(parent, name), 'rb') as f:
                files[os.path.relpath(os.path.join(parent, name), directory)] = f.read()
    return files


def truncate(path):
    with open(path, 'r+b') as f:
        f.truncate(os.path.getsize(path) // 2)


def save_checkpoint(directory, agent, step):
    """A checkpoint laid out as the trainer writes it."""
    checkpoint = tf.train.Checkpoint(
        agent=agent, env_steps=tf.Variable(step, dtype=tf.int64),
        wall_time=tf.Variable(0.0, dtype=tf.float64))
    return checkpoint.write(os.path.join(directory, f'ckpt-{step}'))


class RestoreTest(absltest.TestCase):

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.logdir = trained_run()

    def tearDown(self):
        gin.clear_config()
        super().tearDown()

    def test_trainer_exports_the_policy_of_each_kept_checkpoint(self):
        checkpoints = tf.train.get_checkpoint_state(
            os.path.join(self.logdir, run_dir.CHECKPOINT_DIR)).all_model_checkpoint_paths
        self.assertEqual([path.rsplit('-', 1)[-1] for path in checkpoints], ['512', '768'])
        policy_dir = os.path.join(self.logdir, run_dir.POLICY_DIR)
        self.assertEqual(sorted(os.listdir(policy_dir)), ['512', '768'])
        policy = policy_export.SavedPolicy(os.path.join(policy_dir, '768'))
        self.assertEqual(policy.step, 768)
        self.assertIn("train.env_id = 'Pendulum-v1'", policy.config)

    def test_restores_the_latest_checkpoint_as_exported_by_the_trainer(self):
        run = restore.restore_agent(self.logdir)
        self.assertEqual(run.step, 768)
        self.assertEqual(run.checkpoint, os.path.join(self.logdir, 'checkpoints', 'ckpt-768'))
        self.assertEqual(run.environment, restore.Environment(
            'Pendulum-v1', None, ('range_normalize', 'ClipAction')))
        self.assertEqual(run.observation_space, gym.spaces.Box(-1, 1, (3,), np.float32))
        self.assertEqual(run.agent.observ_normalizer.count.numpy(), 768)
        saved = policy_export.SavedPolicy(os.path.join(self.logdir, 'policy', '768'))
        observ = observations(50)
        live = restore.AgentPolicy(run.agent)
        actions, state = live(observ, (), np.ones(50, bool))
        self.assertEqual(state, ())
        np.testing.assert_allclose(actions, saved(observ, (), None)[0], atol=1e-6)

    def test_runs_of_older_code_restore(self):
        older = os.path.join(self.create_tempdir().full_path, 'run')
        shutil.copytree(self.logdir, older)
        path = os.path.join(older, run_dir.OPERATIVE_CONFIG_FILE)
        with open(path) as f:
            lines = [line for line in f if not line.startswith('train.algorithm')]
        # Older code took these from gin; the run's code passes them itself now.
        lines += ['BatchEnv.copy = True\n', "BatchEnv.mode = 'in_process'\n"]
        with open(path, 'w') as f:
            f.writelines(lines)
        run = restore.restore_agent(older)
        self.assertIsInstance(run.agent, ppo.PPO)
        self.assertEqual(run.step, 768)

    def test_an_unregistered_algorithm_is_named(self):
        other = os.path.join(self.create_tempdir().full_path, 'run')
        shutil.copytree(self.logdir, other)
        path = os.path.join(other, run_dir.OPERATIVE_CONFIG_FILE)
        with open(path) as f:
            config = f.read().replace('train.algorithm = @PPO', 'train.algorithm = @Nonesuch')
        with open(path, 'w') as f:
            f.write(config)
        with self.assertRaisesRegex(run_config.ConfigError, 'names an algorithm that is not '
                                    r'registered \(agents/algorithms/registry.py\): @Nonesuch'):
            restore.restore_agent(other)

    def test_restores_an_earlier_checkpoint_by_step_or_path(self):
        by_step = restore.restore_agent(self.logdir, checkpoint=512)
        by_path = restore.restore_agent(
            self.logdir, checkpoint=os.path.join(self.logdir, 'checkpoints', 'ckpt-512'))
        self.assertEqual((by_step.step, by_path.step), (512, 512))
        observ = observations(20)
        saved = policy_export.SavedPolicy(os.path.join(self.logdir, 'policy', '512'))
        for run in (by_step, by_path):
            actions, _ = restore.AgentPolicy(run.agent)(observ, (), np.ones(20, bool))
            np.testing.assert_allclose(actions, saved(observ, (), None)[0], atol=1e-6)

    def test_missing_logdir_run_or_checkpoint(self):
        with self.assertRaisesRegex(run_config.ConfigError, 'does not exist'):
            restore.restore_agent(os.path.join(self.logdir, 'nothing'))
        empty = self.create_tempdir().full_path
        with self.assertRaisesRegex(run_config.ConfigError, 'not a training run'):
            restore.restore_agent(empty)
        fresh = self.create_tempdir()
        fresh.create_file('config.gin', content=TINY_RUN)
        with self.assertRaisesRegex(run_config.ConfigError, 'holds no checkpoint yet'):
            restore.restore_agent(fresh.full_path)
        with self.assertRaisesRegex(run_config.ConfigError, r'checkpoint 256 not found'):
            restore.restore_agent(self.logdir, checkpoint=256)  # Deleted: only two kept.
        with self.assertRaisesRegex(run_config.ConfigError, 'not found'):
            restore.restore_agent(self.logdir, checkpoint='/no/such/ckpt-1')

    def test_checkpoint_of_another_configuration(self):
        directory = self.create_tempdir().full_path
        wider = ppo.PPO(observ_shape=(3,), action_size=1, num_envs=4,
                        policy_network=lambda **kwargs: networks.FeedForwardGaussianPolicy(
                            hidden_sizes=(32, 32), **kwargs))
        categorical = ppo.PPO(observ_shape=(3,), action_size=2, num_envs=4,
                              policy_network=networks.FeedForwardCategoricalPolicy)
        for agent, message in (
                (wider, r'does not fit the configuration.*agent/policy/mean/kernel has shape '
                        r'\[1, 32, 1\], expected \[1, 64, 1\] \(and \d+ more\)'),
                (categorical, r'does not fit the configuration.*lacks \d+ variable.*e.g. '
                              'agent/policy/log_std')):
            path = save_checkpoint(directory, agent, 100)
            with self.assertRaisesRegex(run_config.ConfigError, message):
                restore.restore_agent(self.logdir, checkpoint=path)


class DamagedRunTest(absltest.TestCase):
    """Checkpoints that do not read back, and checkpoints of runs of other configurations."""

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.baseline = trained_run()

    def setUp(self):
        super().setUp()
        self.logdir = self.copy_run('run')

    def tearDown(self):
        gin.clear_config()
        super().tearDown()

    def copy_run(self, name):
        path = os.path.join(self.create_tempdir().full_path, name)
        shutil.copytree(self.baseline, path)
        return path

    def checkpoint(self, step, suffix='', logdir=None):
        return os.path.join(logdir or self.logdir, 'checkpoints', f'ckpt-{step}{suffix}')

    def test_damaged_latest_falls_back_and_changes_nothing(self):
        truncate(self.checkpoint(768, '.data-00000-of-00001'))
        before = snapshot(self.logdir)
        run = restore.restore_agent(self.logdir)
        self.assertEqual((run.checkpoint, run.step), (self.checkpoint(512), 512))
        self.assertEqual(run.skipped, ((self.checkpoint(768), 'Read less bytes than requested'),))
        self.assertEqual(
            run.fallback_warning,
            f'Checkpoint {self.checkpoint(768)} (Read less bytes than requested) does not read '
            f'back; using {self.checkpoint(512)} (step 512), the newest checkpoint that does. '
            'Nothing in the logdir was changed.')
        self.assertEqual(snapshot(self.logdir), before)
        self.assertIsNone(restore.restore_agent(self.baseline).fallback_warning)

    def test_warning_names_every_checkpoint_passed_over(self):
        run = restore.RestoredRun(None, None, None, None, 'c/ckpt-1', 1, '',
                                  (('c/ckpt-2', 'cut'), ('c/ckpt-3', 'garbage')))
        self.assertEqual(run.fallback_warning,
                         'Checkpoints c/ckpt-2 (cut), c/ckpt-3 (garbage) do not read back; using '
                         'c/ckpt-1 (step 1), the newest checkpoint that does. Nothing in the '
                         'logdir was changed.')

    def test_no_readable_checkpoint(self):
        for step in (512, 768):
            truncate(self.checkpoint(step, '.data-00000-of-00001'))
        with self.assertRaisesRegex(
                run_config.ConfigError, rf'^no checkpoint of logdir {self.logdir} reads back '
                r'\(ckpt-512: Read less bytes than requested; ckpt-768: Read less bytes than '
                r'requested\)$'):
            restore.restore_agent(self.logdir)

    def test_named_damaged_checkpoint_is_an_error(self):
        truncate(self.checkpoint(512, '.data-00000-of-00001'))
        before = snapshot(self.logdir)
        message = (rf'^checkpoint {self.checkpoint(512)} is damaged: it does not read back '
                   r'\(Read less bytes than requested\)$')
        for checkpoint in ('512', self.checkpoint(512)):
            with self.assertRaisesRegex(run_config.ConfigError, message):
                restore.restore_agent(self.logdir, checkpoint=checkpoint)
        self.assertEqual(snapshot(self.logdir), before)

    def test_checkpoint_of_a_run_of_another_configuration_is_refused(self):
        # Same shapes, another activation: it would restore and act wrongly.
        other = self.copy_run('other')
        path = os.path.join(other, run_dir.OPERATIVE_CONFIG_FILE)
        with open(path) as f:
            config = f.read()
        self.assertIn("FeedForwardGaussianPolicy.activation = 'tanh'", config)
        with open(path, 'w') as f:
            f.write(config.replace("FeedForwardGaussianPolicy.activation = 'tanh'",
                                   "FeedForwardGaussianPolicy.activation = 'relu'"))
        with self.assertRaisesRegex(
                run_config.ConfigError,
                rf'^checkpoint {self.checkpoint(512, logdir=other)} belongs to the run {other}, '
                rf'of a different configuration than logdir {self.logdir}; give --logdir='
                rf'{other} to use it with its own configuration. Difference:\n'
                r"(.|\n)*-FeedForwardGaussianPolicy.activation = 'tanh'\n"
                r"\+FeedForwardGaussianPolicy.activation = 'relu'"):
            restore.restore_agent(self.logdir, checkpoint=self.checkpoint(512, logdir=other))

    def test_config_gin_is_compared_first(self):
        other = self.copy_run('other')
        for logdir, seed in ((self.logdir, 1), (other, 2)):
            with open(os.path.join(logdir, run_dir.CONFIG_FILE), 'w') as f:
                f.write(f'train.seed = {seed}\n')
        with self.assertRaisesRegex(run_config.ConfigError, r'-train.seed = 1\n\+train.seed = 2'):
            restore.restore_agent(self.logdir, checkpoint=self.checkpoint(512, logdir=other))

    def test_checkpoint_of_a_run_of_the_same_configuration_or_of_no_run_is_accepted(self):
        same = self.copy_run('same')
        run = restore.restore_agent(self.logdir, checkpoint=self.checkpoint(512, logdir=same))
        self.assertEqual(run.step, 512)
        elsewhere = self.create_tempdir().full_path
        for name in os.listdir(os.path.join(same, 'checkpoints')):
            if name.startswith('ckpt-512.'):
                shutil.copy(os.path.join(same, 'checkpoints', name), elsewhere)
        run = restore.restore_agent(self.logdir, checkpoint=os.path.join(elsewhere, 'ckpt-512'))
        self.assertEqual(run.step, 512)
        self.assertIsNone(restore.checkpoint_run(os.path.join(elsewhere, 'ckpt-512')))
        self.assertEqual(restore.checkpoint_run(self.checkpoint(512, logdir=same)), same)


class EnvironmentFromConfigTest(absltest.TestCase):

    def tearDown(self):
        gin.clear_config()
        super().tearDown()

    def test_unbound_values_take_the_trainer_defaults(self):
        environment = restore.environment_from_config("train.env_id = 'CartPole-v1'")
        self.assertEqual(environment, restore.Environment(
            'CartPole-v1', None, ('range_normalize', 'ClipAction')))

    def test_gin_references_are_resolved(self):
        environment = restore.environment_from_config(
            "train.env_id = 'Pendulum-v1'\n"
            'train.wrappers = [@range_normalize]\n'
            'range_normalize.observ = False\n')
        env = environment.make()
        # range_normalize ran with its gin binding: actions rescaled, observations not.
        self.assertEqual(env.action_space, gym.spaces.Box(-1, 1, (1,), np.float32))
        self.assertEqual(env.observation_space.high.tolist(), [1.0, 1.0, 8.0])

    def test_env_kwargs_apply_to_the_trained_environment_only(self):
        environment = restore.environment_from_config(
            "train.env_id = 'Pendulum-v1'\ntrain.env_kwargs = {'g': 5.0}\ntrain.wrappers = []")
        self.assertEqual(environment.make().unwrapped.g, 5.0)
        self.assertEqual(environment.make(render_mode='rgb_array').render_mode, 'rgb_array')
        self.assertEqual(environment.make('MountainCarContinuous-v0').spec.id,
                         'MountainCarContinuous-v0')

    def test_a_run_on_envpool_acts_in_gymnasiums_environment(self):
        # Its env_kwargs were envpool.make's, which gymnasium.make does not take.
        environment = restore.environment_from_config(
            "train.env_id = 'Pendulum-v1'\ntrain.env_backend = 'envpool'\n"
            "train.env_kwargs = {'num_threads': 1}")
        self.assertEqual(environment, restore.Environment(
            'Pendulum-v1', None, ('range_normalize', 'ClipAction')))
        self.assertEqual(environment.make().action_space,
                         gym.spaces.Box(-np.inf, np.inf, (1,), np.float32))

    def test_a_run_on_envpool_of_an_atari_game_plays_it_in_envpool(self):
        environment = restore.environment_from_config(
            "train.env_id = 'Breakout-v5'\ntrain.env_backend = 'envpool'\n"
            "train.env_kwargs = {'num_threads': 1}\ntrain.wrappers = []")
        self.assertEqual(environment, restore.Environment(
            'Breakout-v5', {'num_threads': 1}, [], backend='envpool'))
        # As visualize makes it: pickled into a worker, in its extra wrapper.
        factory = environment.factory(extra_wrappers=[rendering.configure_fast_rendering],
                                      render_mode='rgb_array')
        env = pickle.loads(pickle.dumps(factory))()
        self.addCleanup(env.close)
        self.assertIsInstance(env.unwrapped, envpool_atari.AtariEnv)
        self.assertEqual(env.observation_space, gym.spaces.Box(0, 255, (4, 84, 84), np.uint8))
        self.assertEqual(env.action_space, gym.spaces.Discrete(4))
        self.assertEqual(env.metadata['render_fps'], 15.0)
        observ, _ = env.reset(seed=0)
        self.assertEqual(observ.dtype, np.uint8)
        frame = env.render()
        self.assertEqual((frame.shape, frame.dtype), ((210, 160, 3), np.uint8))
        # The evaluation's settings: an episode is a whole game.
        rng = np.random.default_rng(0)
        terminated = truncated = False
        while not (terminated or truncated):
            _, _, terminated, truncated, info = env.step(rng.integers(0, 4))
        self.assertEqual((terminated, info['lives'], info['terminated']), (True, 0, 1))
        # Another id is another of EnvPool's games, without the run's env_kwargs.
        other = environment.make('Pong-v5')
        self.addCleanup(other.close)
        self.assertEqual(other.action_space, gym.spaces.Discrete(6))
        with self.assertRaisesRegex(
                run_config.ConfigError,
                "^cannot make environment 'Pendulum-v1': 'Pendulum-v1' is not one of EnvPool's "
                'Atari games$'):
            environment.make('Pendulum-v1')

    def test_a_run_on_envpool_of_a_task_neither_gymnasiums_nor_atari_is_refused(self):
        with self.assertRaisesRegex(run_config.ConfigError,
                                    "'CheetahRun-v1' is an EnvPool task but not a Gymnasium"):
            restore.environment_from_config(
                "train.env_id = 'CheetahRun-v1'\ntrain.env_backend = 'envpool'")

    def test_bad_configurations(self):
        with self.assertRaisesRegex(run_config.ConfigError, 'no train.env_id binding'):
            restore.environment_from_config('train.num_envs = 4')
        with self.assertRaisesRegex(run_config.ConfigError, 'cannot parse'):
            restore.environment_from_config('train.env_id = ')
        environment = restore.environment_from_config("train.env_id = 'Pendulum-v1'")
        with self.assertRaisesRegex(run_config.ConfigError, "cannot make environment 'Nope-v0'"):
            environment.make('Nope-v0')


if __name__ == '__main__':
    absltest.main()
