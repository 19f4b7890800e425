"""Tests for what PPO and A2C share: argument checks, targets, the guarded gradient step."""

import numpy as np
import tensorflow as tf
from absl.testing import absltest

from agents.algorithms import actor_critic, advantages, networks


class _Objectiveless(actor_critic.ActorCritic):
    """The shared machinery with a trivial update, to test it alone."""

    def __init__(self, num_envs=2, **kwargs):
        arguments = dict(
            observ_shape=(3,), action_size=1, num_envs=num_envs,
            policy_network=networks.FeedForwardGaussianPolicy,
            value_network=networks.FeedForwardValue,
            optimizer=tf.keras.optimizers.SGD(0.1), discount=0.9, learning_rate=0.1,
            lr_anneal_updates=None, max_grad_norm=None, normalize_observ=True, observ_clip=5.0,
            scale_reward=False, reward_clip=10.0, jit_compile=False, jit_compile_act=False,
            seed=0, name=None)
        super().__init__(**{**arguments, **kwargs})


def _batch(agent, steps=4, reward=1.0):
    observ = tf.random.stateless_normal([steps, agent.num_envs, 3], seed=[1, 2])
    done = np.zeros([steps, agent.num_envs], bool)
    done[1, 0] = True
    return {
        'observ': observ, 'next_observ': observ + 1.0,
        'action': tf.zeros([steps, agent.num_envs, 1]),
        'reward': tf.fill([steps, agent.num_envs], reward),
        'terminated': tf.constant(done), 'truncated': tf.zeros_like(done),
        'extras': {'value': tf.fill([steps, agent.num_envs], 0.5)},
    }


class ActorCriticTest(absltest.TestCase):

    def test_check_arguments_names_the_first_bad_one(self):
        actor_critic.check_arguments(positive=('a',), a=None)  # None always passes.
        for kind, value, message in (
                ('positive_int', 2.0, 'a must be a positive integer, got 2.0.'),
                ('positive_int', True, 'a must be a positive integer, got True.'),
                ('positive', 0.0, 'a must be positive, got 0.0.'),
                ('unit_interval', 1.5, r'a must lie in \[0, 1\], got 1.5.'),
                ('non_negative', -1, 'a must be non-negative, got -1.')):
            with self.subTest(kind=kind), self.assertRaisesRegex(ValueError, message):
                actor_critic.check_arguments(**{kind: ('a',)}, a=value)

    def test_shared_arguments_are_checked(self):
        with self.assertRaisesRegex(ValueError, 'learning_rate must be positive'):
            _Objectiveless(learning_rate=-1.0)
        with self.assertRaisesRegex(ValueError, 'discount must lie in'):
            _Objectiveless(discount=1.5)

    def test_targets_are_gae_of_the_batch(self):
        agent = _Objectiveless()
        batch = _batch(agent)
        reward, advantage, return_, done = agent._targets(batch, gae_lambda=0.8)
        expected = advantages.generalized_advantage_estimation(
            batch['reward'], batch['extras']['value'],
            agent.value(agent.normalize(batch['next_observ'])), batch['terminated'],
            batch['truncated'], 0.9, 0.8)
        np.testing.assert_allclose(advantage, expected[0], rtol=1e-6)
        np.testing.assert_allclose(return_, expected[1], rtol=1e-6)
        np.testing.assert_array_equal(reward, batch['reward'])  # Not scaled.
        np.testing.assert_array_equal(done, batch['terminated'])

    def test_nonfinite_loss_or_gradient_is_never_applied(self):
        agent = _Objectiveless()
        before = [variable.numpy() for variable in agent.policy.trainable_variables]
        for scale, code in ((np.nan, 1), (1.0, 0)):
            with tf.GradientTape() as tape:
                loss = scale * tf.reduce_sum(agent.policy.log_std)
            applied, norm, nonfinite = agent._gradient_step(loss, tape)
            self.assertEqual(int(nonfinite), code)
            self.assertEqual(bool(applied), code == 0)
        self.assertTrue(np.isfinite(norm))
        after = [variable.numpy() for variable in agent.policy.trainable_variables]
        # Only the finite step moved log_std, by the learning rate times its gradient (one).
        np.testing.assert_allclose(after[0], before[0] - 0.1)

    def test_learning_rate_anneals_linearly_to_zero(self):
        agent = _Objectiveless(lr_anneal_updates=4)
        for count, expected in ((0, 0.1), (2, 0.05), (4, 0.0), (6, 0.0)):
            agent.update_count.assign(count)
            agent._anneal_learning_rate()
            self.assertAlmostEqual(float(agent.optimizer.learning_rate), expected, places=6)

    def test_finishing_an_update_counts_it_and_takes_in_the_observations(self):
        agent = _Objectiveless()
        agent._finish_update(_batch(agent))
        self.assertEqual(int(agent.update_count), 1)
        self.assertEqual(int(agent.observ_normalizer.count), 8)

    def test_interface(self):
        agent = _Objectiveless()
        self.assertEqual(agent.action_dtype, tf.float32)
        self.assertEqual(set(agent.acting_modules()), {'policy', 'value', 'observ_normalizer'})
        policy, normalizer = agent.exported_policy()
        self.assertIs(policy, agent.policy)
        self.assertIs(normalizer, agent.observ_normalizer)
        states = {variable.ref() for variable in agent.undo_variables()}
        self.assertIn(agent.random.state.ref(), states)
        self.assertIn(agent.update_count.ref(), states)
        action, extras, state = agent.act(tf.zeros([2, 3]), (), tf.ones([2], tf.bool))
        self.assertEqual(action.shape, (2, 1))
        self.assertEqual(set(extras), {'value'})
        self.assertEqual(state, ())


if __name__ == '__main__':
    absltest.main()
