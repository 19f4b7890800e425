"""Tests for the run loop: learning (PPO), logs, checkpoint round trip, bad input, and the
loop with a stub algorithm."""

import contextlib
import functools
import glob
import os
import shutil
import tempfile
import threading
from unittest import mock

import gin
import numpy as np
import tensorflow as tf
from absl.testing import absltest, parameterized

from agents.algorithms import algorithm, networks, registry  # noqa: F401 (registry: registers PPO)
from agents.algorithms.ppo import ppo
from agents.runs import (
    agent_factory,
    environments,
    evaluator,
    faults,
    loop,
    metrics,
    policy_export,
    run_config,
    run_dir,
)

# Small and fast: Pendulum with its usual short-horizon PPO settings, the update in graph mode
# (compiling it with XLA costs each run seconds; the tests of XLA and of learning turn it on).
PENDULUM = """
train.algorithm = @PPO
PPO.discount = 0.9
PPO.learning_rate = 1e-3
PPO.num_epochs = 10
PPO.num_minibatches = 16
PPO.jit_compile = False
"""


# The short run several tests share (each building a run costs seconds of tracing): 128 steps
# per iteration, so the evaluations come at the first iteration past each multiple of 300
# (384, 640, 1024) and at the end (1280).
SHORT = dict(env_id='Pendulum-v1', num_envs=2, rollout_length=64, env_mode='in_process',
             eval_every_steps=300, eval_episodes=1, seed=3)
SHORT_STEPS = 1280
SHORT_EVALUATIONS = [384, 640, 1024, 1280]
HALF_STEPS = 640  # A run of SHORT stopped half-way, at its second evaluation.


def read_metrics(logdir):
    return metrics.evaluations(os.path.join(logdir, run_dir.METRICS_FILE))


def _shared_dir(name):
    directory = tempfile.mkdtemp(prefix=f'{name}-', dir=absltest.TEST_TMPDIR.value)
    return os.path.join(directory, 'run')


@contextlib.contextmanager
def _pendulum_config():
    """Gin holds PENDULUM alone inside the context, and again after it (as the tests' setUp
    leaves it: the shared runs are made on the first test that asks for them)."""
    gin.clear_config()
    gin.parse_config(PENDULUM)
    try:
        yield
    finally:
        gin.clear_config()
        gin.parse_config(PENDULUM)


@functools.cache
def finished_run():
    """A run of SHORT to its end (keeping 2 checkpoints), with the threads that wrote its
    policies and checkpoints: (logdir, the training thread's name, the threads of
    tf.saved_model.save, the threads of PolicyExporter._write_saved_model, the threads of
    CheckpointManager.save). Read-only: copy it to change it."""
    savers, writers, checkpointers = [], [], []
    save, write = tf.saved_model.save, policy_export.PolicyExporter._write_saved_model
    save_checkpoint = tf.train.CheckpointManager.save

    def recording_checkpoint(*args, **kwargs):
        checkpointers.append(threading.current_thread().name)
        return save_checkpoint(*args, **kwargs)

    def recording_save(*args, **kwargs):
        savers.append(threading.current_thread().name)
        return save(*args, **kwargs)

    def recording_write(exporter, directory):
        writers.append(threading.current_thread().name)
        return write(exporter, directory)

    logdir = _shared_dir('finished')
    with _pendulum_config(), mock.patch.object(tf.saved_model, 'save', recording_save), \
            mock.patch.object(policy_export.PolicyExporter, '_write_saved_model',
                              recording_write), \
            mock.patch.object(tf.train.CheckpointManager, 'save', recording_checkpoint):
        loop.train(logdir, total_steps=SHORT_STEPS, checkpoints_to_keep=2, **SHORT)
    return logdir, threading.current_thread().name, savers, writers, checkpointers


@functools.cache
def half_run():
    """A run of SHORT stopped at HALF_STEPS (its budget then). Read-only: copy it to resume."""
    logdir = _shared_dir('half')
    with _pendulum_config():
        loop.train(logdir, total_steps=HALF_STEPS, **SHORT)
    return logdir


@functools.cache
def resumed_run():
    """A copy of `half_run` resumed to SHORT_STEPS, and what it held once restored: (logdir,
    the checkpoint it restored, its env_steps then, a checkpoint of all it then held).
    Read-only."""
    logdir = shutil.copytree(half_run(), _shared_dir('resumed'))
    with _pendulum_config(), loop.training_run(
            logdir, total_steps=SHORT_STEPS, **SHORT) as run:
        restored = run.restore()
        steps = int(run.env_steps)
        again = run.checkpoint.write(os.path.join(os.path.dirname(logdir), 'again', 'ckpt'))
        run.run()
    return logdir, restored, steps, again


# A native run (deterministic on CPU), 128 steps per iteration: evaluations at 256, 512 and
# 640 (the end). Stopped at NATIVE_STOP, it stops at 384, where no evaluation is due. Without
# XLA, as configs/pendulum_native.gin, and faster to build (XLA ends bit-for-bit equal too).
NATIVE = dict(env_id='Pendulum-v1', env_backend='native', num_envs=4, rollout_length=32,
              eval_every_steps=250, eval_episodes=2, seed=5, jit_compile=False)
NATIVE_STEPS = 640
NATIVE_STOP = 300
NATIVE_STOPPED_AT = 384
NATIVE_EVALUATIONS = [256, 512, NATIVE_STEPS]
# What differs between equal runs: the clock, and how often each saved.
UNTIMED = ('_CHECKPOINTABLE_OBJECT_GRAPH', 'save_counter/', 'wall_time/', 'steps_per_sec/')
EVALUATION_RESULTS = ('step', 'mean_return', 'std_return', 'episodes', 'mean_length')


@functools.cache
def native_runs():
    """A native run to NATIVE_STEPS, and one stopped at NATIVE_STOP then continued to the end by
    a new TrainingRun (fresh objects, as a new process has): (uninterrupted logdir, a copy of
    the stopped run, the continued logdir, what the stop returned, whether the continuation
    restored the episodes in flight). Read-only."""
    uninterrupted = _shared_dir('native')
    continued = _shared_dir('continued')
    with _pendulum_config():
        loop.train(uninterrupted, total_steps=NATIVE_STEPS, **NATIVE)
        stop = loop.train(continued, total_steps=NATIVE_STEPS, stop_at_step=NATIVE_STOP,
                          **NATIVE)
        stopped = shutil.copytree(continued, _shared_dir('stopped'))
        with loop.training_run(continued, total_steps=NATIVE_STEPS, **NATIVE) as run:
            run.restore()
            restored = run.episodes_restored
            run.run()
    return uninterrupted, stopped, continued, stop, restored


def count_calls(run):
    """The (iterations asked, iterations run) of each compiled call `run` makes from now on."""
    calls = []
    compiled = run.training_step.compiled

    def counted(reset, count):
        outputs = compiled(reset, count)
        calls.append((int(count), int(outputs['ran'])))
        return outputs

    counted.get_concrete_function = compiled.get_concrete_function  # For `run.check`.
    run.training_step.compiled = counted
    return calls


def copy_run(logdir, test):
    """A copy of the run in `logdir` in a temporary directory of `test`."""
    return shutil.copytree(logdir, os.path.join(test.create_tempdir().full_path, 'run'))


class TrainerTest(parameterized.TestCase):

    def setUp(self):
        super().setUp()
        gin.clear_config()
        gin.parse_config(PENDULUM)
        self.addCleanup(gin.clear_config)

    @parameterized.named_parameters(
        ('gymnasium', dict(env_backend='gymnasium', env_mode='in_process')),
        ('native', dict(env_backend='native')))
    def test_pendulum_return_improves(self, backend):
        gin.bind_parameter('PPO.jit_compile', True)  # As trained runs update.
        logdir = self.create_tempdir().full_path
        last = loop.train(
            logdir, env_id='Pendulum-v1', total_steps=30720, num_envs=16, rollout_length=128,
            eval_every_steps=10240, eval_episodes=8, seed=1, **backend)
        metrics = read_metrics(logdir)
        self.assertEqual([m['step'] for m in metrics], [10240, 20480, 30720])
        self.assertEqual(last, metrics[-1])
        for record in metrics:
            self.assertEqual(record['episodes'], 8)
            self.assertEqual(record['mean_length'], 200.0)  # Gymnasium's time limit.
            self.assertGreater(record['env_steps_per_sec'], 0)
        # A random policy scores about -1200; learning brings it far up.
        self.assertGreater(metrics[-1]['mean_return'], metrics[0]['mean_return'] + 300,
                           metrics)
        self.assertTrue(os.path.isfile(os.path.join(logdir, 'operative_config.gin')))
        self.assertNotEmpty([name for name in os.listdir(logdir)
                             if name.startswith('events.out.tfevents')])
        self.assertTrue(os.path.isdir(os.path.join(logdir, 'policy', str(metrics[-1]['step']))))

    def test_resume_restores_state_exactly_and_goes_on(self):
        saved = tf.train.load_checkpoint(os.path.join(half_run(), run_dir.CHECKPOINT_DIR))
        logdir, restored, steps, written = resumed_run()
        self.assertIsNotNone(restored)
        self.assertEqual(steps, HALF_STEPS)
        # Everything the run held once restored, written out again, equals the checkpoint
        # tensor by tensor: weights, optimizer slots, normalizer statistics, counters.
        again = tf.train.load_checkpoint(written)
        names = sorted(saved.get_variable_to_shape_map())
        self.assertEqual(names, sorted(again.get_variable_to_shape_map()))
        self.assertContainsSubset(
            ['agent/observ_normalizer/mean/.ATTRIBUTES/VARIABLE_VALUE',
             'env_steps/.ATTRIBUTES/VARIABLE_VALUE'], names)
        self.assertNotEmpty([name for name in names if 'optimizer' in name])
        # Gymnasium's environments are out of a checkpoint's reach: episodes restart.
        self.assertEmpty([name for name in names if name.startswith('rollout/')])
        for name in names:
            if name.startswith('_CHECKPOINTABLE_OBJECT_GRAPH') or 'save_counter' in name:
                continue
            np.testing.assert_array_equal(again.get_tensor(name), saved.get_tensor(name),
                                          err_msg=name)
        # Then it went on to the end of its budget.
        self.assertEqual([m['step'] for m in read_metrics(logdir)], SHORT_EVALUATIONS)

    def test_policies_exported_in_the_background_match_their_checkpoints(self):
        logdir = finished_run()[0]  # Kept 2 checkpoints.
        self.assertEqual(sorted(os.listdir(os.path.join(logdir, 'policy'))), ['1024', '1280'])
        env = environments.env_factory('Pendulum-v1', None, ('range_normalize', 'ClipAction'))()
        observ = np.random.default_rng(0).uniform(-1, 1, (20, 3)).astype(np.float32)
        for step in (1024, 1280):
            agent = agent_factory.build_algorithm(
                ppo.PPO, env.observation_space, env.action_space, 1, seed=9)
            tf.train.Checkpoint(agent=tf.train.Checkpoint(
                policy=agent.policy, observ_normalizer=agent.observ_normalizer)).read(
                    os.path.join(logdir, run_dir.CHECKPOINT_DIR, f'ckpt-{step}')).expect_partial()
            live, _, _ = agent.act(tf.constant(observ), (), tf.ones([20], tf.bool), greedy=True)
            saved = policy_export.SavedPolicy(os.path.join(logdir, 'policy', str(step)))
            self.assertEqual(saved.step, step)
            np.testing.assert_array_equal(saved(observ, (), None)[0], live.numpy())
        env.close()

    def test_only_exports_after_the_first_are_written_beside_training(self):
        # tf.saved_model.save (the first export) lowers the process-wide log level while it
        # runs: beside training it silenced the run's warnings. It must run on the training
        # thread; the later exports (values only) in the background.
        _, training_thread, savers, writers, _ = finished_run()
        self.assertEqual(savers, [training_thread])
        self.assertLen(writers, len(SHORT_EVALUATIONS) - 1)
        self.assertTrue(all(name.startswith('background') for name in writers), writers)

    def test_checkpoints_are_written_beside_training(self):
        # From a snapshot of the variables taken between iterations (checkpoint_snapshot_test).
        # The first with the first export, on the training thread (see above).
        logdir, training_thread, _, _, checkpointers = finished_run()
        self.assertLen(checkpointers, len(SHORT_EVALUATIONS))
        self.assertEqual(checkpointers[0], training_thread)
        self.assertTrue(all(name.startswith('background') for name in checkpointers[1:]),
                        checkpointers)
        # Each holds the state of its step, not of the iterations trained while it was written.
        for step in SHORT_EVALUATIONS[-2:]:
            reader = tf.train.load_checkpoint(
                os.path.join(logdir, run_dir.CHECKPOINT_DIR, f'ckpt-{step}'))
            self.assertEqual(reader.get_tensor('env_steps/.ATTRIBUTES/VARIABLE_VALUE'), step)
            self.assertEqual(
                reader.get_tensor('agent/update_count/.ATTRIBUTES/VARIABLE_VALUE'), step // 128)

    def test_graph_optimizer_follows_the_backend(self):
        for arguments, disabled in ((dict(env_backend='native'), True),
                                    (dict(env_backend='gymnasium'), False),
                                    (dict(env_backend='native', optimize_graphs=True), False)):
            with loop.training_run(self.create_tempdir().full_path, env_id='Pendulum-v1',
                                      total_steps=64, env_mode='in_process', **arguments):
                options = tf.config.optimizer.get_experimental_options()
                self.assertEqual(options.get('disable_meta_optimizer', False), disabled,
                                 arguments)

    def test_rerun_of_a_finished_run_does_nothing(self):
        logdir = copy_run(finished_run()[0], self)
        before = read_metrics(logdir)
        self.assertIsNone(loop.train(logdir, total_steps=SHORT_STEPS, checkpoints_to_keep=2,
                                        **SHORT))
        self.assertEqual(read_metrics(logdir), before)

    def test_native_backend_runs_discrete_actions_under_xla(self):
        gin.bind_parameter('PPO.policy_network', networks.FeedForwardCategoricalPolicy)
        logdir = self.create_tempdir().full_path
        loop.train(logdir, env_id='CartPole-v1', total_steps=512, num_envs=4,
                      rollout_length=32, wrappers=(), env_backend='native', jit_compile=True,
                      native_dtype='float32', eval_every_steps=256, eval_episodes=2, seed=0)
        metrics = read_metrics(logdir)
        self.assertEqual([m['step'] for m in metrics], [256, 512])
        for record in metrics:
            self.assertBetween(record['mean_length'], 8, 500)

    def test_networks_side_by_side_keep_their_two_programs_under_xla(self):
        # train.jit_compile compiles the rollout alone then: one program around the iteration
        # would make the update's two one again.
        gin.bind_parameter('PPO.concurrent_networks', True)
        gin.bind_parameter('PPO.jit_compile', True)
        logdir = self.create_tempdir().full_path
        with mock.patch.object(tf.config.threading, 'get_inter_op_parallelism_threads',
                               return_value=1), self.assertLogs(level='WARNING') as logs:
            with loop.training_run(logdir, env_id='Pendulum-v1', total_steps=256, num_envs=4,
                                   rollout_length=32, env_backend='native', jit_compile=True,
                                   native_dtype='float32', eval_every_steps=128,
                                   eval_episodes=2, seed=0) as run:
                self.assertFalse(run.training_step.compiled._jit_compile)
                self.assertTrue(run.training_step.rollout._jit_compile)
                run.run()
        self.assertIn('set configure_threads.inter_op_threads = 2', '\n'.join(logs.output))
        metrics = read_metrics(logdir)
        self.assertEqual([m['step'] for m in metrics], [128, 256])
        self.assertTrue(all(np.isfinite(m['mean_return']) for m in metrics))

    def test_native_backend_mistakes(self):
        for arguments, message in (
                (dict(env_id='MountainCar-v0'), "no native environment for 'MountainCar-v0'; "
                 'native ones: Acrobot-v1, CartPole-v1'),
                (dict(env_kwargs={'g': 9.0}), 'native environments take no keyword arguments'),
                (dict(wrappers=('FrameStackObservation',)), "cannot make native environment "
                 "'Pendulum-v1': unknown wrapper 'FrameStackObservation'"),
                (dict(env_backend='jax'), "train.env_backend must be one of 'gymnasium', "
                 "'native', 'envpool'; got 'jax'"),
                (dict(native_dtype='float16'), 'train.native_dtype must be one of'),
                (dict(optimize_graphs='yes'), 'train.optimize_graphs must be one of'),
                (dict(env_backend='gymnasium', jit_compile=True),
                 "train.jit_compile = True needs train.env_backend = 'native'"),
                (dict(iterations_per_call=0), 'train.iterations_per_call must be a positive '
                 'integer or None, got 0'),
                (dict(iterations_per_call=2.5), 'train.iterations_per_call must be a positive '
                 'integer or None, got 2.5')):
            arguments = {'env_id': 'Pendulum-v1', 'env_backend': 'native', **arguments}
            with self.subTest(**arguments), \
                    self.assertRaisesRegex(run_config.ConfigError, message):
                loop.train(self.create_tempdir().full_path, total_steps=64, **arguments)

    def test_unknown_env_id(self):
        with self.assertRaisesRegex(run_config.ConfigError, "unknown env id 'NoSuchEnv-v0'"):
            loop.train(self.create_tempdir().full_path, env_id='NoSuchEnv-v0',
                          total_steps=100)

    def test_bad_budget(self):
        with self.assertRaisesRegex(run_config.ConfigError, 'total_steps must be a positive'):
            loop.train(self.create_tempdir().full_path, env_id='Pendulum-v1', total_steps=-5)

    def test_bad_fault_policies_and_seed(self):
        for arguments, message in (
                (dict(on_env_failure='retry'), "train.on_env_failure must be one of 'restart', "
                 "'stop'; got 'retry'"),
                (dict(on_nonfinite='ignore'), "train.on_nonfinite must be one of 'stop', 'skip'"),
                (dict(max_env_restarts=-1), 'train.max_env_restarts must be a non-negative'),
                (dict(seed=-3), 'train.seed must be a non-negative integer, got -3'),
                (dict(num_envs=True), 'train.num_envs must be a positive integer, got True')):
            with self.assertRaisesRegex(run_config.ConfigError, message):
                loop.train(self.create_tempdir().full_path, env_id='Pendulum-v1',
                              total_steps=64, **arguments)

    def test_policy_that_does_not_fit_the_action_space(self):
        gin.bind_parameter('PPO.policy_network', networks.FeedForwardCategoricalPolicy)
        with self.assertRaisesRegex(run_config.ConfigError, 'FeedForwardCategoricalPolicy acts '
                                    'with int32 actions but .* is continuous'):
            loop.train(self.create_tempdir().full_path, env_id='Pendulum-v1', total_steps=64)

    def test_nothing_is_written_before_run(self):
        logdir = os.path.join(self.create_tempdir().full_path, 'run')
        with loop.training_run(logdir, env_id='Pendulum-v1', total_steps=64, num_envs=2,
                                  rollout_length=32, env_mode='in_process') as run:
            run.check()  # Traces the graphs: mistakes found there are ConfigErrors.
        self.assertFalse(os.path.exists(logdir))

    def test_graph_mistakes_are_config_errors(self):
        gin.bind_parameter('PPO.num_minibatches', 1000)
        with loop.training_run(self.create_tempdir().full_path, env_id='Pendulum-v1',
                                  total_steps=64, num_envs=2, rollout_length=32,
                                  env_mode='in_process') as run:
            with self.assertRaisesRegex(run_config.ConfigError, 'does not build a training '
                                        'graph: num_minibatches=1000 exceeds the 64'):
                run.check()

    def test_evaluations_fall_where_an_uninterrupted_run_puts_them(self):
        uninterrupted = finished_run()[0]
        resumed, _, _, _ = resumed_run()  # Stopped at 640 steps, then resumed to the end.
        # 128 steps per iteration: the first past each multiple of 300, and the last.
        for logdir in (uninterrupted, resumed):
            self.assertEqual([m['step'] for m in read_metrics(logdir)], [384, 640, 1024, 1280])


    @parameterized.named_parameters(('graph', False, (1, 3, None)), ('xla', True, (1, None)))
    def test_iterations_per_call_changes_no_result(self, jit_compile, per_call_values):
        # 16 steps per iteration; evaluations at 128, 256 and 336: calls of up to 8 iterations.
        native = dict(env_id='Pendulum-v1', env_backend='native', num_envs=2, rollout_length=8,
                      total_steps=336, eval_every_steps=128, eval_episodes=2, seed=5,
                      jit_compile=jit_compile, checkpoints_to_keep=1)
        runs = {}
        for per_call in per_call_values:
            logdir = self.create_tempdir().full_path
            with mock.patch.object(loop, 'CALL_SECONDS', 1e6), \
                    loop.training_run(logdir, iterations_per_call=per_call, **native) as run:
                calls = count_calls(run)
                run.run()
            checkpoint = tf.train.load_checkpoint(os.path.join(logdir, run_dir.CHECKPOINT_DIR))
            runs[per_call] = dict(
                calls=[count for count, _ in calls], summaries=_summaries(logdir, steps=True),
                metrics=[{key: record[key] for key in ('step', 'mean_return', 'mean_length')}
                         for record in read_metrics(logdir)],
                variables={name: checkpoint.get_tensor(name) for name in
                           checkpoint.get_variable_to_shape_map() if 'save_counter' not in name
                           and not name.startswith(('wall_time', 'steps_per_sec', '_CHECK'))})
        # The first call (which compiles) and the second (which times an iteration) run one
        # iteration; the others run up to the next evaluation, at most `iterations_per_call`.
        expected_calls = {1: [1] * 21, 3: [1, 1, 3, 3, 3, 3, 2, 3, 2], None: [1, 1, 6, 8, 5]}
        for per_call in per_call_values:
            self.assertEqual(runs[per_call]['calls'], expected_calls[per_call])
        for per_call in per_call_values[1:]:
            self.assertEqual(runs[per_call]['metrics'], runs[1]['metrics'])
            self.assertEqual(runs[per_call]['summaries'].keys(), runs[1]['summaries'].keys())
            for tag, values in runs[1]['summaries'].items():
                if tag != 'train/env_steps_per_sec':
                    self.assertEqual(runs[per_call]['summaries'][tag], values, tag)
            self.assertEqual(runs[per_call]['variables'].keys(), runs[1]['variables'].keys())
            for name, value in runs[1]['variables'].items():
                np.testing.assert_array_equal(runs[per_call]['variables'][name], value, name)
        self.assertLen(runs[1]['summaries']['train/loss'], 21)  # One per iteration.
        self.assertEqual([step for step, _ in runs[1]['summaries']['train/loss']],
                         list(range(16, 337, 16)))

    def test_stopped_and_continued_native_run_ends_bit_for_bit_as_an_uninterrupted_one(self):
        uninterrupted, stopped, continued, stop, restored = native_runs()
        # The stop came at the first iteration end past NATIVE_STOP, saved and evaluated.
        self.assertEqual(stop['step'], NATIVE_STOPPED_AT)
        self.assertEqual([m['step'] for m in read_metrics(stopped)],
                         [NATIVE_EVALUATIONS[0], NATIVE_STOPPED_AT])
        self.assertTrue(os.path.isfile(os.path.join(
            stopped, run_dir.CHECKPOINT_DIR, f'ckpt-{NATIVE_STOPPED_AT}.index')))
        self.assertTrue(os.path.isdir(os.path.join(stopped, 'policy', str(NATIVE_STOPPED_AT))))
        self.assertTrue(restored)  # The continuation went on with the episodes in flight.
        # Every evaluation of the uninterrupted run, also after the stop's extra one, is the
        # continued run's: evaluations depend on the weights and the step alone.
        expected = read_metrics(uninterrupted)
        self.assertEqual([m['step'] for m in expected], NATIVE_EVALUATIONS)
        results = {m['step']: {key: m[key] for key in EVALUATION_RESULTS}
                   for m in read_metrics(continued)}
        self.assertEqual(sorted(results), sorted([*NATIVE_EVALUATIONS, NATIVE_STOPPED_AT]))
        for record in expected:
            self.assertEqual(results[record['step']],
                             {key: record[key] for key in EVALUATION_RESULTS})
        # The final checkpoints are equal tensor by tensor (bit for bit): weights, optimizer,
        # normalizers, update count (learning-rate annealing), random generator, environments.
        readers = [tf.train.load_checkpoint(os.path.join(
            logdir, run_dir.CHECKPOINT_DIR, f'ckpt-{NATIVE_STEPS}'))
            for logdir in (uninterrupted, continued)]
        names = sorted(readers[0].get_variable_to_shape_map())
        self.assertEqual(names, sorted(readers[1].get_variable_to_shape_map()))
        self.assertContainsSubset(
            ['agent/update_count/.ATTRIBUTES/VARIABLE_VALUE',
             'rollout/env/state/.ATTRIBUTES/VARIABLE_VALUE',
             'rollout/env/resets/.ATTRIBUTES/VARIABLE_VALUE',
             'rollout/episode_score/.ATTRIBUTES/VARIABLE_VALUE',
             'rollout/agent/pending_reset/.ATTRIBUTES/VARIABLE_VALUE'], names)
        self.assertEqual(readers[0].get_tensor('agent/update_count/.ATTRIBUTES/VARIABLE_VALUE'),
                         NATIVE_STEPS // 128)
        compared = [name for name in names if not name.startswith(UNTIMED)]
        self.assertGreater(len(compared), 30)
        for name in compared:
            np.testing.assert_array_equal(readers[1].get_tensor(name),
                                          readers[0].get_tensor(name), err_msg=name)

    def test_a_run_at_or_past_its_stop_does_nothing(self):
        _, stopped, _, _, _ = native_runs()
        logdir = copy_run(stopped, self)
        before = (read_metrics(logdir), sorted(os.listdir(os.path.join(
            logdir, run_dir.CHECKPOINT_DIR))))
        for stop_at_step in (NATIVE_STOPPED_AT, NATIVE_STOP, 1):
            with self.assertLogs(level='INFO') as logs:
                loop.train(logdir, stop_at_step=stop_at_step, total_steps=NATIVE_STEPS,
                           **NATIVE)
            self.assertIn(f'Nothing to do: the run is at step {NATIVE_STOPPED_AT}, at or past '
                          f'--stop_at_step={stop_at_step}', '\n'.join(logs.output))
            self.assertEqual((read_metrics(logdir), sorted(os.listdir(os.path.join(
                logdir, run_dir.CHECKPOINT_DIR)))), before)
        for stop_at_step in (0, -5, 1.5, True):
            with self.assertRaisesRegex(ValueError, 'stop_at_step must be a positive integer'):
                loop.train(logdir, stop_at_step=stop_at_step, total_steps=NATIVE_STEPS,
                           **NATIVE)

    def test_a_stop_killed_before_its_evaluation_is_completed_by_the_same_stop(self):
        _, stopped, _, _, _ = native_runs()
        logdir = copy_run(stopped, self)
        path = os.path.join(logdir, run_dir.METRICS_FILE)
        with open(path) as f:
            lines = f.readlines()
        with open(path, 'w') as f:  # As if killed between the stop's checkpoint and its line.
            f.writelines(lines[:-1])
        with self.assertLogs(level='INFO') as logs:
            loop.train(logdir, stop_at_step=NATIVE_STOP, total_steps=NATIVE_STEPS, **NATIVE)
        self.assertIn(f'Completing the evaluation of step {NATIVE_STOPPED_AT}',
                      '\n'.join(logs.output))
        self.assertEqual(read_metrics(logdir), read_metrics(stopped))

    def test_a_native_checkpoint_without_episodes_resumes_with_new_ones(self):
        # As the checkpoints of native runs written before they held the episodes in flight.
        logdir = self.create_tempdir().full_path
        with loop.training_run(logdir, total_steps=NATIVE_STEPS, **NATIVE) as run:
            run.env_steps.assign(512)
            old = tf.train.Checkpoint(agent=run.agent, env_steps=run.env_steps)
            tf.train.CheckpointManager(old, os.path.join(logdir, run_dir.CHECKPOINT_DIR),
                                       max_to_keep=3).save(checkpoint_number=512)
        with loop.training_run(logdir, total_steps=NATIVE_STEPS, **NATIVE) as run:
            self.assertIsNotNone(run.restore())
            self.assertEqual(int(run.env_steps), 512)
            self.assertFalse(run.episodes_restored)

    def test_evaluation_seeds_depend_on_the_seed_and_step_alone(self):
        seeds = {evaluator.evaluation_seed(seed, steps) for seed in range(3)
                 for steps in (0, 256, 512, 10**12)}
        self.assertLen(seeds, 12)
        self.assertTrue(all(0 <= seed < 2**62 for seed in seeds))
        self.assertEqual(evaluator.evaluation_seed(1, 256), evaluator.evaluation_seed(1, 256))


class StubAlgorithm(algorithm.OnPolicyAlgorithm):
    """The least an algorithm gives the loop: it acts with a small Gaussian policy and each
    update only counts itself and records the batch's mean reward."""

    FAIL_AT_UPDATE = None  # An update (1, 2...) that reports its statistic as non-finite.

    def __init__(self, observ_shape, action_size, num_envs, seed, lr_anneal_updates):
        super().__init__(name='stub')
        del num_envs, lr_anneal_updates
        self.policy = networks.FeedForwardGaussianPolicy(
            observ_shape, action_size, hidden_sizes=(4,), seed=seed)
        self.updates = tf.Variable(0, dtype=tf.int64, trainable=False)
        self.mean_reward = tf.Variable(0.0, trainable=False)
        # Counts undone updates too: not among `undo_variables`.
        self.calls = tf.Variable(0, dtype=tf.int64, trainable=False)

    @property
    def action_dtype(self):
        return tf.float32

    def initial_state(self, batch_size):
        return ()

    def act(self, observ, state, reset_mask, greedy=False):
        # The network's leading member axis: one member.
        params, state = self.policy.step(tf.cast(observ, tf.float32)[None], state)
        distribution = self.policy.distribution(params)
        action = distribution.mode() if greedy else distribution.sample(seed=[1, 2])
        return action[0], {'seen': tf.ones_like(reset_mask)}, state

    def update(self, batch):
        # As a real update, after its batch: the counters have no other tie to the rollout,
        # and graph mode would run them beside a rollout that fails.
        with tf.control_dependencies(tf.nest.flatten(batch)):
            self.updates.assign_add(1)
            failing = tf.equal(self.calls.assign_add(1), self.FAIL_AT_UPDATE or -1)
        self.mean_reward.assign(tf.reduce_mean(tf.cast(batch['reward'], tf.float32)))
        seen = tf.reduce_all(batch['extras']['seen'])  # What `act` returned, stacked.
        return {'mean_reward': self.mean_reward.read_value(),
                'all_seen': tf.cast(seen, tf.float32),
                'nonfinite': {'stub statistic': failing}}

    def undo_variables(self):
        return [self.updates, self.mean_reward, *self.policy.variables]

    def acting_modules(self):
        return {'policy': self.policy}

    def exported_policy(self):
        return self.policy, None


class FailingStubAlgorithm(StubAlgorithm):
    FAIL_AT_UPDATE = 2


class FailingLaterStubAlgorithm(StubAlgorithm):
    FAIL_AT_UPDATE = 4


class NanActionStubAlgorithm(StubAlgorithm):
    """Acts with a NaN action once: at the 101st sampling act (in the fourth iteration of 32
    steps), which the environments refuse."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.acts = tf.Variable(0, dtype=tf.int64, trainable=False)

    def act(self, observ, state, reset_mask, greedy=False):
        action, extras, state = super().act(observ, state, reset_mask, greedy)
        if not greedy:
            action = tf.where(tf.equal(self.acts.assign_add(1), 101), np.nan, action)
        return action, extras, state


STUB_RUN = dict(env_id='Pendulum-v1', num_envs=2, rollout_length=32, env_mode='in_process',
                eval_every_steps=128, eval_episodes=1)


def _summaries(logdir, steps=False):
    """{tag: [values]} of the run's TensorBoard summaries; [(step, value)] with `steps`."""
    found = {}
    for path in glob.glob(os.path.join(logdir, 'events.out.tfevents.*')):
        for event in tf.compat.v1.train.summary_iterator(path):
            for value in event.summary.value:
                number = float(tf.make_ndarray(value.tensor))
                found.setdefault(value.tag, []).append((event.step, number) if steps else number)
    return found


class AtariGamesTest(absltest.TestCase):
    """The whole games of an Atari run's training, whose episodes are lives with clipped
    rewards: their scores in the progress lines and the summaries."""

    def setUp(self):
        super().setUp()
        gin.clear_config()
        self.addCleanup(gin.clear_config)
        gin.parse_config(PENDULUM)
        gin.parse_config("""
PPO.policy_network = @SharedTorsoCategoricalPolicy
PPO.value_network = None
PPO.num_epochs = 1
PPO.num_minibatches = 1
PPO.normalize_observ = False
""")

    def test_game_scores_are_logged_beside_the_lives(self):
        logdir = self.create_tempdir().full_path
        # Breakout's games cut at 12 steps: several end in each 2 x 16-step iteration.
        with self.assertLogs(level='INFO') as logs:
            loop.train(logdir, env_id='Breakout-v5', env_backend='envpool', wrappers=(),
                       env_kwargs={'num_threads': 1, 'max_episode_steps': 12}, num_envs=2,
                       rollout_length=16, total_steps=64, eval_every_steps=64,
                       eval_episodes=1, log_every_secs=0.001, seed=0)
        lines = [line for line in logs.output if 'env steps/s | ETA' in line]
        self.assertTrue(lines, logs.output)  # A progress line at each call's end.
        for line in lines:
            self.assertRegex(line, r'\| train game score -?\d+\.\d \| train life return '
                                   r'clipped ')
        found = _summaries(logdir, steps=True)
        self.assertEqual([step for step, _ in found['train/game_length']], [32, 64])
        for _, length in found['train/game_length']:
            self.assertBetween(length, 1, 12)
        for _, score in found['train/game_score']:
            self.assertGreaterEqual(score, 0.0)
        self.assertIn('train/life_return_clipped', found)


class StubAlgorithmTest(absltest.TestCase):
    """The loop with an algorithm it has never heard of: no PPO anywhere."""

    def setUp(self):
        super().setUp()
        gin.clear_config()
        self.addCleanup(gin.clear_config)

    def _updates(self, logdir, step):
        reader = tf.train.load_checkpoint(os.path.join(logdir, run_dir.CHECKPOINT_DIR,
                                                       f'ckpt-{step}'))
        return int(reader.get_tensor('agent/updates/.ATTRIBUTES/VARIABLE_VALUE'))

    def test_trains_checkpoints_exports_and_resumes_any_algorithm(self):
        logdir = self.create_tempdir().full_path
        last = loop.train(logdir, algorithm=StubAlgorithm, total_steps=256, **STUB_RUN)
        self.assertEqual(last['step'], 256)
        self.assertEqual([record['step'] for record in read_metrics(logdir)], [128, 256])
        self.assertEqual(self._updates(logdir, 256), 4)  # 64 steps per iteration.
        summaries = _summaries(logdir)
        self.assertLen(summaries['train/mean_reward'], 4)
        self.assertEqual(summaries['train/all_seen'], [1.0] * 4)
        self.assertLess(max(summaries['train/mean_reward']), 0.0)  # Pendulum's costs.
        policy = policy_export.SavedPolicy(os.path.join(logdir, 'policy', '256'))
        action, _ = policy(np.zeros([1, 3], np.float32), (), np.ones([1], bool))
        self.assertEqual(np.shape(action), (1, 1))
        # A rerun with a larger budget resumes the algorithm's state where it stopped.
        loop.train(logdir, algorithm=StubAlgorithm, total_steps=384, **STUB_RUN)
        self.assertEqual(self._updates(logdir, 384), 6)

    def test_a_stop_past_the_budget_ends_the_run_at_its_budget(self):
        logdir = self.create_tempdir().full_path
        last = loop.train(logdir, stop_at_step=10**9, algorithm=StubAlgorithm, total_steps=128,
                          **STUB_RUN)
        self.assertEqual(last['step'], 128)
        self.assertEqual([record['step'] for record in read_metrics(logdir)], [128])

    def test_the_algorithms_nonfinite_quantities_are_named_and_undone(self):
        logdir = self.create_tempdir().full_path
        with self.assertRaisesRegex(faults.NonFiniteError, 'non-finite stub statistic in the '
                                    'iteration that ended at step 128; its update was undone'):
            loop.train(logdir, algorithm=FailingStubAlgorithm, total_steps=256, **STUB_RUN)
        skipping = self.create_tempdir().full_path
        loop.train(skipping, algorithm=FailingStubAlgorithm, total_steps=256,
                   on_nonfinite='skip', **STUB_RUN)
        # The second update was undone: its count too.
        self.assertEqual(self._updates(skipping, 256), 3)

    def test_a_nonfinite_batch_ends_its_call_of_several_iterations(self):
        # 64 steps per iteration, one evaluation at the end: calls of 1, 1 and then 6
        # iterations, of which the second (update 4) fails.
        native = dict(STUB_RUN, env_backend='native', eval_every_steps=512, total_steps=512)
        with mock.patch.object(loop, 'CALL_SECONDS', 1e6):
            with self.assertRaisesRegex(faults.NonFiniteError, 'non-finite stub statistic in the '
                                        'iteration that ended at step 256; its update was '
                                        'undone and the run stopped'):
                loop.train(self.create_tempdir().full_path,
                           algorithm=FailingLaterStubAlgorithm, **native)
            logdir = self.create_tempdir().full_path
            with loop.training_run(logdir, algorithm=FailingLaterStubAlgorithm,
                                   on_nonfinite='skip', **native) as run:
                calls = count_calls(run)
                run.run()
        self.assertEqual(calls, [(1, 1), (1, 1), (6, 2), (4, 4)])
        self.assertEqual(self._updates(logdir, 512), 7)  # Of 8: the fourth was undone.
        self.assertEqual(int(run.agent.calls), 8)
        rewards = _summaries(logdir, steps=True)['train/mean_reward']
        self.assertEqual([step for step, _ in rewards], [64, 128, 192, 320, 384, 448, 512])
        self.assertEqual(_summaries(logdir, steps=True)['train/skipped_batches'], [(256, 1.0)])

    def test_a_failed_call_is_retried_for_its_remaining_iterations(self):
        # The third call (6 iterations up to the evaluation at 512) fails in its second
        # iteration; its first stands and the retry runs the other 5.
        logdir = self.create_tempdir().full_path
        native = dict(STUB_RUN, env_backend='native', eval_every_steps=512, total_steps=512,
                      on_nonfinite='skip', jit_compile=False)  # The environments' checks on.
        with mock.patch.object(loop, 'CALL_SECONDS', 1e6), loop.training_run(
                logdir, algorithm=NanActionStubAlgorithm, **native) as run:
            calls = count_calls(run)
            run.run()
        self.assertEqual(calls, [(1, 1), (1, 1), (5, 5)])  # The failed call raised.
        self.assertEqual([record['step'] for record in read_metrics(logdir)], [512])
        self.assertEqual(self._updates(logdir, 512), 8)
        self.assertEqual(run.skipped_batches, 1)
        rewards = _summaries(logdir, steps=True)['train/mean_reward']
        self.assertEqual([step for step, _ in rewards], [64, 128, *range(256, 513, 64)])

    def test_something_else_than_an_algorithm_is_refused(self):
        for value in (networks.FeedForwardValue, 'PPO', None):
            with self.subTest(value=value), self.assertRaisesRegex(
                    run_config.ConfigError, 'train.algorithm must name an algorithm'):
                loop.train(self.create_tempdir().full_path, algorithm=value, total_steps=64,
                           **STUB_RUN)


if __name__ == '__main__':
    absltest.main()
