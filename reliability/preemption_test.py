"""Preemption: the train binary killed at random moments resumes and loses nothing.

A Pendulum run is killed with SIGKILL at seven moments drawn from a seeded RNG (during start-up,
while a checkpoint is being written, while the policy is being exported, right after a
checkpoint, and at random points of training) and rerun with the same command after each kill.
The step count never goes backwards, the checkpoint the state file names always reads back, the
metrics never lead the checkpoints, and the finished run has exactly the evaluations and the
budget of an uninterrupted one. SIGTERM and SIGINT stop the run with a checkpoint and exit
128 + the signal's number. The trainers run in forks of this process (harness.ForkedBinary),
which imported TensorFlow once: the binary's own code from flag parsing to exit status, so the
start-up kill strikes while the trainer builds and traces its graphs.
"""

import os
import random
import signal
import time

from absl import logging
from absl.testing import absltest

from reliability import harness

STEPS_PER_ITERATION = 8 * 128
TOTAL_STEPS = 20_000
EVAL_EVERY = 3_000
# Grappler is off: the kills are not about graph optimization, which only lengthens each start.
FLAGS = ['--gin_file=configs/pendulum.gin', *harness.bindings(
    train__env_mode='in_process', train__num_envs=8, train__rollout_length=128,
    train__total_steps=TOTAL_STEPS, train__eval_every_steps=EVAL_EVERY, train__eval_episodes=2,
    train__log_every_secs=0.001, train__optimize_graphs=False, PPO__num_minibatches=4,
    PPO__num_epochs=2)]
# Where each kill strikes, in order (every kind, a checkpoint write and a random step twice);
# 'step' kills come at a random step and instant.
KILLS = ('startup', 'step', 'checkpoint_write', 'export', 'after_checkpoint', 'step',
         'checkpoint_write')
STARTUP_TIMEOUT = 180


def expected_evaluations():
    """The steps an uninterrupted run evaluates at: the first iteration past each multiple of
    EVAL_EVERY, and the last."""
    steps, previous, evaluations = 0, 0, []
    while steps < TOTAL_STEPS:
        previous, steps = steps, steps + STEPS_PER_ITERATION
        if steps >= TOTAL_STEPS or steps // EVAL_EVERY > previous // EVAL_EVERY:
            evaluations.append(steps)
    return evaluations


class PreemptionTest(absltest.TestCase):

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        harness.preload(pipelines=False)

    def setUp(self):
        super().setUp()
        self.logdir = os.path.join(self.create_tempdir().full_path, 'run')
        self.logs = self.create_tempdir().full_path
        self.attempt = 0

    def start(self, *flags):
        self.attempt += 1
        return harness.ForkedBinary(
            'train', *FLAGS, *flags, f'--logdir={self.logdir}',
            log_path=os.path.join(self.logs, f'attempt-{self.attempt}.log'))

    def latest_checkpoint(self):
        return harness.checkpoint_state(self.logdir)[1] or 0

    def wait_for_entry(self, trainer, directory, pattern, timeout):
        """Polls `directory` (tightly: the entry lives for a fraction of a second) for a name
        containing `pattern`; returns it."""
        def find():
            try:
                return next((name for name in os.listdir(directory) if pattern in name), None)
            except FileNotFoundError:
                return None
        return harness.wait_for(find, timeout, f'{pattern} in {directory}', interval=0.001,
                                process=trainer)

    def kill_at(self, trainer, kind, rng):
        """Waits for the moment `kind` names, SIGKILLs the trainer; returns what it struck."""
        checkpoints = harness.checkpoint_dir(self.logdir)
        policies = os.path.join(self.logdir, 'policy')
        if kind == 'startup':
            harness.wait_for(lambda: 'Logdir:' in trainer.output(), STARTUP_TIMEOUT,
                             'the trainer to start', process=trainer)
            struck = 'start-up (tracing the graphs)'
        elif kind == 'step':
            harness.wait_for(lambda: trainer.progress() is not None, STARTUP_TIMEOUT,
                             'the first iteration', process=trainer)
            target = trainer.progress() + rng.randint(1, 6) * STEPS_PER_ITERATION
            harness.wait_for(lambda: (trainer.progress() or 0) >= target, 120,
                             f'step {target}', process=trainer)
            # A random instant inside the next iteration: the fault's timing, not a wait.
            time.sleep(rng.uniform(0.0, 0.3))
            struck = f'training after step {trainer.progress()}'
        elif kind == 'checkpoint_write':
            name = self.wait_for_entry(trainer, checkpoints, '_temp', STARTUP_TIMEOUT)
            struck = f'checkpoint write ({name})'
        elif kind == 'export':
            name = self.wait_for_entry(trainer, policies, '.partial-', STARTUP_TIMEOUT)
            struck = f'policy export ({name})'
        elif kind == 'after_checkpoint':
            before = self.latest_checkpoint()
            harness.wait_for(lambda: self.latest_checkpoint() > before, STARTUP_TIMEOUT,
                             'a new checkpoint', interval=0.002, process=trainer)
            struck = f'right after checkpoint {self.latest_checkpoint()}'
        else:
            raise ValueError(kind)
        trainer.kill()
        self.assertEqual(trainer.returncode, -signal.SIGKILL, trainer.output()[-3000:])
        return struck

    def assert_consistent(self, previous_checkpoint):
        """What a killed run leaves: a readable latest checkpoint, not behind the previous one,
        and metrics that do not lead it. Returns the latest checkpoint's step."""
        steps, latest = harness.checkpoint_state(self.logdir)
        latest = latest or 0
        self.assertGreaterEqual(latest, previous_checkpoint, 'the step went backwards')
        if latest:
            self.assertIsNone(harness.checkpoint_problem(self.logdir, latest))
        evaluated = [record['step'] for record in harness.metrics(self.logdir)]
        self.assertEqual(evaluated, sorted(set(evaluated)), 'metrics not strictly increasing')
        if evaluated:
            self.assertLessEqual(evaluated[-1], latest, 'metrics lead the checkpoints')
        return latest

    def test_sigkill_at_random_moments_then_resume(self):
        rng = random.Random(20240611)
        latest, mid_write = 0, []
        for number, kind in enumerate(KILLS, 1):
            with self.start() as trainer:
                struck = self.kill_at(trainer, kind, rng)
            leftovers = harness.leftovers(self.logdir)
            if kind in ('checkpoint_write', 'export') and leftovers:
                mid_write.append(leftovers)
            latest = self.assert_consistent(latest)
            logging.info('Kill %d (%s): %s; latest checkpoint %d; left behind %s', number, kind,
                         struck, latest, leftovers)
        # The kills in the middle of writes did land there (the temporary files prove it),
        # including one in TensorFlow's checkpoint writer itself.
        self.assertNotEmpty(mid_write)
        self.assertTrue(any(name.endswith('_temp') for found in mid_write for name in found),
                        mid_write)

        with self.start() as trainer:
            self.assertEqual(trainer.wait(600), 0, trainer.output()[-5000:])
            output = trainer.output()
        final_step = -(-TOTAL_STEPS // STEPS_PER_ITERATION) * STEPS_PER_ITERATION
        steps, latest = harness.checkpoint_state(self.logdir)
        self.assertEqual(latest, final_step)
        self.assertLen(steps, 3)
        for step in steps:
            self.assertIsNone(harness.checkpoint_problem(self.logdir, step), step)
        self.assertEqual([record['step'] for record in harness.metrics(self.logdir)],
                         expected_evaluations())
        self.assertEqual(sorted(os.listdir(os.path.join(self.logdir, 'policy'))),
                         sorted(str(step) for step in steps))
        self.assertEqual(harness.leftovers(self.logdir), [])
        for name in ('corrupt', 'metrics.orphaned.jsonl'):  # Nothing was broken.
            self.assertFalse(os.path.exists(os.path.join(self.logdir, 'checkpoints', name)))
            self.assertFalse(os.path.exists(os.path.join(self.logdir, name)))
        self.assertIn(f'Done: {final_step} steps', output)

    def interrupt(self, signum, resumed_at=0):
        """Starts the run (resuming from step `resumed_at`), signals it after two iterations of
        training; returns (trainer, step it stopped at)."""
        trainer = self.start('--gin_bindings=train.eval_every_steps = 100000')
        with trainer:
            target = resumed_at + 2 * STEPS_PER_ITERATION
            harness.wait_for(lambda: (trainer.progress() or 0) >= target,
                             STARTUP_TIMEOUT, 'two iterations', process=trainer)
            trainer.signal(signum)
            self.assertEqual(trainer.wait(120), 128 + signum, trainer.output()[-3000:])
        output = trainer.output()
        name = signal.Signals(signum).name
        self.assertRegex(output, rf'train: interrupted by {name} at step (\d+); saved a '
                         r'checkpoint at step \1\. Rerun the same command to resume\.')
        step = int(output.split(f'interrupted by {name} at step ')[1].split(';')[0])
        self.assertEqual(harness.checkpoint_state(self.logdir)[1], step)
        self.assertIsNone(harness.checkpoint_problem(self.logdir, step))
        return trainer, step

    def test_sigterm_and_sigint_save_a_checkpoint_and_exit_128_plus_signum(self):
        _, first = self.interrupt(signal.SIGTERM)
        trainer, second = self.interrupt(signal.SIGINT, resumed_at=first)
        self.assertIn(f'Resumed from {self.logdir}/checkpoints/ckpt-{first} at step {first}.',
                      trainer.output())
        self.assertGreater(second, first)
        self.assertEqual(harness.leftovers(self.logdir), [])


if __name__ == '__main__':
    absltest.main()
