"""Tests of building a run's agent for its spaces."""

from unittest import mock

import gin
import gymnasium as gym
import numpy as np
from absl.testing import absltest

from agents.algorithms import off_policy_testing, registry
from agents.runs import agent_factory, run_config, run_settings

PENDULUM = gym.spaces.Box(-1.0, 1.0, (3,), np.float32), gym.spaces.Box(-1.0, 1.0, (1,))


class _Env:
    observation_space, action_space = PENDULUM


class AgentFactoryTest(absltest.TestCase):

    def setUp(self):
        super().setUp()
        gin.clear_config()
        self.addCleanup(gin.clear_config)

    def settings(self, algorithm, **overrides):
        return run_settings.RunSettings(algorithm=algorithm, env_id='Pendulum-v1',
                                        total_steps=1000, num_envs=2, rollout_length=100,
                                        **overrides)

    def test_an_on_policy_agent_anneals_over_the_runs_iterations(self):
        agent = agent_factory.build_agent(self.settings(registry.ALGORITHMS['PPO']), _Env())
        self.assertEqual(agent.num_envs, 2)
        self.assertEqual(agent._lr_anneal_updates, 5)  # 1000 steps / (2 x 100).
        constant = agent_factory.build_agent(
            self.settings(registry.ALGORITHMS['PPO'], anneal_learning_rate=False), _Env())
        self.assertIsNone(constant._lr_anneal_updates)

    def test_an_off_policy_agent_keeps_its_own_schedules(self):
        agent = agent_factory.build_agent(self.settings(off_policy_testing.OffPolicyTesting),
                                          _Env())
        self.assertEqual(agent.cadence.train_freq, 1)

    def test_a_population_of_the_members_hyperparameters(self):
        settings = self.settings(registry.ALGORITHMS['PPO'], population=2, env_backend='native')
        members, _ = settings.member_overrides()
        agent = agent_factory.build_agent(settings, _Env(), members)
        self.assertEqual(agent.num_members, 2)
        self.assertLen(agent.members, 2)

    def test_bad_hyperparameters_and_a_policy_that_does_not_fit_the_actions(self):
        gin.parse_config('PPO.num_epochs = 0')
        with self.assertRaisesRegex(run_config.ConfigError,
                                    'cannot build the PPO agent: num_epochs must be a positive'):
            agent_factory.build_agent(self.settings(registry.ALGORITHMS['PPO']), _Env())
        gin.clear_config()
        with self.assertRaisesRegex(run_config.ConfigError,
                                    r'acts with float32 actions but the environment\'s action '
                                    r'space Discrete\(2\) is discrete'):
            agent_factory.build_algorithm(registry.ALGORITHMS['PPO'], PENDULUM[0],
                                          gym.spaces.Discrete(2), num_envs=2, seed=0)
        with self.assertRaisesRegex(run_config.ConfigError,
                                    r'SquashedGaussianPolicy acts with float32 actions but the '
                                    r'environment\'s action space Discrete\(2\) is discrete; '
                                    r'SAC trains only on continuous actions$'):
            agent_factory.build_algorithm(registry.ALGORITHMS['SAC'], PENDULUM[0],
                                          gym.spaces.Discrete(2), num_envs=2, seed=0,
                                          buffer_size=16)

    def test_an_action_space_outside_the_algorithms_action_range_is_refused(self):
        sac = registry.ALGORITHMS['SAC']
        gin.parse_config('SAC.buffer_size = 100')
        with self.assertRaisesRegex(
                run_config.ConfigError,
                r"SAC acts in \[-1, 1\] but the environment's action space Box\(-2.0, 2.0, "
                r"\(1,\), float32\) has other bounds; add 'range_normalize' to train.wrappers"):
            agent_factory.build_algorithm(sac, PENDULUM[0], gym.spaces.Box(-2.0, 2.0, (1,)),
                                          num_envs=1, seed=0)
        half_bounded = gym.spaces.Box(np.array([-1.0, 0.0]), np.array([1.0, np.inf]))
        with self.assertRaisesRegex(run_config.ConfigError, 'has other bounds'):
            agent_factory.build_algorithm(sac, PENDULUM[0], half_bounded, num_envs=1, seed=0)
        # Rescaled bounds, and the unbounded space of an outer ClipAction, are SAC's range.
        for space in (PENDULUM[1], gym.spaces.Box(-np.inf, np.inf, (2,))):
            agent = agent_factory.build_algorithm(sac, PENDULUM[0], space, num_envs=1, seed=0)
            self.assertEqual(agent.ACTION_BOUNDS, (-1.0, 1.0))
        # An algorithm of another range is told the wrapper that rescales to it.
        with mock.patch.object(sac, 'ACTION_BOUNDS', (0.0, 1.0)), self.assertRaisesRegex(
                run_config.ConfigError,
                r"SAC acts in \[0, 1\] but the environment's action space Box\(-1.0, 1.0, "
                r"\(1,\), float32\) has other bounds; add \('RescaleAction', \{'min_action': 0, "
                r"'max_action': 1\}\) to train.wrappers$"):
            agent_factory.build_algorithm(sac, PENDULUM[0], PENDULUM[1], num_envs=1, seed=0)
        # An algorithm that declares no range takes any bounds.
        agent_factory.build_algorithm(registry.ALGORITHMS['PPO'], PENDULUM[0],
                                      gym.spaces.Box(-2.0, 2.0, (1,)), num_envs=2, seed=0)


if __name__ == '__main__':
    absltest.main()
