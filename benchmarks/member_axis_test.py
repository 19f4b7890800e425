"""Tests that both sides of the member-axis benchmark take the same gradient steps."""

import contextlib
import io

import numpy as np
from absl.testing import absltest, flagsaver

from benchmarks import member_axis


class MemberAxisTest(absltest.TestCase):

    @flagsaver.flagsaver(members=3, batch=5, hidden=8, steps=4, jit_compile=False)
    def test_both_sides_step_the_same_weights_alike(self):
        sides = member_axis.build()
        (axis_call, axis_weights), (mapped_call, mapped_weights) = (
            sides['member_axis'], sides['vectorized_map'])
        before = [weight.numpy() for weight in axis_weights]
        self.assertEqual(int(axis_call()), 4)
        self.assertEqual(int(mapped_call()), 4)
        for start, mine, theirs in zip(before, axis_weights, mapped_weights, strict=True):
            self.assertEqual(mine.shape[0], 3)  # Every weight has the member axis.
            self.assertFalse(np.array_equal(start, mine.numpy()))  # The steps moved it.
            np.testing.assert_allclose(mine.numpy(), theirs.numpy(), rtol=1e-5, atol=1e-6)

    @flagsaver.flagsaver(members=2, batch=4, hidden=4, steps=2, repeats=2)
    def test_prints_both_sides_and_their_ratio(self):
        output = io.StringIO()
        with contextlib.redirect_stdout(output):
            member_axis.main([])
        text = output.getvalue()
        self.assertRegex(text, r'member_axis: median \d+ us per step of 2 members')
        self.assertRegex(text, r'vectorized_map: median \d+ us per step of 2 members')
        self.assertRegex(text, r'vectorized_map / member_axis: median [\d.]+ \[[\d.]+, [\d.]+\] '
                               r'over 2 alternated pairs')


if __name__ == '__main__':
    absltest.main()
