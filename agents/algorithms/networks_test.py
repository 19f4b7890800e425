"""Tests the policy and value networks: shapes, initialization, distributions and recurrence."""

import math

import gin
import numpy as np
import tensorflow as tf
from absl.testing import absltest, parameterized

from agents.algorithms import networks


class LayersTest(parameterized.TestCase):

    @parameterized.parameters(((5, 3), 0.01), ((3, 5), math.sqrt(2)), ((4, 4), 1.0))
    def test_linear_kernel_is_orthogonal_with_gain(self, shape, gain):
        layer = networks.Linear(*shape, gain=gain, seed=3)
        kernel = layer.kernel.numpy()
        small = min(shape)
        gram = kernel.T @ kernel if shape[0] >= shape[1] else kernel @ kernel.T
        np.testing.assert_allclose(gram, gain ** 2 * np.eye(small), atol=1e-5 * max(gain, 1))
        np.testing.assert_array_equal(layer.bias.numpy(), np.zeros(shape[1]))

    def test_seed_makes_initialization_deterministic(self):
        first = networks.FeedForwardGaussianPolicy((4,), 2, seed=7)
        second = networks.FeedForwardGaussianPolicy((4,), 2, seed=7)
        other = networks.FeedForwardGaussianPolicy((4,), 2, seed=8)
        for a, b, c in zip(first.trainable_variables, second.trainable_variables,
                           other.trainable_variables, strict=True):
            np.testing.assert_array_equal(a.numpy(), b.numpy())
            if a.name.startswith('kernel'):
                self.assertFalse(np.allclose(a.numpy(), c.numpy()))

    def test_gru_cell_matches_numpy(self):
        cell = networks.GRUCell(3, 2, seed=1)
        cell.bias.assign(tf.random.normal([6], seed=2))
        rng = np.random.default_rng(0)
        inputs = rng.normal(size=(4, 3)).astype(np.float32)
        state = rng.normal(size=(4, 2)).astype(np.float32)
        result = cell(cell.input_projection(inputs), state).numpy()
        w, u, b = cell.input_kernel.numpy(), cell.recurrent_kernel.numpy(), cell.bias.numpy()
        x = inputs @ w + b
        h = state @ u

        def sigmoid(v):
            return 1 / (1 + np.exp(-v))
        update = sigmoid(x[:, :2] + h[:, :2])
        reset = sigmoid(x[:, 2:4] + h[:, 2:4])
        candidate = np.tanh(x[:, 4:] + reset * h[:, 4:])
        np.testing.assert_allclose(result, update * state + (1 - update) * candidate, rtol=1e-5,
                                   atol=1e-6)

    def test_bad_activation_raises(self):
        with self.assertRaisesRegex(ValueError, "Unknown activation 'tanhh'"):
            networks.MLP(3, (4,), activation='tanhh')

    def test_activation_by_callable(self):
        mlp = networks.MLP(3, (4,), activation=tf.nn.relu)
        self.assertTrue(np.all(mlp(tf.random.normal([10, 3])).numpy() >= 0))

    def test_bad_sizes_raise(self):
        with self.assertRaisesRegex(ValueError, 'action_size must be a positive integer'):
            networks.FeedForwardGaussianPolicy((3,), 0)
        with self.assertRaisesRegex(ValueError, 'init_std must be positive'):
            networks.FeedForwardGaussianPolicy((3,), 2, init_std=0.0)


class GaussianPolicyTest(absltest.TestCase):

    def test_shapes_and_state_independent_std(self):
        policy = networks.FeedForwardGaussianPolicy((2, 3), 4, init_std=0.5)
        observ = tf.random.normal([5, 2, 3])
        params, state = policy.step(observ, policy.initial_state(5))
        self.assertEqual(state, ())
        self.assertEqual(params['loc'].shape, (5, 4))
        np.testing.assert_allclose(params['scale'].numpy(), np.full((5, 4), 0.5), rtol=1e-6)
        sequence = policy.sequence(tf.random.normal([7, 5, 2, 3]), (), tf.zeros([7, 5], tf.bool))
        self.assertEqual(sequence['loc'].shape, (7, 5, 4))
        np.testing.assert_allclose(sequence['scale'].numpy(), np.full((7, 5, 4), 0.5), rtol=1e-6)

    def test_small_initial_mean(self):
        policy = networks.FeedForwardGaussianPolicy((3,), 2)
        params, _ = policy.step(tf.random.normal([100, 3]), ())
        self.assertLess(np.abs(params['loc'].numpy()).max(), 0.2)

    def test_distribution_log_prob_entropy_match_formula(self):
        policy = networks.FeedForwardGaussianPolicy((3,), 2)
        policy.log_std.assign([-0.5, 0.3])
        params, _ = policy.step(tf.random.normal([6, 3]), ())
        distribution = policy.distribution(params)
        action = tf.random.normal([6, 2])
        std = np.exp([-0.5, 0.3])
        loc = params['loc'].numpy()
        expected = np.sum(-0.5 * ((action.numpy() - loc) / std) ** 2 - np.log(std) -
                          0.5 * np.log(2 * np.pi), axis=-1)
        np.testing.assert_allclose(distribution.log_prob(action).numpy(), expected, rtol=1e-5)
        np.testing.assert_allclose(distribution.entropy().numpy(),
                                   np.full(6, np.sum(0.5 * np.log(2 * np.pi * np.e * std ** 2))),
                                   rtol=1e-5)
        self.assertEqual(distribution.sample(seed=(1, 2)).shape, (6, 2))

    def test_wrong_observation_shape_raises(self):
        policy = networks.FeedForwardGaussianPolicy((3,), 2, name='policy')
        with self.assertRaisesRegex(ValueError, r'policy: observations of shape \(5, 4\) do not'):
            policy.step(tf.zeros([5, 4]), ())


class CategoricalPolicyTest(absltest.TestCase):

    def test_distribution(self):
        policy = networks.FeedForwardCategoricalPolicy((4,), 3)
        params, _ = policy.step(tf.random.normal([5, 4]), ())
        self.assertEqual(params['logits'].shape, (5, 3))
        distribution = policy.distribution(params)
        self.assertEqual(distribution.dtype, tf.int32)
        self.assertEqual(policy.action_shape, ())
        probs = distribution.probs().numpy()
        np.testing.assert_allclose(probs.sum(-1), np.ones(5), rtol=1e-6)
        # Small output gain: the initial policy is close to uniform.
        np.testing.assert_allclose(probs, np.full((5, 3), 1 / 3), atol=0.02)
        sample = distribution.sample(seed=(3, 4))
        self.assertEqual(sample.shape, (5,))
        np.testing.assert_allclose(distribution.log_prob(sample).numpy(),
                                   np.log(probs[np.arange(5), sample.numpy()]), rtol=1e-5)


class RecurrentGaussianPolicyTest(absltest.TestCase):

    def setUp(self):
        super().setUp()
        self.policy = networks.RecurrentGaussianPolicy((3,), 2, gru_units=8, output_gain=1.0)

    def test_sequence_matches_stepping_with_resets(self):
        length, batch = 6, 4
        observ = tf.random.normal([length, batch, 3], seed=1)
        reset = tf.constant(np.random.default_rng(0).uniform(size=(length, batch)) < 0.3)
        state = tf.random.normal([batch, 8], seed=2)
        sequence = self.policy.sequence(observ, state, reset)
        stepped = []
        for step in range(length):
            params, state = self.policy.step(observ[step],
                                             self.policy.reset_state(state, reset[step]))
            stepped.append(params['loc'])
        np.testing.assert_allclose(sequence['loc'].numpy(), tf.stack(stepped).numpy(),
                                   rtol=1e-5, atol=1e-6)
        self.assertEqual(sequence['scale'].shape, (length, batch, 2))

    def test_state_carries_memory_and_reset_clears_it(self):
        observ = tf.random.normal([1, 3])
        zero = self.policy.initial_state(1)
        self.assertEqual(zero.shape, (1, 8))
        _, state = self.policy.step(tf.random.normal([1, 3]) * 3, zero)
        from_zero, _ = self.policy.step(observ, zero)
        from_state, _ = self.policy.step(observ, state)
        self.assertFalse(np.allclose(from_zero['loc'].numpy(), from_state['loc'].numpy()))
        after_reset, _ = self.policy.step(observ, self.policy.reset_state(state, [True]))
        np.testing.assert_allclose(after_reset['loc'].numpy(), from_zero['loc'].numpy())
        kept, _ = self.policy.step(observ, self.policy.reset_state(state, [False]))
        np.testing.assert_allclose(kept['loc'].numpy(), from_state['loc'].numpy())

    def test_gradients_reach_every_variable_through_sequence(self):
        observ = tf.random.normal([5, 3, 3])
        with tf.GradientTape() as tape:
            params = self.policy.sequence(observ, self.policy.initial_state(3),
                                          tf.zeros([5, 3], tf.bool))
            loss = tf.reduce_sum(self.policy.distribution(params).log_prob(tf.ones([5, 3, 2])))
        gradients = tape.gradient(loss, self.policy.trainable_variables)
        self.assertLen(gradients, len(self.policy.trainable_variables))
        for gradient, variable in zip(gradients, self.policy.trainable_variables, strict=True):
            self.assertIsNotNone(gradient, variable.name)
            self.assertGreater(np.abs(tf.convert_to_tensor(gradient).numpy()).sum(), 0,
                               variable.name)


class ValueTest(absltest.TestCase):

    def test_shapes(self):
        value = networks.FeedForwardValue((3,), hidden_sizes=(16,))
        self.assertEqual(value(tf.zeros([4, 3])).shape, (4,))
        self.assertEqual(value(tf.zeros([2, 4, 3])).shape, (2, 4))
        self.assertLen(value.trainable_variables, 4)


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
        self.assertEqual([layer.kernel.shape[1] for layer in policy.torso.layers], [32, 16])
        value = networks.FeedForwardValue((3,))
        self.assertEqual([layer.kernel.shape[1] for layer in value.torso.layers], [8])


if __name__ == '__main__':
    absltest.main()
