"""Tests of evaluation: one deterministic episode per environment, seeded by the step."""

import numpy as np
from absl.testing import absltest

from agents import envs
from agents.algorithms import off_policy_testing
from agents.runs import evaluator


class EvaluatorTest(absltest.TestCase):

    def test_whole_episodes_in_one_call_depend_on_the_seeds_alone(self):
        env = envs.make('Pendulum-v1', num_envs=3, seed=0, wrappers=('range_normalize',))
        agent = off_policy_testing.OffPolicyTesting(env.observation_space.shape, 1, num_envs=3)
        evaluation = evaluator.Evaluator(agent, env, jit_compile=False)
        self.assertTrue(evaluation.whole_episodes)
        calls = []
        first = evaluation.evaluate(7, lambda: calls.append(1))
        self.assertLen(calls, 1)
        np.testing.assert_array_equal(first[1], [200, 200, 200])
        self.assertTrue(np.isfinite(first[0]).all())
        agent.random.reset_from_seed(123)  # Greedy acting draws nothing.
        again = evaluation.evaluate(7, lambda: None)
        np.testing.assert_array_equal(first[0], again[0])
        other = evaluation.evaluate(8, lambda: None)
        self.assertFalse(np.array_equal(first[0], other[0]))

    def test_evaluation_seeds(self):
        seeds = {evaluator.evaluation_seed(seed, steps) for seed in range(3)
                 for steps in (0, 256, 10**12)}
        self.assertLen(seeds, 9)
        self.assertTrue(all(0 <= seed < 2**62 for seed in seeds))


if __name__ == '__main__':
    absltest.main()
