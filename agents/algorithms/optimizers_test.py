"""Tests the per-member optimizers: Adam against Keras' Adam, RMSprop against PyTorch's formula,
and masks, learning rates and step counts that act per member."""

import numpy as np
import tensorflow as tf
from absl.testing import absltest, parameterized

from agents.algorithms import optimizers

_SHAPES = ((3, 2), (4,), (1, 5))


def _variables(num_members, seed=0):
    rng = np.random.default_rng(seed)
    return [tf.Variable(rng.normal(size=(num_members, *shape)).astype(np.float32))
            for shape in _SHAPES]


def _gradients(num_members, seed, scale=1.0):
    """Random gradients of the members, with entries over several orders of magnitude."""
    rng = np.random.default_rng(seed)
    return [tf.constant((rng.normal(size=(num_members, *shape)) * scale *
                         10.0 ** rng.uniform(-3, 0, size=(num_members, *shape)))
                        .astype(np.float32)) for shape in _SHAPES]


def _build(kind, variables, learning_rate):
    if kind == 'adam':
        return optimizers.Adam(variables, learning_rate)
    return optimizers.RMSprop(variables, learning_rate)


def _state(optimizer, variables):
    """The variables, slots and step counts as arrays."""
    return {'variables': [variable.numpy() for variable in variables],
            'slots': {name: [slot.numpy() for slot in slots]
                      for name, slots in optimizer.slots.items()},
            'iterations': optimizer.iterations.numpy()}


class SingleMemberTest(parameterized.TestCase):

    @parameterized.parameters((1e-2, 0.9, 0.999, 1e-7), (3e-3, 0.8, 0.99, 1e-5))
    def test_adam_matches_keras(self, learning_rate, beta_1, beta_2, epsilon):
        ours, theirs = _variables(1), _variables(1)
        optimizer = optimizers.Adam(ours, learning_rate, beta_1, beta_2, epsilon)
        keras = tf.keras.optimizers.Adam(learning_rate, beta_1, beta_2, epsilon)
        for step in range(6):
            gradients = _gradients(1, step)
            optimizer.apply(gradients, ours)
            keras.apply_gradients(zip(gradients, theirs, strict=True))
            for result, reference in zip(ours, theirs, strict=True):
                np.testing.assert_allclose(result.numpy(), reference.numpy(), rtol=0, atol=1e-6)
        np.testing.assert_array_equal(optimizer.iterations.numpy(), [6])
        self.assertEqual(keras.iterations.numpy(), 6)

    @parameterized.parameters((1e-2, 0.99, 1e-5), (7e-4, 0.9, 1e-8))
    def test_rmsprop_matches_pytorch_formula(self, learning_rate, alpha, epsilon):
        """`v = alpha v + (1 - alpha) g^2` from zero, `w -= lr g / (sqrt(v) + epsilon)`: epsilon
        outside the root (Keras puts it inside, a different step for small gradients)."""
        variables = _variables(1)
        optimizer = optimizers.RMSprop(variables, learning_rate, alpha, epsilon)
        weights = [variable.numpy().astype(np.float64) for variable in variables]
        averages = [np.zeros_like(weight) for weight in weights]
        for step in range(6):
            gradients = _gradients(1, step, scale=1e-2)
            optimizer.apply(gradients, variables)
            for index, gradient in enumerate(gradients):
                gradient = gradient.numpy().astype(np.float64)
                averages[index] = alpha * averages[index] + (1 - alpha) * gradient ** 2
                weights[index] -= learning_rate * gradient / (np.sqrt(averages[index]) + epsilon)
            for variable, weight, average, slot in zip(
                    variables, weights, averages, optimizer.slots['square_average'],
                    strict=True):
                np.testing.assert_allclose(variable.numpy(), weight, rtol=0, atol=1e-6)
                np.testing.assert_allclose(slot.numpy(), average, rtol=1e-5, atol=1e-12)
        np.testing.assert_array_equal(optimizer.iterations.numpy(), [6])

    def test_apply_in_tf_function(self):
        """A compiled step, with a mask given as a tensor, steps as an eager one."""
        eager_variables, compiled_variables = _variables(1), _variables(1)
        eager = optimizers.Adam(eager_variables, 1e-2)
        compiled = optimizers.Adam(compiled_variables, 1e-2)
        apply = tf.function(lambda gradients, mask: compiled.apply(gradients, compiled_variables,
                                                                   mask))
        for step, mask in enumerate([True, False, True]):
            gradients = _gradients(1, step)
            eager.apply(gradients, eager_variables, mask=tf.constant([mask]))
            apply(gradients, tf.constant([mask]))
        for result, reference in zip(compiled_variables, eager_variables, strict=True):
            np.testing.assert_allclose(result.numpy(), reference.numpy(), rtol=0, atol=1e-7)
        np.testing.assert_array_equal(compiled.iterations.numpy(), [2])


class MembersTest(parameterized.TestCase):
    """Two members of one optimizer step as two K = 1 optimizers would, each only where its
    mask is true."""

    def _check_members(self, kind, learning_rates, masks):
        variables = _variables(2)
        optimizer = _build(kind, variables, learning_rates)
        lone_variables = [[tf.Variable(variable[k:k + 1]) for variable in variables]
                          for k in range(2)]
        lone = [_build(kind, lone_variables[k], learning_rates[k]) for k in range(2)]
        for step, mask in enumerate(masks):
            gradients = _gradients(2, step)
            before = _state(optimizer, variables)
            optimizer.apply(gradients, variables, mask=tf.constant(mask))
            after = _state(optimizer, variables)
            for k in range(2):
                if mask[k]:
                    lone[k].apply([gradient[k:k + 1] for gradient in gradients],
                                  lone_variables[k])
                else:  # Variables, slots and step count of member k stay as they were.
                    for old, new in zip(tf.nest.flatten(before), tf.nest.flatten(after),
                                        strict=True):
                        np.testing.assert_array_equal(old[k], new[k])
                for result, reference in zip(variables, lone_variables[k], strict=True):
                    np.testing.assert_allclose(result.numpy()[k:k + 1], reference.numpy(),
                                               rtol=0, atol=1e-6)
                for name, slots in optimizer.slots.items():
                    for result, reference in zip(slots, lone[k].slots[name], strict=True):
                        np.testing.assert_allclose(result.numpy()[k:k + 1], reference.numpy(),
                                                   rtol=1e-6, atol=1e-12)
                self.assertEqual(optimizer.iterations.numpy()[k], lone[k].iterations.numpy()[0])
        return optimizer

    @parameterized.parameters(('adam',), ('rmsprop',))
    def test_masked_member_stays_while_the_other_steps(self, kind):
        masks = [(True, False), (True, False), (True, True), (False, True), (False, False),
                 (True, True)]
        optimizer = self._check_members(kind, (1e-2, 1e-2), masks)
        np.testing.assert_array_equal(optimizer.iterations.numpy(), [4, 3])

    @parameterized.product(kind=('adam', 'rmsprop'), num_members=(1, 2),
                           jit_compile=(False, True))
    def test_masked_member_with_a_nonfinite_gradient_stays_exactly(self, kind, num_members,
                                                                   jit_compile):
        """A member masked for its NaN or infinite gradient keeps its weights, slots and count
        bit for bit; a member stepped under a mask steps bit for bit as without one."""
        variables, reference_variables = _variables(num_members), _variables(num_members)
        optimizer = _build(kind, variables, 1e-2)
        reference = _build(kind, reference_variables, 1e-2)
        apply = tf.function(optimizer.apply, jit_compile=jit_compile, autograph=False)
        apply_all = tf.function(reference.apply, jit_compile=jit_compile, autograph=False)
        for step in range(2):  # Nonzero slots first.
            gradients = _gradients(num_members, step)
            apply(gradients, variables, tf.ones([num_members], tf.bool))
            apply_all(gradients, reference_variables)
        before = _state(optimizer, variables)
        gradients = _gradients(num_members, 2)
        bad = [gradient.numpy() for gradient in gradients]
        bad[0][-1].flat[0], bad[-1][-1].flat[-1] = np.nan, np.inf
        mask = [True] * (num_members - 1) + [False]
        apply([tf.constant(gradient) for gradient in bad], variables, tf.constant(mask))
        apply_all(gradients, reference_variables)
        for old, new, stepped in zip(tf.nest.flatten(before),
                                     tf.nest.flatten(_state(optimizer, variables)),
                                     tf.nest.flatten(_state(reference, reference_variables)),
                                     strict=True):
            np.testing.assert_array_equal(new[-1], old[-1])
            np.testing.assert_array_equal(new[:-1], stepped[:-1])

    @parameterized.parameters(('adam',), ('rmsprop',))
    def test_learning_rates_per_member(self, kind):
        optimizer = self._check_members(kind, (1e-3, 1e-2), [(True, True)] * 4)
        np.testing.assert_allclose(optimizer.learning_rate.numpy(), [1e-3, 1e-2])

    @parameterized.parameters(('adam',), ('rmsprop',))
    def test_one_learning_rate_for_all_members(self, kind):
        optimizer = _build(kind, _variables(3), 5e-3)
        np.testing.assert_allclose(optimizer.learning_rate.numpy(), [5e-3] * 3)

    def test_adam_bias_correction_counts_each_members_steps(self):
        """After member 0 stepped three times alone, member 1's first step is Adam's first step
        (`|m_hat / sqrt(v_hat)|` about 1, a step of about the learning rate), member 0's its
        fourth."""
        learning_rate, beta_1, beta_2, epsilon = 1e-2, 0.9, 0.999, 1e-7
        variables = _variables(2)
        optimizer = optimizers.Adam(variables, learning_rate, beta_1, beta_2, epsilon)
        for step in range(3):
            optimizer.apply(_gradients(2, step), variables, mask=tf.constant([True, False]))
        np.testing.assert_array_equal(optimizer.iterations.numpy(), [3, 0])
        before = [variable.numpy() for variable in variables]
        momentum = [slot.numpy() for slot in optimizer.slots['momentum']]
        velocity = [slot.numpy() for slot in optimizer.slots['velocity']]
        gradients = _gradients(2, 3)
        optimizer.apply(gradients, variables)
        np.testing.assert_array_equal(optimizer.iterations.numpy(), [4, 1])
        for index, gradient in enumerate(gradients):
            gradient = gradient.numpy().astype(np.float64)
            new_momentum = momentum[index] + (gradient - momentum[index]) * (1 - beta_1)
            new_velocity = velocity[index] + (gradient ** 2 - velocity[index]) * (1 - beta_2)
            step = np.array([4, 1]).reshape(2, *[1] * (gradient.ndim - 1))
            alpha = learning_rate * np.sqrt(1 - beta_2 ** step) / (1 - beta_1 ** step)
            expected = before[index] - new_momentum * alpha / (np.sqrt(new_velocity) + epsilon)
            np.testing.assert_allclose(variables[index].numpy(), expected, rtol=0, atol=1e-6)
            # Member 1's first step: -lr g / (|g| + epsilon / sqrt(1 - beta_2)), about
            # -lr sign(g).
            np.testing.assert_allclose(
                variables[index].numpy()[1] - before[index][1],
                -learning_rate * gradient[1] / (np.abs(gradient[1]) +
                                                epsilon / np.sqrt(1 - beta_2)),
                rtol=1e-4, atol=1e-7)


if __name__ == '__main__':
    absltest.main()
