"""Tests of the training benchmark's bookkeeping: settings table, process monitoring, summaries.

The runs themselves (BatchPPO, and SB3 and rejax in .venv-peers) are not started here; a small
Python script stands in for them.
"""

import ast
import json
import os
import subprocess
import sys
import textwrap

from absl import app
from absl.testing import absltest, flagsaver

from agents.runs import run_config
from benchmarks import peers_testing, train_throughput

# A stand-in for a training run: holds `MB` of memory in itself and in a child process, writes
# two evaluations to <logdir>/metrics.jsonl and exits with `CODE`.
FAKE_RUN = textwrap.dedent('''
    import json, os, subprocess, sys, time
    logdir, megabytes, code = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    hold = 'import sys, time; b = bytearray(%d << 20); b[::4096] = b"x" * len(b[::4096]); ' \\
           'time.sleep(1.5)' % megabytes
    child = subprocess.Popen([sys.executable, '-c', hold])
    data = bytearray(megabytes << 20)
    data[::4096] = b'x' * len(data[::4096])
    os.makedirs(logdir)
    print('training', flush=True)
    for step, mean_return in ((100, -500.0), (200, -150.0)):
        with open(os.path.join(logdir, 'metrics.jsonl'), 'a') as f:
            f.write(json.dumps({'step': step, 'mean_return': mean_return,
                                'env_steps_per_sec': 1000.0, 'wall_time_s': 0.1}) + '\\n')
        time.sleep(0.3)
    child.wait()
    print('failing' if code else 'done', flush=True)
    sys.exit(code)
''')


class SharedSettingsTest(absltest.TestCase):

    def write_gin(self, text):
        return self.create_tempfile('task.gin', textwrap.dedent(text)).full_path

    def test_reads_bound_values_and_defaults(self):
        path = self.write_gin('''
            include 'base.gin'
            train.env_id = 'Pendulum-v1'
            train.num_envs = 4
            PPO.discount = 0.9
            PPO.learning_rate = 1e-3
            FeedForwardGaussianPolicy.hidden_sizes = (32,)
        ''')
        task = train_throughput.Task((path,), ('PPO.num_epochs = 3',), 5000)
        settings, gin_files, bindings = train_throughput.shared_settings(
            task, 7000, ['train.rollout_length = 64'])
        self.assertEqual(settings['env_id'], 'Pendulum-v1')
        self.assertEqual(settings['num_envs'], 4)
        self.assertEqual(settings['rollout_length'], 64)
        self.assertEqual(settings['total_steps'], 7000)
        self.assertEqual(settings['num_epochs'], 3)
        self.assertEqual(settings['discount'], 0.9)
        self.assertEqual(settings['learning_rate'], 1e-3)
        self.assertEqual(settings['policy_hidden_sizes'], [32])
        self.assertEqual(settings['value_hidden_sizes'], [64, 64])  # From base.gin.
        self.assertEqual(settings['observ_clip'], 5.0)  # PPO's default, bound nowhere.
        self.assertEqual(settings['init_std'], 1.0)
        self.assertEqual(gin_files, [path])
        self.assertEqual(bindings[-1], 'train.total_steps = 7000')
        json.dumps(settings)  # The SB3 runner gets it as JSON.

    def test_refuses_settings_sb3_cannot_run(self):
        path = self.write_gin('''
            include 'base.gin'
            train.env_id = 'Pendulum-v1'
        ''')
        task = train_throughput.Task((path,), ("PPO.objective = 'kl_penalty'",), 5000)
        with self.assertRaisesRegex(run_config.ConfigError, 'PPO.objective'):
            train_throughput.shared_settings(task, 5000)


def _runner_settings(name):
    """The SETTINGS tuple of a peer runner, read from its source: the runners import the peers'
    packages, which only .venv-peers has."""
    with open(os.path.join(train_throughput.HERE, name), encoding='utf-8') as f:
        tree = ast.parse(f.read())
    for node in tree.body:
        if isinstance(node, ast.Assign) and [target.id for target in node.targets] == [
                'SETTINGS']:
            return ast.literal_eval(node.value)
    raise AssertionError(f'{name} defines no SETTINGS')


class PeerCommandTest(absltest.TestCase):

    def test_runners_take_the_shared_settings_table(self):
        settings, _, _ = train_throughput.shared_settings(
            train_throughput.TASKS['pendulum_native4096'], 600_000)
        for runner in ('sb3_runner.py', 'rejax_runner.py'):
            with self.subTest(runner=runner):
                self.assertCountEqual(_runner_settings(runner), settings)

    def test_rejax_command_carries_the_settings(self):
        settings, _, _ = train_throughput.shared_settings(
            train_throughput.TASKS['pendulum_native'], 150_000)
        python, runner, *flags = train_throughput.rejax_command(
            '/peers/python', settings, '/logs/run', 2)
        self.assertEqual(python, '/peers/python')
        self.assertEqual(runner, os.path.join(train_throughput.HERE, 'rejax_runner.py'))
        config = json.loads(flags[0].removeprefix('--config='))
        self.assertEqual(config, settings)
        # pendulum_native.gin's settings, as the issue compares them.
        self.assertEqual((config['num_envs'], config['rollout_length'], config['num_epochs'],
                          config['num_minibatches'], config['total_steps']),
                         (16, 128, 10, 8, 150_000))
        self.assertEqual(flags[1:], ['--logdir=/logs/run', '--seed=2'])

    @peers_testing.needs_peers('rejax')
    def test_rejax_builds_the_algorithm_as_translated(self):
        # Builds (never trains) rejax's PPO under the peers' python.
        script = textwrap.dedent('''
            import json, sys
            sys.path.insert(0, sys.argv[1])
            import rejax_runner
            settings = json.loads(sys.argv[2])
            algo, total = rejax_runner.make_algo(settings)
            rate = algo.learning_rate
            print(json.dumps({
                'total': total, 'num_envs': algo.num_envs, 'num_steps': algo.num_steps,
                'num_epochs': algo.num_epochs, 'num_minibatches': algo.num_minibatches,
                'gamma': algo.gamma, 'gae_lambda': algo.gae_lambda, 'clip_eps': algo.clip_eps,
                'vf_coef': algo.vf_coef, 'ent_coef': algo.ent_coef,
                'max_grad_norm': algo.max_grad_norm,
                'normalize_observations': algo.normalize_observations,
                'normalize_rewards': algo.normalize_rewards,
                'hidden': list(algo.actor.hidden_layer_sizes),
                'critic_hidden': list(algo.critic.hidden_layer_sizes),
                'activation': algo.actor.activation.__name__,
                'rates': [float(rate(count)) for count in (0, 79, 80, 74 * 80 - 1)],
                'max_steps': int(algo.env_params.max_steps_in_episode)}))
        ''')
        found, _, _ = train_throughput.shared_settings(
            train_throughput.TASKS['pendulum_native'], 150_000)
        output = subprocess.run(
            [peers_testing.PEERS_PYTHON, '-c', script, train_throughput.HERE, json.dumps(found)],
            capture_output=True, text=True, check=True,
            env={k: v for k, v in os.environ.items() if k != 'PYTHONPATH'}).stdout
        built = json.loads(output.strip().splitlines()[-1])
        # 150k steps are 74 iterations of 16 x 128, each of 10 epochs x 8 minibatches.
        self.assertEqual(built['total'], 74 * 2048)
        self.assertEqual((built['num_envs'], built['num_steps'], built['num_epochs'],
                          built['num_minibatches']), (16, 128, 10, 8))
        self.assertEqual((built['gamma'], built['gae_lambda'], built['clip_eps'],
                          built['vf_coef'], built['ent_coef'], built['max_grad_norm']),
                         (found['discount'], found['gae_lambda'], found['clip_ratio'],
                          found['value_coef'], found['entropy_coef'], found['max_grad_norm']))
        self.assertTrue(built['normalize_observations'] and built['normalize_rewards'])
        self.assertEqual(built['hidden'], [64, 64])
        self.assertEqual(built['critic_hidden'], [64, 64])
        self.assertEqual(built['activation'], 'tanh')
        rate = found['learning_rate']
        for got, want in zip(built['rates'], (rate, rate, rate * 73 / 74, rate / 74),
                             strict=True):
            self.assertAlmostEqual(got, want)
        self.assertEqual(built['max_steps'], 200)

    def test_rejax_runs_on_native_tasks_only(self):
        self.assertEqual(train_throughput.task_systems('pendulum_native', ['ours', 'rejax']),
                         ['ours', 'rejax'])
        self.assertEqual(train_throughput.task_systems('pendulum_native4096',
                                                       ['sb3', 'ours', 'rejax']),
                         ['ours', 'rejax'])
        self.assertEqual(train_throughput.task_systems('pendulum', ['ours', 'sb3', 'rejax']),
                         ['ours', 'sb3'])


class RunMonitoredTest(absltest.TestCase):

    def run_fake(self, megabytes, code=0):
        logdir = os.path.join(self.create_tempdir().full_path, 'run')
        command = [sys.executable, '-c', FAKE_RUN, logdir, str(megabytes), str(code)]
        return logdir, train_throughput.run_monitored(command, logdir, dict(os.environ), 0.05)

    def test_sums_memory_of_the_process_tree_and_stamps_evaluations(self):
        logdir, run = self.run_fake(100)
        # Both processes hold 100 MB, for longer than several polls.
        self.assertGreater(run['peak_rss_mb'], 200)
        self.assertGreater(run['peak_pss_mb'], 200)
        self.assertGreater(run['cpu_s'], 0)
        self.assertEqual([record['step'] for record in run['evals']], [100, 200])
        first, second = (record['seen_s'] for record in run['evals'])
        self.assertLess(0, first)
        self.assertLessEqual(first, second)
        self.assertLessEqual(second, run['wall_s'])
        with open(logdir + '.log') as f:
            self.assertIn('done', f.read())

    def test_failure_raises_with_the_output(self):
        with self.assertRaisesRegex(RuntimeError, r'failed \(3\)(.|\n)*failing'):
            self.run_fake(1, code=3)

    def test_refuses_an_existing_logdir(self):
        logdir = self.create_tempdir().full_path
        with self.assertRaisesRegex(FileExistsError, 'exists'):
            train_throughput.run_monitored(['true'], logdir, {}, 0.05)


def _evals(*records):
    """Evaluation records (step, env_steps_per_sec, seen_s, mean_return); the run's own
    wall_time_s is one second less than seen_s (imports and setup)."""
    return [dict(zip(('step', 'env_steps_per_sec', 'seen_s', 'mean_return'), record,
                     strict=True), wall_time_s=record[2] - 1.0) for record in records]


class SummaryTest(absltest.TestCase):

    def test_summarize_run(self):
        # 1000 steps trained in 2 s (compile), then 3000 more in 1 s.
        run = {'wall_s': 10.0, 'evals': _evals(
            (1000, 500.0, 4.0, -900.0), (2500, 2500 / 2.5, 5.0, -190.0),
            (4000, 4000 / 3.0, 6.0, -150.0))}
        train_throughput.summarize_run(run, threshold=-200.0)
        self.assertEqual(run['steps'], 4000)
        self.assertAlmostEqual(run['overall_sps'], 400.0)
        self.assertAlmostEqual(run['steady_sps'], 3000.0)
        self.assertAlmostEqual(run['steady_wall_sps'], 1500.0)
        self.assertEqual(run['threshold_step'], 2500)
        self.assertEqual(run['to_threshold_s'], 5.0)
        self.assertEqual(run['train_to_threshold_s'], 4.0)
        self.assertEqual(run['final_return'], -150.0)

    def test_summarize_run_without_threshold_or_second_evaluation(self):
        run = train_throughput.summarize_run(
            {'wall_s': 2.0, 'evals': _evals((1000, 500.0, 1.5, -900.0))}, threshold=-200.0)
        self.assertIsNone(run['steady_sps'])
        self.assertIsNone(run['to_threshold_s'])
        with self.assertRaisesRegex(RuntimeError, 'no evaluation'):
            train_throughput.summarize_run({'wall_s': 1.0, 'evals': []}, None)

    def test_summarize_rejax_run(self):
        # rejax_runner.py's one line: 8192 steps in a 2 s compiled call after 6 s of compiling.
        record = {'step': 8192, 'mean_return': -180.0, 'std_return': 20.0, 'episodes': 10,
                  'mean_length': 200.0, 'env_steps_per_sec': 4096.0, 'wall_time_s': 8.0,
                  'compile_s': 6.0, 'train_s': 2.0, 'seen_s': 11.0}
        run = train_throughput.summarize_run({'wall_s': 12.0, 'evals': [record]}, -200.0)
        self.assertAlmostEqual(run['steady_sps'], 4096.0)
        self.assertAlmostEqual(run['train_clock_sps'], 1024.0)
        self.assertAlmostEqual(run['overall_sps'], 8192 / 12.0)
        self.assertEqual(run['compile_s'], 6.0)
        self.assertIsNone(run['steady_wall_sps'])
        self.assertEqual(run['final_return'], -180.0)
        self.assertEqual(run['to_threshold_s'], 11.0)

    def test_ours_against_rejax(self):
        def run(system, seed, sps):
            return {'task': 'pendulum_native', 'system': system, 'seed': seed,
                    'to_threshold_s': None, 'train_to_threshold_s': None,
                    **{key: sps for key in train_throughput.SUMMARY_KEYS
                       if key not in ('to_threshold_s', 'train_to_threshold_s')}}

        runs = [run('ours', 0, 100.0), run('rejax', 0, 50.0), run('ours', 1, 300.0),
                run('rejax', 1, 100.0), run('ours', 2, 200.0), run('rejax', 2, 400.0)]
        summary = train_throughput.summarize(runs, ['pendulum_native'], ['ours', 'rejax'])
        self.assertEqual(summary['pendulum_native']['rejax']['steady_sps'], 100.0)
        self.assertEqual(summary['pendulum_native']['ours/rejax']['steady_sps'], 2.0)
        self.assertEqual(summary['pendulum_native']['ours/rejax']['train_clock_sps'], 2.0)
        self.assertEqual(summary['pendulum_native']['ours/rejax']['wall_s'], 2.0)
        table = train_throughput.format_table(summary, ['pendulum_native'])
        self.assertIn('ours/rejax', table)
        self.assertIn('w/ compile/s', table)

    def test_medians_count_unreached_seeds_as_slowest(self):
        def run(system, to_threshold, sps):
            return {'task': 'pendulum', 'system': system, 'to_threshold_s': to_threshold,
                    **{key: sps for key in train_throughput.SUMMARY_KEYS
                       if key != 'to_threshold_s'}}

        runs = [run('ours', 10.0, 300.0), run('ours', 30.0, 100.0), run('ours', None, 200.0),
                run('sb3', None, 50.0), run('sb3', None, 50.0), run('sb3', 40.0, 50.0)]
        summary = train_throughput.summarize(runs, ['pendulum'], ['ours', 'sb3'])
        self.assertEqual(summary['pendulum']['ours']['to_threshold_s'], 30.0)
        self.assertEqual(summary['pendulum']['ours']['reached'], 2)
        self.assertIsNone(summary['pendulum']['sb3']['to_threshold_s'])
        self.assertEqual(summary['pendulum']['ratio']['overall_sps'], 4.0)
        self.assertIsNone(summary['pendulum']['ratio']['to_threshold_s'])
        table = train_throughput.format_table(summary, ['pendulum'], [1.0, 2.5])
        self.assertIn('ours/SB3', table)
        self.assertIn('30.0 (2/3)', table)
        self.assertIn('1.0 to 2.5', table)

    def test_native_tasks_run_without_sb3_against_their_baseline(self):
        def run(task, system, sps, to_threshold):
            return {'task': task, 'system': system, 'to_threshold_s': to_threshold,
                    'train_to_threshold_s': to_threshold - 2.0,
                    **{key: sps for key in train_throughput.SUMMARY_KEYS
                       if key not in ('to_threshold_s', 'train_to_threshold_s')}}

        tasks = ['pendulum', 'pendulum_native256']
        self.assertEqual(train_throughput.task_systems('pendulum_native256', ['ours', 'sb3']),
                         ['ours'])
        runs = [run('pendulum', 'ours', 200.0, 12.0), run('pendulum', 'sb3', 100.0, 22.0),
                run('pendulum_native256', 'ours', 1000.0, 7.0)]
        summary = train_throughput.summarize(runs, tasks, ['ours', 'sb3'])
        self.assertNotIn('sb3', summary['pendulum_native256'])
        self.assertEqual(summary['pendulum_native256']['native/SB3']['overall_sps'], 10.0)
        self.assertEqual(summary['pendulum_native256']['native/gym']['overall_sps'], 5.0)
        self.assertEqual(summary['pendulum_native256']['native/SB3']['train_to_threshold_s'],
                         0.25)
        table = train_throughput.format_table(summary, tasks)
        self.assertIn('native/SB3', table)
        self.assertIn('native/gym', table)

    def test_a_baseline_tree_runs_beside_ours_with_paired_ratios(self):
        def run(system, seed, sps):
            return {'task': 'pendulum_native', 'system': system, 'seed': seed,
                    'to_threshold_s': None, 'train_to_threshold_s': None,
                    **{key: sps for key in train_throughput.SUMMARY_KEYS
                       if key not in ('to_threshold_s', 'train_to_threshold_s')}}

        self.assertEqual(train_throughput.task_systems(
            'pendulum_native', ['ours', 'baseline', 'sb3']), ['ours', 'baseline'])
        runs = [run('ours', 0, 100.0), run('baseline', 0, 80.0), run('ours', 1, 90.0),
                run('baseline', 1, 100.0), run('ours', 2, 110.0), run('baseline', 2, 100.0)]
        summary = train_throughput.summarize(runs, ['pendulum_native'], ['ours', 'baseline'])
        self.assertEqual(summary['pendulum_native']['ours/baseline']['steady_sps'], 1.0)
        self.assertIn('ours/baseline', train_throughput.format_table(summary,
                                                                     ['pendulum_native']))
        self.assertIn('pendulum_native: overall_sps 1.250, 0.900, 1.100',
                      train_throughput.paired_ratios(runs, ['pendulum_native']))
        command = train_throughput.ours_command(
            [os.path.join(run_config.PACKAGE_ROOT, 'configs', 'pendulum.gin')], ['a = 1'],
            '/logs', 3, tree='/elsewhere')
        self.assertIn('--gin_file=/elsewhere/configs/pendulum.gin', command)
        self.assertIn('--gin_bindings=a = 1', command)

    def test_parse_budgets(self):
        self.assertEqual(train_throughput.parse_budgets(['pendulum=5000'], ['pendulum']),
                         {'pendulum': 5000})
        self.assertEqual(train_throughput.parse_budgets([], ['pendulum', 'cheetah']),
                         {'pendulum': 100_000, 'cheetah': 50_000})
        # Another benchmark's tasks: the overrides alone.
        self.assertEqual(train_throughput.parse_budgets(['cartpole=2000'], known={'cartpole': 0}),
                         {'cartpole': 2000})
        for entry in ('pendulum', 'pendulum=0', 'pendulum=x', 'nosuchtask=5'):
            with self.subTest(entry=entry), self.assertRaisesRegex(Exception, 'task=steps'):
                train_throughput.parse_budgets([entry], ['pendulum'])


class LearningFlagsTest(absltest.TestCase):
    """check_learning_flags, which a2c_learning and sac_learning run on these flags."""

    TASKS = {'cartpole': None, 'pendulum': None}
    SYSTEMS = ('ours', 'sb3')

    def check(self, argv=('learning',), **kwargs):
        return train_throughput.check_learning_flags(list(argv), self.TASKS, self.SYSTEMS,
                                                     **kwargs)

    @flagsaver.flagsaver(tasks=['pendulum', 'cartpole'], systems=['sb3', 'ours'], seeds=2)
    def test_returns_the_systems(self):
        self.assertEqual(self.check(), ['sb3', 'ours'])

    def test_refusals_name_the_flag(self):
        cases = [
            ({}, {'argv': ('learning', 'extra')}, 'Unexpected arguments: extra'),
            ({'tasks': ['pendulum', 'cheetah']}, {}, r"Unknown tasks \['cheetah'\]; known: "
             r"\['cartpole', 'pendulum'\]"),
            ({'tasks': ['pendulum', 'cartpole']}, {'one_task': True},
             r"--tasks: one of cartpole, pendulum, got \['pendulum', 'cartpole'\]"),
            ({'systems': ['ours', 'rejax']}, {}, r"Unknown systems \['rejax'\]; known: ours, sb3"),
            ({'baseline_tree': '/tmp/main'}, {}, '--baseline_tree: not supported'),
            ({'budget': ['pendulum=5000']}, {'budget_instead': '--total_steps'},
             '--budget: use --total_steps'),
            ({'seeds': 0}, {}, '--seeds must be positive'),
        ]
        for values, kwargs, message in cases:
            with self.subTest(message=message), flagsaver.flagsaver(
                    **{'tasks': ['pendulum'], **values}), self.assertRaisesRegex(
                    app.UsageError, message):
                self.check(**kwargs)
        # --budget is allowed where no other flag replaces it.
        with flagsaver.flagsaver(tasks=['pendulum'], budget=['pendulum=5000']):
            self.assertEqual(self.check(), list(train_throughput.FLAGS.systems))


if __name__ == '__main__':
    absltest.main()
