"""Tests the run loop's populations (`train.population`): each member an ordinary run of its
seed, alike to the lone run of that seed; resume; faults named by member."""

import functools
import glob
import os
import tempfile

import gin
import numpy as np
import tensorflow as tf
from absl.testing import absltest

from agents.algorithms import off_policy_testing, registry  # noqa: F401 (registers them)
from agents.runs import faults, loop, metrics, restore, run_config, run_dir

CONFIG = """
train.algorithm = @PPO
train.env_id = 'Pendulum-v1'
train.env_backend = 'native'

PPO.discount = 0.9
PPO.learning_rate = 1e-3
PPO.num_epochs = 4
PPO.num_minibatches = 4
PPO.jit_compile = False
"""
# 128 steps per iteration and member: evaluations at 256, 512 and 640 (the end); stopped at
# STOP, a run stops at STOPPED_AT. The update in graph mode: compiling it with XLA costs each
# run seconds, and these tests are not about XLA.
SETTINGS = dict(num_envs=4, rollout_length=32, eval_every_steps=250, eval_episodes=2,
                jit_compile=False)
STEPS = 640
STOP = 300
STOPPED_AT = 384
SEEDS = (5, 6)
EVALUATIONS = [256, 512, 640]
RESULTS = ('step', 'mean_return', 'std_return', 'episodes', 'mean_length')


def _dir(name):
    return os.path.join(tempfile.mkdtemp(prefix=f'{name}-', dir=absltest.TEST_TMPDIR.value),
                        'run')


def _member(logdir, index):
    return os.path.join(logdir, run_dir.MEMBER_DIR.format(index))


def _records(logdir):
    return metrics.evaluations(os.path.join(logdir, run_dir.METRICS_FILE))


@functools.cache
def runs():
    """A population of SEEDS and the lone runs of the same seeds: (population logdir, [lone
    logdirs]). Read-only."""
    population = _dir('population')
    with _config():
        loop.train(population, total_steps=STEPS, population=len(SEEDS), seed=SEEDS[0],
                   **SETTINGS)
        lone = []
        for seed in SEEDS:
            lone.append(_dir(f'lone-{seed}'))
            loop.train(lone[-1], total_steps=STEPS, seed=seed, **SETTINGS)
    return population, lone


class _config:
    """Gin holds CONFIG inside the context, and again after it (as setUp leaves it)."""

    def __enter__(self):
        gin.clear_config()
        gin.parse_config(CONFIG)

    def __exit__(self, *unused):
        gin.clear_config()
        gin.parse_config(CONFIG)


class PopulationRunTest(absltest.TestCase):

    def setUp(self):
        super().setUp()
        gin.clear_config()
        gin.parse_config(CONFIG)
        self.addCleanup(gin.clear_config)

    def test_each_member_is_the_run_of_its_seed(self):
        population, lone = runs()
        # No run file at the top: tools that look for runs find the members.
        self.assertEqual(sorted(os.listdir(population)), ['member-0', 'member-1'])
        for index, seed in enumerate(SEEDS):
            member = _member(population, index)
            for name in (run_dir.CONFIG_FILE, run_dir.OPERATIVE_CONFIG_FILE):
                with open(os.path.join(member, name), encoding='utf-8') as f:
                    text = f.read()
                self.assertIn(f'train.seed = {seed}\n', text, name)
                self.assertNotIn('train.population', text, name)
            self.assertTrue(glob.glob(os.path.join(member, 'events.out.tfevents.*')))
            records = _records(member)
            alone = _records(lone[index])
            self.assertEqual([record['step'] for record in records], EVALUATIONS)
            self.assertEqual([record['step'] for record in alone], EVALUATIONS)
            # The same run up to float rounding (batched matmuls round otherwise).
            np.testing.assert_allclose([record['mean_return'] for record in records],
                                       [record['mean_return'] for record in alone],
                                       rtol=1e-3, err_msg=f'member {index}')
            for record in records:
                self.assertEqual(record['episodes'], SETTINGS['eval_episodes'])
            # The member's checkpoint and policy read as a lone run's.
            restored = restore.restore_agent(member)
            expected = restore.restore_agent(lone[index])
            self.assertEqual(restored.step, STEPS)
            for mine, theirs in zip(restored.agent.policy.trainable_variables,
                                    expected.agent.policy.trainable_variables, strict=True):
                np.testing.assert_allclose(mine.numpy(), theirs.numpy(), atol=1e-3)
            self.assertEqual(sorted(os.listdir(os.path.join(member, 'policy'))),
                             sorted(os.listdir(os.path.join(lone[index], 'policy'))))
        first, second = (_records(_member(population, index)) for index in (0, 1))
        self.assertNotEqual(first[-1]['mean_return'], second[-1]['mean_return'])

    def test_changing_one_members_learning_rate_leaves_the_others_unchanged(self):
        population, _ = runs()
        changed = _dir('changed')
        loop.train(changed, total_steps=STEPS, population=len(SEEDS), seed=SEEDS[0],
                   population_members=[{}, {'PPO.learning_rate': 3e-3}], **SETTINGS)
        # Member 0's run is the same bit for bit: evaluations, checkpoint.
        self.assertEqual([{key: record[key] for key in RESULTS}
                          for record in _records(_member(changed, 0))],
                         [{key: record[key] for key in RESULTS}
                          for record in _records(_member(population, 0))])
        mine = tf.train.load_checkpoint(os.path.join(_member(changed, 0), 'checkpoints',
                                                     f'ckpt-{STEPS}'))
        theirs = tf.train.load_checkpoint(os.path.join(_member(population, 0), 'checkpoints',
                                                       f'ckpt-{STEPS}'))
        names = [name for name in mine.get_variable_to_shape_map()
                 if name.startswith('agent/')]
        self.assertGreater(len(names), 20)
        for name in names:
            np.testing.assert_array_equal(mine.get_tensor(name), theirs.get_tensor(name), name)
        # Member 1 learned otherwise, and its configuration says why.
        self.assertNotEqual(_records(_member(changed, 1))[-1]['mean_return'],
                            _records(_member(population, 1))[-1]['mean_return'])
        with open(os.path.join(_member(changed, 1), run_dir.CONFIG_FILE),
                  encoding='utf-8') as f:
            config = f.read()
        self.assertIn('PPO.learning_rate = 0.003\n', config)
        self.assertNotIn('population', config)

    def test_a_stopped_population_resumes_from_the_step_every_member_saved(self):
        logdir = _dir('stopped')
        kwargs = dict(total_steps=STEPS, population=len(SEEDS), seed=SEEDS[0], **SETTINGS)
        last = loop.train(logdir, stop_at_step=STOP, **kwargs)
        self.assertEqual(last['step'], STOPPED_AT)
        # As if killed between the members' saves of STOPPED_AT: member-1 kept the first
        # evaluation's only.
        first = EVALUATIONS[0]
        state = os.path.join(_member(logdir, 1), 'checkpoints', 'checkpoint')
        with open(state, encoding='utf-8') as f:
            lines = f.read().splitlines()
        timestamps = [line for line in lines if line.startswith('all_model_checkpoint_time')]
        with open(state, 'w', encoding='utf-8') as f:
            f.write('\n'.join([f'model_checkpoint_path: "ckpt-{first}"',
                               f'all_model_checkpoint_paths: "ckpt-{first}"', timestamps[0]]
                              + [line for line in lines if line.startswith('last_')]) + '\n')
        for path in glob.glob(os.path.join(_member(logdir, 1), 'checkpoints',
                                           f'ckpt-{STOPPED_AT}*')):
            os.remove(path)
        with loop.training_run(logdir, **kwargs) as run:
            with self.assertLogs(level='WARNING') as logs:
                restored = run.restore()
            self.assertEqual(restored, os.path.join(_member(logdir, 0), 'checkpoints',
                                                    f'ckpt-{first}'))
            self.assertEqual(int(run.env_steps), first)
            self.assertIn(f'the population resumes from {first}', '\n'.join(logs.output))
            run.run()
        population, _ = runs()
        for index in range(len(SEEDS)):
            records = _records(_member(logdir, index))
            self.assertEqual([record['step'] for record in records], EVALUATIONS)
            # The first evaluation was logged before the stop and is the same run's.
            uninterrupted = _records(_member(population, index))[0]
            self.assertEqual({key: records[0][key] for key in RESULTS},
                             {key: uninterrupted[key] for key in RESULTS})

    def test_a_nonfinite_member_is_named(self):
        logdir = _dir('nonfinite')
        with loop.training_run(logdir, total_steps=STEPS, population=len(SEEDS), seed=SEEDS[0],
                               **dict(SETTINGS, jit_compile=True)) as run:
            # Member 1 acts NaN: under XLA the environments take it (no checks), and its
            # observations go non-finite while member 0's stay finite.
            log_std = run.agent.policy.log_std  # [members, action dimensions]
            log_std.assign(tf.tensor_scatter_nd_update(log_std, [[1]], [[np.nan]]))
            with self.assertRaisesRegex(
                    faults.NonFiniteError,
                    r'non-finite observation from the environments \[0, 1, 2, 3\] '
                    r'of member-1 in the iteration that ended at step 128; its update was '
                    r'undone and the run stopped; no checkpoint was saved'):
                run.run()
            # Member 0's update stood; member 1's was undone.
            self.assertEqual(run.agent.update_count.numpy().tolist(), [1, 0])

    def test_configuration_errors(self):
        for arguments, message in (
                (dict(env_backend='gymnasium', env_mode='in_process'),
                 "train.population > 1 needs train.env_backend = 'native'"),
                (dict(population=0), 'train.population must be a positive integer'),
        ):
            settings = dict(SETTINGS, population=2)
            settings.update(arguments)
            with self.assertRaisesRegex(run_config.ConfigError, message):
                with loop.training_run(_dir('error'), total_steps=STEPS, **settings):
                    pass
        for members, message in (
                ([{}], r'train.population_members must be a list of 2 dicts'),
                ([{}, {'PPO.value_coef': 1.0}], r'train.population_members\[1\] is .* a member '
                 r'may bind only PPO.clip_ratio, PPO.discount, PPO.entropy_coef, '
                 r'PPO.gae_lambda, PPO.learning_rate, train.seed'),
                ([{}, {'train.seed': -1}], r'train.seed must be a non-negative integer')):
            with self.assertRaisesRegex(run_config.ConfigError, message):
                with loop.training_run(_dir('error'), total_steps=STEPS, population=2,
                                       population_members=members, **SETTINGS):
                    pass
        gin.parse_config('train.algorithm = @OffPolicyTesting')
        with self.assertRaisesRegex(
                run_config.ConfigError,
                'train.population = 2: OffPolicyTesting does not train as a population; A2C, '
                'PPO do'):
            with loop.training_run(_dir('error'), total_steps=STEPS, population=2, **SETTINGS):
                pass

    def test_an_a2c_population_is_the_lone_runs_of_its_seeds(self):
        gin.parse_config('train.algorithm = @A2C\nA2C.jit_compile = False')
        settings = dict(SETTINGS, rollout_length=8, eval_every_steps=250)
        population = _dir('a2c-population')
        loop.train(population, total_steps=512, population=len(SEEDS), seed=SEEDS[0],
                   **settings)
        for index, seed in enumerate(SEEDS):
            lone = _dir(f'a2c-{seed}')
            loop.train(lone, total_steps=512, seed=seed, **settings)
            records, alone = _records(_member(population, index)), _records(lone)
            self.assertEqual([record['step'] for record in records], [256, 512])
            # The same run up to float rounding (batched matmuls round otherwise).
            np.testing.assert_allclose([record['mean_return'] for record in records],
                                       [record['mean_return'] for record in alone],
                                       rtol=1e-3, err_msg=f'member {index}')


if __name__ == '__main__':
    absltest.main()
