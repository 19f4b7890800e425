"""Tests every native env must pass against Gymnasium's env of its task.

`NativeEnvTests` is the test case each task's test subclasses (setting `NATIVE` and its
policies): trajectories from the same start states under the same actions match Gymnasium's
(observations, rewards, terminated, truncated) over many episodes, with and without the
trainer's wrappers and under XLA; a `simulate.Simulator` rollout gives Gymnasium's episode
returns and lengths; start states are reproducible for a seed; bad input is refused.
`compare_with_gymnasium` is the lock-step runner behind them.
"""

import math
from typing import NamedTuple

import gymnasium as gym
import numpy as np
import tensorflow as tf
from absl.testing import parameterized

from agents.envs import native_batch_env
from agents.tools import simulate, simulate_testing
from agents.tools import wrappers as wrappers_lib


class Trajectories(NamedTuple):
    """[T, N, ...] arrays of the native env and of Gymnasium's, in the same order."""
    native: dict
    gym: dict
    episodes: int  # Episodes that ended, over all envs.


def make_gym_env(native, wrappers=()):
    """Gymnasium's env of the same task, wrapped like the native env by `wrappers`."""
    return wrappers_lib.apply_wrappers(gym.make(native.gym_id), wrappers)


def compare_with_gymnasium(native, num_envs, num_steps, policy, seed=0, wrappers=(),
                           jit_compile=False, resync=False):
    """Steps `num_envs` native and Gymnasium envs in lock-step for `num_steps` steps.

    `policy(observ [N, ...] numpy) -> actions [N, ...]` picks the actions of both. Every
    episode starts from Gymnasium's seeded reset (seeds `seed`, `seed + 1`...), whose state goes
    into the native env through `set_state`, at the step after the previous episode ended.
    With `resync`, every step starts from Gymnasium's state: for chaotic or unstable motion,
    where compiled TF and numpy, which round a few operations differently (TF's graph
    optimizer and XLA reassociate products with constants; numpy's scalar `x**2` is libm's
    `pow`), part after enough steps however precise the state.
    """
    env = native_batch_env.NativeBatchEnv(native, num_envs, seed=seed, wrappers=wrappers)
    gym_envs = [make_gym_env(native, wrappers) for _ in range(num_envs)]
    step = tf.function(env.step, autograph=False, jit_compile=jit_compile)
    set_state = tf.function(env.set_state, autograph=False, reduce_retracing=True)
    records = {'native': [], 'gym': []}
    episodes = resets = 0
    try:
        done = np.ones(num_envs, bool)
        for t in range(num_steps):
            if done.any():
                indices = np.flatnonzero(done)
                starts = [gym_envs[i].reset(seed=seed + resets + k)[0]
                          for k, i in enumerate(indices)]
                resets += len(indices)
                states = [native.from_gym_state(gym_envs[i].unwrapped.state) for i in indices]
                observ = set_state(tf.constant(np.stack(states)), tf.constant(indices, tf.int32))
                np.testing.assert_allclose(
                    observ.numpy(), np.stack(starts), rtol=0, atol=1e-5,
                    err_msg=f'start observations at step {t}')
            if resync:
                states = [native.from_gym_state(gym_env.unwrapped.state) for gym_env in gym_envs]
                set_state(tf.constant(np.stack(states)), tf.range(num_envs), env.elapsed)
            actions = np.asarray(policy(env.observ.numpy()))
            observ, reward, terminated, truncated = (x.numpy() for x in step(actions))
            records['native'].append(dict(
                observ=observ, reward=reward, terminated=terminated, truncated=truncated))
            outcome = [gym_env.step(action) for gym_env, action in zip(
                gym_envs, actions, strict=True)]
            gym_record = dict(
                observ=np.stack([np.asarray(o[0], np.float32) for o in outcome]),
                reward=np.array([o[1] for o in outcome], np.float64),
                terminated=np.array([o[2] for o in outcome]),
                truncated=np.array([o[3] for o in outcome]))
            records['gym'].append(gym_record)
            done = gym_record['terminated'] | gym_record['truncated']
            episodes += int(done.sum())
    finally:
        for gym_env in gym_envs:
            gym_env.close()

    def stack(steps):
        return {key: np.stack([step[key] for step in steps]) for key in steps[0]}

    return Trajectories(stack(records['native']), stack(records['gym']), episodes)


def random_policy(space, seed, scale=1.0):
    """Uniform actions of `space` from a numpy generator of `seed`; a Box is widened by `scale`
    around its centre (> 1 goes out of range)."""
    rng = np.random.default_rng(seed)

    def policy(observ):
        num_envs = len(observ)
        if isinstance(space, gym.spaces.Discrete):
            return rng.integers(space.start, space.start + space.n, num_envs).astype(space.dtype)
        centre, half = (space.high + space.low) / 2, (space.high - space.low) / 2
        sample = rng.uniform(-1, 1, (num_envs,) + space.shape)
        return (centre + scale * half * sample).astype(space.dtype)

    return policy


def mixed_policy(policy, space, seed, random_fraction):
    """`policy`, but each action is random with probability `random_fraction`."""
    rng = np.random.default_rng(seed)
    explore = random_policy(space, seed + 1)

    def mixed(observ):
        actions = np.asarray(policy(observ))
        random = explore(observ)
        pick = rng.uniform(size=len(observ)) < random_fraction
        return np.where(pick.reshape((-1,) + (1,) * (actions.ndim - 1)), random, actions)

    return mixed


class _StateRecorder(simulate.Algorithm):
    """A constant action; hands the physical state each env acts from out as extras."""

    def __init__(self, env, action):
        self._env = env
        self._action = tf.constant(action)

    def perform(self, agent_indices, observ):
        del observ
        shape = tf.concat([tf.shape(agent_indices), tf.shape(self._action)], 0)
        return tf.broadcast_to(self._action, shape), {'state': self._env.state.read_value()}


class NativeEnvTests(parameterized.TestCase):
    """The tests of one native env; subclasses set the attributes below."""

    NATIVE = None  # The NativeEnv class.
    NUM_ENVS = 4
    NUM_STEPS = 1000  # Per lock-step comparison.
    MIN_EPISODES = 8  # Episodes a comparison of NUM_STEPS steps must see end.
    RESYNCED = ()  # Names of policies compared with `resync` (see compare_with_gymnasium).

    def policies(self, space):
        """Named policies for the lock-step comparisons (`random_policy` by default)."""
        return {'random': random_policy(space, 0)}

    def constant_action(self):
        """The action of the Simulator test."""
        return simulate_testing.neutral_action(self.NATIVE.action_space)

    def wrapper_lists(self):
        return [['range_normalize', 'ClipAction']] if isinstance(
            self.NATIVE.action_space, gym.spaces.Box) else [['range_normalize']]

    def assert_trajectories_match(self, trajectories, min_episodes, atol=1e-5):
        native, reference = trajectories.native, trajectories.gym
        for key in ('terminated', 'truncated'):
            np.testing.assert_array_equal(native[key], reference[key], err_msg=key)
        np.testing.assert_allclose(native['observ'], reference['observ'], rtol=0, atol=atol,
                                   err_msg='observations')
        np.testing.assert_allclose(native['reward'], reference['reward'], rtol=0, atol=atol,
                                   err_msg='rewards')
        self.assertGreaterEqual(trajectories.episodes, min_episodes)

    def test_spaces_and_time_limit_equal_gymnasium(self):
        native = self.NATIVE()
        reference = gym.make(native.gym_id)
        self.assertEqual(native.observation_space, reference.observation_space)
        self.assertEqual(native.action_space, reference.action_space)
        self.assertEqual(native.max_episode_steps, reference.spec.max_episode_steps)
        for wrappers in self.wrapper_lists():
            env = native_batch_env.NativeBatchEnv(native, 2, wrappers=wrappers)
            wrapped = make_gym_env(native, wrappers)
            self.assertEqual(env.observation_space, wrapped.observation_space)
            self.assertEqual(env.action_space, wrapped.action_space)

    def test_trajectories_match_gymnasium(self):
        native = self.NATIVE()
        for name, policy in self.policies(native.action_space).items():
            with self.subTest(policy=name):
                self.assert_trajectories_match(compare_with_gymnasium(
                    native, self.NUM_ENVS, self.NUM_STEPS, policy,
                    resync=name in self.RESYNCED), self.MIN_EPISODES)

    def test_trajectories_match_gymnasium_with_wrappers(self):
        native = self.NATIVE()
        for wrappers in self.wrapper_lists():
            # The policies act in the rescaled spaces (ClipAction's is unbounded).
            rescaled = native_batch_env.NativeBatchEnv(native, 1, wrappers=['range_normalize'])
            name, policy = list(self.policies(rescaled.action_space).items())[-1]
            with self.subTest(wrappers=wrappers):
                self.assert_trajectories_match(compare_with_gymnasium(
                    native, self.NUM_ENVS, self.NUM_STEPS // 2, policy, seed=7,
                    wrappers=wrappers, resync=name in self.RESYNCED),
                    max(1, self.MIN_EPISODES // 4))

    def test_trajectories_match_gymnasium_under_xla(self):
        native = self.NATIVE()
        name, policy = list(self.policies(native.action_space).items())[-1]
        trajectories = compare_with_gymnasium(
            native, self.NUM_ENVS, self.NUM_STEPS // 2, policy, seed=3, jit_compile=True,
            resync=name in self.RESYNCED)
        self.assert_trajectories_match(trajectories, max(1, self.MIN_EPISODES // 4))

    def test_simulator_rollout_gives_gymnasium_episodes(self):
        native = self.NATIVE()
        env = native_batch_env.NativeBatchEnv(native, 3, seed=5)
        action = self.constant_action()
        simulator = simulate.Simulator(env, _StateRecorder(env, action))
        num_steps = self.NATIVE.max_episode_steps + 50  # A whole episode and a partial one.
        rollout = tf.nest.map_structure(np.asarray, simulator.rollout(num_steps))
        self.assertTrue(rollout.first[0].all())
        reference = gym.make(native.gym_id)
        checked = 0
        for index in range(len(env)):
            starts = np.flatnonzero(rollout.first[:, index])
            ends = list(starts[1:]) + [num_steps]
            for start, end in zip(starts, ends, strict=True):
                reference.reset(seed=0)
                reference.unwrapped.state = native.to_gym_state(
                    rollout.extras['state'][start, index])
                outcome = [reference.step(action) for _ in range(end - start)]
                rewards = np.array([o[1] for o in outcome])
                np.testing.assert_allclose(
                    rollout.episode_return[start:end, index], np.cumsum(rewards), rtol=1e-5,
                    atol=1e-4, err_msg=f'returns of env {index} from step {start}')
                np.testing.assert_array_equal(
                    rollout.episode_length[start:end, index], np.arange(1, end - start + 1))
                done = rollout.terminated | rollout.truncated
                np.testing.assert_array_equal(
                    done[start:end, index], [o[2] or o[3] for o in outcome])
                np.testing.assert_array_equal(
                    rollout.terminated[start:end, index], [o[2] for o in outcome])
                # Episodes end only where the next one begins (or at the rollout's end).
                self.assertEqual(done[start:end, index].tolist(),
                                 [False] * (end - start - 1) + [bool(done[end - 1, index])])
                if end < num_steps:
                    self.assertTrue(done[end - 1, index])
                checked += bool(done[end - 1, index])
        self.assertGreater(checked, 0)

    def test_start_states_are_reproducible_for_a_seed(self):
        def start_states(seed, resets):
            env = native_batch_env.NativeBatchEnv(self.NATIVE(), 64, seed=seed)
            states = []
            for _ in range(resets):
                env.reset()
                states.append(env.state.numpy())
            return np.stack(states)

        first = start_states(1, 3)
        np.testing.assert_array_equal(first, start_states(1, 3))
        self.assertFalse(np.array_equal(first, start_states(2, 3)))
        # Every reset draws new states.
        self.assertFalse(np.array_equal(first[0], first[1]))

    def test_start_states_spread_like_gymnasium(self):
        native = self.NATIVE()
        env = native_batch_env.NativeBatchEnv(native, 4000, seed=0)
        env.reset()
        ours = np.stack([native.to_gym_state(state) for state in env.state.numpy()])
        reference = gym.make(native.gym_id)
        theirs = []
        for seed in range(400):
            reference.reset(seed=seed)
            theirs.append(np.asarray(reference.unwrapped.state, np.float64))
        theirs = np.stack(theirs)
        low, high = theirs.min(axis=0), theirs.max(axis=0)
        width = np.maximum(high - low, 1e-9)
        self.assertTrue((ours.min(axis=0) >= low - 0.02 * width).all(), ours.min(axis=0))
        self.assertTrue((ours.max(axis=0) <= high + 0.02 * width).all(), ours.max(axis=0))
        # Uniform on the same ranges: the means agree to a few standard errors.
        np.testing.assert_allclose(ours.mean(axis=0), theirs.mean(axis=0),
                                   atol=float(5 * width.max() / math.sqrt(12 * 400)))

    def gymnasium_steps(self, count=300, seed=0):
        """(states, actions, next states, rewards, terminated) of `count` single steps of
        Gymnasium's env from states along random episodes (numpy arrays; states as the
        native env's, next states as Gymnasium's)."""
        native = self.NATIVE()
        reference = gym.make(native.gym_id).unwrapped
        policy = random_policy(native.action_space, seed, scale=1.5)
        steps = []
        reference.reset(seed=seed)
        for index in range(count):
            state = native.from_gym_state(reference.state)
            action = policy(np.zeros(1))[0]
            _, reward, terminated, _, _ = reference.step(action)
            steps.append((state, action, np.array(reference.state, np.float64), reward,
                          terminated))
            if terminated or index % 50 == 49:
                reference.reset(seed=seed + index + 1)
        return tuple(np.stack(column) for column in zip(*steps, strict=True))

    def test_eager_steps_agree_with_gymnasium_to_float64_rounding(self):
        # One step at a time, so chaos cannot amplify differences in the last bits; eagerly,
        # as TF's graph optimizer may reassociate products with constants.
        native = self.NATIVE()
        states, actions, next_states, rewards, terminated = self.gymnasium_steps()
        state, reward, done = native.dynamics(tf.constant(states), tf.constant(actions))
        ours = np.stack([native.to_gym_state(row) for row in state.numpy()])
        np.testing.assert_allclose(ours, next_states, rtol=1e-13, atol=1e-13)
        np.testing.assert_allclose(reward, rewards, rtol=1e-13, atol=1e-13)
        np.testing.assert_array_equal(done, terminated)
        if isinstance(native.action_space, gym.spaces.Box):  # Out-of-range actions seen.
            self.assertTrue((np.abs(actions) > native.action_space.high).any())

    def test_float32_physics_agree_for_a_step(self):
        states, actions, _, _, _ = self.gymnasium_steps(64, seed=1)
        outputs = []
        for dtype in (tf.float64, tf.float32):
            native = self.NATIVE(dtype)
            state, reward, terminated = native.dynamics(
                tf.constant(states, dtype), tf.constant(actions))
            outputs.append((native.observe(state).numpy(), reward.numpy(), terminated.numpy()))
        np.testing.assert_allclose(outputs[1][0], outputs[0][0], rtol=0, atol=1e-5)
        np.testing.assert_allclose(outputs[1][1], outputs[0][1], rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(outputs[1][2], outputs[0][2])

    def test_gym_state_round_trip(self):
        native = self.NATIVE()
        reference = gym.make(native.gym_id)
        reference.reset(seed=3)
        state = native.from_gym_state(reference.unwrapped.state)
        self.assertEqual(state.shape, (native.state_size,))
        np.testing.assert_array_equal(
            native.to_gym_state(state), np.asarray(reference.unwrapped.state))
        with self.assertRaisesRegex(ValueError, 'state must have shape'):
            native.from_gym_state(np.zeros(native.state_size + 5))

    def test_rejects_actions_of_another_shape_or_kind(self):
        env = native_batch_env.NativeBatchEnv(self.NATIVE(), 3)
        env.reset()
        space = env.action_space
        good = np.stack([self.constant_action()] * 3)
        with self.assertRaisesRegex(ValueError, 'action shape'):
            env.step(good[:2])
        wrong_kind = good.astype(np.float32 if space.dtype.kind in 'iu' else np.int32)
        with self.assertRaisesRegex(TypeError, 'action dtype'):
            env.step(wrong_kind)
        # Nothing stepped.
        np.testing.assert_array_equal(env.elapsed.numpy(), [0, 0, 0])
        env.step(good)
        np.testing.assert_array_equal(env.elapsed.numpy(), [1, 1, 1])
