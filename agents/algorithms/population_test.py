"""Tests populations of PPO and A2C against their lone agents: member k acts, updates and ends
in the state of a lone agent of its seed and hyperparameters, alone of the other members."""

import functools

import numpy as np
import tensorflow as tf
from absl.testing import absltest, parameterized

from agents.algorithms import networks
from agents.algorithms.a2c import a2c
from agents.algorithms.ppo import ppo

NUM_ENVS = 4  # Of each member.
STEPS = 16
OBSERV_SIZE = 3
ALGORITHMS = {'ppo': ppo.PPO, 'a2c': a2c.A2C}
# PPO's units per member (16 steps, or 4 chunks of 4 steps, of 4 environments) in 4 minibatches.
SETTINGS = {
    'ppo': dict(num_epochs=2, num_minibatches=4),
    'a2c': dict(normalize_observ=True, scale_reward=True),
}
# A second member's values of every member hyperparameter, apart from the defaults.
OTHER_VALUES = {'learning_rate': 1e-3, 'clip_ratio': 0.1, 'entropy_coef': 0.01,
                'discount': 0.9, 'gae_lambda': 0.8}


def _make(algorithm, policy='gaussian', **kwargs):
    """The agents' constructor: `(seed=..., population=..., **member hyperparameters)`."""
    network = {
        'gaussian': functools.partial(networks.FeedForwardGaussianPolicy, hidden_sizes=(16,)),
        'categorical': functools.partial(networks.FeedForwardCategoricalPolicy,
                                         hidden_sizes=(16,)),
        'recurrent': functools.partial(networks.RecurrentGaussianPolicy, hidden_sizes=(8,),
                                       gru_units=8),
    }[policy]
    kwargs = {
        'policy_network': network,
        'value_network': functools.partial(networks.FeedForwardValue, hidden_sizes=(16,)),
        'jit_compile': False, 'lr_anneal_updates': 10, **SETTINGS[algorithm], **kwargs}
    return functools.partial(ALGORITHMS[algorithm], (OBSERV_SIZE,),
                             3 if policy == 'categorical' else 2, NUM_ENVS, **kwargs)


def _population(make, members):
    """A population of `members` (each the lone agent's keyword arguments: seed and member
    hyperparameters), built of fresh lone agents."""
    return make(seed=members[0]['seed'], population=[make(**member) for member in members])


def _state(agent):
    return [variable.numpy() for variable in agent.variables]


def _iterate(agents, iterations, seed=0, poison=None):
    """Acts and updates `iterations` times on made-up observations and rewards.

    `agents` is a population or a list of lone agents, member k on the k-th block of
    environments. Returns the actions and the [K] metrics of each iteration. `poison`: a member
    whose rewards are NaN.
    """
    agents = agents if isinstance(agents, list) else [agents]
    blocks, start = [], 0
    for agent in agents:
        blocks.append(slice(start, start + agent.num_members * NUM_ENVS))
        start = blocks[-1].stop
    rng = np.random.default_rng(seed)
    history = []
    for _ in range(iterations):
        observ = rng.normal(size=(STEPS, start, OBSERV_SIZE)).astype(np.float32) * 3.0
        terminated = rng.random((STEPS, start)) < 0.05
        truncated = rng.random((STEPS, start)) < 0.05
        reset = np.concatenate([np.ones((1, start), bool), (terminated | truncated)[:-1]])
        states = [agent.initial_state(block.stop - block.start)
                  for agent, block in zip(agents, blocks, strict=True)]
        steps = []
        for t in range(STEPS):
            outputs = [agent.act(observ[t, block], state, reset[t, block])
                       for agent, block, state in zip(agents, blocks, states, strict=True)]
            states = [output[2] for output in outputs]
            steps.append(tf.nest.map_structure(lambda *parts: tf.concat(parts, 0),
                                               *[output[:2] for output in outputs]))
        action, extras = tf.nest.map_structure(lambda *parts: tf.stack(parts), *steps)
        reward = rng.normal(size=(STEPS, start)).astype(np.float32)
        if poison is not None:
            reward[:, poison * NUM_ENVS:(poison + 1) * NUM_ENVS] = np.nan
        batch = {
            'observ': observ, 'action': action, 'reward': reward, 'terminated': terminated,
            'truncated': truncated,
            'next_observ': rng.normal(size=(STEPS, start, OBSERV_SIZE)).astype(np.float32),
            'extras': extras,
        }
        metrics = [agent.update(tf.nest.map_structure(lambda x, b=block: x[:, b], batch))
                   for agent, block in zip(agents, blocks, strict=True)]
        metrics = tf.nest.map_structure(lambda *values: np.concatenate(values), *metrics)
        metrics.update({f'nonfinite/{name}': value
                        for name, value in metrics.pop('nonfinite').items()})
        history.append((action.numpy(), metrics))
    return history


class PopulationTest(parameterized.TestCase):

    def assert_members_match(self, population, lone, rtol=1e-5, atol=1e-6):
        """Every variable of member k (copied out by `to_members`) against lone agent k's."""
        population.to_members()
        for index, agent in enumerate(lone):
            for mine, theirs in zip(population.members[index].variables, agent.variables,
                                    strict=True):
                np.testing.assert_allclose(mine.numpy(), theirs.numpy(), rtol=rtol, atol=atol,
                                           err_msg=f'member {index}: {theirs.name}')

    def assert_histories_match(self, history, lone_history):
        for (action, metrics), (lone_action, lone_metrics) in zip(
                history, lone_history, strict=True):
            np.testing.assert_allclose(action, lone_action, rtol=1e-5, atol=1e-5)
            self.assertEqual(set(metrics), set(lone_metrics))
            for name, values in metrics.items():
                self.assertEqual(values.shape, lone_metrics[name].shape, name)
                np.testing.assert_allclose(values, lone_metrics[name], rtol=1e-4, atol=1e-5,
                                           err_msg=name)

    @parameterized.named_parameters(
        ('ppo_gaussian', 'ppo', 'gaussian', {}),
        ('ppo_categorical', 'ppo', 'categorical', {}),
        ('ppo_kl_penalty', 'ppo', 'gaussian', {'objective': 'kl_penalty'}),
        ('ppo_concurrent_networks', 'ppo', 'gaussian',
         {'jit_compile': True, 'concurrent_networks': True}),
        ('ppo_recurrent', 'ppo', 'recurrent', {'chunk_length': 4}),
        ('a2c_gaussian', 'a2c', 'gaussian', {}),
        ('a2c_categorical_adam', 'a2c', 'categorical', {'optimizer': 'adam'}),
        ('a2c_recurrent', 'a2c', 'recurrent', {}),
    )
    def test_members_follow_their_lone_agents(self, algorithm, policy, settings):
        make = _make(algorithm, policy, **settings)
        names = ALGORITHMS[algorithm].MEMBER_HYPERPARAMETERS
        members = [{'seed': 3}, {'seed': 8, **{name: OTHER_VALUES[name] for name in names}}]
        lone = [make(**member) for member in members]
        population = _population(make, members)
        self.assertEqual(population.num_members, 2)
        self.assertEqual(population.seeds, (3, 8))
        for name in names:
            self.assertEqual(population.hyperparameters[name],
                             tuple(agent.hyperparameters[name][0] for agent in lone), name)
        # Two iterations: the second acts and updates from the state the first left.
        lone_history = _iterate(lone, iterations=2)
        history = _iterate(population, iterations=2)
        self.assert_histories_match(history, lone_history)
        self.assertEqual(history[-1][1]['loss'].shape, (2,))
        if algorithm == 'ppo':
            self.assertEqual(list(history[-1][1]['num_gradient_steps']), [8.0, 8.0])
        self.assert_members_match(population, lone)

    @parameterized.parameters(('ppo', 'clip_ratio', 1e-3), ('ppo', 'learning_rate', 3e-3),
                              ('a2c', 'learning_rate', 3e-3), ('a2c', 'discount', 0.9))
    def test_a_members_hyperparameter_leaves_the_others_unchanged(self, algorithm, name, value):
        make = _make(algorithm)
        base = [{'seed': 1}, {'seed': 2}, {'seed': 3}]
        changed = [{'seed': 1}, {'seed': 2, name: value}, {'seed': 3}]
        first, second = _population(make, base), _population(make, changed)
        self.assertEqual(second.hyperparameters[name][1], value)
        first_history = _iterate(first, iterations=2)
        second_history = _iterate(second, iterations=2)
        block = slice(NUM_ENVS, 2 * NUM_ENVS)
        for (first_action, first_metrics), (second_action, second_metrics) in zip(
                first_history, second_history, strict=True):
            # Bit for bit.
            np.testing.assert_array_equal(np.delete(first_action, block, axis=1),
                                          np.delete(second_action, block, axis=1))
            for metric in first_metrics:
                np.testing.assert_array_equal(first_metrics[metric][[0, 2]],
                                              second_metrics[metric][[0, 2]], err_msg=metric)
        first.to_members()
        second.to_members()
        for member in (0, 2):
            for mine, theirs in zip(_state(first.members[member]),
                                    _state(second.members[member]), strict=True):
                np.testing.assert_array_equal(mine, theirs)
        # The changed member did change.
        self.assertFalse(all(np.array_equal(mine, theirs) for mine, theirs in zip(
            _state(first.members[1]), _state(second.members[1]), strict=True)))

    @parameterized.parameters('ppo', 'a2c')
    def test_a_poisoned_member_is_undone_alone(self, algorithm):
        make = _make(algorithm, jit_compile=True)  # The loop's setting: XLA.
        members = [{'seed': 1}, {'seed': 2}]
        healthy, poisoned = _population(make, members), _population(make, members)
        for population in (healthy, poisoned):
            _iterate(population, iterations=1, seed=0)
        _iterate(healthy, iterations=1, seed=1)
        pairs = [(variable, tf.constant(variable.numpy()))
                 for variable in poisoned.undo_variables()]
        metrics = _iterate(poisoned, iterations=1, seed=1, poison=1)[0][1]
        self.assertEqual(list(metrics['nonfinite/loss']), [False, True])
        self.assertEqual(list(metrics['nonfinite/gradient']), [False, False])
        if algorithm == 'ppo':
            self.assertEqual(list(metrics['num_gradient_steps']), [8.0, 0.0])
        before = {variable.ref(): saved for variable, saved in pairs}
        for variable in poisoned._trainable:  # No gradient step reached member 1's weights.
            np.testing.assert_array_equal(variable.numpy()[1], before[variable.ref()].numpy()[1])
        poisoned.undo(tf.constant([False, True]), pairs)
        for variable, saved in pairs:
            # Member 1 is back where it was; member 0 kept its update, that of the healthy run.
            np.testing.assert_array_equal(variable.numpy()[1], saved.numpy()[1], variable.name)
        healthy.to_members()
        poisoned.to_members()
        for mine, theirs in zip(_state(poisoned.members[0]), _state(healthy.members[0]),
                                strict=True):
            np.testing.assert_array_equal(mine, theirs)
        self.assertEqual(poisoned.update_count.numpy().tolist(), [2, 1])

    @parameterized.parameters('ppo', 'a2c')
    def test_state_moves_between_the_population_and_its_members(self, algorithm):
        make = _make(algorithm)
        population = _population(make, [{'seed': 1}, {'seed': 2}])
        # Built as its lone agents are.
        for index, seed in enumerate((1, 2)):
            for mine, theirs in zip(population.variables, make(seed=seed).variables,
                                    strict=True):
                np.testing.assert_array_equal(mine.numpy()[index:index + 1], theirs.numpy(),
                                              theirs.name)
        member = population.members[1]
        self.assertEqual(member.num_members, 1)
        self.assertEqual(member.members, [member])
        stacked, kernel = population.value.head.kernel, member.value.head.kernel
        self.assertEqual(stacked.shape[0], 2)
        self.assertEqual(stacked.shape[1:], kernel.shape[1:])
        stacked.assign(stacked + 1.0)
        population.to_members()
        np.testing.assert_array_equal(kernel.numpy(), stacked.numpy()[1:])
        kernel.assign(tf.zeros_like(kernel))
        population.from_members()
        np.testing.assert_array_equal(stacked.numpy()[1], np.zeros(kernel.shape[1:]))
        self.assertFalse(np.any(stacked.numpy()[0] == 0.0))
        # A round trip changes nothing.
        before = _state(population)
        population.to_members()
        population.from_members()
        for mine, theirs in zip(_state(population), before, strict=True):
            np.testing.assert_array_equal(mine, theirs)

    def test_bad_inputs_raise(self):
        ppo_make, a2c_make = _make('ppo'), _make('a2c')
        with self.assertRaisesRegex(ValueError, 'lone agents of one algorithm: the PPO '
                                    'population got an agent of A2C as a member'):
            ppo_make(population=[ppo_make(seed=1), a2c_make(seed=2)])
        with self.assertRaisesRegex(ValueError, 'the A2C population got an agent of PPO'):
            a2c_make(population=[ppo_make(seed=1), ppo_make(seed=2)])
        with self.assertRaisesRegex(ValueError, 'the PPO population got a population'):
            ppo_make(population=[_population(ppo_make, [{'seed': 1}, {'seed': 2}])])
        wider = _make('ppo', value_network=networks.FeedForwardValue)
        with self.assertRaisesRegex(ValueError, 'differ in more than their seeds'):
            ppo_make(population=[ppo_make(seed=1), wider(seed=2)]).to_members()
        for make, extras in (
                (ppo_make, lambda reward, action: {
                    'log_prob': reward, 'value': reward,
                    'policy_params': {'loc': action, 'scale': action}}),
                (a2c_make, lambda reward, action: {'value': reward})):
            population = _population(make, [{'seed': 1}, {'seed': 2}])
            for envs in (3 * NUM_ENVS, NUM_ENVS):
                batch = {key: tf.zeros([STEPS, envs] + shape) for key, shape in (
                    ('observ', [OBSERV_SIZE]), ('action', [2]), ('reward', []),
                    ('next_observ', [OBSERV_SIZE]))}
                batch.update(terminated=tf.zeros([STEPS, envs], tf.bool),
                             truncated=tf.zeros([STEPS, envs], tf.bool),
                             extras=extras(batch['reward'], batch['action']))
                with self.assertRaisesRegex(ValueError, f'{envs} environments .* 2 members of '
                                                        f'num_envs={NUM_ENVS}'):
                    population.update(batch)


if __name__ == '__main__':
    absltest.main()
