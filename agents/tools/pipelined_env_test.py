"""Tests the pipelined VectorEnv: groups stepped apart give one batch's outcomes, in order;
misuse and failures are named. (simulate_test.py checks whole rollouts against one batch's.)"""

import threading

import gymnasium as gym
import numpy as np
from absl.testing import absltest

from agents.tools import batch_env, pipelined_env

DISABLED = gym.vector.AutoresetMode.DISABLED


def _pendulums(num_envs, **kwargs):
    return batch_env.BatchEnv([lambda: gym.make('Pendulum-v1', max_episode_steps=5)] * num_envs,
                              mode='in_process', autoreset_mode=DISABLED, **kwargs)


class _FailingEnv(gym.Env):
    observation_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
    action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(1, np.float32), {}

    def step(self, action):
        raise RuntimeError('the physics blew up')


class _BlockingGroup(gym.vector.VectorWrapper):
    """A group whose step waits for `release`, to see what happens while it steps."""

    def __init__(self, env):
        super().__init__(env)
        self.release = threading.Event()

    def step(self, actions):
        self.release.wait(10)
        return self.env.step(actions)


class PipelinedVectorEnvTest(absltest.TestCase):

    def make(self, *groups):
        env = pipelined_env.PipelinedVectorEnv(groups)
        self.addCleanup(env.close)
        return env

    def test_groups_step_and_reset_as_one_batch(self):
        batch = _pendulums(4)
        self.addCleanup(batch.close)
        pipelined = self.make(_pendulums(2), _pendulums(2))
        self.assertEqual((pipelined.num_envs, pipelined.num_groups, pipelined.group_size),
                         (4, 2, 2))
        self.assertEqual(pipelined.group_slice(1), slice(2, 4))
        np.testing.assert_array_equal(pipelined.reset(seed=3)[0], batch.reset(seed=3)[0])
        actions = np.linspace(-2, 2, 4, dtype=np.float32)[:, None]
        for _ in range(5):  # To the time limit.
            expected = batch.step(actions)[:4]
            outcome = pipelined.step(actions)[:4]
            for want, got in zip(expected, outcome, strict=True):
                np.testing.assert_array_equal(got, want)
        self.assertTrue(outcome[3].all())  # Truncated: a partial reset is needed.
        mask = np.array([False, True, True, False])
        np.testing.assert_array_equal(
            pipelined.reset(options={'reset_mask': mask})[0][mask],
            batch.reset(options={'reset_mask': mask})[0][mask])

    def test_one_group_steps_while_another_is_reset(self):
        blocked = _BlockingGroup(_pendulums(2))
        env = self.make(blocked, _pendulums(2))
        env.reset(seed=0)
        env.step_group_async(0, np.zeros((2, 1), np.float32))
        # Group 1 is idle: its reset goes ahead while group 0 steps.
        env.reset(options={'reset_mask': np.array([False, False, True, False])})
        with self.assertRaisesRegex(gym.error.AlreadyPendingCallError, 'group 0 while it is'):
            env.reset(options={'reset_mask': np.array([True, False, False, False])})
        with self.assertRaisesRegex(gym.error.AlreadyPendingCallError, 'already stepping'):
            env.step_group_async(0, np.zeros((2, 1), np.float32))
        blocked.release.set()
        observ, reward, terminated, truncated = env.step_group_wait(0)
        self.assertEqual(observ.shape, (2, 3))
        self.assertFalse(terminated.any() or truncated.any())
        with self.assertRaisesRegex(gym.error.NoAsyncCallError, 'no step to wait for'):
            env.step_group_wait(0)

    def test_a_failed_step_is_kept_and_raised_where_it_is_waited_for(self):
        env = self.make(*(batch_env.BatchEnv([_FailingEnv] * 2, mode='in_process',
                                             autoreset_mode=DISABLED) for _ in range(2)))
        env.reset(seed=0)
        env.step_group_async(1, np.zeros((2, 1), np.float32))
        with self.assertRaisesRegex(batch_env.EnvError, 'the physics blew up'):
            env.step_group_wait(1)
        self.assertIsInstance(env.failure, batch_env.EnvError)
        env.failure = None
        self.assertIsNone(env.failure)

    def test_groups_must_match_and_reset_themselves(self):
        with self.assertRaisesRegex(ValueError, 'at least 2 groups'):
            self.make(_pendulums(2))
        with self.assertRaisesRegex(ValueError, 'equal sizes and spaces'):
            self.make(_pendulums(2), _pendulums(1))
        autoresetting = gym.vector.SyncVectorEnv([lambda: gym.make('Pendulum-v1')] * 2)
        self.addCleanup(autoresetting.close)
        with self.assertRaisesRegex(ValueError, 'autoreset disabled'):
            self.make(_pendulums(2), autoresetting)

    def test_close_closes_the_groups(self):
        groups = [_pendulums(1), _pendulums(1)]
        env = pipelined_env.PipelinedVectorEnv(groups)
        env.reset(seed=0)
        env.step_group_async(0, np.zeros((1, 1), np.float32))
        env.close()
        self.assertTrue(all(group.closed for group in groups))


if __name__ == '__main__':
    absltest.main()
