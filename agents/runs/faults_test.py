"""Tests of the faults' decisions and sentences."""

import types

from absl.testing import absltest

from agents.runs import faults


class _TrainEnv:
    """Training environments whose rebuilt VectorEnvs are recorded."""

    def __init__(self):
        self.vector_env = types.SimpleNamespace(close=lambda terminate: None)
        self.replaced = []

    def __len__(self):
        return 4

    def replace_vector_env(self, new, seed):
        self.replaced.append((new, seed))


class KeptTest(absltest.TestCase):

    def test_one_sentence_of_what_was_kept(self):
        self.assertEqual(faults.kept(None), 'no checkpoint was saved yet')
        self.assertEqual(faults.kept(256), 'the last checkpoint (step 256) is intact')
        self.assertEqual(faults.kept(256, stays_latest=True),
                         'the last checkpoint (step 256) is intact and stays the latest')


class EnvironmentRestartsTest(absltest.TestCase):

    def test_restarts_up_to_the_limit_between_checkpoints_with_new_seeds(self):
        env = _TrainEnv()
        restarts = faults.EnvironmentRestarts(env, lambda: 'new', 'restart', 2, seed=5)
        failure = RuntimeError('Environment 3 failed in step: boom; the batch is closed.')
        restarts.restart(failure, 128, None)
        restarts.restart(failure, 256, None)
        self.assertEqual(env.replaced, [('new', 5 + faults.RESTART_SEED_STRIDE),
                                        ('new', 5 + 2 * faults.RESTART_SEED_STRIDE)])
        with self.assertRaisesRegex(
                faults.EnvironmentFailure,
                r'^Training environment failure: Environment 3 failed in step: boom \(in the '
                r'iteration after step 384\), after 2 restarts .* no checkpoint was saved yet'):
            restarts.restart(failure, 384, None)
        restarts.checkpointed()
        restarts.restart(failure, 512, 512)  # Counted from the checkpoint again.
        self.assertLen(env.replaced, 3)

    def test_stops_at_once_when_told_to(self):
        restarts = faults.EnvironmentRestarts(_TrainEnv(), None, 'stop', 3, seed=0)
        with self.assertRaisesRegex(faults.EnvironmentFailure,
                                    r"train.on_env_failure = 'stop'\); the last checkpoint "
                                    r'\(step 64\) is intact\. Rerun'):
            restarts.restart(RuntimeError('dead'), 128, 64)

    def test_a_failed_rebuild_stops_the_run(self):
        def fail():
            raise OSError('no workers')
        restarts = faults.EnvironmentRestarts(_TrainEnv(), fail, 'restart', 3, seed=0)
        with self.assertRaisesRegex(faults.EnvironmentFailure,
                                    'rebuilding the training environments failed: no workers'):
            restarts.restart(RuntimeError('dead'), 128, None)


class NonFiniteBatchesTest(absltest.TestCase):

    def test_stop_names_the_problem_and_the_checkpoint_that_stays(self):
        batches = faults.NonFiniteBatches('stop')
        with self.assertRaisesRegex(faults.NonFiniteError,
                                    r'^non-finite loss and the run stopped; the last checkpoint '
                                    r"\(step 8\) is intact and stays the latest\. To drop"):
            batches.dropped('non-finite loss', 8)

    def test_skip_counts_and_stops_when_the_fault_does_not_pass(self):
        batches = faults.NonFiniteBatches('skip')
        for _ in range(faults.MAX_DROPPED_IN_A_ROW - 1):
            batches.dropped('non-finite loss', None)
        batches.passed()
        for _ in range(faults.MAX_DROPPED_IN_A_ROW - 1):
            batches.dropped('non-finite loss', None)
        self.assertEqual(batches.skipped, 2 * (faults.MAX_DROPPED_IN_A_ROW - 1))
        with self.assertRaisesRegex(faults.NonFiniteError, 'batches in a row were dropped'):
            batches.dropped('non-finite loss', None)


class TfReasonTest(absltest.TestCase):

    def test_drops_the_ops_decorations(self):
        error = types.SimpleNamespace(message='Read less bytes {{node x}} than asked [Op:Foo]')
        self.assertEqual(faults.tf_reason(error), 'Read less bytes than asked')


if __name__ == '__main__':
    absltest.main()
