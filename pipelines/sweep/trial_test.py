"""Tests of running one trial: results, failures, timeouts, locks, cleanup and remote uploads.

A stand-in trainer (written to a temporary module, behaving as its `fake.mode` binding says)
keeps these fast; sweep_test runs the real trainer.
"""

import dataclasses
import fcntl
import json
import os
import socket
import subprocess
import sys
import textwrap
import time
from unittest import mock

from absl.testing import absltest

from agents.storage import file_io, gcs_testing
from pipelines.process_testing import lock_is_free, process_gone, wait_for
from pipelines.sweep import sweep_spec, trial

FAKE_TRAINER = '''
import ast, json, os, signal, subprocess, sys, time

args = sys.argv[1:]
flags = dict(arg[2:].split('=', 1) for arg in args if '=' in arg)
bindings = [arg.split('=', 1)[1] for arg in args if arg.startswith('--gin_bindings=')]
mode = next(b.split('=', 1)[1].strip().strip("'") for b in bindings if b.startswith('fake.mode'))
logdir = flags['logdir']
members = next((ast.literal_eval(b.split('=', 1)[1].strip()) for b in bindings
                if b.startswith('train.population_members')), None)
if members is not None:  # A population: a run directory per member.
    from agents.storage import file_io
    file_io.write_text(logdir + '/population.gin', '\\n'.join(bindings))
    file_io.write_text(logdir + '/seen.json', json.dumps({'argv': args}))
    print('training a population', flush=True)
    if mode == 'raise':
        sys.exit('train: error: non-finite loss of member-1; the run stopped')
    if mode == 'hang':
        time.sleep(600)
    for index, member in enumerate(members):
        file_io.write_text(f'{logdir}/member-{index}/metrics.jsonl', ''.join(
            json.dumps({'step': step, 'mean_return': -step - member['train.seed']}) + '\\n'
            for step in (1024, 2048)))
    sys.exit(0)
if logdir.startswith('gs://'):  # A trial in a bucket: the files go there.
    from agents.storage import file_io
    print('training', flush=True)
    time.sleep(3 if mode == 'slow' else 0)
    file_io.write_text(logdir + '/config.gin', '\\n'.join(bindings))
    file_io.write_text(logdir + '/seen.json', json.dumps({'argv': args, 'ended': time.time()}))
    file_io.write_text(logdir + '/metrics.jsonl', ''.join(
        json.dumps({'step': step, 'mean_return': value}) + '\\n'
        for step, value in ((1024, -900.0), (2048, -950.0))))
    sys.exit(0)
if mode == 'strict' and os.listdir(logdir):
    sys.exit(f'train: error: logdir {logdir} is not empty and holds no config.gin')
os.makedirs(logdir, exist_ok=True)
with open(os.path.join(logdir, 'config.gin'), 'w') as f:
    f.write('\\n'.join(bindings))
with open(os.path.join(logdir, 'seen.json'), 'w') as f:
    json.dump({'argv': args, 'threads': os.environ.get('TF_NUM_INTRAOP_THREADS'),
               'caller': os.environ.get('BUILD_WORKING_DIRECTORY'), 'pid': os.getpid()}, f)
print('training', flush=True)
if mode == 'raise':
    raise RuntimeError('exploded at step 1024')
if mode == 'kill':
    os.kill(os.getpid(), signal.SIGKILL)
if mode in ('hang', 'hang_with_child'):
    if mode == 'hang_with_child':
        child = subprocess.Popen(['sleep', '600'])
        with open(os.path.join(logdir, 'child.pid'), 'w') as f:
            f.write(str(child.pid))
    # Written whole, then renamed: a reader never sees it half written.
    with open(os.path.join(logdir, 'hanging.tmp'), 'w') as f:
        f.write(f'{os.getpid()} {os.getppid()}')  # The trainer and its supervisor.
    os.rename(os.path.join(logdir, 'hanging.tmp'), os.path.join(logdir, 'hanging'))
    time.sleep(600)
returns = {'nan': [-900.0, float('nan')], 'short': [-900.0]}.get(mode, [-900.0, -950.0])
with open(os.path.join(logdir, 'metrics.jsonl'), 'a') as f:
    for step, value in zip((1024, 2048), returns):
        f.write(json.dumps({'step': step, 'mean_return': value}) + '\\n')
'''


def make_trial(mode, trial_id='abcd1234-seed3'):
    return sweep_spec.Trial(id=trial_id, config_id=trial_id.split('-')[0], index=5, seed=3,
                            bindings={'fake.mode': mode},
                            gin_bindings=('train.total_steps = 2048', f"fake.mode = '{mode}'"))


def make_population(mode, seeds=(3, 4)):
    trials = tuple(
        dataclasses.replace(make_trial(mode, f'abcd1234-seed{seed}'), seed=seed, index=seed)
        for seed in seeds)
    members = [{'train.seed': seed} for seed in seeds]
    return trial.Population('pop-test', trials, trials[0].gin_bindings + (
        f'train.population = {len(seeds)}', f'train.population_members = {members!r}'))


class TrialTest(absltest.TestCase):

    def setUp(self):
        super().setUp()
        modules = self.create_tempdir('modules').full_path
        with open(os.path.join(modules, 'fake_trainer.py'), 'w') as f:
            f.write(FAKE_TRAINER)
        environ = mock.patch.dict(os.environ, {'PYTHONPATH': modules})
        environ.start()
        self.addCleanup(environ.stop)
        self.output_dir = self.create_tempdir('sweep').full_path
        self.settings = trial.Settings(
            output_dir=self.output_dir, gin_files=('configs/pendulum.gin',), env_steps=2048,
            timeout_s=60, caller_directory='/some/caller', threads=1,
            trainer_module='fake_trainer')

    def logdir(self, trial_id='abcd1234-seed3'):
        return os.path.join(self.output_dir, 'trials', trial_id)

    def seen(self, trial_id='abcd1234-seed3'):
        with open(os.path.join(self.logdir(trial_id), 'seen.json')) as f:
            return json.load(f)

    def test_ok_trial(self):
        record = trial.run(make_trial('ok'), self.settings)
        self.assertEqual(record['status'], 'ok', record['error'])
        self.assertEqual((record['final_return'], record['best_return'], record['env_steps']),
                         (-950.0, -900.0, 2048))
        self.assertEqual((record['id'], record['config_id'], record['seed'], record['index']),
                         ('abcd1234-seed3', 'abcd1234', 3, 5))
        self.assertEqual(record['bindings'], {'fake.mode': 'ok'})
        self.assertEqual(record['logdir'], 'trials/abcd1234-seed3')
        self.assertIsNone(record['error'])
        self.assertGreater(record['wall_time_s'], 0)
        self.assertEqual(record['worker'], f'{socket.gethostname()}/{os.getpid()}')
        self.assertEqual(trial.read_result(self.output_dir, 'abcd1234-seed3'), record)
        with open(os.path.join(self.logdir(), 'train.log')) as f:
            self.assertIn('training', f.read())
        seen = self.seen()
        self.assertEqual(seen['argv'], [
            '--gin_file=configs/pendulum.gin', '--gin_bindings=train.total_steps = 2048',
            "--gin_bindings=fake.mode = 'ok'", f'--logdir={self.logdir()}', '--seed=3'])
        self.assertEqual((seen['threads'], seen['caller']), ('1', '/some/caller'))

    def test_command_is_the_trainers(self):
        settings = trial.Settings(output_dir='/out', gin_files=('a.gin', 'b.gin'), env_steps=5)
        self.assertEqual(trial.trainer_command(make_trial('ok'), settings, '/out/trials/x'), [
            sys.executable, '-m', 'agents.scripts.train', '--gin_file=a.gin', '--gin_file=b.gin',
            '--gin_bindings=train.total_steps = 2048', "--gin_bindings=fake.mode = 'ok'",
            '--logdir=/out/trials/x', '--seed=3'])

    def test_a_trainer_in_a_bucket_rides_out_an_outage_as_long_as_the_sweep(self):
        settings = trial.Settings(output_dir='gs://b/out', gin_files=('a.gin',), env_steps=5,
                                  max_outage_s=600.0)
        command = trial.trainer_command(make_trial('ok'), settings, 'gs://b/out/trials/x')
        bindings = [arg for arg in command if arg.startswith('--gin_bindings=')]
        # First, so that a spec's own binding of it wins.
        self.assertEqual(bindings[0], '--gin_bindings=staging.max_outage_s = 600')
        local = dataclasses.replace(settings, output_dir='/out')
        self.assertNotIn('staging', ' '.join(trial.trainer_command(make_trial('ok'), local,
                                                                   '/out/trials/x')))

    def test_a_rung_stops_the_trainer_at_its_budget(self):
        record = trial.run(make_trial('ok'), self.settings, stop_at_step=1024)
        self.assertEqual((record['status'], record['budget']), ('ok', 1024), record['error'])
        self.assertEqual(self.seen()['argv'][-1], '--stop_at_step=1024')
        self.assertEqual(record['final_metrics'], {'mean_return': -950.0})
        # The full budget is the trainer's own: no flag.
        settings = trial.Settings(output_dir='/out', gin_files=('a.gin',), env_steps=2048)
        self.assertNotIn('--stop_at_step', ' '.join(trial.trainer_command(
            make_trial('ok'), settings, '/out/trials/x', 2048)))
        record = trial.run(make_trial('short'), self.settings, stop_at_step=2000)
        self.assertEqual(record['status'], 'failed')
        self.assertIn('trainer stopped at step 1024, before the budget of 2000 steps',
                      record['error'])

    def test_trainer_error_is_recorded_with_its_output(self):
        record = trial.run(make_trial('raise'), self.settings)
        self.assertEqual(record['status'], 'failed')
        self.assertIn('trainer exited with status 1', record['error'])
        self.assertIn('RuntimeError: exploded at step 1024', record['error'])
        self.assertIsNone(record['final_return'])
        self.assertEqual(trial.read_result(self.output_dir, record['id'])['status'], 'failed')

    def test_nan_return_fails(self):
        record = trial.run(make_trial('nan'), self.settings)
        self.assertEqual(record['status'], 'failed')
        self.assertEqual(record['error'], 'non-finite evaluation return at step 2048')
        self.assertIsNone(record['final_return'])
        self.assertEqual(record['best_return'], -900.0)
        json.dumps(record, allow_nan=False)  # Stays valid JSON.

    def test_stopping_before_the_budget_fails(self):
        record = trial.run(make_trial('short'), self.settings)
        self.assertEqual(record['status'], 'failed')
        self.assertIn('stopped at step 1024, before the budget of 2048', record['error'])

    def test_killed_trainer_fails(self):
        record = trial.run(make_trial('kill'), self.settings)
        self.assertEqual(record['status'], 'failed')
        self.assertIn('trainer killed by SIGKILL', record['error'])

    def test_timeout_kills_the_process_group(self):
        settings = dataclasses.replace(self.settings, timeout_s=3)
        record = trial.run(make_trial('hang_with_child'), settings)
        self.assertEqual(record['status'], 'failed')
        self.assertStartsWith(record['error'], 'timed out after 3 s')
        self.assertIn('training', record['error'])
        with open(os.path.join(self.logdir(), 'child.pid')) as f:
            child = int(f.read())
        wait_for(lambda: process_gone(child), what='the trainer\'s own child to be killed')
        # SIGKILL takes effect asynchronously: under load the trainer can still be exiting.
        trainer = self.seen()['pid']
        wait_for(lambda: process_gone(trainer), timeout=5, what='the trainer to be killed')

    def test_rerun_resumes_in_the_same_logdir(self):
        trial.run(make_trial('raise'), self.settings)
        record = trial.run(make_trial('ok'), self.settings)
        self.assertEqual(record['status'], 'ok')
        with open(os.path.join(self.logdir(), 'train.log')) as f:
            log = f.read()
        self.assertIn('exploded', log)  # The earlier attempt's output is kept.
        self.assertEqual(log.count('=== '), 2)

    def test_an_attempt_that_never_trained_leaves_the_logdir_empty(self):
        logdir = self.logdir()
        os.makedirs(logdir)
        for name in ('result.json', 'train.log'):
            with open(os.path.join(logdir, name), 'w') as f:
                f.write('from an attempt whose trainer refused its config\n')
        record = trial.run(make_trial('strict'), self.settings)
        self.assertEqual(record['status'], 'ok', record['error'])

    def test_a_locked_logdir_is_not_trained(self):
        os.makedirs(self.logdir())
        descriptor = os.open(self.logdir(), os.O_RDONLY)
        self.addCleanup(os.close, descriptor)
        fcntl.flock(descriptor, fcntl.LOCK_EX)
        record = trial.run(make_trial('ok'), self.settings)
        self.assertEqual(record['status'], 'failed')
        self.assertIn('being trained by another process', record['error'])
        self.assertEqual(os.listdir(self.logdir()), [])  # Nothing written, nothing started.

    def test_trainer_dies_with_the_process_that_started_it(self):
        # A stand-in for a sweep worker: runs a hanging trial, then is killed.
        script = textwrap.dedent(f'''
            from pipelines.sweep import trial, sweep_spec
            settings = trial.Settings(
                output_dir={self.output_dir!r}, gin_files=('a.gin',), env_steps=2048,
                trainer_module='fake_trainer')
            trial.run(sweep_spec.Trial('abcd1234-seed3', 'abcd1234', 0, 3, {{}},
                                       ("fake.mode = 'hang_with_child'",)), settings)
            ''')
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(
            [os.environ['PYTHONPATH'], trial.run_config.PACKAGE_ROOT]))
        worker = subprocess.Popen([sys.executable, '-c', script], env=env)
        self.addCleanup(worker.wait)
        hanging = os.path.join(self.logdir(), 'hanging')
        wait_for(lambda: os.path.exists(hanging), what='the trainer to start')
        with open(hanging) as f:
            trainer, supervisor = map(int, f.read().split())
        with open(os.path.join(self.logdir(), 'child.pid')) as f:
            child = int(f.read())
        worker.kill()
        wait_for(lambda: process_gone(trainer), what='the trainer to die with its worker')
        wait_for(lambda: process_gone(child), what='the trainer\'s child to die too')
        # The supervisor held the lock too; it kills the group, itself included.
        wait_for(lambda: process_gone(supervisor), what='the trainer\'s supervisor to die')
        # The lock goes with them and with the worker, which opened it: its main thread's exit
        # already took the supervisor down, but its other threads (it runs 3) may still be
        # exiting, holding the descriptor (under CI's load a rerun found the logdir locked).
        wait_for(lambda: lock_is_free(self.logdir()), what='the killed trial\'s lock to go')
        record = trial.run(make_trial('ok'), self.settings)
        self.assertEqual(record['status'], 'ok', record.get('error'))

    def test_a_trial_in_a_bucket_trains_there_and_commits_its_result_last(self):
        with gcs_testing.GcsEmulator(buckets=('sweeps',)) as emulator, \
                mock.patch.object(trial, 'LOG_UPLOAD_S', 0.5):
            settings = dataclasses.replace(self.settings, output_dir='gs://sweeps/sweep')
            logdir = 'gs://sweeps/sweep/trials/abcd1234-seed3'
            # An earlier attempt that failed: its log stays, its result goes.
            file_io.write_text(f'{logdir}/train.log', 'earlier attempt\n')
            file_io.write_text(f'{logdir}/result.json', '{"status": "failed"}\n')
            writes = []
            write_text = file_io.write_text

            def recording(path, text):
                writes.append((path.rsplit('/', 1)[1], time.time(), text))
                return write_text(path, text)

            with mock.patch.object(file_io, 'write_text', recording):
                record = trial.run(make_trial('slow'), settings)
            self.assertEqual(record['status'], 'ok', record['error'])
            self.assertEqual((record['final_return'], record['env_steps']), (-950.0, 2048))
            stored = emulator.objects('sweeps', 'sweep/trials/abcd1234-seed3/')
            seen = json.loads(stored['sweep/trials/abcd1234-seed3/seen.json'])
            self.assertIn(f'--logdir={logdir}', seen['argv'])  # The trainer's logdir is the bucket.
            self.assertEqual(json.loads(stored['sweep/trials/abcd1234-seed3/result.json']), record)
            log = stored['sweep/trials/abcd1234-seed3/train.log'].decode()
            self.assertStartsWith(log, 'earlier attempt\n')
            self.assertIn('training', log)
            # The log reached the bucket while the trainer ran; the result came last.
            self.assertTrue(any(name == 'train.log' and at < seen['ended'] and 'training' in text
                                for name, at, text in writes), writes)
            self.assertEqual(writes[-1][0], 'result.json')
            self.assertNotIn('result.json', [name for name, _, _ in writes[:-1]])

    def test_a_population_trains_its_trials_in_one_trainer(self):
        population = make_population('ok')
        records = trial.run_population(population, self.settings)
        logdir = os.path.join(self.output_dir, 'populations', 'pop-test')
        for index, (record, member) in enumerate(zip(records, population.trials, strict=True)):
            self.assertEqual(record['status'], 'ok', record['error'])
            self.assertEqual((record['id'], record['seed'], record['population'], record['logdir']),
                             (member.id, member.seed, 'pop-test',
                              f'populations/pop-test/member-{index}'))
            self.assertEqual((record['final_return'], record['env_steps']),
                             (-2048 - member.seed, 2048))
            self.assertEqual(trial.read_result(self.output_dir, member.id), record)
        with open(os.path.join(logdir, 'seen.json')) as f:
            argv = json.load(f)['argv']
        self.assertEqual(argv[-2:], ['--gin_bindings=train.population_members = '
                                     "[{'train.seed': 3}, {'train.seed': 4}]",
                                     f'--logdir={logdir}'])
        self.assertNotIn('--seed', ' '.join(argv))
        with open(os.path.join(logdir, 'train.log')) as f:
            log = f.read()
        self.assertIn('ok after', log)
        self.assertIn('2 of 2 trials ok', log)
        self.assertIn('training a population', log)

    def test_a_failed_population_fails_each_of_its_trials(self):
        records = trial.run_population(make_population('raise'), self.settings)
        for record in records:
            self.assertEqual((record['status'], record['population']), ('failed', 'pop-test'))
            self.assertIn('population pop-test (2 trials): trainer exited with status 1',
                          record['error'])
            self.assertIn('non-finite loss of member-1', record['error'])
            self.assertEqual(trial.read_result(self.output_dir, record['id']), record)

    def test_a_population_may_take_the_timeout_of_each_of_its_trials(self):
        settings = dataclasses.replace(self.settings, timeout_s=1.5)
        began = time.time()
        records = trial.run_population(make_population('hang'), settings)
        self.assertGreaterEqual(time.time() - began, 3.0)
        for record in records:
            self.assertEqual(record['status'], 'failed')
            self.assertIn('timed out after 3 s; its process group was killed', record['error'])

    def test_a_population_in_a_bucket(self):
        with gcs_testing.GcsEmulator(buckets=('sweeps',)) as emulator:
            settings = dataclasses.replace(self.settings, output_dir='gs://sweeps/sweep')
            records = trial.run_population(make_population('ok'), settings)
            stored = emulator.objects('sweeps', 'sweep/')
        for index, record in enumerate(records):
            self.assertEqual(record['status'], 'ok', record['error'])
            self.assertEqual(record['logdir'], f'populations/pop-test/member-{index}')
            self.assertEqual(
                json.loads(stored[f'sweep/trials/{record["id"]}/result.json']), record)
        seen = json.loads(stored['sweep/populations/pop-test/seen.json'])
        self.assertIn('--logdir=gs://sweeps/sweep/populations/pop-test', seen['argv'])
        self.assertIn('2 of 2 trials ok', stored['sweep/populations/pop-test/train.log'].decode())

    def test_read_result_of_a_missing_or_corrupt_file(self):
        self.assertIsNone(trial.read_result(self.output_dir, 'nope-seed0'))
        file_io.write_text(os.path.join(self.logdir(), 'result.json'), '{"status": "o')
        self.assertIsNone(trial.read_result(self.output_dir, 'abcd1234-seed3'))

    def test_read_metrics_skips_a_cut_line_and_other_values(self):
        logdir = self.create_tempdir().full_path
        with open(os.path.join(logdir, 'metrics.jsonl'), 'w') as f:
            f.write('{"step": 1, "mean_return": -5.0}\n[1]\n{"step": 2, "mean_ret')
        self.assertEqual(trial.read_metrics(logdir), [{'step': 1, 'mean_return': -5.0}])
        self.assertEqual(trial.read_metrics(os.path.join(logdir, 'missing')), [])


if __name__ == '__main__':
    absltest.main()
