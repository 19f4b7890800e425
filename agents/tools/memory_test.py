"""Tests of the machine's memory as the size checks see it."""

import psutil
from absl.testing import absltest

from agents.tools import memory


class MemoryTest(absltest.TestCase):

    def test_physical_bytes_is_the_machines_total(self):
        self.assertAlmostEqual(memory.physical_bytes() / psutil.virtual_memory().total, 1.0,
                               delta=0.01)

    def test_describe(self):
        self.assertEqual(memory.describe(3 * 2**30 // 2), '1.5 GiB')


if __name__ == '__main__':
    absltest.main()
