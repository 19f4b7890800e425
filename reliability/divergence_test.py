"""NaN / divergence: a non-finite rollout or update never reaches the weights or a checkpoint.

With `train.on_nonfinite = 'stop'` (the default) the update is undone, the run stops naming the
quantity, and the last checkpoint stays the latest; with 'skip' the batch is dropped and the run
goes on. Faults: an environment returning a NaN reward or observation (faulty_envs.py) and a
learning rate that makes the loss blow up.

The trainer runs in a fork of this process (harness.run_module_forked), which imported TensorFlow
once: the binary's own code from flag parsing to exit status and output.
"""

import os

import gin
import numpy as np
import tensorflow as tf
from absl.testing import absltest

from agents.algorithms.ppo import ppo
from agents.runs import loop
from reliability import harness


class DivergenceBinaryTest(harness.TrainerTestCase):

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        harness.preload(pipelines=False)

    def train(self, fault, **overrides):
        # The fault strikes once, at the 300th step of a training environment (third iteration,
        # after the checkpoints of steps 512 and 1024), in a worker: never in evaluation.
        return harness.run_train(*harness.faulty_workers_run(
            self.logdir, {'fault': fault, 'at_step': 300, 'workers_only': True,
                          'once_marker': os.path.join(self.root, 'struck')}, **overrides))

    def test_nan_reward_stops_the_run_and_keeps_the_last_checkpoint(self):
        result = self.train('nan_reward')
        self.assertEqual(result.returncode, 1, result.stderr[-5000:])
        self.assertRegex(
            result.stderr, r"train: error: non-finite reward from the environments \[[0-3]\] in "
            r"the iteration that ended at step 1536; its update was undone and the run stopped; "
            r"the last checkpoint \(step 1024\) is intact and stays the latest\. To drop such "
            r"batches and go on, set train.on_nonfinite = 'skip'\.")
        self.assertEqual(harness.checkpoint_state(self.logdir), ([512, 1024], 1024))
        self.assertIsNone(harness.checkpoint_problem(self.logdir, 1024))
        self.assertEqual([record['step'] for record in harness.metrics(self.logdir)],
                         [512, 1024])

    def test_skip_drops_the_batch_of_a_nan_observation_and_goes_on(self):
        result = self.train('nan_observation', train__on_nonfinite='skip')
        self.assertEqual(result.returncode, 0, result.stderr[-5000:])
        # The policy acts on the NaN observation, so the rollout stops at the NaN action.
        self.assertRegex(
            result.stderr, r"Non-finite action \(the policy acted on a non-finite observation, "
            r"or its parameters are not finite\) in the iteration after step 1024; the rollout "
            r"stopped before the update; the batch was dropped \(train.on_nonfinite = 'skip'; 1 "
            r"so far\)\.")
        self.assertEqual([record['step'] for record in harness.metrics(self.logdir)],
                         [512, 1024, 1536, 2048])

    def test_skip_drops_the_batch_of_a_nan_reward_and_goes_on(self):
        result = self.train('nan_reward', train__on_nonfinite='skip')
        self.assertEqual(result.returncode, 0, result.stderr[-5000:])
        self.assertRegex(
            result.stderr, r"Non-finite reward from the environments \[[0-3]\] in the iteration "
            r"that ended at step 1536; its update was undone; the batch was dropped")
        self.assertEqual([record['step'] for record in harness.metrics(self.logdir)],
                         [512, 1024, 1536, 2048])

    def test_exploding_learning_rate_stops_on_a_nonfinite_loss(self):
        result = harness.run_train(*harness.small_run(
            self.logdir, PPO__learning_rate=1e30, PPO__max_grad_norm=None))
        self.assertEqual(result.returncode, 1, result.stderr[-5000:])
        self.assertRegex(
            result.stderr, r'train: error: non-finite (loss|gradient|parameter)[^\n]* in the '
            r'iteration that ended at step 512; its update was undone and the run stopped; no '
            r'checkpoint was saved yet\.')
        self.assertEqual(harness.checkpoint_state(self.logdir), ([], None))


def _values(agent):
    """Every variable of the agent (its optimizer's included) but the count of its sampling
    seeds' draws (which the rollout before the update advanced)."""
    return {f'{index}:{variable.name}': variable.numpy() for index, variable in
            enumerate(agent.variables) if variable is not agent.sampling_seeds.draws}


class UndoTest(absltest.TestCase):
    """The undo itself, in one process: the dropped batch leaves every variable as it was."""

    def setUp(self):
        super().setUp()
        gin.clear_config()
        gin.parse_config('train.algorithm = @PPO\nPPO.num_minibatches = 4\nPPO.num_epochs = 2\n')
        self.addCleanup(gin.clear_config)

    def test_skipped_batch_leaves_weights_optimizer_and_statistics_unchanged(self):
        root = self.create_tempdir().full_path
        marker = os.path.join(root, 'struck')
        with loop.training_run(
                os.path.join(root, 'run'), env_id=harness.FAULTY_ENV_ID,
                env_kwargs={'fault': 'nan_reward', 'at_step': 10, 'once_marker': marker},
                total_steps=256, num_envs=2, rollout_length=128, env_mode='in_process',
                eval_every_steps=256, eval_episodes=1, on_nonfinite='skip') as run:
            agent = run.checkpoint.agent
            before = _values(agent)
            self.assertIsNotNone(run.run())  # One iteration, dropped; then the evaluation.
            self.assertTrue(os.path.exists(marker))
            self.assertEqual(run.skipped_batches, 1)
            after = _values(agent)
        self.assertEqual(sorted(before), sorted(after))
        self.assertGreater(len(before), 20)
        for name, value in before.items():
            np.testing.assert_array_equal(after[name], value, err_msg=name)

    def test_update_stops_before_applying_a_nonfinite_step(self):
        agent = ppo.PPO((3,), 1, num_envs=2, num_minibatches=2, num_epochs=1, seed=1)
        weights = [variable.numpy() for variable in agent.trainable_variables]
        observ = tf.random.stateless_normal([8, 2, 3], seed=[1, 2])
        action, extras, _ = agent.act(tf.reshape(observ, [16, 3]), (), tf.ones([16], tf.bool))
        extras = tf.nest.map_structure(lambda x: tf.reshape(x, [8, 2, *x.shape[1:]]), extras)
        reward = tf.tensor_scatter_nd_update(tf.ones([8, 2]), [[3, 1]], [np.nan])
        metrics = agent.update({
            'observ': observ, 'action': tf.reshape(action, [8, 2, 1]), 'reward': reward,
            'terminated': tf.zeros([8, 2], tf.bool), 'truncated': tf.zeros([8, 2], tf.bool),
            'next_observ': observ, 'extras': extras})
        # A lone agent's metrics: one per member.
        self.assertEqual(metrics['nonfinite']['loss'].numpy().tolist(), [True])
        self.assertEqual(metrics['num_gradient_steps'].numpy().tolist(), [0.0])
        for variable, value in zip(agent.trainable_variables, weights, strict=True):
            np.testing.assert_array_equal(variable.numpy(), value)


if __name__ == '__main__':
    absltest.main()
