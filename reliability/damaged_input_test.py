"""Damaged input: evaluate, visualize and export on broken checkpoints and SavedModels.

Two runs of the same shapes are trained once: the run under test (checkpoints and policies of
steps 512 and 1024) and a run of another configuration (relu instead of tanh in the policy).
Each test damages a copy the way disks and kills damage files and runs the real binaries: a
broken latest checkpoint falls back to the newest one that reads back, with a warning; a
broken checkpoint the user named, a broken SavedModel or a checkpoint of a run of another
configuration is a one-line error (`<tool>: error: ...`, exit 1, no traceback). These tools
only read: the damaged files stay as they were, nothing is moved aside.

The binaries, trainers included, run in forks of this test's process, which imported their
libraries once (harness.run_module_forked): the same code from flag parsing to exit status and
output, without importing TensorFlow again for every run. Their real start-up is covered by
bad_input_test.
"""

import json
import os
import re
import shutil

from absl.testing import absltest

from agents.runs import policy_export
from agents.scripts import testing_utils
from reliability import harness

BUDGET = dict(train__total_steps=1024)
OTHER_CONFIG = dict(FeedForwardGaussianPolicy__activation='relu')
TIMEOUT = 300
TRUNCATED = 'Read less bytes than requested'  # TensorFlow's reader on a cut data file.


def truncate(path):
    """Cuts file `path` to half its size, as a write cut short leaves it."""
    with open(path, 'r+b') as f:
        f.truncate(os.path.getsize(path) // 2)


class DamagedInputTest(absltest.TestCase):

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        harness.preload(pipelines=False)
        root = absltest.get_default_test_tmpdir()
        cls.baseline = os.path.join(root, 'baseline')
        cls.other = os.path.join(root, 'other')
        trainers = []  # Both at once: one per core.
        for logdir, overrides in ((cls.baseline, {}), (cls.other, OTHER_CONFIG)):
            shutil.rmtree(logdir, ignore_errors=True)
            trainers.append(harness.start_module_forked(
                'agents.scripts.train', *harness.small_run(logdir, **BUDGET, **overrides)))
        try:
            for trainer in trainers:
                result = trainer.wait(TIMEOUT)
                assert result.returncode == 0, result.stderr[-5000:]
        finally:
            for trainer in trainers:
                trainer.kill()
        assert harness.checkpoint_state(cls.baseline) == ([512, 1024], 1024)

    def setUp(self):
        super().setUp()
        self.directory = self.create_tempdir().full_path
        self.logdir = os.path.join(self.directory, 'run')
        shutil.copytree(self.baseline, self.logdir)

    def checkpoint(self, step, suffix='', logdir=None):
        return os.path.join(harness.checkpoint_dir(logdir or self.logdir), f'ckpt-{step}{suffix}')

    def run_all(self, *commands):
        """Runs the binaries (tool, *flags) at once; returns their CompletedProcesses in order."""
        binaries = [harness.start_module_forked(f'agents.scripts.{tool}', *flags)
                    for tool, *flags in commands]
        try:
            return [binary.wait(TIMEOUT) for binary in binaries]
        finally:
            for binary in binaries:
                binary.kill()

    def exported_step(self, policy):
        """The step of the exported policy, loaded in a fork: TensorFlow runs in none but forks
        of this process."""
        result = harness.run_forked(lambda: print(policy_export.SavedPolicy(policy).step))
        self.assertEqual(result.returncode, 0, result.stderr[-5000:])
        return int(result.stdout)

    def assert_error(self, result, tool, message):
        """The binary failed with `<tool>: error: <message>` (a regex) and no traceback."""
        self.assertEqual(result.returncode, 1, result.stderr[-5000:])
        self.assertRegex(result.stderr, rf'(^|\n){tool}: error: {message}')
        self.assertNotIn('Traceback', result.stderr)

    def test_broken_latest_checkpoint_falls_back_and_changes_nothing(self):
        truncate(self.checkpoint(1024, '.data-00000-of-00001'))
        self.assertIn(TRUNCATED, harness.checkpoint_problem(self.logdir, 1024))
        before = testing_utils.snapshot(self.logdir)
        outdir = os.path.join(self.directory, 'export')
        videos = os.path.join(self.directory, 'videos')
        evaluated, exported, visualized = self.run_all(
            ('evaluate', f'--logdir={self.logdir}', '--num_episodes=1'),
            ('export', f'--logdir={self.logdir}', f'--outdir={outdir}'),
            ('visualize', f'--logdir={self.logdir}', '--num_episodes=1', f'--outdir={videos}'))
        warning = (rf'Checkpoint {re.escape(self.checkpoint(1024))} \({TRUNCATED}\) does not '
                   rf'read back; using {re.escape(self.checkpoint(512))} \(step 512\), the '
                   r'newest checkpoint that does\. Nothing in the logdir was changed\.')
        for result in (evaluated, exported, visualized):
            self.assertEqual(result.returncode, 0, result.stderr[-5000:])
            self.assertRegex(result.stderr, warning)
        metrics = json.loads(evaluated.stdout)
        self.assertEqual((metrics['checkpoint'], metrics['step']), (self.checkpoint(512), 512))
        self.assertEqual(self.exported_step(outdir), 512)
        with open(os.path.join(videos, 'episodes.jsonl')) as f:
            self.assertLen(f.readlines(), 1)
        self.assertEqual(testing_utils.snapshot(self.logdir), before)

    def test_broken_checkpoints_that_cannot_be_used_are_errors(self):
        truncate(self.checkpoint(1024, '.data-00000-of-00001'))
        nothing_readable = os.path.join(self.directory, 'nothing_readable')
        shutil.copytree(self.logdir, nothing_readable)
        truncate(self.checkpoint(512, '.data-00000-of-00001', logdir=nothing_readable))
        before = testing_utils.snapshot(self.directory)
        damaged = re.escape(self.checkpoint(1024))
        by_step, by_path, latest = self.run_all(
            ('evaluate', f'--logdir={self.logdir}', '--checkpoint=1024', '--num_episodes=1'),
            ('export', f'--logdir={self.logdir}', f'--checkpoint={self.checkpoint(1024)}',
             f'--outdir={os.path.join(self.directory, "export")}'),
            ('evaluate', f'--logdir={nothing_readable}', '--num_episodes=1'))
        # Named: no fallback to another checkpoint than the one asked for.
        message = rf'checkpoint {damaged} is damaged: it does not read back \({TRUNCATED}\)'
        self.assert_error(by_step, 'evaluate', message)
        self.assert_error(by_path, 'export', message)
        self.assert_error(latest, 'evaluate',
                          rf'no checkpoint of logdir {re.escape(nothing_readable)} reads back '
                          rf'\(ckpt-512: {TRUNCATED}; ckpt-1024: {TRUNCATED}\)')
        self.assertEqual(testing_utils.snapshot(self.directory), before)

    def test_broken_saved_models_are_errors(self):
        intact = os.path.join(self.logdir, 'policy', '1024')
        variables = os.path.join('variables', 'variables')
        cases = {
            'truncated_program': (
                lambda policy: truncate(os.path.join(policy, 'saved_model.pb')),
                r"saved_model.pb does not parse \(Error parsing message with type "
                r"'tensorflow.SavedModel'\)"),
            'no_variables': (
                lambda policy: shutil.rmtree(os.path.join(policy, 'variables')),
                r'variables/variables does not read back \(variables.index is missing\)'),
            'truncated_variables': (
                lambda policy: truncate(os.path.join(policy, f'{variables}.data-00000-of-00001')),
                rf'variables/variables does not read back \({TRUNCATED}\)'),
        }
        policies = {}
        for name, (damage, _) in cases.items():
            policies[name] = os.path.join(self.directory, name)
            shutil.copytree(intact, policies[name])
            damage(policies[name])
            self.assertNotEqual(testing_utils.snapshot(policies[name]),
                                testing_utils.snapshot(intact), name)
        before = testing_utils.snapshot(self.directory)
        results = self.run_all(*(('evaluate', f'--policy={policies[name]}', '--num_episodes=1')
                                 for name in cases))
        for name, result in zip(cases, results, strict=True):
            with self.subTest(name):
                self.assert_error(result, 'evaluate', rf'{re.escape(policies[name])} holds a '
                                  rf'damaged SavedModel: {cases[name][1]}')
        self.assertEqual(testing_utils.snapshot(self.directory), before)

    def test_checkpoint_of_a_run_of_another_configuration_is_refused(self):
        # Same shapes: restoring it would succeed and act with the other activation.
        checkpoint = self.checkpoint(1024, logdir=self.other)
        self.assertIsNone(harness.checkpoint_problem(self.other, 1024))
        before = testing_utils.snapshot(self.other)
        result, = self.run_all(('evaluate', f'--logdir={self.logdir}',
                                f'--checkpoint={checkpoint}', '--num_episodes=1'))
        self.assert_error(
            result, 'evaluate',
            rf'checkpoint {re.escape(checkpoint)} belongs to the run {re.escape(self.other)}, '
            rf'of a different configuration than logdir {re.escape(self.logdir)}; give '
            rf'--logdir={re.escape(self.other)} to use it with its own configuration\. '
            r'Difference:\n')
        self.assertIn("+FeedForwardGaussianPolicy.activation = 'relu'", result.stderr)
        self.assertEqual(testing_utils.snapshot(self.other), before)


if __name__ == '__main__':
    absltest.main()
