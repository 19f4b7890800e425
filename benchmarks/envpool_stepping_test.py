"""Tests of the EnvPool stepping benchmark: every runner steps the environments it names with
the same actions (tiny sizes); their speed is the benchmark's to show."""

import numpy as np
from absl import app
from absl.testing import absltest

from agents.runs import environments
from benchmarks import envpool_stepping


class ActionsTest(absltest.TestCase):

    def test_random_actions_and_their_unit_range(self):
        space = environments.make_envpool_env('Pendulum-v1', 1).unwrapped.single_action_space
        actions = envpool_stepping.random_actions(space, 50, 3, seed=0)
        self.assertEqual(actions.shape, (50, 3, 1))
        self.assertTrue(((actions >= -2) & (actions <= 2)).all())
        unit = envpool_stepping.to_unit_range(actions, space)
        np.testing.assert_allclose(unit, actions / 2, atol=1e-6)

    def test_parse_tasks(self):
        self.assertEqual(envpool_stepping.parse_tasks(['Pendulum-v1:16', 'Pong-v5:8']),
                         [('Pendulum-v1', 16), ('Pong-v5', 8)])
        for bad in ('Pendulum-v1', 'Pendulum-v1:0', ':4'):
            with self.assertRaises(app.UsageError):
                envpool_stepping.parse_tasks([bad])


class RunnersTest(absltest.TestCase):

    def test_every_runner_steps_the_same_actions(self):
        steps, num_envs = 30, 2
        space = environments.make_envpool_env('Pendulum-v1', 1).unwrapped.single_action_space
        actions = envpool_stepping.random_actions(space, steps, num_envs, seed=1)
        for name in envpool_stepping.RUNNERS:
            with self.subTest(runner=name):
                runner = envpool_stepping.make_runner(name, 'Pendulum-v1', num_envs, actions, 0)
                try:
                    sent = runner.actions
                    if name.endswith('_wrapped'):
                        sent = sent * 2.0  # [-1, 1] back to Pendulum's [-2, 2].
                    np.testing.assert_allclose(sent, actions, atol=1e-5)
                    runner.run(runner.actions[:steps])
                finally:
                    runner.close()

    def test_time_task_alternates_and_summarizes(self):
        timings = envpool_stepping.time_task(
            'Pendulum-v1', 2, ['raw', 'step', 'in_graph'], steps=20, warmup_steps=5, repeats=2,
            seed=0)
        self.assertEqual(set(timings), {'raw', 'step', 'in_graph'})
        self.assertTrue(all(len(runs) == 2 for runs in timings.values()))
        summary = envpool_stepping.summarize(timings, 20, 2)
        self.assertEqual(summary['raw']['ratios'], [1.0, 1.0])
        self.assertGreater(summary['in_graph']['steps_per_sec'], 0)
        table = envpool_stepping.format_table('Pendulum-v1', 2, summary)
        self.assertIn('in_graph', table)


if __name__ == '__main__':
    absltest.main()
