"""Tests of the environment throughput benchmark's in-graph and raw-loop timings.

Only that they run and step what they claim; their speed is the benchmark's to show.
"""

import numpy as np
from absl.testing import absltest, flagsaver

from agents.tools import mock_vector_env
from benchmarks import env_throughput


class SimulationTimingTest(absltest.TestCase):

    def test_raw_loop_resets_finished_envs(self):
        vector_env = mock_vector_env.MockVectorEnv([2, 3])
        vector_env.reset()
        env_throughput.raw_loop(vector_env, np.array([0.5], np.float32), 6)
        self.assertLen(vector_env.actions, 6)
        np.testing.assert_array_equal(vector_env.episodes, [4, 3])
        np.testing.assert_allclose(np.stack(vector_env.actions), np.full((6, 2, 1), 0.5))

    @flagsaver.flagsaver(warmup_steps=3)
    def test_raw_loop_timing(self):
        vector_env = mock_vector_env.MockVectorEnv([2, 3])
        timing = env_throughput.time_raw_loop(vector_env, 5)
        self.assertGreater(timing.wall, 0)
        self.assertLen(vector_env.actions, 3 + 5)
        self.assertEqual(vector_env.reset_seeds[0], 0)
        np.testing.assert_array_equal(vector_env.actions[0], [[0], [0]])  # The neutral action.

    def test_in_graph_rollout_timing(self):
        vector_env = mock_vector_env.MockVectorEnv([2, 3])
        timing = env_throughput.time_in_graph_rollout(vector_env, 5)
        self.assertGreater(timing.wall, 0)
        self.assertLen(vector_env.actions, 2 * 5)  # The compiling rollout and the timed one.
        np.testing.assert_array_equal(vector_env.actions[-1], [[0], [0]])

    def test_runners_name_their_timings(self):
        names = [runner.name for runner in env_throughput.simulation_runners('hybrid', 2)]
        self.assertEqual(names, ['raw_loop_hybrid', 'in_graph_hybrid'])


if __name__ == '__main__':
    absltest.main()
