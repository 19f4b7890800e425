"""Tests of the A2C learning benchmark: its settings table, their translation into SB3's A2C
arguments, and the curves and thresholds it reports. No training runs here.
"""

import json
import math
import os
import re
import subprocess
import textwrap

from absl.testing import absltest

from agents.runs import run_config
from benchmarks import a2c_learning, peer_runner, peers_testing, sb3_a2c_runner, train_throughput

# The settings key of each gin parameter the configs may bind; IGNORED are bindings that do not
# concern SB3 (how BatchPPO steps its environments, which algorithm and value network it names:
# the reader checks those). A binding in neither fails the test: the reader must carry it.
GIN_KEYS = {
    'train.env_id': 'env_id', 'train.env_kwargs': 'env_kwargs', 'train.wrappers': 'wrappers',
    'train.total_steps': 'total_steps', 'train.num_envs': 'num_envs',
    'train.rollout_length': 'rollout_length', 'train.eval_every_steps': 'eval_every_steps',
    'train.eval_episodes': 'eval_episodes',
    'train.anneal_learning_rate': 'anneal_learning_rate',
    **{f'A2C.{key}': key for key in (
        'discount', 'gae_lambda', 'learning_rate', 'optimizer', 'rmsprop_alpha',
        'optimizer_epsilon', 'max_grad_norm', 'value_coef', 'entropy_coef',
        'normalize_advantages', 'normalize_observ', 'observ_clip', 'scale_reward',
        'reward_clip', 'policy_network')},
    'FeedForwardGaussianPolicy.hidden_sizes': 'policy_hidden_sizes',
    'FeedForwardCategoricalPolicy.hidden_sizes': 'policy_hidden_sizes',
    'FeedForwardGaussianPolicy.activation': 'activation',
    'FeedForwardCategoricalPolicy.activation': 'activation',
    'FeedForwardGaussianPolicy.init_std': 'init_std',
    'FeedForwardValue.hidden_sizes': 'value_hidden_sizes',
}
IGNORED = {'train.algorithm', 'train.env_mode', 'train.env_backend', 'A2C.value_network'}


def settings(task, budget=None, bindings=()):
    return a2c_learning.a2c_settings(a2c_learning.TASKS[task], budget, bindings)[0]


class SettingsTest(absltest.TestCase):

    def test_values_match_the_gin_files(self):
        for task in a2c_learning.TASKS:
            with self.subTest(task=task):
                path = run_config.find_gin_file(a2c_learning.TASKS[task].gin_file)
                found = settings(task)
                bound = peers_testing.gin_file_bindings(path)
                self.assertGreater(len(bound), 10)
                for name, value in bound.items():
                    if name in IGNORED:
                        continue
                    self.assertIn(name, GIN_KEYS, f'{path} binds {name}, which the settings '
                                  'table does not carry')
                    expected = list(value) if isinstance(value, list | tuple) else value
                    self.assertEqual(found[GIN_KEYS[name]], expected, name)
                json.dumps(found)  # The SB3 runner gets it as JSON.

    def test_the_tasks_and_the_defaults_of_unbound_parameters(self):
        cartpole, pendulum = settings('cartpole'), settings('pendulum')
        self.assertEqual(cartpole['env_id'], 'CartPole-v1')
        self.assertEqual(cartpole['policy_network'], 'FeedForwardCategoricalPolicy')
        self.assertIsNone(cartpole['init_std'])
        self.assertEqual(cartpole['wrappers'], [])
        self.assertEqual(pendulum['env_id'], 'Pendulum-v1')
        self.assertEqual(pendulum['policy_network'], 'FeedForwardGaussianPolicy')
        self.assertEqual(pendulum['wrappers'], ['range_normalize', 'ClipAction'])
        # Bound by neither config: A2C's signature.
        self.assertEqual(cartpole['rmsprop_alpha'], 0.99)
        self.assertEqual(cartpole['optimizer_epsilon'], 1e-5)
        self.assertEqual(cartpole['activation'], 'tanh')
        self.assertEqual(a2c_learning.TASKS['cartpole'].threshold, 500.0)
        self.assertEqual(a2c_learning.TASKS['pendulum'].threshold, -200.0)

    def test_budget_and_bindings_override_the_config(self):
        found = settings('pendulum', 2000, ['A2C.rmsprop_alpha = 0.95',
                                            'train.eval_every_steps = 1000'])
        self.assertEqual(found['total_steps'], 2000)
        self.assertEqual(found['rmsprop_alpha'], 0.95)
        self.assertEqual(found['eval_every_steps'], 1000)
        _, _, bindings = a2c_learning.a2c_settings(
            a2c_learning.TASKS['cartpole'], 3000, ['A2C.entropy_coef = 0.01'])
        self.assertEqual(bindings, ['A2C.entropy_coef = 0.01', 'train.total_steps = 3000'])

    def test_refuses_settings_sb3_cannot_express(self):
        cases = {
            'A2C.policy_network': 'A2C.policy_network = @RecurrentGaussianPolicy',
            'output_gain': 'FeedForwardGaussianPolicy.output_gain = 1.0',
            'activation': 'FeedForwardValue.activation = "relu"',
            'train.wrappers': "train.wrappers = ['ClipAction']",
            'FeedForwardGaussianPolicy.activation': (
                'FeedForwardGaussianPolicy.activation = "elu"',
                'FeedForwardValue.activation = "elu"'),
            'optimizer': "A2C.optimizer = 'adam'",  # Accepted: no error expected.
        }
        for name, binding in cases.items():
            with self.subTest(name=name):
                if name == 'optimizer':
                    self.assertEqual(settings('pendulum', bindings=[binding])['optimizer'],
                                     'adam')
                    continue
                bindings = [binding] if isinstance(binding, str) else list(binding)
                with self.assertRaisesRegex(run_config.ConfigError, f'^{re.escape(name)}'
                                            if '.' in name else name):
                    settings('pendulum', bindings=bindings)

    def test_parse_budgets(self):
        def parse(entries):
            return train_throughput.parse_budgets(entries, known=a2c_learning.TASKS)

        self.assertEqual(parse(['cartpole=2000']), {'cartpole': 2000})
        for entry in ('cartpole', 'cartpole=0', 'cartpole=x', 'nosuchtask=5',
                      'pendulum_native=5'):
            with self.subTest(entry=entry), self.assertRaisesRegex(Exception, 'task=steps'):
                parse([entry])


class Sb3KwargsTest(absltest.TestCase):

    def test_cartpole(self):
        found = settings('cartpole')
        kwargs = sb3_a2c_runner.sb3_a2c_kwargs(found)
        self.assertEqual(kwargs['learning_rate'], found['learning_rate'])
        self.assertEqual(kwargs['n_steps'], found['rollout_length'])
        self.assertEqual(kwargs['gamma'], found['discount'])
        self.assertEqual(kwargs['gae_lambda'], found['gae_lambda'])
        self.assertEqual(kwargs['vf_coef'], found['value_coef'])  # No factor 0.5 in A2C.
        self.assertEqual(kwargs['ent_coef'], found['entropy_coef'])
        self.assertEqual(kwargs['max_grad_norm'], found['max_grad_norm'])
        self.assertEqual(kwargs['normalize_advantage'], found['normalize_advantages'])
        self.assertTrue(kwargs['use_rms_prop'])
        self.assertEqual(kwargs['rms_prop_eps'], found['optimizer_epsilon'])
        policy = kwargs['policy_kwargs']
        self.assertEqual(policy['optimizer_class'], 'rmsprop')
        self.assertEqual(policy['optimizer_kwargs'], {
            'alpha': found['rmsprop_alpha'], 'eps': found['optimizer_epsilon'],
            'weight_decay': 0})
        self.assertEqual(policy['net_arch'], {'pi': found['policy_hidden_sizes'],
                                              'vf': found['value_hidden_sizes']})
        self.assertEqual(policy['activation_fn'], 'tanh')
        self.assertTrue(policy['ortho_init'])
        self.assertNotIn('log_std_init', policy)  # Categorical.
        self.assertEqual(sb3_a2c_runner.vec_normalize_kwargs(found), {
            'norm_obs': found['normalize_observ'], 'norm_reward': found['scale_reward'],
            'clip_obs': found['observ_clip'], 'clip_reward': found['reward_clip'],
            'gamma': found['discount'], 'epsilon': 1e-8})

    def test_pendulum_anneals_as_batchppo(self):
        found = settings('pendulum', 6400)  # 100 updates of 8 x 8 steps.
        kwargs = sb3_a2c_runner.sb3_a2c_kwargs(found)
        self.assertAlmostEqual(kwargs['policy_kwargs']['log_std_init'],
                               math.log(found['init_std']))
        self.assertEqual(sb3_a2c_runner.iterations(found), (100, 6400))
        rate, schedule = found['learning_rate'], kwargs['learning_rate']
        # SB3's progress_remaining at update k (0-based) of n is 1 - (k + 1) / n; BatchPPO's
        # rate then is rate * (1 - k / n).
        for k in (0, 1, 50, 99):
            self.assertAlmostEqual(schedule(1.0 - (k + 1) / 100), rate * (1 - k / 100))
        self.assertAlmostEqual(schedule(1.0), rate)  # The optimizer's initial rate.

    def test_adam_and_no_clipping(self):
        found = dict(settings('pendulum'), optimizer='adam', max_grad_norm=None,
                     observ_clip=None, reward_clip=None)
        kwargs = sb3_a2c_runner.sb3_a2c_kwargs(found)
        self.assertFalse(kwargs['use_rms_prop'])
        self.assertEqual(kwargs['policy_kwargs']['optimizer_class'], 'adam')
        self.assertEqual(kwargs['policy_kwargs']['optimizer_kwargs'],
                         {'eps': found['optimizer_epsilon']})
        self.assertEqual(kwargs['max_grad_norm'], math.inf)
        vec = sb3_a2c_runner.vec_normalize_kwargs(found)
        self.assertEqual((vec['clip_obs'], vec['clip_reward']), (math.inf, math.inf))

    def test_refuses_what_sb3_cannot_express(self):
        base = settings('pendulum')
        cases = {'activation': {'activation': 'elu'}, 'optimizer': {'optimizer': 'sgd'},
                 'wrappers': {'wrappers': ['ClipAction']},
                 'policy_network': {'policy_network': 'RecurrentGaussianPolicy'},
                 'unknown keys': {'clip_ratio': 0.2}}
        for name, change in cases.items():
            with self.subTest(name=name), self.assertRaisesRegex(
                    peer_runner.UnsupportedSetting, name):
                sb3_a2c_runner.sb3_a2c_kwargs(dict(base, **change))
        with self.assertRaisesRegex(peer_runner.UnsupportedSetting, 'missing keys'):
            sb3_a2c_runner.sb3_a2c_kwargs({key: base[key] for key in list(base)[1:]})

    @peers_testing.needs_peers('SB3')
    def test_sb3_builds_the_model_as_translated(self):
        # Builds (never trains) SB3's A2C and its evaluator under the peers' python.
        script = textwrap.dedent('''
            import json, sys
            sys.path.insert(0, sys.argv[1])
            import sb3_a2c_runner as runner
            import sb3_runner
            settings = json.loads(sys.argv[2])
            model, venv, total = runner.make_model(settings, 0)
            evaluator = sb3_runner.Evaluator(settings, venv, sys.argv[3], 0)
            optimizer = model.policy.optimizer
            print(json.dumps({
                'optimizer': type(optimizer).__name__,
                'alpha': optimizer.defaults.get('alpha'), 'eps': optimizer.defaults['eps'],
                'lr': optimizer.defaults['lr'], 'n_steps': model.n_steps, 'n_envs': model.n_envs,
                'vf_coef': model.vf_coef, 'activation': model.policy.activation_fn.__name__,
                'log_std': model.policy.log_std.tolist() if hasattr(model.policy, 'log_std')
                           else None,
                'norm_obs': venv.norm_obs, 'norm_reward': venv.norm_reward, 'total': total,
                'eval_observ_high': evaluator._envs[0].observation_space.high.tolist()}))
        ''')
        logdir = self.create_tempdir().full_path
        for task in ('cartpole', 'pendulum'):
            with self.subTest(task=task):
                found = settings(task, 2000)
                output = subprocess.run(
                    [peers_testing.PEERS_PYTHON, '-c', script, train_throughput.HERE,
                     json.dumps(found), logdir], capture_output=True, text=True, check=True,
                    env={k: v for k, v in os.environ.items() if k != 'PYTHONPATH'}).stdout
                built = json.loads(output.strip().splitlines()[-1])
                self.assertEqual(built['optimizer'], 'RMSprop')
                self.assertEqual(built['alpha'], found['rmsprop_alpha'])
                self.assertEqual(built['eps'], found['optimizer_epsilon'])
                self.assertAlmostEqual(built['lr'], found['learning_rate'])
                self.assertEqual(built['n_steps'], found['rollout_length'])
                self.assertEqual(built['n_envs'], found['num_envs'])
                self.assertEqual(built['vf_coef'], found['value_coef'])
                self.assertEqual(built['activation'], 'Tanh')
                self.assertEqual(built['norm_obs'], found['normalize_observ'])
                self.assertEqual(built['norm_reward'], found['scale_reward'])
                self.assertEqual(built['total'], sb3_a2c_runner.iterations(found)[1])
                if task == 'pendulum':
                    self.assertAlmostEqual(built['log_std'][0], math.log(found['init_std']),
                                           places=6)
                    self.assertEqual(built['eval_observ_high'], [1.0, 1.0, 1.0])
                else:
                    self.assertIsNone(built['log_std'])
                    # No wrappers: CartPole's own bounds (position 4.8), not rescaled.
                    self.assertAlmostEqual(built['eval_observ_high'][0], 4.8, places=5)


def _run(task, system, seed, returns, every=1000, offset=0, wall_s=10.0):
    """A run as summarize_run leaves it, from evaluations at every, 2 * every, ... (+ offset
    per evaluation: SB3's drift)."""
    evals = [{'step': (index + 1) * (every + offset), 'mean_return': value,
              'env_steps_per_sec': 1000.0, 'seen_s': index + 1.0, 'wall_time_s': index + 0.5}
             for index, value in enumerate(returns)]
    run = train_throughput.summarize_run({'wall_s': wall_s, 'evals': evals, 'load_before': 1.0},
                                         a2c_learning.TASKS[task].threshold)
    run.update(task=task, system=system, seed=seed)
    return run


class SummaryTest(absltest.TestCase):

    def setUp(self):
        super().setUp()
        self.settings = {'cartpole': {'env_id': 'CartPole-v1', 'eval_every_steps': 1000,
                                      'total_steps': 4000},
                         'pendulum': {'env_id': 'Pendulum-v1', 'eval_every_steps': 1000,
                                      'total_steps': 4000}}

    def test_curves_take_the_median_and_band_and_align_drifting_evaluations(self):
        runs = [_run('pendulum', 'ours', 0, [-900, -500, -180, -150]),
                _run('pendulum', 'ours', 1, [-1000, -700, -400, -190]),
                _run('pendulum', 'ours', 2, [-800, -600, -300, -250]),
                # SB3 evaluates 24 steps later each time; one seed only.
                _run('pendulum', 'sb3', 0, [-1100, -900, -700, -500], offset=24)]
        curve = train_throughput.curves(runs, ['ours', 'sb3'], 1000)
        self.assertEqual(curve['steps'], [1000, 2000, 3000, 4000])
        self.assertEqual(curve['ours']['median'], [-900, -600, -300, -190])
        self.assertEqual(curve['ours']['min'], [-1000, -700, -400, -250])
        self.assertEqual(curve['ours']['max'], [-800, -500, -180, -150])
        self.assertEqual(curve['sb3']['median'], [-1100, -900, -700, -500])
        # An evaluation farther than half an interval away fills nothing.
        self.assertEqual(train_throughput.curves(runs[3:], ['sb3'], 1000)['steps'],
                         [1024, 2048, 3072, 4096])
        self.assertEqual(train_throughput.curves(runs, ['ours', 'sb3'], 40)['sb3']['median'],
                         [None] * 4)

    def test_thresholds_and_the_cartpole_claim(self):
        runs = [_run('cartpole', 'ours', 0, [100, 500, 500, 500]),
                _run('cartpole', 'sb3', 0, [50, 200, 500, 480]),
                _run('cartpole', 'ours', 1, [100, 300, 480, 500]),
                _run('cartpole', 'sb3', 1, [50, 100, 200, 300]),
                _run('cartpole', 'ours', 2, [200, 500, 500, 500]),
                _run('cartpole', 'sb3', 2, [60, 100, 150, 300])]
        summary = a2c_learning.summarize(runs, ['cartpole'], ['ours', 'sb3'], self.settings)
        ours, sb3 = summary['cartpole']['ours'], summary['cartpole']['sb3']
        self.assertEqual(ours['threshold_steps'], [2000, 4000, 2000])
        self.assertEqual(ours['median_threshold_step'], 2000)
        self.assertEqual(ours['reached'], 3)
        self.assertEqual(ours['final_return'], 500)
        self.assertEqual(sb3['threshold_steps'], [3000, None, None])
        self.assertIsNone(sb3['median_threshold_step'])  # Unreached counts as slowest.
        self.assertEqual(summary['cartpole']['claim'], {
            'steps': 250_000, 'within': 3, 'seeds': 3, 'holds': True, 'budget': 4000})
        report = a2c_learning.format_report(summary, ['cartpole'], ['ours', 'sb3'],
                                            self.settings)
        self.assertIn('step |  ours |   sb3', report)
        self.assertIn('2,000 | 500.0 | 100.0', report)
        self.assertIn('ours: steps to 500 per seed 2,000, 4,000, 2,000; median 2,000 (3/3 '
                      'reached)', report)
        self.assertIn('sb3: steps to 500 per seed 3,000, -, -; median - (1/3 reached)', report)
        self.assertIn('every seed of ours reached 500 within 250,000 steps: yes (3/3); the '
                      'budget was 4,000 steps: not a test of the claim', report)
        self.assertIn('cartpole ours seed 0: final return 500.0 at step 4,000, first reached '
                      '500 at step 2,000, wall 10.0 s', a2c_learning.format_run(runs[0]))

    def test_a_seed_short_of_the_threshold_fails_the_claim(self):
        runs = [_run('cartpole', 'ours', 0, [100, 500]), _run('cartpole', 'ours', 1, [100, 490])]
        settings = {'cartpole': dict(self.settings['cartpole'], total_steps=250_000)}
        summary = a2c_learning.summarize(runs, ['cartpole'], ['ours', 'sb3'], settings)
        self.assertFalse(summary['cartpole']['claim']['holds'])
        self.assertNotIn('sb3', summary['cartpole'])
        report = a2c_learning.format_report(summary, ['cartpole'], ['ours', 'sb3'], settings)
        self.assertIn('within 250,000 steps: no (1/2)\n', report)

    def test_plot(self):
        runs = [_run('pendulum', system, seed, [-900 + 100 * seed, -300])
                for seed in range(2) for system in ('ours', 'sb3')]
        summary = a2c_learning.summarize(runs, ['pendulum'], ['ours', 'sb3'], self.settings)
        path = os.path.join(self.create_tempdir().full_path, 'curves.png')
        a2c_learning.plot(summary, ['pendulum'], ['ours', 'sb3'], path)
        with open(path, 'rb') as f:
            self.assertEqual(f.read(8), b'\x89PNG\r\n\x1a\n')


if __name__ == '__main__':
    absltest.main()
