"""Tests the policy and value networks: shapes, initialization, distributions, recurrence and the
member axis (K members computed as one batch, each as a lone network of its seed)."""

import math

import gin
import numpy as np
import tensorflow as tf
from absl.testing import absltest, parameterized

from agents.algorithms import networks


def _sigmoid(values):
    return 1 / (1 + np.exp(-values))


class LayersTest(parameterized.TestCase):

    @parameterized.parameters(((5, 3), 0.01), ((3, 5), math.sqrt(2)), ((4, 4), 1.0))
    def test_linear_kernel_is_orthogonal_with_gain(self, shape, gain):
        layer = networks.Linear(*shape, gain=gain, seed=3)
        self.assertEqual(layer.kernel.shape, (1, *shape))
        kernel = layer.kernel.numpy()[0]
        small = min(shape)
        gram = kernel.T @ kernel if shape[0] >= shape[1] else kernel @ kernel.T
        np.testing.assert_allclose(gram, gain ** 2 * np.eye(small), atol=1e-5 * max(gain, 1))
        np.testing.assert_array_equal(layer.bias.numpy(), np.zeros((1, 1, shape[1])))

    def test_torch_default_is_uniform_in_one_over_the_root_of_the_fan_in(self):
        layer = networks.Linear(256, 128, gain=0.01, seed=(3, 4), initializer='torch_default')
        bound = 1 / math.sqrt(256)
        for values, size in ((layer.kernel.numpy(), 256 * 128), (layer.bias.numpy(), 128)):
            self.assertEqual(values.size, 2 * size)
            self.assertLessEqual(np.abs(values).max(), bound)
            # Uniform in +-bound, whatever the gain: standard deviation bound / sqrt(3).
            np.testing.assert_allclose(values.std(), bound / math.sqrt(3), rtol=0.1)
        self.assertFalse(np.allclose(layer.kernel[0], layer.kernel[1]))  # Each member's seed.
        again = networks.Linear(256, 128, seed=(3, 4), initializer='torch_default')
        np.testing.assert_array_equal(again.kernel.numpy(), layer.kernel.numpy())
        value = networks.FeedForwardValue((5,), (7,), seed=1, initializer='torch_default')
        self.assertLessEqual(np.abs(value.head.kernel.numpy()).max(), 1 / math.sqrt(7))
        self.assertTrue(np.abs(value.head.bias.numpy()).max() > 0)
        with self.assertRaisesRegex(ValueError, "initializer must be one of 'orthogonal', "
                                    "'torch_default', got 'xavier'"):
            networks.Linear(3, 2, initializer='xavier')

    def test_linear_matches_numpy_per_member(self):
        """Member k's output is its own affine map of its own inputs."""
        layer = networks.Linear(3, 2, seed=(1, 2))
        layer.bias.assign(tf.random.normal([2, 1, 2], seed=3))
        inputs = np.random.default_rng(0).normal(size=(2, 5, 3)).astype(np.float32)
        kernel, bias = layer.kernel.numpy(), layer.bias.numpy()
        expected = np.stack([inputs[k] @ kernel[k] + bias[k] for k in range(2)])
        np.testing.assert_allclose(layer(inputs).numpy(), expected, rtol=1e-5, atol=1e-6)

    def test_seed_makes_initialization_deterministic(self):
        first = networks.FeedForwardGaussianPolicy((4,), 2, seed=7)
        second = networks.FeedForwardGaussianPolicy((4,), 2, seed=7)
        other = networks.FeedForwardGaussianPolicy((4,), 2, seed=8)
        for a, b, c in zip(first.trainable_variables, second.trainable_variables,
                           other.trainable_variables, strict=True):
            np.testing.assert_array_equal(a.numpy(), b.numpy())
            if a.name.startswith('kernel'):
                self.assertFalse(np.allclose(a.numpy(), c.numpy()))

    @parameterized.parameters((1,), ((1, 4),))
    def test_gru_cell_matches_numpy(self, seed):
        cell = networks.GRUCell(3, 2, seed=seed)
        num_members = cell.input_kernel.shape[0]
        self.assertEqual(cell.recurrent_kernel.shape, (num_members, 2, 6))
        cell.bias.assign(tf.random.normal([num_members, 1, 6], seed=2))
        rng = np.random.default_rng(0)
        inputs = rng.normal(size=(num_members, 4, 3)).astype(np.float32)
        state = rng.normal(size=(num_members, 4, 2)).astype(np.float32)
        result = cell(cell.input_projection(inputs), state).numpy()
        w, u, b = cell.input_kernel.numpy(), cell.recurrent_kernel.numpy(), cell.bias.numpy()
        for k in range(num_members):
            x = inputs[k] @ w[k] + b[k]
            h = state[k] @ u[k]
            update = _sigmoid(x[:, :2] + h[:, :2])
            reset = _sigmoid(x[:, 2:4] + h[:, 2:4])
            candidate = np.tanh(x[:, 4:] + reset * h[:, 4:])
            np.testing.assert_allclose(result[k], update * state[k] + (1 - update) * candidate,
                                       rtol=1e-5, atol=1e-6)

    def test_bad_activation_raises(self):
        with self.assertRaisesRegex(ValueError, "Unknown activation 'tanhh'"):
            networks.MLP(3, (4,), activation='tanhh')

    def test_activation_by_callable(self):
        mlp = networks.MLP(3, (4,), activation=tf.nn.relu)
        outputs = mlp(tf.random.normal([1, 10, 3])).numpy()
        self.assertEqual(outputs.shape, (1, 10, 4))
        self.assertTrue(np.all(outputs >= 0))

    def test_bad_sizes_raise(self):
        with self.assertRaisesRegex(ValueError, 'action_size must be a positive integer'):
            networks.FeedForwardGaussianPolicy((3,), 0)
        with self.assertRaisesRegex(ValueError, 'init_std must be positive'):
            networks.FeedForwardGaussianPolicy((3,), 2, init_std=0.0)


class GaussianPolicyTest(absltest.TestCase):

    def test_shapes_and_state_independent_std(self):
        policy = networks.FeedForwardGaussianPolicy((2, 3), 4, init_std=0.5)
        self.assertEqual((policy.seeds, policy.num_members), ((0,), 1))
        self.assertEqual(policy.log_std.shape, (1, 4))
        observ = tf.random.normal([1, 5, 2, 3])
        params, state = policy.step(observ, policy.initial_state(5))
        self.assertEqual(state, ())
        self.assertEqual(params['loc'].shape, (1, 5, 4))
        np.testing.assert_allclose(params['scale'].numpy(), np.full((1, 5, 4), 0.5), rtol=1e-6)
        sequence = policy.sequence(tf.random.normal([1, 7, 5, 2, 3]), (),
                                   tf.zeros([1, 7, 5], tf.bool))
        self.assertEqual(sequence['loc'].shape, (1, 7, 5, 4))
        np.testing.assert_allclose(sequence['scale'].numpy(), np.full((1, 7, 5, 4), 0.5),
                                   rtol=1e-6)

    def test_each_member_has_its_own_std(self):
        policy = networks.FeedForwardGaussianPolicy((3,), 2, seed=(0, 1))
        policy.log_std.assign([[-0.5, 0.3], [0.1, -1.0]])
        params, _ = policy.step(tf.random.normal([2, 4, 3]), ())
        expected = np.broadcast_to(np.exp([[-0.5, 0.3], [0.1, -1.0]])[:, None], (2, 4, 2))
        np.testing.assert_allclose(params['scale'].numpy(), expected, rtol=1e-6)

    def test_small_initial_mean(self):
        policy = networks.FeedForwardGaussianPolicy((3,), 2)
        params, _ = policy.step(tf.random.normal([1, 100, 3]), ())
        self.assertLess(np.abs(params['loc'].numpy()).max(), 0.2)

    def test_distribution_log_prob_entropy_match_formula(self):
        policy = networks.FeedForwardGaussianPolicy((3,), 2)
        policy.log_std.assign([[-0.5, 0.3]])
        params, _ = policy.step(tf.random.normal([1, 6, 3]), ())
        distribution = policy.distribution(params)
        action = tf.random.normal([1, 6, 2])
        std = np.exp([-0.5, 0.3])
        loc = params['loc'].numpy()
        expected = np.sum(-0.5 * ((action.numpy() - loc) / std) ** 2 - np.log(std) -
                          0.5 * np.log(2 * np.pi), axis=-1)
        np.testing.assert_allclose(distribution.log_prob(action).numpy(), expected, rtol=1e-5)
        np.testing.assert_allclose(
            distribution.entropy().numpy(),
            np.full((1, 6), np.sum(0.5 * np.log(2 * np.pi * np.e * std ** 2))), rtol=1e-5)
        self.assertEqual(distribution.sample(seed=(1, 2)).shape, (1, 6, 2))

    def test_wrong_observation_shape_raises(self):
        policy = networks.FeedForwardGaussianPolicy((3,), 2, name='policy')
        with self.assertRaisesRegex(
                ValueError,
                r'policy: observations of shape \(1, 5, 4\) are not \[members \(1\), \.\.\., '
                r'\*\(3,\)\]'):
            policy.step(tf.zeros([1, 5, 4]), ())
        with self.assertRaisesRegex(ValueError, r'observations of shape \(3,\) are not'):
            policy.step(tf.zeros([3]), ())  # No member axis.


class CategoricalPolicyTest(absltest.TestCase):

    def test_distribution(self):
        policy = networks.FeedForwardCategoricalPolicy((4,), 3)
        params, _ = policy.step(tf.random.normal([1, 5, 4]), ())
        self.assertEqual(params['logits'].shape, (1, 5, 3))
        distribution = policy.distribution(params)
        self.assertEqual(distribution.dtype, tf.int32)
        self.assertEqual(policy.action_shape, ())
        probs = distribution.probs().numpy()
        np.testing.assert_allclose(probs.sum(-1), np.ones((1, 5)), rtol=1e-6)
        # Small output gain: the initial policy is close to uniform.
        np.testing.assert_allclose(probs, np.full((1, 5, 3), 1 / 3), atol=0.02)
        sample = distribution.sample(seed=(3, 4))
        self.assertEqual(sample.shape, (1, 5))
        np.testing.assert_allclose(distribution.log_prob(sample).numpy()[0],
                                   np.log(probs[0, np.arange(5), sample.numpy()[0]]), rtol=1e-5)


class RecurrentGaussianPolicyTest(parameterized.TestCase):

    def setUp(self):
        super().setUp()
        self.policy = networks.RecurrentGaussianPolicy((3,), 2, gru_units=8, output_gain=1.0)

    @parameterized.parameters((0,), ((0, 5),))
    def test_sequence_matches_stepping_with_resets(self, seed):
        policy = networks.RecurrentGaussianPolicy((3,), 2, gru_units=8, output_gain=1.0,
                                                  seed=seed)
        members, length, batch = policy.num_members, 6, 4
        observ = tf.random.normal([members, length, batch, 3], seed=1)
        reset = tf.constant(np.random.default_rng(0).uniform(size=(members, length, batch)) < 0.3)
        state = tf.random.normal([members, batch, 8], seed=2)
        sequence = policy.sequence(observ, state, reset)
        stepped = []
        for step in range(length):
            params, state = policy.step(observ[:, step],
                                        policy.reset_state(state, reset[:, step]))
            stepped.append(params['loc'])
        np.testing.assert_allclose(sequence['loc'].numpy(), tf.stack(stepped, axis=1).numpy(),
                                   rtol=1e-5, atol=1e-6)
        self.assertEqual(sequence['scale'].shape, (members, length, batch, 2))

    def test_state_carries_memory_and_reset_clears_it(self):
        observ = tf.random.normal([1, 1, 3])
        zero = self.policy.initial_state(1)
        self.assertEqual(zero.shape, (1, 1, 8))
        _, state = self.policy.step(tf.random.normal([1, 1, 3]) * 3, zero)
        from_zero, _ = self.policy.step(observ, zero)
        from_state, _ = self.policy.step(observ, state)
        self.assertFalse(np.allclose(from_zero['loc'].numpy(), from_state['loc'].numpy()))
        after_reset, _ = self.policy.step(observ, self.policy.reset_state(state, [[True]]))
        np.testing.assert_allclose(after_reset['loc'].numpy(), from_zero['loc'].numpy())
        kept, _ = self.policy.step(observ, self.policy.reset_state(state, [[False]]))
        np.testing.assert_allclose(kept['loc'].numpy(), from_state['loc'].numpy())

    def test_gradients_reach_every_variable_through_sequence(self):
        observ = tf.random.normal([1, 5, 3, 3])
        with tf.GradientTape() as tape:
            params = self.policy.sequence(observ, self.policy.initial_state(3),
                                          tf.zeros([1, 5, 3], tf.bool))
            loss = tf.reduce_sum(
                self.policy.distribution(params).log_prob(tf.ones([1, 5, 3, 2])))
        gradients = tape.gradient(loss, self.policy.trainable_variables)
        self.assertLen(gradients, len(self.policy.trainable_variables))
        for gradient, variable in zip(gradients, self.policy.trainable_variables, strict=True):
            self.assertIsNotNone(gradient, variable.name)
            self.assertGreater(np.abs(tf.convert_to_tensor(gradient).numpy()).sum(), 0,
                               variable.name)


class ValueTest(absltest.TestCase):

    def test_shapes(self):
        value = networks.FeedForwardValue((3,), hidden_sizes=(16,))
        self.assertEqual(value(tf.zeros([1, 4, 3])).shape, (1, 4))
        self.assertEqual(value(tf.zeros([1, 2, 4, 3])).shape, (1, 2, 4))
        self.assertLen(value.trainable_variables, 4)
        population = networks.FeedForwardValue((3,), hidden_sizes=(16,), seed=(0, 1))
        self.assertEqual(population(tf.zeros([2, 4, 3])).shape, (2, 4))
        self.assertEqual(population(tf.zeros([2, 3])).shape, (2,))
        self.assertEqual([variable.shape[0] for variable in population.trainable_variables],
                         [2] * 4)


# The networks of the member-axis tests: a constructor of (seed) and the observation shape.
_NETWORKS = {
    'gaussian': (lambda seed: networks.FeedForwardGaussianPolicy(
        (2, 3), 2, hidden_sizes=(8, 8), output_gain=1.0, seed=seed), (2, 3)),
    'categorical': (lambda seed: networks.FeedForwardCategoricalPolicy(
        (3,), 4, hidden_sizes=(8,), output_gain=1.0, seed=seed), (3,)),
    'recurrent': (lambda seed: networks.RecurrentGaussianPolicy(
        (3,), 2, hidden_sizes=(8,), gru_units=5, output_gain=1.0, seed=seed), (3,)),
    'value': (lambda seed: networks.FeedForwardValue((3,), hidden_sizes=(8, 8), seed=seed),
              (3,)),
}


def _outputs(network, observ, state, reset):
    """All outputs of `network` for `observ` [K, L, B, *observ_shape], `state` [K, B, ...] and
    `reset` [K, L, B], as a flat list of arrays: one step on the first time step and a
    sequence (policies), or the values of the sequence (value networks)."""
    if isinstance(network, networks.FeedForwardValue):
        return [network(observ).numpy()]
    params, new_state = network.step(observ[:, 0], state)
    sequence = network.sequence(observ, state, reset)
    return [tensor.numpy() for tensor in tf.nest.flatten((params, new_state, sequence))]


class MemberAxisTest(parameterized.TestCase):
    """A network of K = 2 members of seeds (a, b) computes, for member k, what a lone network of
    seed k computes, and its members never mix."""

    def _inputs(self, network, observ_shape, num_members, seed=0):
        rng = np.random.default_rng(seed)
        observ = rng.normal(size=(num_members, 4, 3, *observ_shape)).astype(np.float32)
        reset = rng.uniform(size=(num_members, 4, 3)) < 0.3
        state = ()
        if getattr(network, 'recurrent', False):
            state = rng.normal(size=(num_members, 3, network.cell.units)).astype(np.float32)
        return observ, state, reset

    @parameterized.named_parameters(*[(name, name) for name in _NETWORKS])
    def test_members_equal_lone_networks_of_their_seeds(self, name):
        build, observ_shape = _NETWORKS[name]
        population = build((11, 4))
        lone = [build(11), build(4)]
        self.assertEqual((population.seeds, population.num_members), ((11, 4), 2))
        variables = population.trainable_variables
        for k, network in enumerate(lone):
            for stacked, single in zip(variables, network.trainable_variables, strict=True):
                self.assertEqual(stacked.shape, (2, *single.shape[1:]))
                np.testing.assert_array_equal(stacked.numpy()[k:k + 1], single.numpy(),
                                              stacked.name)
        # Different weights per member (not only at initialization) are computed apart too.
        rng = np.random.default_rng(1)
        for variable in variables:
            variable.assign_add(rng.normal(scale=0.3, size=variable.shape).astype(np.float32))
        for k, network in enumerate(lone):
            for stacked, single in zip(variables, network.trainable_variables, strict=True):
                single.assign(stacked[k:k + 1])
        observ, state, reset = self._inputs(population, observ_shape, 2)
        outputs = _outputs(population, observ, state, reset)
        for k, network in enumerate(lone):
            lone_state = state if isinstance(state, tuple) else state[k:k + 1]
            expected = _outputs(network, observ[k:k + 1], lone_state, reset[k:k + 1])
            for result, reference in zip(outputs, expected, strict=True):
                np.testing.assert_allclose(result[k:k + 1], reference, rtol=0, atol=1e-6)

    @parameterized.named_parameters(*[(name, name) for name in _NETWORKS])
    def test_members_never_mix(self, name):
        build, observ_shape = _NETWORKS[name]
        population = build((0, 1))
        observ, state, reset = self._inputs(population, observ_shape, 2)
        before = _outputs(population, observ, state, reset)
        observ[1] = observ[1] * 5 + 1
        reset[1] = ~reset[1]
        if not isinstance(state, tuple):
            state[1] = -state[1]
        after = _outputs(population, observ, state, reset)
        for old, new in zip(before, after, strict=True):
            np.testing.assert_array_equal(old[0], new[0])
        self.assertFalse(all(np.array_equal(old[1], new[1])
                             for old, new in zip(before, after, strict=True)))

    @parameterized.named_parameters(*[(name, name) for name in _NETWORKS])
    def test_gradients_stay_in_their_member(self, name):
        """A loss of member 0's outputs has zero gradient in member 1's slice of every
        variable."""
        build, observ_shape = _NETWORKS[name]
        population = build((0, 1))
        observ, state, reset = self._inputs(population, observ_shape, 2)
        with tf.GradientTape() as tape:
            if isinstance(population, networks.FeedForwardValue):
                outputs = [population(observ)]
            else:
                outputs = tf.nest.flatten(population.sequence(observ, state, reset))
            loss = tf.add_n([tf.reduce_sum(tf.square(output[0])) for output in outputs])
        gradients = tape.gradient(loss, population.trainable_variables)
        for gradient, variable in zip(gradients, population.trainable_variables, strict=True):
            gradient = tf.convert_to_tensor(gradient).numpy()
            np.testing.assert_array_equal(gradient[1], np.zeros_like(gradient[1]), variable.name)
            self.assertGreater(np.abs(gradient[0]).sum(), 0, variable.name)

    @parameterized.named_parameters(*[(name, name) for name in _NETWORKS])
    def test_bad_observation_shapes_raise(self, name):
        build, observ_shape = _NETWORKS[name]
        population = build((0, 1))
        call = population if isinstance(population, networks.FeedForwardValue) else (
            lambda observ: population.step(observ, population.initial_state(3)))
        for shape in ((3, 3, *observ_shape),  # Three members, not two.
                      (2, 3, 7),  # Wrong observation shape.
                      observ_shape):  # No member axis.
            with self.subTest(shape=shape), self.assertRaisesRegex(
                    ValueError, rf'observations of shape \({", ".join(map(str, shape))},?\) are '
                    r'not \[members \(2\), \.\.\., \*'):
                call(tf.zeros(shape))

    def test_initial_state_has_member_axis(self):
        policy = networks.RecurrentGaussianPolicy((3,), 2, gru_units=5, seed=(0, 1, 2))
        self.assertEqual(policy.initial_state(4).shape, (3, 4, 5))
        self.assertEqual(policy.log_std.shape, (3, 2))

    @parameterized.parameters(([],), ((1, 'a'),), (1.5,), (True,), ((1, True),), (None,),
                              ('12',))
    def test_bad_seeds_raise(self, seed):
        with self.assertRaisesRegex(ValueError, 'seed must be an integer or a non-empty sequence'):
            networks.Linear(2, 2, seed=seed)


class GinTest(absltest.TestCase):

    def tearDown(self):
        gin.clear_config()
        super().tearDown()

    def test_hyperparameters_from_gin(self):
        gin.parse_config("""
            FeedForwardGaussianPolicy.hidden_sizes = (32, 16)
            FeedForwardGaussianPolicy.activation = 'relu'
            FeedForwardValue.hidden_sizes = (8,)
        """)
        policy = networks.FeedForwardGaussianPolicy((3,), 2)
        self.assertEqual([layer.kernel.shape[2] for layer in policy.torso.layers], [32, 16])
        value = networks.FeedForwardValue((3,))
        self.assertEqual([layer.kernel.shape[2] for layer in value.torso.layers], [8])


if __name__ == '__main__':
    absltest.main()
