"""End-to-end tests of the train binary: short runs, resume, and the bad input that
//reliability:bad_input_test (the catalogue of docs/errors.md) cannot set up."""

import json
import math
import os
import re
import signal
import subprocess
import sys
import time

from absl.testing import absltest

from agents.runs import run_config
from agents.storage import gcs_testing

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# One iteration of 256 steps and its evaluation. The update runs as a graph that neither XLA nor
# Grappler optimizes, which would take longer than such runs (the XLA cache's test binds its own).
UNCOMPILED = ['--gin_bindings=PPO.jit_compile = False',
              '--gin_bindings=train.optimize_graphs = False']
TINY = ['--gin_bindings=train.total_steps = 256', '--gin_bindings=train.num_envs = 4',
        '--gin_bindings=train.rollout_length = 64', '--gin_bindings=train.eval_every_steps = 256',
        '--gin_bindings=train.eval_episodes = 1', "--gin_bindings=train.env_mode = 'in_process'",
        '--gin_bindings=PPO.num_minibatches = 4', *UNCOMPILED]


def run_train(*args, cwd=None, env=None):
    env = dict(os.environ if env is None else env, PYTHONPATH=ROOT)
    if cwd:
        env['BUILD_WORKING_DIRECTORY'] = cwd
    return subprocess.run([sys.executable, '-m', 'agents.scripts.train', *args], env=env,
                          capture_output=True, text=True, timeout=600, check=False)


def run_evaluate(*args):
    return subprocess.run([sys.executable, '-m', 'agents.scripts.evaluate', *args],
                          env=dict(os.environ, PYTHONPATH=ROOT), capture_output=True, text=True,
                          timeout=600, check=False)


def metric_steps(logdir):
    with open(os.path.join(logdir, 'metrics.jsonl')) as f:
        return [json.loads(line)['step'] for line in f if line.strip()]


def snapshot(directory):
    files = {}
    for parent, _, names in os.walk(directory):
        for name in names:
            path = os.path.join(parent, name)
            with open(path, 'rb') as f:
                files[os.path.relpath(path, directory)] = f.read()
    return files


class TrainBinaryTest(absltest.TestCase):

    def test_trains_into_a_relative_logdir_resumes_and_only_its_budget_can_be_raised(self):
        cwd = self.create_tempdir().full_path
        command = ['--gin_file=configs/pendulum.gin', '--logdir=runs/a', *TINY]
        first = run_train(*command, cwd=cwd)
        self.assertEqual(first.returncode, 0, first.stderr[-3000:])
        logdir = os.path.join(cwd, 'runs', 'a')
        for name in ('config.gin', 'operative_config.gin', 'metrics.jsonl', 'checkpoints'):
            self.assertTrue(os.path.exists(os.path.join(logdir, name)), name)
        with open(os.path.join(logdir, 'metrics.jsonl')) as f:
            record = json.loads(f.readline())
        self.assertContainsSubset(
            ['step', 'mean_return', 'std_return', 'episodes', 'env_steps_per_sec', 'wall_time_s'],
            list(record))
        self.assertIn('Done:', first.stderr)
        # The libraries' routine lines of saving and of finding included gin files are gone.
        for noise in ('Sharding callback', 'Writing fingerprint', 'Assets written',
                      'Path not found', 'system_path_file_exists'):
            self.assertNotIn(noise, first.stderr)
        # The same command again finds the finished run and changes nothing.
        before = snapshot(os.path.join(logdir, 'checkpoints'))
        second = run_train(*command, cwd=cwd)
        self.assertEqual(second.returncode, 0, second.stderr[-3000:])
        self.assertIn('Resumed from', second.stderr)
        self.assertEqual(snapshot(os.path.join(logdir, 'checkpoints')), before)
        # Its budget can be raised, and nothing else.
        raised = run_train(*command, '--gin_bindings=train.total_steps = 512', cwd=cwd)
        self.assertEqual(raised.returncode, 0, raised.stderr[-3000:])
        self.assertIn('Raising the budget of the run in', raised.stderr)
        self.assertIn('from train.total_steps = 256 to 512', raised.stderr)
        self.assertRegex(raised.stderr, r'Resumed from \S+ckpt-256 at step 256')
        self.assertEqual(metric_steps(logdir), [256, 512])
        with open(os.path.join(logdir, 'config.gin')) as f:
            self.assertIn('train.total_steps = 512\n', f.read())
        # Any other change is refused, also beside a raised budget (run_config_test has the
        # lowered one).
        before = snapshot(logdir)
        refused = run_train(*command, '--gin_bindings=train.total_steps = 1024',
                            '--gin_bindings=PPO.learning_rate = 1e-4', cwd=cwd)
        self.assert_fails(refused, 'holds a run of a different configuration')
        self.assertIn('+PPO.learning_rate = 0.0001', refused.stderr)
        self.assertEqual(snapshot(logdir), before)

    def test_stop_at_step_stops_and_a_rerun_continues(self):
        cwd = self.create_tempdir().full_path
        # 256 steps per iteration, one evaluation (at the end of the budget, 768).
        command = ['--gin_file=configs/pendulum.gin', '--logdir=run', *TINY,
                   '--gin_bindings=train.total_steps = 768',
                   '--gin_bindings=train.eval_every_steps = 700']
        logdir = os.path.join(cwd, 'run')
        stopped = run_train(*command, '--stop_at_step=300', cwd=cwd)
        self.assertEqual(stopped.returncode, 0, stopped.stderr[-3000:])
        self.assertIn('Stopped at step 512 of 768 (--stop_at_step=300); rerun without '
                      '--stop_at_step, or with a later one, to continue.', stopped.stderr)
        self.assertTrue(os.path.isfile(os.path.join(logdir, 'checkpoints', 'ckpt-512.index')))
        self.assertEqual(metric_steps(logdir), [512])  # The stop has its evaluation.
        with open(os.path.join(logdir, 'config.gin')) as f:
            config = f.read()
        self.assertNotIn('stop_at_step', config)
        continued = run_train(*command, cwd=cwd)
        self.assertEqual(continued.returncode, 0, continued.stderr[-3000:])
        self.assertRegex(continued.stderr, r'Resumed from \S+ckpt-512 at step 512')
        self.assertIn('Done:', continued.stderr)
        self.assertEqual(metric_steps(logdir), [512, 768])
        with open(os.path.join(logdir, 'config.gin')) as f:
            self.assertEqual(f.read(), config)

    def test_a_population_writes_a_run_per_member_and_resumes(self):
        cwd = self.create_tempdir().full_path
        command = ['--gin_file=configs/pendulum_native.gin', '--logdir=population', *TINY,
                   '--gin_bindings=train.population = 2', '--seed=3',
                   '--gin_bindings=train.jit_compile = False']
        first = run_train(*command, cwd=cwd)
        self.assertEqual(first.returncode, 0, first.stderr[-3000:])
        self.assertIn('2 members x', first.stderr)
        logdir = os.path.join(cwd, 'population')
        self.assertEqual(sorted(name for name in os.listdir(logdir) if name != '.lock'),
                         ['member-0', 'member-1', 'population.gin'])
        with open(os.path.join(logdir, 'population.gin')) as f:
            self.assertIn('train.population = 2', f.read())
        for index, seed in enumerate((3, 4)):
            member = os.path.join(logdir, f'member-{index}')
            self.assertEqual(metric_steps(member), [256])
            with open(os.path.join(member, 'config.gin')) as f:
                config = f.read()
            self.assertIn(f'train.seed = {seed}\n', config)
            self.assertNotIn('train.population', config)
        before = snapshot(os.path.join(logdir, 'member-1', 'checkpoints'))
        again = run_train(*command, cwd=cwd)
        self.assertEqual(again.returncode, 0, again.stderr[-3000:])
        self.assertIn('Resumed from', again.stderr)
        self.assertEqual(snapshot(os.path.join(logdir, 'member-1', 'checkpoints')), before)
        # A lone run is refused the population's logdir, and the other way round.
        lone = run_train(*command[:-3], cwd=cwd)
        self.assertEqual(lone.returncode, 1)
        self.assertIn('holds no config.gin: not a BatchPPO run', lone.stderr)
        run_config.prepare_logdir(os.path.join(cwd, 'lone'), 'train.seed = 3\n')
        refused = run_train(*command[:1], '--logdir=lone', *command[2:], cwd=cwd)
        self.assertEqual(refused.returncode, 1)
        self.assertIn('holds no population.gin: not a BatchPPO population', refused.stderr)

    def test_xla_cache_is_reused_and_a_damaged_one_moved_aside(self):
        cwd = self.create_tempdir().full_path
        cache = os.path.join(cwd, 'cache', 'xla')
        # 256 steps per iteration under XLA, an evaluation after each.
        command = ['--gin_file=configs/pendulum_native.gin', '--logdir=run', *TINY[1:5],
                   '--gin_bindings=PPO.num_minibatches = 4', '--gin_bindings=train.jit_compile = '
                   'True', '--gin_bindings=train.total_steps = 512']
        env = dict(os.environ, BATCHPPO_XLA_CACHE_DIR=cache)
        logdir = os.path.join(cwd, 'run')
        first = run_train(*command, '--stop_at_step=256', cwd=cwd, env=env)
        self.assertEqual(first.returncode, 0, first.stderr[-3000:])
        entries = sorted(os.listdir(cache))
        self.assertLen(entries, 2)  # The iterations and the evaluation.
        for name in entries:
            with open(os.path.join(cache, name), 'r+b') as f:
                f.truncate(100)
        damaged = run_train(*command, cwd=cwd, env=env)
        self.assert_fails(damaged, f"XLA's compilation cache in {cache} holds a damaged entry "
                          '(Read less bytes than requested); its entries were moved to '
                          f'{cache}/damaged-')
        self.assertIn('The run stopped; the last checkpoint (step 256) is intact. Rerun the same '
                      'command to resume', damaged.stderr)
        self.assertEqual(metric_steps(logdir), [256])
        (moved,) = os.listdir(cache)
        self.assertEqual(sorted(os.listdir(os.path.join(cache, moved))), entries)
        again = run_train(*command, cwd=cwd, env=env)
        self.assertEqual(again.returncode, 0, again.stderr[-3000:])
        self.assertEqual(metric_steps(logdir), [256, 512])
        # The same programs again: their entries have the same names (they would be loaded).
        self.assertEqual(sorted(set(os.listdir(cache)) - {moved}), entries)
        # Another seed runs the same programs: loaded, not compiled and written again.
        other = run_train(*command[:1], '--logdir=other', *command[2:], '--seed=1',
                          '--stop_at_step=256', cwd=cwd, env=env)
        self.assertEqual(other.returncode, 0, other.stderr[-3000:])
        self.assertEqual(sorted(set(os.listdir(cache)) - {moved}), entries)

    def test_unusable_xla_cache_dir(self):
        cwd = self.create_tempdir().full_path
        blocker = self.create_tempfile('file').full_path
        result = run_train('--gin_file=configs/pendulum_native.gin', '--logdir=run', cwd=cwd,
                           env=dict(os.environ, BATCHPPO_XLA_CACHE_DIR=f'{blocker}/xla'))
        self.assert_fails(result, 'train: error: BATCHPPO_XLA_CACHE_DIR: cannot use '
                          f'{blocker}/xla as the XLA compilation cache')
        self.assertEqual(os.listdir(cwd), [])

    def assert_fails(self, result, message):
        self.assertNotEqual(result.returncode, 0)
        self.assertIn(message, result.stderr)

    def test_imports_leave_the_garbage_collector_on_with_their_objects_frozen(self):
        # Collection pauses only while TensorFlow loads; left off, a long run would never free
        # its cyclic garbage.
        probe = ('import gc; from agents.scripts import train; '
                 'print(gc.isenabled(), gc.get_freeze_count())')
        result = subprocess.run(
            [sys.executable, '-c', probe], env=dict(os.environ, PYTHONPATH=ROOT),
            capture_output=True, text=True, timeout=600, check=True)
        enabled, frozen = result.stdout.split()
        self.assertEqual(enabled, 'True')
        self.assertGreater(int(frozen), 100_000)

    def test_envpool_backend_trains_and_its_policy_acts_in_gymnasium(self):
        cwd = self.create_tempdir().full_path
        # TINY binds env_mode for the Gymnasium backend, as pendulum.gin does: EnvPool ignores it.
        result = run_train('--logdir=run', '--gin_file=configs/pendulum.gin', *TINY,
                           "--gin_bindings=train.env_backend='envpool'",
                           '--gin_bindings=train.eval_episodes = 2', cwd=cwd)
        self.assertEqual(result.returncode, 0, result.stderr[-3000:])
        self.assertIn('Done: 256 steps', result.stderr)
        self.assertNotIn('precision lowered', result.stderr)  # EnvPool's spaces, quietly.
        logdir = os.path.join(cwd, 'run')
        with open(os.path.join(logdir, 'metrics.jsonl')) as f:
            (record,) = [json.loads(line) for line in f if line.strip()]
        self.assertEqual((record['step'], record['episodes'], record['mean_length']),
                         (256, 2, 200.0))
        # Finite, and a Pendulum return: 200 steps of rewards in [-16.3, 0].
        self.assertTrue(math.isfinite(record['mean_return']), record)
        self.assertTrue(math.isfinite(record['std_return']), record)
        self.assertBetween(record['mean_return'], -16.3 * 200, 0.0)
        # The run's policy acts in Gymnasium's Pendulum (evaluate, as visualize does).
        evaluated = run_evaluate(f'--logdir={logdir}', '--num_episodes=2')
        self.assertEqual(evaluated.returncode, 0, evaluated.stderr[-3000:])
        metrics = json.loads(evaluated.stdout)
        self.assertEqual((metrics['env_id'], metrics['lengths']), ('Pendulum-v1', [200, 200]))
        self.assertBetween(metrics['mean_return'], -16.3 * 200, 0.0)

    def test_atari_trains_from_frames_and_evaluates_whole_unclipped_games(self):
        cwd = self.create_tempdir().full_path
        # One iteration of 4 x 32 frames: learning is not the point.
        result = run_train('--logdir=run', '--gin_file=configs/atari_pong.gin',
                           '--gin_bindings=train.num_envs=4',
                           '--gin_bindings=train.rollout_length=32',
                           '--gin_bindings=train.total_steps=128',
                           '--gin_bindings=train.eval_episodes=2', *UNCOMPILED, cwd=cwd)
        self.assertEqual(result.returncode, 0, result.stderr[-3000:])
        self.assertIn('Done: 128 steps', result.stderr)
        # Training's episodes are lives with clipped rewards, and say so; its whole games
        # (none ends in 32 steps of Pong) are told apart.
        self.assertIn('| train game score n/a | train life return clipped ', result.stderr)
        logdir = os.path.join(cwd, 'run')
        with open(os.path.join(logdir, 'metrics.jsonl')) as f:
            (record,) = [json.loads(line) for line in f if line.strip()]
        # Whole games of Pong: one side reaches 21 points, so the score is a whole number in
        # [-21, 21], not a clipped per-point episode, and a game lasts hundreds of steps.
        self.assertEqual(record['episodes'], 2)
        self.assertBetween(record['mean_return'], -21.0, 21.0)
        self.assertGreater(record['mean_length'], 500)
        # Its exported policy takes uint8 frames and plays whole games too.
        policy = os.path.join(logdir, 'policy', '128')
        evaluated = run_evaluate(f'--policy={policy}', '--num_episodes=1')
        self.assertEqual(evaluated.returncode, 0, evaluated.stderr[-3000:])
        metrics = json.loads(evaluated.stdout)
        self.assertEqual(metrics['env_id'], 'Pong-v5')
        self.assertEqual(metrics['mean_return'], round(metrics['mean_return']))
        self.assertBetween(metrics['mean_return'], -21.0, 21.0)
        self.assertGreater(metrics['lengths'][0], 500)

    def test_envpool_backend_without_envpool_says_how_to_install_it(self):
        cwd = self.create_tempdir().full_path
        # An `envpool` that is not there, first on the path.
        stub = self.create_tempdir().create_file(
            'envpool/__init__.py',
            "raise ModuleNotFoundError(\"No module named 'envpool'\", name='envpool')\n")
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(
            [os.path.dirname(os.path.dirname(stub.full_path)), ROOT]),
            BUILD_WORKING_DIRECTORY=cwd)
        result = subprocess.run(
            [sys.executable, '-m', 'agents.scripts.train', '--logdir=run',
             '--gin_file=configs/pendulum.gin', "--gin_bindings=train.env_backend='envpool'"],
            env=env, capture_output=True, text=True, timeout=600, check=False)
        self.assertEqual(result.returncode, 1, result.stderr[-3000:])
        self.assertIn("train: error: train.env_backend = 'envpool': EnvPool is not installed; "
                      "install it with: pip install 'batchppo[envpool]'\n", result.stderr)
        self.assertNotIn('Traceback', result.stderr)
        self.assertEqual(os.listdir(cwd), [])


# Three evaluations, the first well before the end: a signal after it stops the run midway.
BUCKET_RUN = ['--gin_bindings=train.total_steps = 6144', '--gin_bindings=train.num_envs = 4',
              '--gin_bindings=train.rollout_length = 64',
              '--gin_bindings=train.eval_every_steps = 2048',
              '--gin_bindings=train.eval_episodes = 1',
              "--gin_bindings=train.env_mode = 'in_process'",
              '--gin_bindings=PPO.num_minibatches = 4', *UNCOMPILED]
TOTAL_STEPS = 6144


def steps_of(metrics):
    return [json.loads(line)['step'] for line in metrics.decode().splitlines() if line.strip()]


class TrainInBucketTest(absltest.TestCase):
    """`--logdir=gs://...` against a GCS emulator: each run stages in a fresh local directory."""

    def setUp(self):
        super().setUp()
        self.emulator = self.enter_context(gcs_testing.GcsEmulator(buckets=('runs',)))

    def environment(self):
        """The trainer's environment: the emulator's, with a temporary directory of its own (as a
        machine that never saw the run has)."""
        self.staging = self.create_tempdir().full_path
        return self.emulator.environment(dict(
            os.environ, PYTHONPATH=ROOT, TMPDIR=self.staging,
            BATCHPPO_STAGING_DIR=os.path.join(self.staging, 'staging')))

    def run_objects(self):
        return {name[len('run/'):]: data
                for name, data in self.emulator.objects('runs', 'run/').items()}

    def staging_dirs(self):
        root = os.path.join(self.staging, 'staging')
        return os.listdir(root) if os.path.isdir(root) else []

    def test_stopped_run_resumes_from_the_bucket_on_another_machine(self):
        command = [sys.executable, '-m', 'agents.scripts.train', '--gin_file=configs/pendulum.gin',
                   '--logdir=gs://runs/run', *BUCKET_RUN]
        cwd = self.create_tempdir().full_path
        log = self.create_tempfile('first.log').full_path
        with open(log, 'w') as stderr:
            first = subprocess.Popen(command, env=self.environment(), cwd=cwd,
                                     stdout=subprocess.DEVNULL, stderr=stderr)
        self.addCleanup(lambda: first.poll() is not None or first.kill())
        # Stopped once its first evaluation is in the bucket.
        deadline = time.time() + 300
        while 'run/metrics.jsonl' not in self.emulator.names('runs', 'run/'):
            self.assertIsNone(first.poll(), 'the first run ended before its first evaluation')
            self.assertLess(time.time(), deadline, 'no evaluation reached the bucket')
            time.sleep(0.2)
        first.send_signal(signal.SIGTERM)
        status = first.wait(timeout=120)
        with open(log) as f:
            first_log = f.read()
        self.assertEqual(status, 128 + signal.SIGTERM, first_log[-3000:])
        self.assertIn('interrupted by SIGTERM', first_log)
        self.assertEqual(self.staging_dirs(), [])  # The staging copy is gone.
        objects = self.run_objects()
        self.assertIn('config.gin', objects)
        self.assertIn('operative_config.gin', objects)
        self.assertIn('checkpoints/checkpoint', objects)
        self.assertTrue([name for name in objects if name.startswith('checkpoints/ckpt-')
                         and name.endswith('.index')], sorted(objects))
        policies = {name.split('/')[1] for name in objects
                    if name.startswith('policy/') and name.endswith('/saved_model.pb')}
        self.assertTrue(policies, sorted(objects))
        self.assertTrue(all(step.isdigit() for step in policies), policies)
        self.assertTrue([name for name in objects if name.startswith('events.out.tfevents.')])
        self.assertNotIn('.lease', objects)  # Released.
        self.assertFalse([name for name in objects if 'probe' in name or '.tmp-' in name])
        first_config = objects['config.gin']
        first_steps = steps_of(objects['metrics.jsonl'])
        self.assertTrue(first_steps)
        self.assertLess(first_steps[-1], TOTAL_STEPS)
        # Every stored policy belongs to a kept checkpoint or an evaluation.
        self.assertContainsSubset({str(step) for step in first_steps[-1:]}, policies)

        # The same command on a machine that never saw the run: resumed from the bucket.
        second = run_train('--gin_file=configs/pendulum.gin', '--logdir=gs://runs/run',
                           *BUCKET_RUN, cwd=cwd, env=self.environment())
        self.assertEqual(second.returncode, 0, second.stderr[-3000:])
        self.assertNotIn('Resumed from', first_log)
        resumed = re.search(r'Resumed from \S+ at step (\d+)', second.stderr)
        self.assertIsNotNone(resumed, second.stderr[-3000:])
        self.assertGreaterEqual(int(resumed.group(1)), first_steps[-1])  # Not from scratch.
        self.assertIn('Done:', second.stderr)
        self.assertEqual(self.staging_dirs(), [])
        objects = self.run_objects()
        steps = steps_of(objects['metrics.jsonl'])
        self.assertEqual(steps[:len(first_steps)], first_steps)
        self.assertEqual(steps, sorted(set(steps)), steps)  # Strictly increasing: none repeated.
        self.assertEqual(steps[-1], TOTAL_STEPS)
        self.assertIn(f'policy/{TOTAL_STEPS}/saved_model.pb', objects)
        self.assertNotIn('.lease', objects)
        self.assertEqual(objects['config.gin'], first_config)

    def test_bucket_run_of_another_config_is_untouched(self):
        bucket = self.emulator.client().bucket('runs')
        stored = {'run/config.gin': b'train.env_id = "CartPole-v1"\n',
                  'run/metrics.jsonl': b'{"step": 1}\n', 'run/train.log': b'trial\n'}
        for name, data in stored.items():
            bucket.blob(name).upload_from_string(data)
        result = run_train('--gin_file=configs/pendulum.gin', '--logdir=gs://runs/run',
                           *BUCKET_RUN, cwd=self.create_tempdir().full_path,
                           env=self.environment())
        self.assertEqual(result.returncode, 1, result.stderr[-3000:])
        self.assertIn('train: error: logdir gs://runs/run holds a run of a different '
                      'configuration', result.stderr)
        error = result.stderr[result.stderr.index('train: error:'):]
        self.assertNotIn('batchppo-run-', error)  # Named by its bucket, not its local copy.
        self.assertEqual(self.emulator.objects('runs'), stored)  # No lease left, nothing written.
        self.assertEqual(self.staging_dirs(), [])

    def test_missing_bucket(self):
        cwd = self.create_tempdir().full_path
        result = run_train('--gin_file=configs/pendulum.gin', '--logdir=gs://missing-bucket/run',
                           *BUCKET_RUN, cwd=cwd, env=self.environment())
        self.assertEqual(result.returncode, 1, result.stderr[-3000:])
        errors = [line for line in result.stderr.splitlines() if 'error' in line.lower()
                  and not line.startswith(('E0000', 'W0000', 'I0000'))]
        self.assertLen(errors, 1, result.stderr[-3000:])
        self.assertRegex(errors[0], r'^train: error: .*missing-bucket.* does not exist')
        self.assertEqual(result.stderr.rstrip().splitlines()[-1], errors[0])
        self.assertNotIn('Traceback', result.stderr)
        self.assertNotIn('Logdir:', result.stderr)  # Nothing trained.
        self.assertEqual(self.staging_dirs(), [])
        self.assertEqual(os.listdir(cwd), [])
        self.assertEqual(self.emulator.objects('runs'), {})


if __name__ == '__main__':
    absltest.main()
