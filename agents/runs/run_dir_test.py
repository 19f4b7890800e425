"""Tests of run_dir: the layout of run and sweep directories."""

import os

from absl.testing import absltest

from agents.runs import run_dir


class LayoutTest(absltest.TestCase):

    def test_names_are_distinct(self):
        names = [value for name, value in vars(run_dir).items()
                 if name.endswith(('_FILE', '_DIR')) and isinstance(value, str)]
        self.assertLen(set(names), len(names))

    def test_member_dir(self):
        self.assertEqual(run_dir.MEMBER_DIR.format(3), 'member-3')

    def test_exported_steps(self):
        policy_dir = self.create_tempdir().full_path
        self.assertEqual(run_dir.exported_steps(os.path.join(policy_dir, 'missing')), [])
        for name in ('200', '10', 'tmp', '30'):
            os.makedirs(os.path.join(policy_dir, name))
        open(os.path.join(policy_dir, '40'), 'w').close()  # A file, not an export.
        self.assertEqual(run_dir.exported_steps(policy_dir), [10, 30, 200])


if __name__ == '__main__':
    absltest.main()
