"""Tests of the two cadences' `learn` and of the interface's defaults."""

import numpy as np
import tensorflow as tf
from absl.testing import absltest

from agents.algorithms import algorithm


class _Counting(algorithm.OffPolicyAlgorithm):
    """Keeps the batches' rewards summed; `train` reports the sum."""

    TRAIN_METRICS = ('kept',)
    NONFINITE_QUANTITIES = ('kept',)

    def __init__(self, learning_starts=4, train_freq=1, gradient_steps=2):
        super().__init__(learning_starts, train_freq, gradient_steps)
        self.kept = tf.Variable(0.0)
        self.trained = tf.Variable(0)

    def observe(self, batch, keep):
        return self.kept.assign_add(tf.where(keep, tf.reduce_sum(batch['reward']), 0.0))

    def train(self, gradient_steps):
        self.trained.assign_add(gradient_steps)
        return ({'kept': self.kept.read_value()},
                {'kept': ~tf.math.is_finite(self.kept.read_value())})


def _batch(reward):
    return {'reward': tf.constant(reward, tf.float32)}  # [T, N]


class OffPolicyLearnTest(absltest.TestCase):

    def test_trains_once_learning_starts_steps_were_observed(self):
        agent = _Counting(learning_starts=4)
        metrics, nonfinite = agent.learn(_batch([[1.0, 1.0]]), tf.constant([True]))
        self.assertTrue(np.isnan(metrics['kept']))  # Not trained: not logged.
        self.assertFalse(bool(nonfinite['kept']))
        self.assertEqual(int(agent.trained), 0)
        metrics, _ = agent.learn(_batch([[1.0, 1.0]]), tf.constant([True]))
        self.assertEqual(float(metrics['kept']), 4.0)
        self.assertEqual(int(agent.trained), 2)  # gradient_steps.
        self.assertEqual(int(agent.observed_steps), 4)
        self.assertEqual(agent.cadence, algorithm.OffPolicy(4, 1, 2))

    def test_keeps_no_transition_of_a_nonfinite_batch_and_does_not_train_on_it(self):
        agent = _Counting(learning_starts=0)
        compiled = tf.function(agent.learn, autograph=False)
        metrics, _ = compiled(_batch([[np.nan, 1.0]]), tf.constant([False]))
        self.assertEqual((float(agent.kept), int(agent.observed_steps), int(agent.trained)),
                         (0.0, 0, 0))
        self.assertTrue(np.isnan(metrics['kept']))

    def test_refuses_a_bad_cadence(self):
        for arguments, message in (((-1, 1, 1), 'learning_starts'), ((0, 0, 1), 'train_freq'),
                                   ((0, 1, 1.5), 'gradient_steps')):
            with self.assertRaisesRegex(ValueError, message):
                _Counting(*arguments)


class _Rollouts(algorithm.OnPolicyAlgorithm):

    def update(self, batch):
        return {'mean': tf.reduce_mean(batch['reward']), 'nonfinite': {'loss': tf.constant(True)}}


class InterfaceTest(absltest.TestCase):

    def test_an_on_policy_update_reports_its_nonfinite_quantities_apart(self):
        agent = _Rollouts()
        metrics, nonfinite = agent.learn(_batch([[2.0]]), tf.constant([True]))
        self.assertEqual(set(metrics), {'mean'})
        self.assertEqual(nonfinite, {'loss': True})
        self.assertEqual(agent.cadence, algorithm.OnPolicy())

    def test_a_lone_agent_is_a_population_of_one_undone_as_a_whole(self):
        agent = _Rollouts()
        self.assertEqual((agent.num_members, agent.members, agent.concurrent_update),
                         (1, [agent], False))
        self.assertIs(agent.checkpointed(), agent)
        variable, saved = tf.Variable(1.0), tf.Variable(5.0)
        agent.undo(tf.constant([False]), [(variable, saved)])
        self.assertEqual(float(variable), 1.0)
        agent.undo(tf.constant([True]), [(variable, saved)])
        self.assertEqual(float(variable), 5.0)


if __name__ == '__main__':
    absltest.main()
