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

    def test_checkpoint_index_step(self):
        self.assertEqual(run_dir.checkpoint_index_step('ckpt-2048.index'), 2048)
        for name in ('ckpt-2048.data-00000-of-00001', 'ckpt-x.index', 'ckpt-1.index.tmp',
                     'checkpoint', 'other-3.index'):
            self.assertIsNone(run_dir.checkpoint_index_step(name), name)


if __name__ == '__main__':
    absltest.main()
