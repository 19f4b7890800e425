"""Tests for restoring a run's agent, and the trainer's policy exports that mirror checkpoints."""

import os
import tempfile

import gin
import gymnasium as gym
import numpy as np
import tensorflow as tf
from absl.testing import absltest

from agents.algorithms.ppo import networks, policy_export, ppo, restore, trainer
from agents.scripts import run_config

# A tiny Pendulum run: three evaluations (256, 512, 768), two checkpoints kept.
TINY_RUN = """
train.env_id = 'Pendulum-v1'
train.total_steps = 768
train.num_envs = 4
train.rollout_length = 64
train.env_mode = 'in_process'
train.eval_every_steps = 256
train.eval_episodes = 1
train.checkpoints_to_keep = 2
PPO.num_minibatches = 4
"""


def observations(count):
    return np.random.default_rng(0).uniform(-1, 1, (count, 3)).astype(np.float32)


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
        cls.logdir = tempfile.mkdtemp(dir=absltest.TEST_TMPDIR.value)
        gin.clear_config()
        gin.parse_config(TINY_RUN)
        trainer.train(cls.logdir)
        gin.clear_config()

    def tearDown(self):
        gin.clear_config()
        super().tearDown()

    def test_trainer_exports_the_policy_of_each_kept_checkpoint(self):
        checkpoints = tf.train.get_checkpoint_state(
            os.path.join(self.logdir, trainer.CHECKPOINT_DIR)).all_model_checkpoint_paths
        self.assertEqual([path.rsplit('-', 1)[-1] for path in checkpoints], ['512', '768'])
        policy_dir = os.path.join(self.logdir, policy_export.POLICY_DIR)
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
                        r'\[32, 1\], expected \[64, 1\] \(and \d+ more\)'),
                (categorical, r'does not fit the configuration.*lacks \d+ variable.*e.g. '
                              'agent/policy/log_std')):
            path = save_checkpoint(directory, agent, 100)
            with self.assertRaisesRegex(run_config.ConfigError, message):
                restore.restore_agent(self.logdir, checkpoint=path)


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
