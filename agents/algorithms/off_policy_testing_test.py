"""Tests of the off-policy test algorithm on its own: it learns from its buffer."""

import numpy as np
import tensorflow as tf
from absl.testing import absltest

from agents.algorithms import off_policy_testing


def _bandit_batch(agent, steps, envs, seed):
    """Random actions whose reward is -(action - 0.5)^2, each episode one step long."""
    rng = np.random.default_rng(seed)
    observ = rng.normal(size=(steps, envs, 3)).astype(np.float32)
    action = rng.uniform(-1, 1, size=(steps, envs, 1)).astype(np.float32)
    return {'observ': observ, 'action': action, 'reward': -(action[..., 0] - 0.5) ** 2,
            'next_observ': observ, 'terminated': np.ones((steps, envs), bool),
            'truncated': np.zeros((steps, envs), bool), 'extras': {}}


class OffPolicyTestingTest(absltest.TestCase):

    def test_learns_the_best_action_from_its_buffer(self):
        agent = off_policy_testing.OffPolicyTesting(
            (3,), 1, num_envs=4, learning_starts=0, gradient_steps=50, batch_size=64,
            learning_rate=1e-2, seed=2)
        learn = tf.function(agent.learn, autograph=False)
        observ = tf.zeros([9, 3])
        first_action = agent.act(observ, (), tf.ones([9], tf.bool), greedy=True)[0]
        losses = []
        for index in range(8):
            metrics, nonfinite = learn(_bandit_batch(agent, 16, 4, index), tf.constant([True]))
            self.assertFalse(any(bool(value) for value in nonfinite.values()))
            losses.append(float(metrics['q_loss']))
        self.assertLess(losses[-1], losses[0] / 4)
        # Q learned the reward's shape: best near 0.5 on a grid of actions in [-1, 1] ...
        grid = tf.reshape(tf.linspace(-1.0, 1.0, 9), [9, 1])
        q_values = agent._q(observ, grid).numpy()
        self.assertIn(grid.numpy()[q_values.argmax(), 0], (0.25, 0.5, 0.75))
        # ... and the policy climbed it.
        action, extras, _ = agent.act(observ, (), tf.ones([9], tf.bool), greedy=True)
        self.assertEqual((action.shape, extras), ((9, 1), {}))
        self.assertGreater(float(tf.reduce_mean(agent._q(observ, action))),
                           float(tf.reduce_mean(agent._q(observ, first_action))) + 0.05)

    def test_a_nonfinite_q_loss_changes_no_network(self):
        agent = off_policy_testing.OffPolicyTesting(
            (3,), 1, num_envs=2, learning_starts=0, nonfinite_at_train=1)
        weights = [variable.numpy() for variable in agent.trainable_variables
                   if 'buffer' not in variable.name]
        _, nonfinite = agent.learn(_bandit_batch(agent, 4, 2, 0), tf.constant([True]))
        self.assertEqual({name: bool(value) for name, value in nonfinite.items()},
                         {'q_loss': True, 'policy_loss': False})
        for before, variable in zip(weights, [v for v in agent.trainable_variables
                                              if 'buffer' not in v.name], strict=True):
            np.testing.assert_array_equal(before, variable.numpy())

    def test_its_undo_state_leaves_out_the_buffer_and_its_checkpoint_may_too(self):
        agent = off_policy_testing.OffPolicyTesting((3,), 1, num_envs=2,
                                                    checkpoint_buffer=False)
        buffer = {variable.ref() for variable in agent.buffer.variables}
        self.assertFalse(buffer & {variable.ref() for variable in agent.undo_variables()})
        self.assertIsInstance(agent.checkpointed(), tf.train.Checkpoint)
        self.assertFalse(hasattr(agent.checkpointed(), 'buffer'))


if __name__ == '__main__':
    absltest.main()
