"""Tests for the evaluation loop: returns, per-episode seeds, policy state, space checks."""

import gymnasium as gym
import numpy as np
from absl.testing import absltest

from agents.tools import evaluation


class SwingPolicy:
    """A deterministic feed-forward policy for Pendulum: push along the angular velocity."""

    def initial_state(self, batch_size):
        del batch_size
        return ()

    def __call__(self, observ, state, reset):
        return np.clip(observ[:, 2:3], -2.0, 2.0).astype(np.float32), state


class CountingPolicy:
    """A recurrent policy whose state counts the steps since the last reset."""

    def __init__(self):
        self.calls = []

    def initial_state(self, batch_size):
        return np.full([batch_size], -100)

    def __call__(self, observ, state, reset):
        state = np.where(reset, 0, state) + 1
        self.calls.append((bool(reset[0]), int(state[0])))
        return np.zeros([len(observ), 1], np.float32), state


def reference_returns(policy, seeds):
    """Pendulum episodes run by hand, each from its own seed."""
    returns = []
    for seed in seeds:
        env = gym.make('Pendulum-v1')
        observ, _ = env.reset(seed=seed)
        total, done = 0.0, False
        while not done:
            action, _ = policy(observ[None], (), np.array([False]))
            observ, reward, terminated, truncated, _ = env.step(action[0])
            total += reward
            done = terminated or truncated
        returns.append(total)
    return returns


class RunEpisodesTest(absltest.TestCase):

    def test_returns_match_a_hand_written_loop_with_per_episode_seeds(self):
        env = gym.make('Pendulum-v1')
        steps = []
        episodes = evaluation.run_episodes(env, SwingPolicy(), 3, seed=10,
                                           on_step=lambda index, step: steps.append((index, step)))
        self.assertEqual([episode.seed for episode in episodes], [10, 11, 12])
        self.assertEqual([episode.index for episode in episodes], [0, 1, 2])
        self.assertEqual([episode.length for episode in episodes], [200] * 3)
        np.testing.assert_allclose([episode.episode_return for episode in episodes],
                                   reference_returns(SwingPolicy(), [10, 11, 12]), rtol=1e-12)
        # on_step: after each reset and after each of the 200 steps.
        self.assertEqual(steps, [(index, step) for index in range(3) for step in range(201)])

    def test_an_episode_replays_alone_from_its_seed(self):
        env = gym.make('Pendulum-v1')
        all_three = evaluation.run_episodes(env, SwingPolicy(), 3, seed=0)
        third = evaluation.run_episodes(env, SwingPolicy(), 1, seed=2)
        self.assertEqual(third[0].episode_return, all_three[2].episode_return)
        self.assertNotEqual(all_three[0].episode_return, all_three[1].episode_return)

    def test_policy_state_is_carried_and_reset_at_each_episode_start(self):
        env = gym.make('Pendulum-v1', max_episode_steps=4)
        policy = CountingPolicy()
        evaluation.run_episodes(env, policy, 2)
        self.assertEqual(policy.calls, [(True, 1), (False, 2), (False, 3), (False, 4)] * 2)

    def test_max_steps_ends_episodes(self):
        episodes = evaluation.run_episodes(gym.make('Pendulum-v1'), SwingPolicy(), 2,
                                           max_steps=7)
        self.assertEqual([episode.length for episode in episodes], [7, 7])

    def test_iterate_yields_each_episode_when_it_ends(self):
        steps = []
        iterator = evaluation.iterate_episodes(
            gym.make('Pendulum-v1', max_episode_steps=5), SwingPolicy(), 2,
            on_step=lambda index, step: steps.append(step))
        first = next(iterator)
        self.assertEqual((first.index, first.length, len(steps)), (0, 5, 6))
        self.assertEqual(next(iterator).index, 1)

    def test_bad_num_episodes(self):
        with self.assertRaisesRegex(ValueError, 'num_episodes must be a positive integer'):
            evaluation.run_episodes(gym.make('Pendulum-v1'), SwingPolicy(), 0)


class SummarizeTest(absltest.TestCase):

    def test_statistics(self):
        episodes = [evaluation.Episode(0, 0, -10.0, 200), evaluation.Episode(1, 1, -30.0, 100)]
        summary = evaluation.summarize(episodes)
        self.assertEqual(summary, {
            'num_episodes': 2, 'mean_return': -20.0, 'std_return': 10.0, 'min_return': -30.0,
            'max_return': -10.0, 'mean_length': 150.0, 'min_length': 100, 'max_length': 200,
            'returns': [-10.0, -30.0], 'lengths': [200, 100]})
        with self.assertRaisesRegex(ValueError, 'no episodes'):
            evaluation.summarize([])


class CheckSpacesTest(absltest.TestCase):

    def test_matching_spaces_pass(self):
        env = gym.make('Pendulum-v1')
        evaluation.check_spaces(env, env.observation_space, env.action_space)
        env = gym.make('CartPole-v1')
        evaluation.check_spaces(env, gym.spaces.Box(-1, 1, (4,)), gym.spaces.Discrete(2))

    def test_mismatches_name_the_environment_and_the_spaces(self):
        pendulum = gym.make('Pendulum-v1')
        cartpole = gym.make('CartPole-v1')
        box = gym.spaces.Box(-2.0, 2.0, (1,), np.float32)
        cases = [
            (cartpole, pendulum.observation_space, box, 'CartPole-v1 has observation space'),
            (pendulum, pendulum.observation_space, gym.spaces.Discrete(2),
             'Pendulum-v1 has action space'),
            (cartpole, cartpole.observation_space, box, 'CartPole-v1 has action space'),
            (cartpole, cartpole.observation_space, gym.spaces.Discrete(3), 'acts in Discrete'),
            (pendulum, pendulum.observation_space, gym.spaces.Box(-1.0, 1.0, (1,), np.float32),
             'acts in Box'),
        ]
        for env, observation_space, action_space, message in cases:
            with self.assertRaisesRegex(ValueError, message):
                evaluation.check_spaces(env, observation_space, action_space)


if __name__ == '__main__':
    absltest.main()
