"""Tests for registry: native envs by Gymnasium id, configurable through gin."""

import gin
import gymnasium as gym
import tensorflow as tf
from absl.testing import absltest, parameterized

import agents.envs
from agents.envs import native_batch_env, registry


class RegistryTest(parameterized.TestCase):

    def tearDown(self):
        gin.clear_config()
        super().tearDown()

    @parameterized.parameters(
        'Pendulum-v1', 'CartPole-v1', 'MountainCarContinuous-v0', 'Acrobot-v1')
    def test_make_gives_the_native_twin_of_a_gymnasium_id(self, env_id):
        env = agents.envs.make(env_id, num_envs=5, seed=1)
        self.assertIsInstance(env, native_batch_env.NativeBatchEnv)
        self.assertLen(env, 5)
        self.assertEqual(env.env.gym_id, env_id)
        self.assertEqual(env.env.dtype, tf.float64)
        reference = gym.make(env_id)
        self.assertEqual(env.observation_space, reference.observation_space)
        self.assertEqual(env.action_space, reference.action_space)
        self.assertTrue(agents.envs.has_native_env(env_id))

    def test_unknown_id_lists_the_known_ones(self):
        with self.assertRaisesRegex(ValueError, r"'HalfCheetah-v5'.*'Acrobot-v1', 'CartPole-v1'"):
            agents.envs.make('HalfCheetah-v5', 4)
        self.assertFalse(agents.envs.has_native_env('HalfCheetah-v5'))
        self.assertEqual(sorted(registry.ENVS), [
            'Acrobot-v1', 'CartPole-v1', 'MountainCarContinuous-v0', 'Pendulum-v1'])

    def test_configurable_through_gin(self):
        gin.parse_config("""
            agents.envs.make.dtype = 'float32'
            agents.envs.make.wrappers = ['range_normalize']
        """)
        env = agents.envs.make('Pendulum-v1', 2, seed=3)
        self.assertEqual(env.env.dtype, tf.float32)
        self.assertEqual(env.observation_space.high.tolist(), [1, 1, 1])

    def test_bad_dtype_is_refused(self):
        with self.assertRaisesRegex(ValueError, 'dtype must be one of'):
            agents.envs.make('CartPole-v1', 2, dtype='int32')


if __name__ == '__main__':
    absltest.main()
