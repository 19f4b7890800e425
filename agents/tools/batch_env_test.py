"""Tests of BatchEnv: equality with SyncVectorEnv, faults, bad input and process hygiene."""

import functools
import gc
import inspect
import multiprocessing
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import traceback
from unittest import mock

import gin
import gymnasium as gym
import numpy as np
import psutil
from absl.testing import absltest, parameterized

from agents.tools import batch_env, gin_testing

AutoresetMode = gym.vector.AutoresetMode
MODES = ('in_process', 'external', 'hybrid')

# Short episodes, so a few dozen steps cross several episode ends.
ENV_FACTORIES = {
    'Pendulum-v1': functools.partial(gym.make, 'Pendulum-v1', max_episode_steps=9),
    'CartPole-v1': functools.partial(gym.make, 'CartPole-v1', max_episode_steps=14),
    'HalfCheetah-v5': functools.partial(gym.make, 'HalfCheetah-v5', max_episode_steps=7),
}


def _scripted_failure(message):
    """Raises from a function whose name the tests look for in tracebacks."""
    raise ValueError(message)


class ScriptedEnv(gym.Env):
    """Observes [tag, steps]; fails, dies or blocks where told, to test fault handling.

    With a `log` list, appends (tag, 'step') and (tag, 'close') to it, which the test sees when
    the env lives in the test's process.
    """

    def __init__(self, tag=0, fail_reset=False, fail_step_at=None, die_step_at=None,
                 block_on=None, block_reset_on=None, block_make_on=None, fail_make=False,
                 log=None):
        if fail_make:
            _scripted_failure('scripted make failure')
        if block_make_on is not None:
            block_make_on.wait()
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)
        self.action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
        self.tag = tag
        self._fail_reset = fail_reset
        self._fail_step_at = fail_step_at
        self._die_step_at = die_step_at
        self._block_on = block_on
        self._block_reset_on = block_reset_on
        self._log = log
        self._steps = 0

    def _observation(self):
        return np.array([self.tag, self._steps], np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        if self._fail_reset:
            _scripted_failure('scripted reset failure')
        if self._block_reset_on is not None:
            self._block_reset_on.wait()
        self._steps = 0
        return self._observation(), {}

    def step(self, action):
        self._steps += 1
        if self._log is not None:
            self._log.append((self.tag, 'step'))
        if self._steps == self._fail_step_at:
            _scripted_failure(f'scripted step failure of env {self.tag}')
        if self._steps == self._die_step_at:
            os.kill(os.getpid(), signal.SIGKILL)
        if self._block_on is not None:
            self._block_on.wait()
        return self._observation(), float(action[0]), False, False, {}

    def close(self):
        if self._log is not None:
            self._log.append((self.tag, 'close'))

    def main_module_file(self):
        return getattr(sys.modules['__main__'], '__file__', None)

    def big_array(self, size):
        return np.full(size, self.tag, np.float64)


def scripted_fns(num_envs, special=None):
    """Factories of ScriptedEnvs; `special` maps env index -> ScriptedEnv kwargs."""
    return [functools.partial(ScriptedEnv, tag=index, **(special or {}).get(index, {}))
            for index in range(num_envs)]


def _process_alive(pid):
    """Whether process `pid` runs (a zombie has ended; it waits to be reaped)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _descendants(recursive=True):
    """Pids of this process's live descendants (with `recursive=False`, of its children)."""
    return {child.pid for child in psutil.Process().children(recursive)
            if _process_alive(child.pid)}


def _run_script(script):
    """Runs Python `script` in a fresh interpreter that imports this tree."""
    return subprocess.run(
        [sys.executable, '-c', script], capture_output=True, text=True, timeout=60,
        env={**os.environ, 'PYTHONPATH': os.pathsep.join(sys.path)})


def _wait_until(condition, timeout=10.0):
    """Polls `condition` until true or `timeout` s passed; returns its last value."""
    deadline = time.monotonic() + timeout
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.01)
    return condition()


# Bad actions for 3 Pendulums: (actions, error type, message pattern).
BAD_PENDULUM_ACTIONS = {
    'shape': (np.zeros((3, 2), np.float32), ValueError, r'shape \(3, 1\)'),
    'dtype': (np.full((3, 1), 'a'), TypeError, 'dtype <U1'),
    'outside': (np.array([[0.0], [0.0], [2.5]], np.float32), ValueError,
                r'env 2, array\(\[2.5\].*outside'),
    'nan': (np.array([[0.0], [np.nan], [np.nan]]), ValueError,
            r'env 1, array\(\[nan\]\), is NaN .*envs \[2\]'),
}


def setUpModule():
    # Starts the forkserver and resource tracker, which live as long as this process, so that
    # tests that count child processes see only workers.
    batch_env.BatchEnv(scripted_fns(1)).close()


class BatchEnvTestCase(parameterized.TestCase):

    def make(self, env_fns, mode='external', **kwargs):
        if mode == 'external':
            kwargs.setdefault('num_workers', 2)
        elif mode == 'hybrid':
            kwargs.setdefault('num_workers', 1)
        env = batch_env.BatchEnv(env_fns, mode=mode, **kwargs)
        self.addCleanup(env.close)
        return env

    def assert_same(self, actual, expected, path='result'):
        """Deep equality of observations / infos, including dtypes."""
        if isinstance(expected, (tuple, list)):
            self.assertIsInstance(actual, type(expected), path)
            self.assertLen(actual, len(expected), path)
            for index, (item, expected_item) in enumerate(zip(actual, expected, strict=True)):
                self.assert_same(item, expected_item, f'{path}[{index}]')
        elif isinstance(expected, dict):
            self.assertIsInstance(actual, dict, path)
            self.assertEqual(sorted(actual), sorted(expected), path)
            for key in expected:
                self.assert_same(actual[key], expected[key], f'{path}[{key!r}]')
        elif isinstance(expected, np.ndarray):
            self.assertIsInstance(actual, np.ndarray, path)
            self.assertEqual(actual.dtype, expected.dtype, path)
            self.assertEqual(actual.shape, expected.shape, path)
            if expected.dtype == object:
                for index, (item, expected_item) in enumerate(zip(actual, expected, strict=True)):
                    self.assert_same(item, expected_item, f'{path}[{index}]')
            else:
                np.testing.assert_array_equal(actual, expected, err_msg=path)
        elif expected is None:
            self.assertIsNone(actual, path)
        else:
            self.assertEqual(actual, expected, path)


class EquivalenceTest(BatchEnvTestCase):

    @parameterized.product(
        mode=MODES, env_id=list(ENV_FACTORIES), autoreset_mode=list(AutoresetMode))
    def test_matches_sync_vector_env(self, mode, env_id, autoreset_mode):
        env_fns = [ENV_FACTORIES[env_id]] * 3
        env = self.make(env_fns, mode, autoreset_mode=autoreset_mode)
        reference = gym.vector.SyncVectorEnv(env_fns, autoreset_mode=autoreset_mode)
        self.addCleanup(reference.close)
        self.assertEqual(env.single_observation_space, reference.single_observation_space)
        self.assertEqual(env.single_action_space, reference.single_action_space)
        self.assertEqual(env.observation_space, reference.observation_space)
        self.assertEqual(env.action_space, reference.action_space)
        self.assertEqual(env.metadata, reference.metadata)
        self.assert_same(env.reset(seed=5), reference.reset(seed=5))
        reference.action_space.seed(1)
        episode_ends = 0
        for step in range(30):
            actions = reference.action_space.sample()
            result = env.step(actions)
            expected = reference.step(actions)
            for name, actual, wanted in zip(
                    ('observations', 'rewards', 'terminations', 'truncations', 'infos'),
                    result, expected, strict=True):
                self.assert_same(actual, wanted, f'step {step} {name}')
            ended = expected[2] | expected[3]
            episode_ends += ended.sum()
            if autoreset_mode == AutoresetMode.DISABLED and ended.any():
                self.assert_same(env.reset(options={'reset_mask': ended}),
                                 reference.reset(options={'reset_mask': ended}))
            elif step == 4:  # A partial reset with per-env seeds, in the other modes too.
                mask = np.array([True, False, True])
                seeds = [11, 12, 13]
                self.assert_same(env.reset(seed=seeds, options={'reset_mask': mask}),
                                 reference.reset(seed=seeds, options={'reset_mask': mask}))
        self.assertGreaterEqual(episode_ends, 3)

    @parameterized.parameters(*MODES)
    def test_returned_arrays_survive_later_steps(self, mode):
        env = self.make([ENV_FACTORIES['Pendulum-v1']] * 2, mode)
        observations, _ = env.reset(seed=0)
        first = env.step(np.ones((2, 1), np.float32))
        saved = [observations.copy()] + [array.copy() for array in first[:4]]
        env.step(-np.ones((2, 1), np.float32))
        for kept, copy in zip([observations, *first[:4]], saved, strict=True):
            np.testing.assert_array_equal(kept, copy)

    @parameterized.parameters(*MODES)
    def test_without_copy_returns_its_buffers(self, mode):
        env = self.make([ENV_FACTORIES['Pendulum-v1']] * 2, mode, copy=False)
        observations, _ = env.reset(seed=0)
        stepped = env.step(np.ones((2, 1), np.float32))[0]
        self.assertIs(stepped, observations)

    @parameterized.parameters(*MODES)
    def test_without_infos_returns_only_final_entries(self, mode):
        env_fns = [ENV_FACTORIES['HalfCheetah-v5']] * 2
        env = self.make(env_fns, mode, collect_infos=False,
                        autoreset_mode=AutoresetMode.SAME_STEP)
        reference = gym.vector.SyncVectorEnv(env_fns, autoreset_mode=AutoresetMode.SAME_STEP)
        self.addCleanup(reference.close)
        self.assertEqual(env.reset(seed=0)[1], {})
        reference.reset(seed=0)
        actions = np.zeros((2, 6), np.float32)
        for _ in range(7):
            observations, _, _, truncations, infos = env.step(actions)
            expected = reference.step(actions)
        self.assertTrue(truncations.all())
        self.assert_same(observations, expected[0])
        self.assertEqual(sorted(infos), ['_final_info', '_final_obs', 'final_info', 'final_obs'])
        self.assert_same(infos['final_obs'], expected[4]['final_obs'])
        self.assert_same(infos['final_info'], expected[4]['final_info'])

    @parameterized.parameters(*MODES)
    def test_gymnasium_vector_wrappers_work(self, mode):
        env_fns = [ENV_FACTORIES['CartPole-v1']] * 3

        def wrap(env):
            env = gym.wrappers.vector.RecordEpisodeStatistics(env)
            return gym.wrappers.vector.NormalizeObservation(env)

        env = wrap(self.make(env_fns, mode))
        reference = wrap(gym.vector.SyncVectorEnv(env_fns))
        self.addCleanup(reference.close)
        self.assert_same(env.reset(seed=3), reference.reset(seed=3))
        reference.action_space.seed(0)
        for _ in range(30):
            actions = reference.action_space.sample()
            result, expected = env.step(actions), reference.step(actions)
            for infos in (result[4], expected[4]):  # Episode durations in wall-clock time.
                infos.get('episode', {}).pop('t', None)
            self.assert_same(result, expected)

    @parameterized.parameters(*MODES)
    def test_call_get_attr_and_set_attr(self, mode):
        env = self.make(scripted_fns(3), mode)
        self.assertEqual(env.get_attr('tag'), (0, 1, 2))
        env.set_attr('tag', [7, 8, 9])
        self.assertEqual(env.get_attr('tag'), (7, 8, 9))
        env.set_attr('tag', 4)
        env.reset()
        self.assertEqual(env.call('_observation')[2].tolist(), [4, 0])

    def test_workers_do_not_import_the_main_module(self):
        env = self.make(scripted_fns(2))
        self.assertNotIn(sys.modules['__main__'].__file__, env.call('main_module_file'))

    def test_spawn_start_method_matches_forkserver(self):
        env_fns = [ENV_FACTORIES['Pendulum-v1']] * 2
        spawned = self.make(env_fns, start_method='spawn')
        forked = self.make(env_fns)
        self.assert_same(spawned.reset(seed=1), forked.reset(seed=1))
        actions = np.full((2, 1), 0.5, np.float32)
        self.assert_same(spawned.step(actions), forked.step(actions))

    def test_hosts_envs_in_the_requested_number_of_workers(self):
        env = self.make(scripted_fns(5), num_workers=3)
        self.assertEqual(env.num_workers, 3)
        self.assertLen(set(env.worker_pids), 3)
        env.reset()
        observations = env.step(np.zeros((5, 1), np.float32))[0]
        np.testing.assert_array_equal(observations, [[tag, 1] for tag in range(5)])


class AsyncTest(BatchEnvTestCase):

    def test_step_async_returns_while_envs_work(self):
        release = multiprocessing.get_context('forkserver').Event()
        env = self.make(scripted_fns(2, {1: {'block_on': release}}), close_timeout=0.5)
        env.reset()
        env.step_async(np.zeros((2, 1), np.float32))  # Would hang if it waited for env 1.
        with self.assertRaises(multiprocessing.TimeoutError):
            env.step_wait(timeout=0.05)
        with self.assertRaises(gym.error.AlreadyPendingCallError):
            env.step_async(np.zeros((2, 1), np.float32))
        with self.assertRaises(gym.error.AlreadyPendingCallError):
            env.reset()
        release.set()
        results = []

        def poll():  # step_wait(timeout=0) polls.
            if not results:
                try:
                    results.append(env.step_wait(timeout=0))
                except multiprocessing.TimeoutError:
                    pass
            return results

        self.assertTrue(_wait_until(poll))
        np.testing.assert_array_equal(results[0][0], [[0, 1], [1, 1]])
        with self.assertRaises(gym.error.NoAsyncCallError):
            env.step_wait()

    @parameterized.parameters(*MODES)
    def test_step_wait_without_step_async_raises(self, mode):
        env = self.make(scripted_fns(2), mode)
        env.reset()
        with self.assertRaises(gym.error.NoAsyncCallError):
            env.step_wait()

    def test_worker_that_misses_the_timeout_is_killed_and_named(self):
        never = multiprocessing.get_context('forkserver').Event()
        env = self.make(scripted_fns(4, {3: {'block_on': never}}), num_workers=2, timeout=1.0)
        env.reset()
        pids = env.worker_pids
        begun = time.monotonic()
        with self.assertRaisesRegex(
                batch_env.WorkerHungError,
                rf'^BatchEnv worker process 1 \(pid {pids[1]}\) hosting envs \[2, 3\] did not '
                r'answer step within 1.0 s and was killed; the batch is closed'):
            env.step(np.zeros((4, 1), np.float32))
        self.assertLess(time.monotonic() - begun, 5)
        self.assertFalse(any(_process_alive(pid) for pid in pids))
        with self.assertRaisesRegex(batch_env.WorkerDiedError, 'did not answer step'):
            env.step(np.zeros((4, 1), np.float32))

    def test_stopped_worker_is_killed_and_named(self):
        env = self.make(scripted_fns(2), timeout=1.0)
        env.reset()
        pid = env.worker_pids[1]
        os.kill(pid, signal.SIGSTOP)
        self.addCleanup(lambda: _process_alive(pid) and os.kill(pid, signal.SIGKILL))
        with self.assertRaisesRegex(
                batch_env.WorkerHungError,
                r'hosting envs \[1\] \(it was stopped\) did not answer step within 1.0 s'):
            env.step(np.zeros((2, 1), np.float32))
        self.assertTrue(_wait_until(lambda: not _process_alive(pid)))

    def test_hung_worker_error_is_a_timeout_and_a_dead_worker(self):
        self.assertTrue(issubclass(batch_env.WorkerHungError, multiprocessing.TimeoutError))
        self.assertTrue(issubclass(batch_env.WorkerHungError, batch_env.WorkerDiedError))

    def test_default_timeout_is_finite_and_gin_configurable(self):
        env = self.make(scripted_fns(2))
        self.assertEqual(env._timeout, batch_env.TIMEOUT)
        with gin.unlock_config():
            gin.bind_parameter('BatchEnv.timeout', 7.5)
        self.addCleanup(gin.clear_config)
        self.assertEqual(self.make(scripted_fns(2))._timeout, 7.5)

    @parameterized.parameters(0, -1.0, True, '60')
    def test_bad_timeout_raises(self, timeout):
        with self.assertRaisesRegex(ValueError, 'timeout must be None or a number of seconds'):
            batch_env.BatchEnv(scripted_fns(2), timeout=timeout)

    def test_worker_hung_while_starting_is_killed(self):
        never = multiprocessing.get_context('forkserver').Event()
        before = _descendants()
        with self.assertRaisesRegex(batch_env.WorkerHungError, 'did not answer start within'):
            batch_env.BatchEnv(scripted_fns(2, {1: {'block_make_on': never}}), timeout=0.5)
        # What may remain is the forkserver and the resource tracker, children of this process.
        self.assertTrue(_wait_until(
            lambda: _descendants() - before <= _descendants(recursive=False)))

    def test_timed_out_reset_terminates_the_workers(self):
        never = multiprocessing.get_context('forkserver').Event()
        env = self.make(scripted_fns(2, {0: {'block_reset_on': never}}), timeout=1.0)
        pids = env.worker_pids
        with self.assertRaises(multiprocessing.TimeoutError):
            env.reset()
        self.assertFalse(any(_process_alive(pid) for pid in pids))
        with self.assertRaisesRegex(batch_env.WorkerDiedError, 'did not answer reset'):
            env.reset()

    def test_close_with_a_stuck_env_returns_and_reaps_workers(self):
        never = multiprocessing.get_context('forkserver').Event()
        env = self.make(scripted_fns(2, {0: {'block_on': never}}), close_timeout=0.2)
        env.reset()
        pids = env.worker_pids
        env.step_async(np.zeros((2, 1), np.float32))
        env.close()
        self.assertFalse(any(_process_alive(pid) for pid in pids))


class FaultTest(BatchEnvTestCase):

    @parameterized.parameters(*MODES)
    def test_env_error_in_step_names_env_and_traceback(self, mode):
        env = self.make(scripted_fns(3, {2: {'fail_step_at': 2}}), mode)
        env.reset()
        actions = np.zeros((3, 1), np.float32)
        env.step(actions)
        with self.assertRaisesRegex(batch_env.EnvError, 'Environment 2 failed in step') as error:
            env.step(actions)
        self.assertEqual(error.exception.env_index, 2)
        self.assertEqual(error.exception.method, 'step')
        text = ''.join(traceback.format_exception(error.exception))
        self.assertIn('_scripted_failure', text)
        self.assertIn('scripted step failure of env 2', text)
        self.assertIsInstance(error.exception.__cause__, ValueError)
        # The batch was partly stepped, so it must be reset before stepping again.
        with self.assertRaisesRegex(RuntimeError, 'needs a full reset'):
            env.step(actions)
        observations, _ = env.reset()
        np.testing.assert_array_equal(observations[:, 1], [0, 0, 0])
        np.testing.assert_array_equal(env.step(actions)[0][:, 1], [1, 1, 1])

    @parameterized.parameters(*MODES)
    def test_env_error_in_reset(self, mode):
        env = self.make(scripted_fns(3, {1: {'fail_reset': True}}), mode)
        with self.assertRaisesRegex(batch_env.EnvError, 'Environment 1 failed in reset') as error:
            env.reset()
        self.assertIn('_scripted_failure', ''.join(traceback.format_exception(error.exception)))
        with self.assertRaisesRegex(RuntimeError, 'needs a full reset'):
            env.step(np.zeros((3, 1), np.float32))

    @parameterized.parameters(
        ('in_process', 2), ('external', 2), ('hybrid', 2), ('hybrid', 0))
    def test_env_error_in_make_leaves_no_process(self, mode, failing_env):
        before = _descendants()
        with self.assertRaisesRegex(batch_env.EnvError,
                                    f'Environment {failing_env} failed in make') as error:
            batch_env.BatchEnv(scripted_fns(3, {failing_env: {'fail_make': True}}), mode=mode,
                               num_workers=2 if mode == 'external' else None)
        self.assertIn('_scripted_failure', ''.join(traceback.format_exception(error.exception)))
        self.assertTrue(_wait_until(lambda: _descendants() <= before), _descendants() - before)

    def test_killed_idle_worker_is_reported_with_its_envs(self):
        env = self.make(scripted_fns(4))
        env.reset()
        pids = env.worker_pids
        os.kill(pids[1], signal.SIGKILL)
        self.assertTrue(_wait_until(lambda: not _process_alive(pids[1])))
        with self.assertRaisesRegex(batch_env.WorkerDiedError,
                                    r'hosting envs \[2, 3\].*SIGKILL'):
            env.step(np.zeros((4, 1), np.float32))
        self.assertFalse(any(_process_alive(pid) for pid in pids))
        with self.assertRaisesRegex(batch_env.WorkerDiedError, r'envs \[2, 3\]'):
            env.reset()
        env.close()

    def test_worker_dying_during_step_is_detected_within_a_second(self):
        env = self.make(scripted_fns(4, {1: {'die_step_at': 1}}))
        env.reset()
        start = time.monotonic()
        with self.assertRaisesRegex(batch_env.WorkerDiedError,
                                    r'hosting envs \[0, 1\].*SIGKILL'):
            env.step(np.zeros((4, 1), np.float32))
        self.assertLess(time.monotonic() - start, 1.0)

    def test_unpicklable_factory_is_rejected(self):
        lock = threading.Lock()
        with self.assertRaisesRegex(TypeError, 'picklable'):
            batch_env.BatchEnv([lambda: ScriptedEnv(tag=lock is None)] * 2, num_workers=2)


class ProcessHygieneTest(BatchEnvTestCase):

    def test_close_reaps_every_worker(self):
        before = _descendants()
        env = batch_env.BatchEnv(scripted_fns(4), num_workers=2)
        self.assertLen(_descendants() - before, 2)
        env.reset()
        env.step(np.zeros((4, 1), np.float32))
        env.close()
        self.assertEqual(_descendants(), before)
        with self.assertRaises(gym.error.ClosedEnvironmentError):
            env.step(np.zeros((4, 1), np.float32))

    def test_garbage_collection_reaps_every_worker(self):
        before = _descendants()
        env = batch_env.BatchEnv(scripted_fns(4), num_workers=2)
        env.reset()
        env.step_async(np.zeros((4, 1), np.float32))
        del env
        gc.collect()
        self.assertEqual(_descendants(), before)

    def test_interpreter_exit_reaps_every_worker(self):
        script = textwrap.dedent('''
            import numpy as np
            from agents.tools import batch_env
            env = batch_env.BatchEnv(['Pendulum-v1'] * 4, num_workers=2)
            env.reset()
            env.step_async(np.zeros((4, 1), np.float32))
            print(*env.worker_pids, flush=True)
        ''')
        result = _run_script(script)
        self.assertEqual(result.returncode, 0, result.stderr)
        pids = [int(pid) for pid in result.stdout.split()]
        self.assertLen(pids, 2)
        self.assertTrue(_wait_until(lambda: not any(_process_alive(pid) for pid in pids)))

    @parameterized.parameters('external', 'hybrid')
    def test_workers_exit_when_the_parent_is_killed(self, mode):
        # Quick steps first, so that the workers poll for the next command (spin_seconds).
        script = textwrap.dedent(f'''
            import os, signal
            import numpy as np
            from agents.tools import batch_env
            env = batch_env.BatchEnv(['Pendulum-v1'] * 4, mode={mode!r}, num_workers=1,
                                     spin_seconds=0.5)
            env.reset()
            for _ in range(50):
                env.step(np.zeros((4, 1), np.float32))
            print(*env.worker_pids, flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        ''')
        result = _run_script(script)
        self.assertEqual(result.returncode, -signal.SIGKILL, result.stderr)
        pids = [int(pid) for pid in result.stdout.split()]
        self.assertLen(pids, 1)
        self.assertTrue(_wait_until(lambda: not any(_process_alive(pid) for pid in pids)))


    @parameterized.parameters('hung', 'stopped')
    def test_no_process_survives_a_killed_parent_with_a_stuck_worker(self, stuck):
        # Worker 1 hangs in its step, or is stopped with SIGSTOP; then the parent is killed.
        script = textwrap.dedent(f'''
            import multiprocessing.forkserver, multiprocessing.resource_tracker
            import os, signal, threading
            import gymnasium as gym
            import numpy as np
            from agents.tools import batch_env

            class Stuck(gym.Wrapper):
                def step(self, action):
                    threading.Event().wait()

            def make(index):
                env = gym.make('Pendulum-v1')
                return Stuck(env) if index == 1 and {stuck!r} == 'hung' else env

            env = batch_env.BatchEnv([lambda i=i: make(i) for i in range(2)], num_workers=2)
            env.reset()
            if {stuck!r} == 'stopped':
                os.kill(env.worker_pids[1], signal.SIGSTOP)
            env.step_async(np.zeros((2, 1), np.float32))
            print(*env.worker_pids, multiprocessing.forkserver._forkserver._forkserver_pid,
                  multiprocessing.resource_tracker._resource_tracker._pid, flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        ''')
        result = _run_script(script)
        self.assertEqual(result.returncode, -signal.SIGKILL, result.stderr)
        pids = [int(pid) for pid in result.stdout.split()]
        self.assertLen(pids, 4)  # The workers, the forkserver, the resource tracker.
        self.assertTrue(_wait_until(lambda: not any(_process_alive(pid) for pid in pids), 5),
                        [pid for pid in pids if _process_alive(pid)])


class CancelTest(BatchEnvTestCase):

    def test_cancel_wait_ends_a_wait_for_a_stuck_worker_from_another_thread(self):
        release = multiprocessing.get_context('forkserver').Event()
        env = self.make(scripted_fns(2, {1: {'block_on': release}}), timeout=None)
        env.reset()
        env.step_async(np.zeros((2, 1), np.float32))
        canceller = threading.Timer(0.3, env.cancel_wait, ['stop requested'])
        canceller.start()
        begun = time.monotonic()
        with self.assertRaisesRegex(batch_env.WaitCancelled, '^stop requested$'):
            env.step_wait()
        self.assertLess(time.monotonic() - begun, 5)
        release.set()  # The step stays pending and can still be collected.
        np.testing.assert_array_equal(env.step_wait()[0], [[0, 1], [1, 1]])

    def test_cancel_before_a_wait_ends_the_next_wait_only(self):
        env = self.make(scripted_fns(2))
        env.reset()
        env.cancel_wait('early')
        with self.assertRaisesRegex(batch_env.WaitCancelled, 'early'):
            env.step(np.zeros((2, 1), np.float32))
        np.testing.assert_array_equal(env.step_wait()[0], [[0, 1], [1, 1]])
        np.testing.assert_array_equal(env.step(np.zeros((2, 1), np.float32))[0],
                                      [[0, 2], [1, 2]])

    def test_in_process_cancel_does_nothing(self):
        env = self.make(scripted_fns(2), 'in_process')
        env.reset()
        env.cancel_wait('ignored')
        self.assertIsNone(env.waiting())
        env.step(np.zeros((2, 1), np.float32))

    def test_waiting_names_the_workers_that_owe_a_reply(self):
        release = multiprocessing.get_context('forkserver').Event()
        env = self.make(scripted_fns(4, {3: {'block_on': release}}), num_workers=2)
        env.reset()
        self.assertIsNone(env.waiting())
        env.step_async(np.zeros((4, 1), np.float32))
        seen = []
        watcher = threading.Thread(target=lambda: seen.append(
            _wait_until(lambda: (env.waiting() or (0, []))[0] > 0.2)
            and env.waiting()))
        watcher.start()
        threading.Timer(0.5, release.set).start()
        env.step_wait()
        watcher.join()
        seconds, workers = seen[0]
        self.assertGreater(seconds, 0.2)
        self.assertEqual(workers, [f'worker process 1 (pid {env.worker_pids[1]}) hosting envs '
                                   '[2, 3]'])
        self.assertIsNone(env.waiting())


class BadInputTest(BatchEnvTestCase):

    @parameterized.product(mode=MODES, case=list(BAD_PENDULUM_ACTIONS))
    def test_bad_actions_raise_and_step_nothing(self, mode, case):
        actions, error_type, message = BAD_PENDULUM_ACTIONS[case]
        env_fns = [ENV_FACTORIES['Pendulum-v1']] * 3
        env = self.make(env_fns, mode)
        reference = gym.vector.SyncVectorEnv(env_fns)
        self.addCleanup(reference.close)
        env.reset(seed=0)
        reference.reset(seed=0)
        with self.assertRaisesRegex(error_type, message):
            env.step(actions)
        good = np.full((3, 1), 0.3, np.float32)
        self.assert_same(env.step(good), reference.step(good))

    def test_discrete_actions_must_be_integers_in_range(self):
        env = self.make([ENV_FACTORIES['CartPole-v1']] * 2, 'in_process')
        env.reset(seed=0)
        with self.assertRaisesRegex(TypeError, 'float64'):
            env.step(np.array([0.0, 1.0]))
        with self.assertRaisesRegex(ValueError, r'env 1, np.int64\(2\).*outside'):
            env.step(np.array([1, 2]))
        env.step([1, 0])

    def test_action_checker_alone(self):
        # The public checker, which other VectorEnvs (envpool_env.EnvPoolBatchEnv) use too.
        for space, good, bad in (
                (gym.spaces.Box(-2, 2, (1,), np.float32), [[0.5], [-2.0]],
                 ((np.array([[0.0], [2.5]]), ValueError, r'env 1, array\(\[2.5\]\).*outside'),
                  (np.array([[np.nan], [0.0]]), ValueError, r'env 0, array\(\[nan\]\), is NaN'),
                  (np.zeros((2,)), ValueError, r'shape \(2, 1\).*got shape \(2,\)'),
                  (np.full((2, 1), 'a'), TypeError, 'dtype <U1'))),
                (gym.spaces.Discrete(3, start=1), [1, 3],
                 ((np.array([0, 1]), ValueError, r'env 0, np.int64\(0\).*outside'),
                  (np.array([1, 4]), ValueError, r'env 1, np.int64\(4\).*outside'),
                  (np.array([1.0, 2.0]), TypeError, 'float64'),
                  (np.array([[1], [2]]), ValueError, r'shape \(2,\)'))),
                (gym.spaces.MultiBinary(2), [[0, 1], [True, False]],
                 ((np.array([[0, 2], [0, 0]]), ValueError, 'env 0'),))):
            checker = batch_env.ActionChecker(space, 2)
            with self.subTest(space=space):
                np.testing.assert_array_equal(checker(good), np.asarray(good))
                self.assertIsInstance(checker(good), np.ndarray)
                for actions, error_type, message in bad:
                    with self.assertRaisesRegex(error_type, f'{message}.*nothing was stepped'):
                        checker(actions)

    @parameterized.parameters(*MODES)
    def test_stepping_a_finished_env_without_autoreset_raises(self, mode):
        env_fns = [ENV_FACTORIES['Pendulum-v1']] * 2
        env = self.make(env_fns, mode, autoreset_mode='DISABLED')
        env.reset(seed=0)
        actions = np.zeros((2, 1), np.float32)
        for _ in range(9):
            truncations = env.step(actions)[3]
        self.assertTrue(truncations.all())
        with self.assertRaisesRegex(RuntimeError, r'envs \[0, 1\] finished'):
            env.step(actions)
        env.reset(options={'reset_mask': np.array([True, False])})
        with self.assertRaisesRegex(RuntimeError, r'envs \[1\] finished'):
            env.step(actions)
        env.reset(options={'reset_mask': np.array([False, True])})
        self.assertFalse(env.step(actions)[3].any())

    @parameterized.parameters(
        ([True, False], TypeError, 'numpy array'),
        (np.array([True]), ValueError, r'shape \(2,\)'),
        (np.array([1, 0]), TypeError, 'dtype bool'),
        (np.array([False, False]), ValueError, 'True value'),
    )
    def test_bad_reset_masks(self, mask, error_type, message):
        env = self.make(scripted_fns(2), 'in_process')
        with self.assertRaisesRegex(error_type, message):
            env.reset(options={'reset_mask': mask})

    @parameterized.parameters(
        ('seed', TypeError, 'seed must be'),
        ([1, 2, 3], ValueError, 'one per env'),
        ([1, 0.5], TypeError, 'ints or None'),
    )
    def test_bad_seeds(self, seed, error_type, message):
        env = self.make(scripted_fns(2), 'in_process')
        with self.assertRaisesRegex(error_type, message):
            env.reset(seed=seed)

    @parameterized.parameters(
        (dict(env_fns=[]), ValueError, 'non-empty'),
        (dict(env_fns=[3]), TypeError, r'env_fns\[0\]'),
        (dict(mode='threads'), ValueError, 'mode must be'),
        (dict(num_workers=0), ValueError, 'num_workers'),
        (dict(start_method='fork'), ValueError, 'start_method'),
        (dict(autoreset_mode='sometimes'), ValueError, 'autoreset_mode'),
        (dict(spin_seconds=-1.0), ValueError, 'spin_seconds'),
        (dict(mode='in_process', spin_seconds='fast'), ValueError, 'spin_seconds'),
        (dict(mode='hybrid', env_fns=['CartPole-v1']), ValueError, 'at least 2 envs'),
        (dict(mode='hybrid', num_workers=-1), ValueError, 'num_workers'),
    )
    def test_bad_constructor_arguments(self, kwargs, error_type, message):
        kwargs = {'env_fns': ['CartPole-v1'] * 2, 'mode': 'external', **kwargs}
        with self.assertRaisesRegex(error_type, message):
            batch_env.BatchEnv(**kwargs)

    def test_unsupported_and_differing_spaces(self):
        flat_fn = functools.partial(gym.make, 'CartPole-v1')

        def dict_fn():
            env = flat_fn()
            return gym.wrappers.TransformObservation(
                env, lambda obs: {'x': obs}, gym.spaces.Dict({'x': env.observation_space}))

        with self.assertRaisesRegex(TypeError, 'observation spaces of types'):
            batch_env.BatchEnv([dict_fn], mode='in_process')
        with self.assertRaisesRegex(batch_env.EnvError, 'Environment 1 has observation space'):
            batch_env.BatchEnv([flat_fn, 'Pendulum-v1'], mode='in_process')


class HybridTest(BatchEnvTestCase):
    """Hybrid mode: the caller steps the first envs itself, in step_wait."""

    def test_caller_steps_its_envs_once_while_waiting_for_the_workers(self):
        release = multiprocessing.get_context('forkserver').Event()
        log = []
        env = self.make(scripted_fns(4, {1: {'log': log}, 3: {'block_on': release}}), 'hybrid')
        self.assertEqual(env.num_workers, 1)
        env.reset()
        actions = np.zeros((4, 1), np.float32)
        env.step_async(actions)
        self.assertEqual(log, [])  # step_async leaves the caller's envs to step_wait.
        with self.assertRaises(multiprocessing.TimeoutError):
            env.step_wait(timeout=0.05)
        self.assertEqual(log, [(1, 'step')])
        release.set()
        observations = env.step_wait()[0]
        self.assertEqual(log, [(1, 'step')])  # Not stepped again by the second step_wait.
        np.testing.assert_array_equal(observations, [[tag, 1] for tag in range(4)])

    def test_first_failing_env_is_reported_and_the_batch_recovers(self):
        env = self.make(scripted_fns(4, {1: {'fail_step_at': 2}, 3: {'fail_step_at': 2}}),
                        'hybrid')
        env.reset()
        actions = np.zeros((4, 1), np.float32)
        env.step(actions)
        with self.assertRaisesRegex(batch_env.EnvError, r'(?s)Environment 1 failed in step.*'
                                    r'calling process \(pid \d+\) hosting envs \[0, 1\]'
                                    ) as error:
            env.step(actions)
        self.assertIn('_scripted_failure', ''.join(traceback.format_exception(error.exception)))
        observations, _ = env.reset()  # The worker's reply to the failed step was consumed.
        np.testing.assert_array_equal(observations[:, 1], [0, 0, 0, 0])
        np.testing.assert_array_equal(env.step(actions)[0][:, 1], [1, 1, 1, 1])

    def test_worker_death_is_reported_with_its_envs(self):
        env = self.make(scripted_fns(4, {2: {'die_step_at': 1}}), 'hybrid')
        env.reset()
        start = time.monotonic()
        with self.assertRaisesRegex(batch_env.WorkerDiedError,
                                    r'worker process 1 .*hosting envs \[2, 3\].*SIGKILL'):
            env.step(np.zeros((4, 1), np.float32))
        self.assertLess(time.monotonic() - start, 1.0)

    def test_close_closes_the_callers_envs_and_reaps_the_workers(self):
        before = _descendants()
        log = []
        env = batch_env.BatchEnv(scripted_fns(6, {0: {'log': log}}), mode='hybrid',
                                 num_workers=9)
        self.assertEqual(env.num_workers, 5)  # At most one per env the caller leaves.
        self.assertLen(_descendants() - before, 5)
        self.assertEqual(log, [(0, 'close')])  # The throwaway env that told the spaces.
        env.reset()
        env.step(np.zeros((6, 1), np.float32))
        env.close()
        self.assertEqual(log, [(0, 'close'), (0, 'step'), (0, 'close')])
        self.assertEqual(_descendants(), before)


class PipeTest(BatchEnvTestCase):

    @parameterized.parameters('external', 'hybrid')
    def test_messages_larger_than_the_pipes_hold(self, mode):
        env = self.make(scripted_fns(3), mode)
        size = 300_000  # 2.4 MB per env, where a pipe holds 64 KiB.
        results = env.call('big_array', size)
        for tag, result in enumerate(results):
            np.testing.assert_array_equal(result, np.full(size, tag, np.float64))
        blobs = [np.full(size, -tag) for tag in range(3)]
        env.set_attr('blob', blobs)
        for blob, expected in zip(env.get_attr('blob'), blobs, strict=True):
            np.testing.assert_array_equal(blob, expected)
        env.reset()
        np.testing.assert_array_equal(env.step(np.zeros((3, 1), np.float32))[0][:, 1], [1] * 3)

    def test_spinning_wait_keeps_to_the_timeout(self):
        never = multiprocessing.get_context('forkserver').Event()
        env = self.make(scripted_fns(2, {1: {'block_on': never}}), spin_seconds=5.0)
        env.reset()
        env.step_async(np.zeros((2, 1), np.float32))
        start = time.monotonic()
        with self.assertRaises(multiprocessing.TimeoutError):
            env.step_wait(timeout=0.1)
        self.assertLess(time.monotonic() - start, 5.0)


class MakeBatchEnvTest(BatchEnvTestCase):

    def tearDown(self):
        gin.clear_config()
        super().tearDown()

    def test_gin_selects_mode_and_autoreset(self):
        gin.parse_config([
            "make_batch_env.mode = 'in_process'",
            "make_batch_env.autoreset_mode = 'DISABLED'",
        ])
        env = batch_env.make_batch_env(
            'Pendulum-v1', 3, env_kwargs={'g': 1.0}, wrappers=[gym.wrappers.ClipAction])
        self.addCleanup(env.close)
        self.assertEqual(env.mode, 'in_process')
        self.assertEqual(env.metadata['autoreset_mode'], AutoresetMode.DISABLED)
        self.assertEqual(env.get_attr('g'), (1.0, 1.0, 1.0))
        env.reset(seed=0)
        env.step(np.full((3, 1), 5.0, np.float32))  # Out of bounds, but clipped per env.

    def test_gin_selects_hybrid_mode(self):
        gin.parse_config(["make_batch_env.mode = 'hybrid'"])
        env = batch_env.make_batch_env('CartPole-v1', 3, num_workers=1)
        self.addCleanup(env.close)
        self.assertEqual(env.mode, 'hybrid')
        self.assertLen(env.worker_pids, 1)
        reference = gym.vector.SyncVectorEnv([functools.partial(gym.make, 'CartPole-v1')] * 3)
        self.addCleanup(reference.close)
        self.assert_same(env.reset(seed=2), reference.reset(seed=2))
        self.assert_same(env.step([0, 1, 1]), reference.step([0, 1, 1]))

    def test_external_by_default(self):
        env = batch_env.make_batch_env('CartPole-v1', 2, num_workers=2)
        self.addCleanup(env.close)
        self.assertEqual(env.mode, 'external')
        self.assertLen(env.worker_pids, 2)

    def test_bad_num_envs(self):
        with self.assertRaisesRegex(ValueError, 'num_envs'):
            batch_env.make_batch_env('CartPole-v1', 0)


def _passed_arguments(cls, call):
    """The names of the arguments a recorded call of `cls` passed explicitly."""
    return set(inspect.signature(cls).bind(*call.args, **call.kwargs).arguments)


class GinBindingTest(gin_testing.BindingTestCase):
    """A binding of BatchEnv either takes effect where our code makes one, or is refused."""

    def test_bindings_of_arguments_the_caller_sets_are_refused(self):
        self.assert_bindings_refused('BatchEnv', batch_env.NOT_GIN_BINDABLE)

    def test_make_batch_env_passes_only_arguments_that_cannot_be_bound(self):
        with mock.patch.object(batch_env, 'BatchEnv', wraps=batch_env.BatchEnv) as made:
            batch_env.make_batch_env('Pendulum-v1', 2, mode='in_process').close()
        passed = _passed_arguments(batch_env.BatchEnv, made.call_args)
        self.assertContainsSubset(passed, batch_env.NOT_GIN_BINDABLE)

    def test_make_batch_env_bindings_still_choose_the_mode(self):
        gin.parse_config(["make_batch_env.mode = 'in_process'", 'BatchEnv.timeout = 9'])
        env = batch_env.make_batch_env('Pendulum-v1', 2)
        self.addCleanup(env.close)
        self.assertEqual((env.mode, env._timeout), ('in_process', 9))


if __name__ == '__main__':
    absltest.main()
