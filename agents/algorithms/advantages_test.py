"""Tests GAE(lambda) against a plain-Python reference, including episode ends mid-rollout."""

import numpy as np
import tensorflow as tf
from absl.testing import absltest, parameterized

from agents.algorithms import advantages


def reference_gae(reward, value, next_value, terminated, truncated, discount, gae_lambda):
    """Loops over environments and steps backwards, one scalar at a time."""
    num_steps, num_envs = reward.shape
    advantage = np.zeros_like(reward)
    for env in range(num_envs):
        following = 0.0
        for step in reversed(range(num_steps)):
            bootstrap = 0.0 if terminated[step, env] else next_value[step, env]
            delta = reward[step, env] + discount * bootstrap - value[step, env]
            if terminated[step, env] or truncated[step, env]:
                following = 0.0
            following = delta + discount * gae_lambda * following
            advantage[step, env] = following
    return advantage, advantage + value


class GeneralizedAdvantageEstimationTest(parameterized.TestCase):

    @parameterized.parameters((0.99, 0.95), (0.9, 1.0), (0.5, 0.0), (1.0, 0.8))
    def test_matches_reference_with_terminations_and_truncations(self, discount, gae_lambda):
        rng = np.random.default_rng(42)
        shape = (50, 6)
        reward = rng.normal(size=shape).astype(np.float32)
        value = rng.normal(size=shape).astype(np.float32)
        next_value = rng.normal(size=shape).astype(np.float32)
        terminated = rng.uniform(size=shape) < 0.1
        truncated = (rng.uniform(size=shape) < 0.1) & ~terminated
        self.assertGreater(terminated.sum(), 5)
        self.assertGreater(truncated.sum(), 5)
        advantage, return_ = advantages.generalized_advantage_estimation(
            reward, value, next_value, terminated, truncated, discount, gae_lambda)
        expected_advantage, expected_return = reference_gae(
            reward, value, next_value, terminated, truncated, discount, gae_lambda)
        np.testing.assert_allclose(advantage.numpy(), expected_advantage, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(return_.numpy(), expected_return, rtol=1e-5, atol=1e-5)

    def test_discount_and_lambda_per_member(self):
        # [T, K, N] with a [K, 1] discount and lambda: each member as if computed alone.
        rng = np.random.default_rng(7)
        shape = (30, 3, 4)
        reward, value, next_value = (rng.normal(size=shape).astype(np.float32) for _ in range(3))
        terminated = rng.uniform(size=shape) < 0.1
        truncated = (rng.uniform(size=shape) < 0.1) & ~terminated
        discounts, lambdas = [0.99, 0.9, 0.5], [0.95, 1.0, 0.0]
        advantage, return_ = advantages.generalized_advantage_estimation(
            reward, value, next_value, terminated, truncated,
            tf.constant(discounts)[:, None], tf.constant(lambdas)[:, None])
        for member, (discount, gae_lambda) in enumerate(zip(discounts, lambdas, strict=True)):
            expected_advantage, expected_return = reference_gae(
                *(array[:, member] for array in (reward, value, next_value, terminated,
                                                 truncated)), discount, gae_lambda)
            np.testing.assert_allclose(advantage.numpy()[:, member], expected_advantage,
                                       rtol=1e-5, atol=1e-5)
            np.testing.assert_allclose(return_.numpy()[:, member], expected_return,
                                       rtol=1e-5, atol=1e-5)

    def test_truncation_bootstraps_from_final_value_and_termination_does_not(self):
        # Two one-step episodes that differ only in how they ended.
        reward = [[1.0, 1.0]]
        value = [[0.0, 0.0]]
        final_value = [[10.0, 10.0]]
        advantage, return_ = advantages.generalized_advantage_estimation(
            reward, value, final_value, terminated=[[True, False]], truncated=[[False, True]],
            discount=0.5, gae_lambda=0.9)
        np.testing.assert_allclose(return_.numpy(), [[1.0, 1.0 + 0.5 * 10.0]])
        np.testing.assert_allclose(advantage.numpy(), return_.numpy())

    def test_episode_end_stops_the_recursion(self):
        # Step 0 ends an episode; the large advantage of step 1 must not leak into step 0.
        reward = [[0.0], [100.0]]
        value = [[0.0], [0.0]]
        next_value = [[0.0], [0.0]]
        for done_kind in ('terminated', 'truncated'):
            flags = {'terminated': [[False], [False]], 'truncated': [[False], [False]]}
            flags[done_kind] = [[True], [False]]
            advantage, _ = advantages.generalized_advantage_estimation(
                reward, value, next_value, discount=0.99, gae_lambda=0.95, **flags)
            np.testing.assert_allclose(advantage.numpy(), [[0.0], [100.0]], err_msg=done_kind)

    def test_lambda_one_gives_discounted_monte_carlo_return(self):
        reward = np.array([[1.0], [2.0], [3.0]], np.float32)
        value = np.array([[5.0], [-1.0], [2.0]], np.float32)
        next_value = np.array([[-1.0], [2.0], [4.0]], np.float32)
        no = np.zeros((3, 1), bool)
        _, return_ = advantages.generalized_advantage_estimation(
            reward, value, next_value, no, no, discount=0.5, gae_lambda=1.0)
        expected = [[1 + 0.5 * 2 + 0.25 * 3 + 0.125 * 4], [2 + 0.5 * 3 + 0.25 * 4], [3 + 0.5 * 4]]
        np.testing.assert_allclose(return_.numpy(), expected)

    def test_works_inside_tf_function_with_unknown_length(self):
        compute = tf.function(
            lambda *args: advantages.generalized_advantage_estimation(*args, 0.9, 0.8),
            input_signature=([tf.TensorSpec([None, 2])] * 3 +
                             [tf.TensorSpec([None, 2], tf.bool)] * 2))
        rng = np.random.default_rng(1)
        inputs = [rng.normal(size=(7, 2)).astype(np.float32) for _ in range(3)]
        flags = [rng.uniform(size=(7, 2)) < 0.3 for _ in range(2)]
        advantage, _ = compute(*inputs, *flags)
        expected, _ = reference_gae(*inputs, *flags, 0.9, 0.8)
        np.testing.assert_allclose(advantage.numpy(), expected, rtol=1e-5, atol=1e-5)

    def test_mismatched_shapes_raise(self):
        with self.assertRaisesRegex(ValueError, 'next_value has shape'):
            advantages.generalized_advantage_estimation(
                tf.zeros([5, 2]), tf.zeros([5, 2]), tf.zeros([4, 2]), tf.zeros([5, 2], tf.bool),
                tf.zeros([5, 2], tf.bool), 0.99, 0.95)
        with self.assertRaisesRegex(ValueError, 'terminated has shape'):
            advantages.generalized_advantage_estimation(
                tf.zeros([5, 2]), tf.zeros([5, 2]), tf.zeros([5, 2]), tf.zeros([5], tf.bool),
                tf.zeros([5, 2], tf.bool), 0.99, 0.95)

    def test_bad_hyperparameters_raise(self):
        args = [tf.zeros([2, 1])] * 3 + [tf.zeros([2, 1], tf.bool)] * 2
        with self.assertRaisesRegex(ValueError, 'discount'):
            advantages.generalized_advantage_estimation(*args, 1.5, 0.95)
        with self.assertRaisesRegex(ValueError, 'gae_lambda'):
            advantages.generalized_advantage_estimation(*args, 0.99, -0.1)


if __name__ == '__main__':
    absltest.main()
