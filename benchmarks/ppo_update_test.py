"""Tests of what the update benchmark runs: the network floor's program and the printed table."""

import contextlib
import io

import numpy as np
from absl import app
from absl.testing import absltest, flagsaver

from benchmarks import ppo_update

SMALL = dict(num_steps=8, num_envs=4, observ_size=3, action_size=1, num_epochs=3,
             num_minibatches=4, repeats=2)


class NetworkFloorTest(absltest.TestCase):

    @flagsaver.flagsaver(**SMALL)
    def test_floor_steps_through_every_minibatch_and_moves_every_weight(self):
        agent = ppo_update.make_agent(jit_compile=True)
        batch = ppo_update.synthetic_batch(agent, 8, 4, 3)
        before = [variable.numpy() for variable in agent._trainable]
        floor = ppo_update.network_floor(agent, batch, jit_compile=True)
        self.assertEqual(int(floor()), 3 * 4)  # Epochs x minibatches.
        for old, variable in zip(before, agent._trainable, strict=True):
            self.assertFalse(np.array_equal(old, variable.numpy()), variable.name)

    @flagsaver.flagsaver(policy='recurrent', chunk_length=4, **SMALL)
    def test_recurrent_policies_are_refused(self):
        agent = ppo_update.make_agent(jit_compile=False)
        batch = ppo_update.synthetic_batch(agent, 8, 4, 3)
        with self.assertRaisesRegex(app.UsageError, 'feed-forward policies only'):
            ppo_update.network_floor(agent, batch, jit_compile=False)

    @flagsaver.flagsaver(floor=True, **SMALL)
    def test_prints_update_floor_and_their_ratio(self):
        output = io.StringIO()
        with contextlib.redirect_stdout(output):
            ppo_update.time_setting('false')
        lines = output.getvalue().splitlines()
        self.assertLen(lines, 3)
        self.assertRegex(lines[0], r'^jit_compile=false: update: .* over 2 ')
        self.assertRegex(lines[1], r'^jit_compile=false: network floor: .* over 2 ')
        self.assertRegex(lines[2], r'update / floor, median of the pairs \d+\.\d\d \(from ')

    @flagsaver.flagsaver(**SMALL)
    def test_without_floor_prints_the_update_alone(self):
        output = io.StringIO()
        with contextlib.redirect_stdout(output):
            ppo_update.time_setting('true')
        (line,) = output.getvalue().splitlines()
        self.assertRegex(line, r'^jit_compile=true: update: first call .* over 2 .* us per '
                               r'gradient step')


if __name__ == '__main__':
    absltest.main()
