"""Tests of the arithmetic of successive halving and HyperBand."""

from absl.testing import absltest

from pipelines import halving


class RungBudgetsTest(absltest.TestCase):

    def test_powers_of_the_reduction_factor_up_to_the_budget(self):
        self.assertEqual(halving.rung_budgets(100, 3, 900), [100, 300, 900])
        self.assertEqual(halving.rung_budgets(20000, 3, 100000), [20000, 100000])
        self.assertEqual(halving.rung_budgets(20000, 3, 120000), [20000, 60000, 120000])
        self.assertEqual(halving.rung_budgets(100, 2, 150), [100, 150])
        self.assertEqual(halving.rung_budgets(1, 10, 1000), [1, 10, 100, 1000])
        # No rung just short of the full budget.
        self.assertEqual(halving.rung_budgets(16384, 3, 150000), [16384, 49152, 150000])
        self.assertEqual(halving.rung_budgets(100, 3, 899), [100, 300, 899])
        self.assertEqual(halving.rung_budgets(100, 3, 400), [100, 400])


class BracketsTest(absltest.TestCase):

    def test_hyperbands_proportions(self):
        # s = 2, 1, 0: weights 9/3, 3/2, 1/1 -> 3 : 1.5 : 1 of 27.
        self.assertEqual(halving.bracket_sizes(27, 3, 3, 3), [15, 7, 5])
        self.assertEqual(halving.bracket_sizes(27, 1, 3, 3), [27])
        for count in range(0, 40):
            sizes = halving.bracket_sizes(count, 3, 3, 3)
            self.assertEqual(sum(sizes), count)
            self.assertEqual(sizes, sorted(sizes, reverse=True))

    def test_assignment_keeps_the_order(self):
        self.assertEqual(halving.assign_brackets(list('abcdefg'), 2, 2, 3),
                         {0: list('abcd'), 1: list('efg')})  # 4.2 : 2.8, rounded.


class PromoteTest(absltest.TestCase):

    def test_top_third_best_first_ties_by_id(self):
        scores = {'a': 1.0, 'b': 3.0, 'c': 2.0, 'd': 2.0, 'e': 0.0, 'f': 9.0}
        self.assertEqual(halving.promote(scores, 3, 'max'), ['f', 'b'])
        self.assertEqual(halving.promote(scores, 3, 'min'), ['e', 'a'])
        self.assertEqual(halving.promote(scores, 2, 'max'), ['f', 'b', 'c'])
        self.assertEqual(halving.ranks(scores, 'max'), {
            'f': 1, 'b': 2, 'c': 3, 'd': 4, 'a': 5, 'e': 6})

    def test_at_least_one_goes_on_and_never_one_without_a_score(self):
        self.assertEqual(halving.promote({'a': 1.0, 'b': 2.0}, 3, 'max'), ['b'])
        self.assertEqual(halving.promote({'a': None, 'b': -5.0, 'c': None}, 3, 'max'), ['b'])
        self.assertEqual(halving.promote({'a': None}, 3, 'max'), [])

    def test_score_is_the_mean_over_seeds_unless_one_failed(self):
        self.assertEqual(halving.score([1.0, 2.0, 6.0]), 3.0)
        self.assertIsNone(halving.score([1.0, None]))
        self.assertIsNone(halving.score([float('nan'), 1.0]))
        self.assertIsNone(halving.score([]))


if __name__ == '__main__':
    absltest.main()
