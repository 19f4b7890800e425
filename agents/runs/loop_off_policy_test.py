"""The loop's off-policy half: an algorithm that owns its cadence and its replay buffer.

`OffPolicyTesting` (agents/algorithms/off_policy_testing.py) trains through the unchanged loop:
each iteration is `train_freq` steps, it trains once `learning_starts` steps were observed,
it resumes with or without its buffer, and a non-finite step is undone without the buffer
being copied.
"""

import functools
import os
import tempfile
from unittest import mock

import gin
import gymnasium as gym
import numpy as np
import tensorflow as tf
from absl.testing import absltest, parameterized
from gymnasium.envs.classic_control import pendulum

from agents.algorithms import off_policy_testing
from agents.runs import faults, loop, metrics, run_dir, training_step

RUN = dict(algorithm=off_policy_testing.OffPolicyTesting, env_id='Pendulum-v1', num_envs=2,
           eval_every_steps=128, eval_episodes=1, total_steps=256, seed=1)
BACKENDS = (dict(env_backend='gymnasium', env_mode='in_process'), dict(env_backend='native'))


class _RaisingPendulum(gym.Wrapper):
    """Pendulum whose first instance to reach its `STRIKE_AT`-th step raises there, once."""

    STRIKE_AT = 50  # Before the first evaluation, whose environment would reach it too.
    struck = False

    def __init__(self):
        super().__init__(pendulum.PendulumEnv())
        self._steps = 0

    def step(self, action):
        self._steps += 1
        if self._steps == self.STRIKE_AT and not _RaisingPendulum.struck:
            _RaisingPendulum.struck = True
            raise RuntimeError('injected failure')
        return self.env.step(action)


RAISING_PENDULUM = 'RaisingPendulumOffPolicyLoopTest-v0'
gym.register(RAISING_PENDULUM, entry_point=_RaisingPendulum, max_episode_steps=200)


class _CallSizes:
    """Records the iterations asked of each training call, and of the call that raised."""

    def __init__(self):
        self.counts, self.failed = [], []
        self._call = training_step.TrainingStep.__call__

    def __call__(self, step, reset, count):
        self.counts.append(count)
        try:
            return self._call(step, reset, count)
        except tf.errors.OpError:
            self.failed.append(count)
            raise


def _evaluations(logdir):
    return metrics.evaluations(os.path.join(logdir, run_dir.METRICS_FILE))


def _checkpoint(logdir, step):
    return tf.train.load_checkpoint(os.path.join(logdir, run_dir.CHECKPOINT_DIR, f'ckpt-{step}'))


def _saved(logdir, step, name):
    return _checkpoint(logdir, step).get_tensor(f'agent/{name}/.ATTRIBUTES/VARIABLE_VALUE')


def _run_to(logdir, stop_at_step=None, **settings):
    with loop.training_run(logdir, **dict(RUN, **settings)) as run:
        run.run(stop_at_step=stop_at_step)
        return run


@functools.cache
def _whole_native_run():
    """A native run of RUN to its end in the tests' gin configuration: (logdir, its
    TrainingRun). Read-only; several tests share it, as each run costs seconds of tracing."""
    logdir = tempfile.mkdtemp(prefix='whole-', dir=absltest.TEST_TMPDIR.value)
    return logdir, _run_to(logdir, env_backend='native')


class OffPolicyLoopTest(parameterized.TestCase):

    def setUp(self):
        super().setUp()
        gin.clear_config()
        gin.parse_config('OffPolicyTesting.learning_starts = 64\n'
                         'OffPolicyTesting.train_freq = 4\n'
                         'OffPolicyTesting.gradient_steps = 3')
        self.addCleanup(gin.clear_config)

    def run_to(self, logdir, stop_at_step=None, **settings):
        return _run_to(logdir, stop_at_step, **settings)

    @parameterized.parameters(*BACKENDS)
    def test_trains_on_its_cadence_and_evaluates(self, **backend):
        if backend['env_backend'] == 'native':
            logdir, run = _whole_native_run()
        else:
            logdir = self.create_tempdir().full_path
            run = self.run_to(logdir, **backend)
        self.assertEqual([record['step'] for record in _evaluations(logdir)], [128, 256])
        agent = run.agent
        # Iterations of 2 envs x 4 steps; training from the iteration that reaches 64 steps.
        self.assertEqual(int(agent.observed_steps), 256)
        self.assertEqual(int(agent.buffer.added), 256)
        self.assertEqual(int(agent.train_calls), (256 - 64) // 8 + 1)
        self.assertEqual(int(agent.q_optimizer.iterations), 3 * int(agent.train_calls))
        self.assertTrue(np.isfinite(_saved(logdir, 256, 'buffer/storage/reward')).all())

    def run_counting_calls(self, logdir, **settings):
        sizes = _CallSizes()
        # Calls sized by the steps alone: up to the next evaluation, whatever the machine.
        with mock.patch.object(training_step.TrainingStep, '__call__', autospec=True,
                               side_effect=sizes), mock.patch.object(loop, 'CALL_SECONDS', 1e9):
            run = self.run_to(logdir, env_backend='gymnasium', env_mode='in_process',
                              **settings)
        return run, sizes

    def test_gymnasium_runs_several_iterations_per_call_with_the_results_of_one(self):
        several, one = (self.create_tempdir().full_path for _ in range(2))
        _, sizes = self.run_counting_calls(several)
        # Once the first calls timed an iteration, calls run up to the next evaluation.
        self.assertEqual(sizes.counts, [1, 1, 14, 16])
        _, single = self.run_counting_calls(one, iterations_per_call=1)
        self.assertEqual(set(single.counts), {1})
        for name in ('q/head/kernel', 'policy/mean/kernel', 'buffer/storage/observ'):
            np.testing.assert_array_equal(_saved(several, 256, name), _saved(one, 256, name),
                                          err_msg=name)
        self.assertEqual([record['mean_return'] for record in _evaluations(several)],
                         [record['mean_return'] for record in _evaluations(one)])

    def test_an_environment_failure_inside_a_call_redoes_only_the_rest_of_it(self):
        _RaisingPendulum.struck = False
        logdir = self.create_tempdir().full_path
        with self.assertLogs(level='WARNING') as logs:
            run, sizes = self.run_counting_calls(logdir, env_id=RAISING_PENDULUM,
                                                 on_env_failure='restart')
        self.assertTrue(_RaisingPendulum.struck)
        self.assertIn('injected failure', '\n'.join(logs.output))
        self.assertIn('Restarting all 2 training environments', '\n'.join(logs.output))
        # It struck in the 13th iteration (4 steps of each env per iteration), the 11th of
        # the call of 14 from the third; the retry ran the other 4.
        self.assertEqual(sizes.failed, [14])
        self.assertEqual(sizes.counts, [1, 1, 14, 4, 16])
        # Every iteration but the failed one kept its transitions and trained, once.
        self.assertEqual(int(run.agent.observed_steps), 256)
        self.assertEqual(int(run.agent.buffer.added), 256)
        self.assertEqual(int(run.agent.train_calls), (256 - 64) // 8 + 1)
        self.assertEqual([record['step'] for record in _evaluations(logdir)], [128, 256])

    def test_stopped_and_continued_ends_as_an_uninterrupted_run(self):
        whole, _ = _whole_native_run()
        halves = self.create_tempdir().full_path
        self.run_to(halves, stop_at_step=128, env_backend='native')
        self.run_to(halves, env_backend='native')
        for name in ('q/head/kernel', 'policy/mean/kernel', 'buffer/storage/observ',
                     'observed_steps'):
            np.testing.assert_array_equal(_saved(halves, 256, name), _saved(whole, 256, name),
                                          err_msg=name)
        self.assertEqual([record['mean_return'] for record in _evaluations(halves)],
                         [record['mean_return'] for record in _evaluations(whole)])

    def test_a_run_without_its_buffer_in_the_checkpoint_refills_it_on_resume(self):
        gin.parse_config('OffPolicyTesting.checkpoint_buffer = False')
        logdir = self.create_tempdir().full_path
        self.run_to(logdir, stop_at_step=128, env_backend='native')
        saved = _checkpoint(logdir, 128).get_variable_to_shape_map()
        self.assertFalse([name for name in saved if 'buffer' in name or 'observed' in name])
        self.assertTrue([name for name in saved if name.startswith('agent/q/')])
        run = self.run_to(logdir, env_backend='native')
        # The first 64 steps after the resume only refill the buffer.
        self.assertEqual(int(run.agent.observed_steps), 128)
        self.assertEqual(int(run.agent.train_calls), (128 - 64) // 8 + 1 + (128 - 64) // 8 + 1)
        self.assertEqual([record['step'] for record in _evaluations(logdir)], [128, 256])

    def test_a_nonfinite_step_is_undone_from_a_copy_of_the_networks_alone(self):
        gin.parse_config('OffPolicyTesting.nonfinite_at_train = 3')
        logdir = self.create_tempdir().full_path
        with loop.training_run(logdir, **dict(RUN, env_backend='native',
                                             on_nonfinite='skip')) as run:
            buffer_variables = {variable.ref() for variable in run.agent.buffer.variables}
            copied = run.training_step.undone_variables
            self.assertFalse([variable for variable in copied
                              if variable.ref() in buffer_variables])
            self.assertIn(run.agent.q.head.kernel.ref(), {variable.ref() for variable in copied})
            self.assertLess(sum(int(tf.size(variable)) for variable in copied),
                            sum(int(tf.size(variable)) for variable in run.agent.buffer.variables))
            run.run()
            self.assertEqual(run.skipped_batches, 1)
            # The undone iteration's transitions were finite: the buffer kept them.
            self.assertEqual(int(run.agent.buffer.added), 256)
            # Its train call and gradient steps were undone.
            self.assertEqual(int(run.agent.train_attempts), (256 - 64) // 8 + 1)
            self.assertEqual(int(run.agent.train_calls), (256 - 64) // 8)
            self.assertEqual(int(run.agent.q_optimizer.iterations), 3 * (256 - 64) // 8)

    def test_a_nonfinite_step_stops_the_run_naming_its_quantity(self):
        gin.parse_config('OffPolicyTesting.nonfinite_at_train = 2')
        logdir = self.create_tempdir().full_path
        with self.assertRaisesRegex(
                faults.NonFiniteError, r'non-finite q_loss in the iteration that ended at step '
                r'72; its update was undone and the run stopped; no checkpoint was saved yet'):
            self.run_to(logdir, env_backend='native')


if __name__ == '__main__':
    absltest.main()
