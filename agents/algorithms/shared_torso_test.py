"""Tests the shared-torso policy: its heads on one torso pass, initialization, the member axis,
the actor-critics built on it (errors, frames kept uint8 to the torso) and PPO and A2C learning
from frames."""

import functools

import numpy as np
import tensorflow as tf
from absl.testing import absltest, parameterized

from agents.algorithms import conv_torsos, networks, shared_torso
from agents.algorithms.a2c import a2c
from agents.algorithms.ppo import ppo

# Small frames for a fast torso: channels first, as EnvPool gives them.
FRAME_SHAPE = (2, 8, 8)
SMALL_IMPALA = functools.partial(conv_torsos.ImpalaCNN, channels=(4,), features=16)


def _frames(shape, seed=0):
    return tf.constant(np.random.default_rng(seed).integers(0, 256, size=shape, dtype=np.uint8))


def _policy(action_size=3, seed=0, torso=SMALL_IMPALA):
    return shared_torso.SharedTorsoCategoricalPolicy(FRAME_SHAPE, action_size, torso=torso,
                                                     seed=seed)


class RecordingTorso(conv_torsos.ImpalaCNN):
    """A small IMPALA torso that records the dtype of every batch of frames it is traced with."""

    dtypes = []

    def __call__(self, frames):
        self.dtypes.append(tf.convert_to_tensor(frames).dtype)
        return super().__call__(frames)


def _agent(algorithm=ppo.PPO, torso=SMALL_IMPALA, **kwargs):
    policy = functools.partial(shared_torso.SharedTorsoCategoricalPolicy, torso=torso)
    settings = dict(policy_network=policy, value_network=None, normalize_observ=False,
                    jit_compile=False)
    if algorithm is ppo.PPO:
        settings.update(num_epochs=2, num_minibatches=2)
    return algorithm(FRAME_SHAPE, 2, **{'num_envs': 8, **settings, **kwargs})


def _bright_bandit_batch(agent, num_envs, seed):
    """One-step episodes: the frame is bright or dark, and action 1 pays on bright frames, 0 on
    dark ones. Returns (batch, fraction of rewarded actions)."""
    rng = np.random.default_rng(seed)
    bright = rng.uniform(size=num_envs) < 0.5
    observ = np.where(bright[:, None, None, None], 200, 30).astype(np.uint8)
    observ = np.broadcast_to(observ, (num_envs, *FRAME_SHAPE)).copy()
    observ = tf.constant(observ)
    action, extras, _ = agent.act(observ, (), tf.ones([num_envs], tf.bool))
    reward = tf.cast(tf.equal(action, tf.constant(bright, tf.int32)), tf.float32)
    batch = {
        'observ': observ[None], 'action': action[None], 'reward': reward[None],
        'terminated': tf.ones([1, num_envs], tf.bool),
        'truncated': tf.zeros([1, num_envs], tf.bool),
        'next_observ': tf.zeros_like(observ)[None],
        'extras': tf.nest.map_structure(lambda tensor: tensor[None], extras)}
    return batch, float(tf.reduce_mean(reward))


class SharedTorsoCategoricalPolicyTest(parameterized.TestCase):

    @parameterized.parameters(1, 2)
    def test_heads_share_one_torso_pass(self, num_members):
        policy = _policy(seed=list(range(num_members)))
        frames = _frames((num_members, 5, *FRAME_SHAPE))
        params, value = policy.params_and_value(frames)
        self.assertEqual(params['logits'].shape, (num_members, 5, 3))
        self.assertEqual(value.shape, (num_members, 5))
        features = policy.torso(frames)
        np.testing.assert_allclose(params['logits'], policy.logits(features), rtol=1e-5,
                                   atol=1e-6)
        np.testing.assert_allclose(value, policy.value_head(features)[..., 0], rtol=1e-5,
                                   atol=1e-6)
        np.testing.assert_allclose(policy.value(frames), value, rtol=1e-6)
        np.testing.assert_allclose(policy.step(frames, ())[0]['logits'], params['logits'],
                                   rtol=1e-6)

    def test_sequences_of_frames(self):
        policy = _policy()
        frames = _frames((1, 4, 3, *FRAME_SHAPE))  # [K, L, B, ...]
        params, value = policy.params_and_value(frames)
        self.assertEqual(params['logits'].shape, (1, 4, 3, 3))
        self.assertEqual(value.shape, (1, 4, 3))
        np.testing.assert_allclose(
            policy.sequence(frames, (), None)['logits'][0, 2],
            policy.params_and_value(frames[:, 2])[0]['logits'][0], rtol=1e-5, atol=1e-6)

    def test_heads_are_initialized_as_cleanrls(self):
        policy = _policy(action_size=4)
        for head, gain in ((policy.logits, shared_torso.POLICY_HEAD_GAIN),
                           (policy.value_head, shared_torso.VALUE_HEAD_GAIN)):
            kernel = head.kernel.numpy()[0]  # [features, outputs]: orthogonal columns.
            np.testing.assert_allclose(kernel.T @ kernel, gain**2 * np.eye(kernel.shape[1]),
                                       atol=1e-6 * gain**2 + 1e-7)
            np.testing.assert_array_equal(head.bias.numpy(), 0.0)

    def test_members_are_the_lone_policies_of_their_seeds(self):
        population = _policy(seed=[3, 8])
        frames = _frames((2, 4, *FRAME_SHAPE))
        params, value = population.params_and_value(frames)
        for k, seed in enumerate((3, 8)):
            lone_params, lone_value = _policy(seed=seed).params_and_value(frames[k:k + 1])
            np.testing.assert_allclose(params['logits'][k], lone_params['logits'][0], rtol=1e-5,
                                       atol=1e-6)
            np.testing.assert_allclose(value[k], lone_value[0], rtol=1e-5, atol=1e-6)

    def test_declares_its_capabilities(self):
        self.assertTrue(_policy().has_value_head)
        self.assertTrue(_policy().takes_frames)
        mlp = networks.FeedForwardCategoricalPolicy((3,), 2)
        self.assertFalse(mlp.has_value_head)
        self.assertFalse(mlp.takes_frames)

    def test_float_frames_are_refused(self):
        with self.assertRaisesRegex(TypeError, 'expected uint8'):
            _policy().value(tf.zeros((1, 2, *FRAME_SHAPE)))


class ActorCriticOnASharedTorsoTest(parameterized.TestCase):

    @parameterized.parameters(ppo.PPO, a2c.A2C)
    def test_has_no_value_network_and_trains_the_torso(self, algorithm):
        agent = _agent(algorithm)
        self.assertIsNone(agent.value)
        self.assertNotIn('value', agent.acting_modules())
        torso = [variable.numpy() for variable in agent.policy.torso.trainable_variables]
        batch, _ = _bright_bandit_batch(agent, 8, seed=0)
        agent.update(batch)
        moved = [not np.array_equal(before, after.numpy()) for before, after in zip(
            torso, agent.policy.torso.trainable_variables, strict=True)]
        self.assertTrue(all(moved))

    @parameterized.parameters(ppo.PPO, a2c.A2C)
    def test_frames_reach_the_torso_as_bytes(self, algorithm):
        RecordingTorso.dtypes = []
        agent = _agent(algorithm, torso=functools.partial(RecordingTorso, channels=(4,),
                                                          features=16))
        batch, _ = _bright_bandit_batch(agent, 8, seed=0)
        agent.update(batch)
        self.assertGreaterEqual(len(RecordingTorso.dtypes), 3)  # Acting, targets, the loss.
        self.assertEqual(set(RecordingTorso.dtypes), {tf.uint8})

    @parameterized.parameters(
        (ppo.PPO, dict(learning_rate=2.5e-4 * 8, num_epochs=4)),
        (a2c.A2C, dict(learning_rate=3e-3)))
    def test_learns_to_act_on_what_the_frame_shows(self, algorithm, settings):
        agent = _agent(algorithm, num_envs=32, scale_reward=False, entropy_coef=0.0,
                       **settings)
        for update in range(40):
            batch, accuracy = _bright_bandit_batch(agent, 32, seed=update)
            agent.update(batch)
        accuracies = [_bright_bandit_batch(agent, 32, seed=1000 + index)[1]
                      for index in range(3)]
        self.assertGreater(np.mean(accuracies), 0.9)

    def test_misconfigurations_are_refused(self):
        policy = functools.partial(shared_torso.SharedTorsoCategoricalPolicy, torso=SMALL_IMPALA)
        with self.assertRaisesRegex(ValueError, 'set value_network = None'):
            ppo.PPO(FRAME_SHAPE, 2, 4, policy_network=policy, normalize_observ=False)
        with self.assertRaisesRegex(ValueError, 'normalize_observ = False'):
            ppo.PPO(FRAME_SHAPE, 2, 4, policy_network=policy, value_network=None)
        with self.assertRaisesRegex(ValueError, 'needs a policy with a value head'):
            ppo.PPO((3,), 2, 4, policy_network=networks.FeedForwardCategoricalPolicy,
                    value_network=None)
        with self.assertRaisesRegex(ValueError, 'there is one network'):
            ppo.PPO(FRAME_SHAPE, 2, 4, policy_network=policy, value_network=None,
                    normalize_observ=False, concurrent_networks=True)


if __name__ == '__main__':
    absltest.main()
