"""Tests PPOPopulation against lone PPO agents: same actions, updates and state per member."""

import functools

import numpy as np
import tensorflow as tf
from absl.testing import absltest, parameterized

from agents.algorithms import networks
from agents.algorithms.ppo import population, ppo

NUM_ENVS = 4
STEPS = 16
OBSERV_SIZE = 3


def _make(policy='gaussian', **kwargs):
    """The lone agents' constructor: `(seed, **scalars) -> PPO`."""
    network = {'gaussian': networks.FeedForwardGaussianPolicy,
               'categorical': networks.FeedForwardCategoricalPolicy}[policy]
    action_size = 2 if policy == 'gaussian' else 3
    return functools.partial(
        ppo.PPO, (OBSERV_SIZE,), action_size, NUM_ENVS, policy_network=network,
        num_epochs=2, num_minibatches=4, lr_anneal_updates=10, **kwargs)


def _state(agent):
    return [variable.numpy() for variable in tf.nest.flatten(population._lone_state(agent))]


def _iterate(agents, num_members, iterations, seed=0, poison=None):
    """Acts and updates `iterations` times on made-up observations and rewards; `agents` is a
    population or a list of lone agents (member k on the k-th block of environments). Returns
    the actions and metrics of each iteration. `poison`: a member whose rewards are NaN."""
    rng = np.random.default_rng(seed)
    num_envs = num_members * NUM_ENVS
    blocks = [slice(k * NUM_ENVS, (k + 1) * NUM_ENVS) for k in range(num_members)]
    history = []
    for _ in range(iterations):
        observ = rng.normal(size=(STEPS, num_envs, OBSERV_SIZE)).astype(np.float32) * 3.0
        steps = []
        for t in range(STEPS):
            if isinstance(agents, list):
                outputs = [agent.act(observ[t, block], (), tf.zeros([NUM_ENVS], tf.bool))
                           for agent, block in zip(agents, blocks, strict=True)]
                steps.append(tf.nest.map_structure(
                    lambda *parts: tf.concat(parts, 0), *[output[:2] for output in outputs]))
            else:
                steps.append(agents.act(observ[t], (), tf.zeros([num_envs], tf.bool))[:2])
        action, extras = tf.nest.map_structure(lambda *parts: tf.stack(parts), *steps)
        reward = rng.normal(size=(STEPS, num_envs)).astype(np.float32)
        if poison is not None:
            reward[:, blocks[poison]] = np.nan
        batch = {
            'observ': observ, 'action': action, 'reward': reward,
            'terminated': rng.random((STEPS, num_envs)) < 0.05,
            'truncated': rng.random((STEPS, num_envs)) < 0.05,
            'next_observ': rng.normal(size=(STEPS, num_envs, OBSERV_SIZE)).astype(np.float32),
            'extras': extras,
        }
        if isinstance(agents, list):
            metrics = [agent.update(tf.nest.map_structure(lambda x, b=block: x[:, b], batch))
                       for agent, block in zip(agents, blocks, strict=True)]
            metrics = tf.nest.map_structure(lambda *values: np.array([float(v) for v in values]),
                                            *metrics)
        else:
            metrics = tf.nest.map_structure(lambda value: value.numpy(), agents.update(batch))
        metrics.update({f'nonfinite/{name}': value
                        for name, value in metrics.pop('nonfinite').items()})
        history.append((action.numpy(), metrics))
    return history


class PopulationTest(parameterized.TestCase):

    @parameterized.parameters('gaussian', 'categorical')
    def test_members_follow_their_lone_runs(self, policy):
        make = _make(policy)
        members = [{'seed': 3}, {'seed': 8, 'learning_rate': 1e-3, 'clip_ratio': 0.1,
                                 'entropy_coef': 0.01, 'discount': 0.9, 'gae_lambda': 0.8}]
        lone = [make(**member) for member in members]
        together = population.PPOPopulation(make, members)
        lone_history = _iterate(lone, 2, iterations=3)
        population_history = _iterate(together, 2, iterations=3)
        for (lone_action, lone_metrics), (action, metrics) in zip(
                lone_history, population_history, strict=True):
            np.testing.assert_allclose(action, lone_action, atol=1e-5)
            self.assertEqual(set(metrics), set(lone_metrics))
            for name, values in metrics.items():
                self.assertEqual(values.shape, (2,), name)
                np.testing.assert_allclose(values, lone_metrics[name], rtol=1e-4, atol=1e-5,
                                           err_msg=name)
        self.assertGreater(population_history[-1][1]['num_gradient_steps'].min(), 0)
        together.to_members()
        for index, agent in enumerate(lone):
            for mine, theirs in zip(_state(together.members[index]), _state(agent), strict=True):
                np.testing.assert_allclose(mine, theirs, rtol=1e-5, atol=1e-6)

    def test_a_member_is_independent_of_the_others(self):
        make = _make()
        base = [{'seed': 1}, {'seed': 2}, {'seed': 3}]
        changed = [{'seed': 1}, {'seed': 2, 'learning_rate': 3e-3}, {'seed': 3}]
        first = population.PPOPopulation(make, base)
        second = population.PPOPopulation(make, changed)
        first_history = _iterate(first, 3, iterations=3)
        second_history = _iterate(second, 3, iterations=3)
        first.to_members()
        second.to_members()
        for member in (0, 2):  # Bit for bit.
            for mine, theirs in zip(_state(first.members[member]), _state(second.members[member]),
                                    strict=True):
                np.testing.assert_array_equal(mine, theirs)
        for (first_action, first_metrics), (second_action, second_metrics) in zip(
                first_history, second_history, strict=True):
            block = slice(NUM_ENVS, 2 * NUM_ENVS)
            np.testing.assert_array_equal(np.delete(first_action, block, axis=1),
                                          np.delete(second_action, block, axis=1))
            for name in first_metrics:
                np.testing.assert_array_equal(first_metrics[name][[0, 2]],
                                              second_metrics[name][[0, 2]], err_msg=name)
        # The changed member did change.
        self.assertFalse(np.allclose(first_history[-1][0][:, block],
                                     second_history[-1][0][:, block]))

    def test_a_nonfinite_member_stops_alone(self):
        make = _make()
        members = [{'seed': 1}, {'seed': 2}]
        healthy = population.PPOPopulation(make, members)
        poisoned = population.PPOPopulation(make, members)
        _iterate(healthy, 2, iterations=1)
        history = _iterate(poisoned, 2, iterations=1, poison=1)
        metrics = history[0][1]
        self.assertEqual(list(metrics['nonfinite/loss']), [False, True])
        self.assertEqual(list(metrics['nonfinite/gradient']), [False, False])
        self.assertEqual(list(metrics['num_gradient_steps']), [8.0, 0.0])
        poisoned.to_members()
        healthy.to_members()
        for mine, theirs in zip(_state(poisoned.members[0]), _state(healthy.members[0]),
                                strict=True):
            np.testing.assert_array_equal(mine, theirs)
        # The poisoned member applied no gradient step (its statistics took in the batch: the
        # run loop undoes a non-finite member's update from its copy).
        initial = make(seed=2)
        for mine, theirs in zip(poisoned.members[1]._trainable, initial._trainable, strict=True):
            np.testing.assert_array_equal(mine.numpy(), theirs.numpy())

    def test_state_moves_between_the_stack_and_the_members(self):
        together = population.PPOPopulation(_make(), [{'seed': 1}, {'seed': 2}])
        kernel = together.members[1].policy.torso.layers[0].kernel
        stacked = together._stacked(together.members[0].policy.torso.layers[0].kernel)
        self.assertEqual(stacked.shape, (2,) + tuple(kernel.shape))
        np.testing.assert_array_equal(stacked[1].numpy(), kernel.numpy())
        stacked.assign(stacked + 1.0)
        together.to_members()
        np.testing.assert_array_equal(kernel.numpy(), stacked[1].numpy())
        kernel.assign(tf.zeros_like(kernel))
        together.from_members()
        np.testing.assert_array_equal(stacked[1].numpy(), np.zeros(kernel.shape))
        self.assertFalse(np.any(stacked[0].numpy() == 0.0))

    def test_errors_name_the_problem(self):
        make = _make()
        with self.assertRaisesRegex(ValueError, 'at least one member'):
            population.PPOPopulation(make, [])
        with self.assertRaisesRegex(ValueError, 'member 1 .* needs a seed'):
            population.PPOPopulation(make, [{'seed': 1}, {'learning_rate': 1e-3}])
        with self.assertRaisesRegex(ValueError, r'not value_coef'):
            population.PPOPopulation(make, [{'seed': 1, 'value_coef': 1.0}])
        with self.assertRaisesRegex(ValueError, 'clipped objective'):
            population.PPOPopulation(_make(objective='kl_penalty'), [{'seed': 1}])
        with self.assertRaisesRegex(ValueError, 'concurrent_networks = True does not apply'):
            population.PPOPopulation(_make(jit_compile=True, concurrent_networks=True),
                                     [{'seed': 1}])
        recurrent = functools.partial(
            ppo.PPO, (OBSERV_SIZE,), 2, NUM_ENVS,
            policy_network=networks.RecurrentGaussianPolicy)
        with self.assertRaisesRegex(ValueError, 'feed-forward policies'):
            population.PPOPopulation(recurrent, [{'seed': 1}])
        together = population.PPOPopulation(make, [{'seed': 1}, {'seed': 2}])
        batch = {key: tf.zeros([STEPS, 3 * NUM_ENVS] + shape) for key, shape in (
            ('observ', [OBSERV_SIZE]), ('action', [2]), ('reward', []), ('next_observ',
                                                                        [OBSERV_SIZE]))}
        batch.update(terminated=tf.zeros([STEPS, 3 * NUM_ENVS], tf.bool),
                     truncated=tf.zeros([STEPS, 3 * NUM_ENVS], tf.bool),
                     extras={'log_prob': batch['reward'], 'value': batch['reward'],
                             'policy_params': {'loc': batch['action'],
                                               'scale': batch['action']}})
        with self.assertRaisesRegex(ValueError, '12 environments .* 2 members of 4'):
            together.update(batch)


if __name__ == '__main__':
    absltest.main()
