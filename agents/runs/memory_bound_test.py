"""Tests of the memory lower bound: sizes that cannot fit are refused naming the estimate."""

from absl.testing import absltest

from agents.runs import memory_bound, run_config

GIB = 2**30


class MemoryBoundTest(absltest.TestCase):

    def test_what_fits_passes(self):
        memory_bound.check_fits(8, 16, 128, available=GIB)
        memory_bound.check_fits(1, 1, 1)  # This machine's memory.

    def test_a_population_that_cannot_fit_is_refused_with_the_estimate(self):
        with self.assertRaises(run_config.ConfigError) as raised:
            memory_bound.check_fits(100_000, 16, 128, available=8 * GIB)
        self.assertEqual(
            str(raised.exception),
            'train.population = 100000 x train.num_envs = 16 x train.rollout_length = 128 needs '
            'at least 24.4 GiB (128 bytes per environment step of an iteration, for the rollout '
            'and its copies in the update), more than this machine\'s 8.0 GiB; use fewer '
            'members, environments or steps per iteration')

    def test_a_lone_run_names_its_sizes(self):
        with self.assertRaisesRegex(run_config.ConfigError,
                                    r'^train.num_envs = 1000000 x train.rollout_length = 1000 '
                                    r'needs at least 119.2 GiB'):
            memory_bound.check_fits(1, 1_000_000, 1000, available=8 * GIB)

    def test_the_bound_is_exact_at_the_limit(self):
        needed = 10 * 20 * 30 * memory_bound.BYTES_PER_ENV_STEP
        memory_bound.check_fits(10, 20, 30, available=needed)
        with self.assertRaises(run_config.ConfigError):
            memory_bound.check_fits(10, 20, 30, available=needed - 1)


if __name__ == '__main__':
    absltest.main()
