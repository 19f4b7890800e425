"""Tests of what the benchmarks' tests share: a gin file's bindings read as text, and the skip of
a test that needs .venv-peers."""

import os
import textwrap
import unittest
from unittest import mock

from absl.testing import absltest

from agents.runs import run_config
from benchmarks import peers_testing


class GinFileBindingsTest(absltest.TestCase):

    def test_reads_plain_bindings_and_ignores_the_rest(self):
        path = self.create_tempfile('config.gin', textwrap.dedent('''\
            # A comment, then an include and a macro: neither is a binding.
            include 'base.gin'
            STEPS = 1000

            train.env_id = 'Pendulum-v1'
            train.total_steps = 150_000  # A trailing comment.
            PPO.learning_rate=3e-4
            FeedForwardValue.hidden_sizes = (64, 64)
            train.wrappers = ['ClipAction', 'NormalizeObservation']
            train.algorithm = @PPO
            ''')).full_path
        self.assertEqual(peers_testing.gin_file_bindings(path), {
            'train.env_id': 'Pendulum-v1',
            'train.total_steps': 150_000,
            'PPO.learning_rate': 3e-4,
            'FeedForwardValue.hidden_sizes': (64, 64),
            'train.wrappers': ['ClipAction', 'NormalizeObservation'],
            'train.algorithm': 'PPO',
        })

    def test_an_empty_file_binds_nothing(self):
        self.assertEqual(
            peers_testing.gin_file_bindings(self.create_tempfile('empty.gin').full_path), {})


class NeedsPeersTest(absltest.TestCase):

    def run_decorated(self, peers_python):
        """Runs a test decorated while PEERS_PYTHON is `peers_python`: (its result, whether its
        body ran)."""
        ran = []
        with mock.patch.object(peers_testing, 'PEERS_PYTHON', peers_python):

            class Decorated(unittest.TestCase):

                @peers_testing.needs_peers('SB3')
                def test_peers(self):
                    ran.append(True)

        result = unittest.TestResult()
        Decorated('test_peers').run(result)
        return result, bool(ran)

    def test_skips_without_the_peers_python(self):
        missing = os.path.join(self.create_tempdir().full_path, 'bin', 'python')
        result, ran = self.run_decorated(missing)
        self.assertFalse(ran)
        self.assertEqual([reason for _, reason in result.skipped], [
            '.venv-peers is absent (build it with benchmarks/setup_peers.sh) so SB3 cannot be '
            'checked'])
        self.assertTrue(result.wasSuccessful())

    def test_runs_with_the_peers_python(self):
        result, ran = self.run_decorated(self.create_tempfile('python').full_path)
        self.assertTrue(ran)
        self.assertEmpty(result.skipped)
        self.assertEqual(result.testsRun, 1)
        self.assertTrue(result.wasSuccessful())

    def test_the_peers_python_is_in_the_package_root(self):
        self.assertEqual(peers_testing.PEERS_PYTHON,
                         os.path.join(run_config.PACKAGE_ROOT, '.venv-peers', 'bin', 'python'))


if __name__ == '__main__':
    absltest.main()
