"""Tests for what PPO and A2C share: argument checks, targets, the guarded gradient step, each
for a lone agent and for a population of members that differ in their hyperparameters."""

import numpy as np
import tensorflow as tf
from absl.testing import absltest, parameterized

from agents.algorithms import actor_critic, advantages, networks, optimizers

HYPERPARAMETERS = dict(learning_rate=0.1, entropy_coef=0.0, discount=0.9, gae_lambda=0.95)


class _Objectiveless(actor_critic.ActorCritic):
    """The shared machinery with a trivial update, to test it alone."""

    def __init__(self, num_envs=2, population=None, seed=0, **kwargs):
        hyperparameters = {name: kwargs.pop(name, value)
                           for name, value in HYPERPARAMETERS.items()}
        arguments = dict(
            observ_shape=(3,), action_size=1, num_envs=num_envs,
            policy_network=networks.FeedForwardGaussianPolicy,
            value_network=networks.FeedForwardValue, optimizer=optimizers.Adam,
            hyperparameters=hyperparameters, lr_anneal_updates=None, max_grad_norm=None,
            normalize_observ=True, observ_clip=5.0, scale_reward=False, reward_clip=10.0,
            jit_compile=False, jit_compile_act=False, seed=seed, population=population,
            name=None)
        super().__init__(**{**arguments, **kwargs})


# Two members that differ in every member hyperparameter.
MEMBERS = ({'seed': 1, 'learning_rate': 0.1, 'discount': 0.9, 'gae_lambda': 0.8},
           {'seed': 2, 'learning_rate': 0.2, 'discount': 0.5, 'gae_lambda': 1.0,
            'entropy_coef': 0.01})


def _population(members=MEMBERS, **kwargs):
    return _Objectiveless(population=[_Objectiveless(**member, **kwargs) for member in members],
                          **kwargs)


def _batch(agent, steps=4, reward=1.0, truncated_at=None):
    """A time-major batch `[T, K * num_envs, ...]`; member 0's first environment ends an
    episode at step 1, terminated (or truncated at `truncated_at`, a step). The recorded values
    (0.5) are not the value network's, so that targets show which of the two they used."""
    num_envs = agent.num_members * agent.num_envs
    observ = tf.random.stateless_normal([steps, num_envs, 3], seed=[1, 2])
    terminated = np.zeros([steps, num_envs], bool)
    truncated = np.zeros([steps, num_envs], bool)
    if truncated_at is None:
        terminated[1, 0] = True
    else:
        truncated[truncated_at, 0] = True
    return {
        'observ': observ, 'next_observ': observ + 1.0,
        'action': tf.zeros([steps, num_envs, 1]),
        'reward': tf.fill([steps, num_envs], reward),
        'terminated': tf.constant(terminated), 'truncated': tf.constant(truncated),
        'extras': {'value': tf.fill([steps, num_envs], 0.5)},
    }


class ActorCriticTest(parameterized.TestCase):

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
        with self.assertRaisesRegex(ValueError, 'gae_lambda must lie in'):
            _Objectiveless(gae_lambda=-0.1)
        with self.assertRaisesRegex(ValueError, 'entropy_coef must be non-negative'):
            _Objectiveless(entropy_coef=-0.1)

    def test_a_population_takes_its_members_seeds_and_hyperparameters(self):
        agent = _population()
        self.assertEqual((agent.num_members, agent.seeds), (2, (1, 2)))
        self.assertLen(agent.members, 2)
        np.testing.assert_allclose(agent.hyperparameter('discount'), [0.9, 0.5])
        np.testing.assert_allclose(agent.hyperparameter('entropy_coef'), [0.0, 0.01])
        np.testing.assert_allclose(agent.optimizer.learning_rate.numpy(), [0.1, 0.2])
        # Member k starts from the weights of the lone agent of its seed.
        for index, member in enumerate(agent.members):
            self.assertEqual(member.num_members, 1)
            for stacked, lone in zip(agent._trainable, member._trainable, strict=True):
                np.testing.assert_array_equal(stacked[index], lone[0])

    @parameterized.parameters((False, None), (True, None), (False, 1), (True, 1), (False, 3))
    def test_targets_are_gae_of_each_members_block(self, population, truncated_at):
        agent = _population() if population else _Objectiveless(gae_lambda=0.8)
        factors = ([(member['discount'], member['gae_lambda']) for member in MEMBERS]
                   if population else [(0.9, 0.8)])
        batch = _batch(agent, truncated_at=truncated_at)
        member_major = tf.nest.map_structure(agent.member_major, batch)
        self.assertEqual(member_major['observ'].shape, (agent.num_members, 4, 2, 3))
        reward, advantage, return_, done = agent._targets(member_major)
        computed = agent.value(agent.normalize(member_major['next_observ'])).numpy()
        # An episode goes on where the next step's recorded value serves: the value network
        # runs on the last step's next observations alone...
        recorded = agent.member_major(batch['extras']['value']).numpy()
        next_value = np.concatenate([recorded[:, 1:], computed[:, -1:]], axis=1)
        if truncated_at == 1:
            # ...unless the member's episode was truncated before the last step: its final
            # observation bootstraps (member 0's; the others' blocks are left as they are).
            next_value[0] = computed[0]
        for index, (discount, gae_lambda) in enumerate(factors):
            block = slice(index * agent.num_envs, (index + 1) * agent.num_envs)
            expected = advantages.generalized_advantage_estimation(
                batch['reward'][:, block], batch['extras']['value'][:, block],
                next_value[index], batch['terminated'][:, block], batch['truncated'][:, block],
                discount, gae_lambda)
            np.testing.assert_allclose(advantage[index], expected[0], rtol=1e-6)
            np.testing.assert_allclose(return_[index], expected[1], rtol=1e-6)
            np.testing.assert_array_equal(reward[index], batch['reward'][:, block])  # Unscaled.
            np.testing.assert_array_equal(
                done[index], (batch['terminated'] | batch['truncated'])[:, block])

    def test_recorded_values_are_the_value_networks_where_episodes_go_on(self):
        # What the targets rely on: a rollout records V(observ) with the weights and statistics
        # the update starts from, so the next step's recorded value is V(next_observ).
        agent = _population()
        observ = tf.random.stateless_normal([3, agent.num_members * agent.num_envs, 3], [3, 4])
        recorded = tf.stack([agent.act(frame, agent.initial_state(len(frame)),
                                       tf.zeros([len(frame)], tf.bool))[1]['value']
                             for frame in observ])
        computed = agent.value(agent.normalize(agent.member_major(observ)))
        np.testing.assert_allclose(agent.member_major(recorded), computed, rtol=1e-5, atol=1e-6)

    def test_nonfinite_loss_or_gradient_is_never_applied(self):
        agent = _Objectiveless()
        before = agent.policy.log_std.numpy()
        for scale, code in ((np.nan, 1), (1.0, 0)):
            with tf.GradientTape() as tape:
                losses = scale * tf.reduce_sum(agent.policy.log_std, axis=1)
            applied, norm, nonfinite = agent._gradient_step(losses, tape)
            self.assertEqual(nonfinite.numpy().tolist(), [code])
            self.assertEqual(applied.numpy().tolist(), [code == 0])
        self.assertTrue(np.all(np.isfinite(norm)))
        self.assertEqual(agent.optimizer.iterations.numpy().tolist(), [1])
        # Only the finite step moved log_std, by the learning rate (Adam's first step is the
        # learning rate times the gradient's sign).
        np.testing.assert_allclose(agent.policy.log_std.numpy(), before - 0.1, rtol=1e-5)

    def test_a_nonfinite_member_stops_alone(self):
        agent = _population()
        before = [variable.numpy() for variable in agent._trainable]
        log_std = agent.policy.log_std.numpy()
        with tf.GradientTape() as tape:
            losses = tf.constant([np.nan, 1.0]) * tf.reduce_sum(agent.policy.log_std, axis=1)
        applied, norm, nonfinite = agent._gradient_step(losses, tape)
        self.assertEqual(nonfinite.numpy().tolist(), [1, 0])
        self.assertEqual(applied.numpy().tolist(), [False, True])
        self.assertTrue(np.isfinite(norm[1]))
        self.assertEqual(agent.optimizer.iterations.numpy().tolist(), [0, 1])
        for variable, value in zip(agent._trainable, before, strict=True):
            np.testing.assert_array_equal(variable[0], value[0])  # Member 0 untouched.
        for slot in agent.optimizer.slots.values():
            self.assertTrue(all(np.all(np.isfinite(variable.numpy())) for variable in slot))
        # Member 1 stepped at its own learning rate.
        np.testing.assert_allclose(agent.policy.log_std[1], log_std[1] - 0.2, rtol=1e-5)

    def test_a_gradient_is_clipped_per_member(self):
        agent = _population(max_grad_norm=1.0)
        with tf.GradientTape() as tape:
            # Gradients of norm 0.5 and 3 (log_std has one entry per member).
            losses = tf.constant([0.5, 3.0]) * tf.reduce_sum(agent.policy.log_std, axis=1)
        gradients, norm, nonfinite = agent._gradient(losses, tape, agent._trainable)
        np.testing.assert_allclose(norm, [0.5, 3.0], rtol=1e-6)
        self.assertEqual(nonfinite.numpy().tolist(), [0, 0])
        log_std = gradients[[variable.ref() for variable in agent._trainable].index(
            agent.policy.log_std.ref())]
        np.testing.assert_allclose(log_std, [[0.5], [1.0]], rtol=1e-6)

    def test_learning_rate_anneals_linearly_to_zero(self):
        agent = _population(lr_anneal_updates=4)
        for count, expected in ((0, 1.0), (2, 0.5), (4, 0.0), (6, 0.0)):
            agent.update_count.assign([count, count])
            agent._anneal_learning_rate()
            np.testing.assert_allclose(agent.optimizer.learning_rate.numpy(),
                                       [0.1 * expected, 0.2 * expected], atol=1e-7)
        agent.update_count.assign([0, 2])  # Each member anneals by its own count.
        agent._anneal_learning_rate()
        np.testing.assert_allclose(agent.optimizer.learning_rate.numpy(), [0.1, 0.1], atol=1e-7)

    @parameterized.parameters(False, True)
    def test_finishing_an_update_counts_it_and_takes_in_the_observations(self, population):
        agent = _population() if population else _Objectiveless()
        batch = _batch(agent)
        agent._finish_update(tf.nest.map_structure(agent.member_major, batch))
        self.assertEqual(agent.update_count.numpy().tolist(), [1] * agent.num_members)
        self.assertEqual(agent.observ_normalizer.count.numpy().tolist(), [8] * agent.num_members)
        for index in range(agent.num_members):  # Each member's statistics are of its block.
            block = batch['observ'][:, index * 2:(index + 1) * 2].numpy().reshape(-1, 3)
            np.testing.assert_allclose(agent.observ_normalizer.mean[index], block.mean(0),
                                       rtol=1e-5)

    def test_interface(self):
        agent = _Objectiveless()
        self.assertEqual(agent.action_dtype, tf.float32)
        self.assertEqual((agent.num_members, agent.members), (1, [agent]))
        self.assertEqual(set(agent.acting_modules()), {'policy', 'value', 'observ_normalizer'})
        policy, normalizer = agent.exported_policy()
        self.assertIs(policy, agent.policy)
        self.assertIs(normalizer, agent.observ_normalizer)
        states = {variable.ref() for variable in agent.undo_variables()}
        for variable in (agent.sampling_seeds.draws, agent.update_count,
                         agent.optimizer.iterations, agent.optimizer.slots['momentum'][0],
                         agent.optimizer.slots['velocity'][-1]):
            self.assertIn(variable.ref(), states)
        action, extras, state = agent.act(tf.zeros([2, 3]), (), tf.ones([2], tf.bool))
        self.assertEqual(action.shape, (2, 1))
        self.assertEqual(set(extras), {'value'})
        self.assertEqual(extras['value'].shape, (2,))
        self.assertEqual(state, ())
        self.assertEqual(agent.sampling_seeds.draws.numpy().tolist(), [1])

    def test_a_population_acts_as_its_members_do(self):
        agent = _population()
        observ = tf.random.stateless_normal([4, 3], seed=[3, 4])
        for greedy in (True, False):
            action, extras, _ = agent.act(observ, (), tf.ones([4], tf.bool), greedy=greedy)
            self.assertEqual((action.shape, extras['value'].shape), ((4, 1), (4,)))
            for index, member in enumerate(agent.members):
                block = slice(index * 2, (index + 1) * 2)
                member_action, member_extras, _ = member.act(observ[block], (),
                                                             tf.ones([2], tf.bool), greedy=greedy)
                np.testing.assert_allclose(action[block], member_action, rtol=1e-5, atol=1e-6)
                np.testing.assert_allclose(extras['value'][block], member_extras['value'],
                                           rtol=1e-5, atol=1e-6)

    def test_undo_restores_the_masked_members_alone(self):
        agent = _population()
        pairs = [(variable, tf.Variable(variable)) for variable in agent.undo_variables()]
        for variable in (agent.policy.log_std, agent.update_count):
            variable.assign_add(tf.ones_like(variable))
        agent.undo(tf.constant([True, False]), pairs)
        np.testing.assert_array_equal(agent.update_count.numpy(), [0, 1])
        np.testing.assert_array_equal(agent.policy.log_std.numpy(), [[0.0], [1.0]])


if __name__ == '__main__':
    absltest.main()
