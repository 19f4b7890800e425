"""Tests for policy export: the SavedModel acts like the live agent, with TensorFlow alone."""

import functools
import json
import os
import shutil
import subprocess
import sys
import textwrap
import threading
from unittest import mock

import gin
import gymnasium as gym
import numpy as np
import tensorflow as tf
from absl.testing import absltest

from agents.algorithms import conv_torsos, networks, shared_torso
from agents.algorithms.ppo import ppo
from agents.runs import policy_export, run_dir
from agents.tools import gin_testing

OBSERV_SPACE = gym.spaces.Box(-np.inf, np.inf, (3,), np.float32)
BOX_ACTIONS = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
DISCRETE_ACTIONS = gym.spaces.Discrete(4)

# Loads policies and prints their actions, in a process that can import nothing of the project.
FRESH_PROCESS_SCRIPT = textwrap.dedent('''
    import json, sys
    import numpy as np
    import tensorflow as tf
    outputs = {}
    for name, directory in json.loads(sys.argv[1]).items():
        data = np.load(directory + '.inputs.npz')
        policy = tf.saved_model.load(directory)
        signature = policy.signatures['deterministic_action']
        if 'state' in data:
            state, actions = data['state'], []
            for observ, reset in zip(data['observ'], data['reset'], strict=True):
                result = signature(observ=tf.constant(observ), state=tf.constant(state),
                                   reset=tf.constant(reset))
                state = result['state'].numpy()
                actions.append(result['action'].numpy())
            outputs[name] = np.stack(actions).tolist()
        else:
            outputs[name] = signature(observ=tf.constant(data['observ']))['action'].numpy().tolist()
    project = ('agents', 'gin', 'gymnasium', 'tensorflow_probability')
    loaded = sorted(name for name in sys.modules if name.split('.')[0] in project)
    print(json.dumps({'outputs': outputs, 'loaded': loaded}))
''')


def make_agent(action_size, policy_network, seed=0):
    """An agent whose policy outputs vary on the unit scale and whose normalizer has statistics.

    A fresh policy's actions are near zero (output gain 0.01), which would make any comparison
    of actions weak; scaled-up output weights and non-trivial normalizer statistics make every
    part of the exported computation matter.
    """
    agent = ppo.PPO(observ_shape=(3,), action_size=action_size, num_envs=2,
                    policy_network=policy_network, jit_compile=True, seed=seed)
    for variable in agent.policy.trainable_variables:
        if variable.shape.rank == 3 and variable.shape[-1] == action_size:  # Output kernels.
            variable.assign(variable * 150.0)
    rng = np.random.default_rng(seed)
    agent.observ_normalizer.update(rng.normal([1.0, -2.0, 5.0], [0.5, 3.0, 10.0], (1, 500, 3)))
    return agent


def observations(count, seed=1):
    rng = np.random.default_rng(seed)
    return (rng.normal(size=(count, 3)) * [0.5, 3.0, 10.0] + [1.0, -2.0, 5.0]).astype(np.float32)


def live_actions(agent, observ, greedy=True):
    action, _, _ = agent.act(tf.constant(observ), agent.initial_state(len(observ)),
                             tf.ones([len(observ)], tf.bool), greedy=greedy)
    return action.numpy()


def recurrent_inputs(num_steps=12, batch=5, seed=2):
    rng = np.random.default_rng(seed)
    observ = np.stack([observations(batch, seed + step) for step in range(num_steps)])
    reset = rng.uniform(size=(num_steps, batch)) < 0.25
    reset[0] = True
    return observ, reset


def live_recurrent_actions(agent, observ, reset):
    state, actions = agent.initial_state(observ.shape[1]), []
    for step_observ, step_reset in zip(observ, reset, strict=True):
        action, _, state = agent.act(tf.constant(step_observ), state, tf.constant(step_reset),
                                     greedy=True)
        actions.append(action.numpy())
    return np.stack(actions)


def saved_recurrent_actions(policy, observ, reset):
    """Actions of a loaded recurrent SavedPolicy over the sequence `observ` [T, B, ...]."""
    state, actions = policy.initial_state(observ.shape[1]), []
    for step_observ, step_reset in zip(observ, reset, strict=True):
        action, state = policy(step_observ, state, step_reset)
        actions.append(action)
    return np.stack(actions)


class PolicyExportTest(absltest.TestCase):

    def setUp(self):
        super().setUp()
        self.directory = self.create_tempdir().full_path

    def export(self, agent, name, action_space, **kwargs):
        path = os.path.join(self.directory, name)
        return policy_export.export_policy(agent, path, OBSERV_SPACE, action_space, **kwargs)

    def test_fresh_process_with_only_tensorflow_reproduces_the_live_policy(self):
        gaussian = make_agent(2, networks.FeedForwardGaussianPolicy)
        categorical = make_agent(4, networks.FeedForwardCategoricalPolicy)
        recurrent = make_agent(2, networks.RecurrentGaussianPolicy)
        observ = observations(100)
        sequence, reset = recurrent_inputs()
        expected = {
            'gaussian': live_actions(gaussian, observ),
            'categorical': live_actions(categorical, observ),
            'recurrent': live_recurrent_actions(recurrent, sequence, reset),
        }
        # The actions vary (the comparison means something), categorical ones over all actions.
        self.assertGreater(expected['gaussian'].std(), 0.3)
        self.assertLen(set(expected['categorical'].tolist()), 4)
        directories = {}
        for name, agent, space in (('gaussian', gaussian, BOX_ACTIONS),
                                   ('categorical', categorical, DISCRETE_ACTIONS),
                                   ('recurrent', recurrent, BOX_ACTIONS)):
            directories[name] = self.export(agent, name, space)
        np.savez(directories['gaussian'] + '.inputs.npz', observ=observ)
        np.savez(directories['categorical'] + '.inputs.npz', observ=observ)
        np.savez(directories['recurrent'] + '.inputs.npz', observ=sequence, reset=reset,
                 state=np.zeros([sequence.shape[1], 64], np.float32))
        script = os.path.join(self.directory, 'load_policies.py')
        with open(script, 'w') as f:
            f.write(FRESH_PROCESS_SCRIPT)
        # -I: no PYTHONPATH, no user site, no script directory; the project is not importable.
        result = subprocess.run(
            [sys.executable, '-I', script, json.dumps(directories)], cwd=self.directory,
            capture_output=True, text=True, timeout=300, check=False)
        self.assertEqual(result.returncode, 0, result.stderr[-3000:])
        report = json.loads(result.stdout.strip().splitlines()[-1])
        self.assertEqual(report['loaded'], [])
        for name, actions in expected.items():
            np.testing.assert_allclose(np.array(report['outputs'][name]), actions, rtol=0,
                                       atol=1e-6, err_msg=name)

    def test_sampled_actions_follow_the_policy_distribution(self):
        agent = make_agent(2, networks.FeedForwardGaussianPolicy)
        agent.policy.log_std.assign([[np.log(0.5), np.log(2.0)]])
        policy = policy_export.SavedPolicy(self.export(agent, 'gaussian', BOX_ACTIONS),
                                           greedy=False)
        observ = np.repeat(observations(1), 20000, axis=0)
        samples, _ = policy(observ, (), None)
        mode = live_actions(agent, observ[:1])[0]
        np.testing.assert_allclose(samples.mean(0), mode, atol=4 * 2.0 / np.sqrt(20000))
        np.testing.assert_allclose(samples.std(0), [0.5, 2.0], rtol=0.03)
        again, _ = policy(observ[:10], (), None)
        self.assertFalse(np.allclose(again, samples[:10]))  # The generator advances.

        categorical = make_agent(4, networks.FeedForwardCategoricalPolicy)
        policy = policy_export.SavedPolicy(
            self.export(categorical, 'categorical', DISCRETE_ACTIONS), greedy=False)
        samples, _ = policy(observ, (), None)
        params, _ = categorical.policy.step(
            categorical.observ_normalizer.normalize(observ[:1]), ())
        probs = tf.nn.softmax(params['logits'][0]).numpy()
        frequencies = np.bincount(samples, minlength=4) / len(samples)
        np.testing.assert_allclose(frequencies, probs, atol=0.015)

    def test_policy_on_frames_takes_uint8_frames_and_acts_as_the_live_one(self):
        torso = functools.partial(conv_torsos.ImpalaCNN, channels=(4,), features=16)
        agent = ppo.PPO(observ_shape=(2, 8, 8), action_size=4, num_envs=2,
                        policy_network=functools.partial(
                            shared_torso.SharedTorsoCategoricalPolicy, torso=torso),
                        value_network=None, normalize_observ=False, jit_compile=False)
        rng = np.random.default_rng(3)
        logits = agent.policy.logits  # Heads whose argmax the frames' brightness moves.
        logits.kernel.assign(rng.normal(size=logits.kernel.shape) * 10.0)
        logits.bias.assign(rng.normal(size=logits.bias.shape) * 10.0)
        # Frames of many brightnesses, which the features (and so the actions) tell apart.
        frames = (rng.uniform(size=(200, 1, 1, 1)) * rng.integers(0, 256, (200, 2, 8, 8))
                  ).astype(np.uint8)
        expected = live_actions(agent, frames)
        self.assertGreater(len(set(expected.tolist())), 1)
        space = gym.spaces.Box(0, 255, (2, 8, 8), np.uint8)
        path = policy_export.export_policy(agent, os.path.join(self.directory, 'frames'), space,
                                           DISCRETE_ACTIONS)
        signature = tf.saved_model.load(path).signatures['deterministic_action']
        self.assertEqual(signature.structured_input_signature[1]['observ'].dtype, tf.uint8)
        np.testing.assert_array_equal(policy_export.SavedPolicy(path)(frames, (), None)[0],
                                      expected)

    def test_recurrent_policy_carries_and_resets_its_state(self):
        agent = make_agent(2, networks.RecurrentGaussianPolicy)
        policy = policy_export.SavedPolicy(self.export(agent, 'recurrent', BOX_ACTIONS))
        self.assertTrue(policy.recurrent)
        np.testing.assert_array_equal(policy.initial_state(3), np.zeros([3, 64]))
        sequence, reset = recurrent_inputs()
        actions = saved_recurrent_actions(policy, sequence, reset)
        np.testing.assert_allclose(actions, live_recurrent_actions(agent, sequence, reset),
                                   atol=1e-6)
        # Without the resets the actions differ: the state matters and reset is applied.
        unreset = saved_recurrent_actions(policy, sequence, np.zeros_like(reset))
        self.assertGreater(np.abs(unreset - actions).max(), 1e-3)

    def test_metadata_describes_the_policy_and_its_run(self):
        agent = make_agent(4, networks.FeedForwardCategoricalPolicy)
        path = self.export(agent, 'policy', DISCRETE_ACTIONS, step=1234,
                           config="train.env_id = 'CartPole-v1'\n")
        policy = policy_export.SavedPolicy(path)
        self.assertEqual(policy.step, 1234)
        self.assertEqual(policy.config, "train.env_id = 'CartPole-v1'\n")
        self.assertFalse(policy.recurrent)
        self.assertEqual(policy.action_space, DISCRETE_ACTIONS)
        self.assertEqual(policy.observation_space, OBSERV_SPACE)
        loaded = tf.saved_model.load(path)
        self.assertEqual(set(loaded.signatures), set(policy_export.SIGNATURES))

    def test_space_descriptions_round_trip(self):
        for space in (gym.spaces.Box(np.float32([-1.0, -np.inf]), np.float32([2.0, np.inf])),
                      gym.spaces.Box(-1, 1, (2, 3), np.float32),
                      gym.spaces.Discrete(3, start=1)):
            description = json.loads(json.dumps(policy_export.space_to_dict(space)))
            self.assertEqual(policy_export.space_from_dict(description), space)
        with self.assertRaisesRegex(ValueError, 'only Box and Discrete'):
            policy_export.space_to_dict(gym.spaces.MultiBinary(3))

    def test_exporter_exports_current_weights_and_replaces_earlier_exports(self):
        agent = make_agent(2, networks.FeedForwardGaussianPolicy)
        exporter = policy_export.PolicyExporter(agent, OBSERV_SPACE, BOX_ACTIONS)
        path = os.path.join(self.directory, 'policy', '100')
        observ = observations(10)
        exporter.export(path, step=100)
        before = policy_export.SavedPolicy(path)(observ, (), None)[0]
        agent.policy.mean.bias.assign([[[3.0, -3.0]]])
        agent.observ_normalizer.update(observations(50, seed=7)[None] * 4)
        exporter.export(path, step=100)
        after = policy_export.SavedPolicy(path)
        np.testing.assert_allclose(after(observ, (), None)[0], live_actions(agent, observ),
                                   atol=1e-6)
        self.assertGreater(np.abs(after(observ, (), None)[0] - before).min(), 1.0)
        self.assertEqual(os.listdir(os.path.dirname(path)), ['100'])  # No temporary left.

    def test_later_exports_are_whole_saved_models_of_the_new_values(self):
        agent = make_agent(2, networks.RecurrentGaussianPolicy)
        exporter = policy_export.PolicyExporter(agent, OBSERV_SPACE, BOX_ACTIONS)
        first = exporter.export(os.path.join(self.directory, '1'), step=1, config='a = 1')
        for variable in agent.policy.trainable_variables:
            variable.assign(variable * 1.5)
        agent.observ_normalizer.update(observations(50, seed=7)[None] * 4)
        later = exporter.export(os.path.join(self.directory, '2'), step=2, config='a = 2')

        def files(directory):
            return sorted(os.path.relpath(os.path.join(parent, name), directory)
                          for parent, dirs, names in os.walk(directory) for name in dirs + names)

        self.assertEqual(files(later), files(first))
        fingerprints = [tf.saved_model.experimental.read_fingerprint(path)
                        for path in (first, later)]
        self.assertEqual(fingerprints[0].saved_model_checksum,
                         fingerprints[1].saved_model_checksum)  # The same program...
        self.assertNotEqual(fingerprints[0].checkpoint_hash,
                            fingerprints[1].checkpoint_hash)  # ...with other values.
        saved = policy_export.SavedPolicy(later)
        self.assertEqual((saved.step, saved.config), (2, 'a = 2'))
        sequence, reset = recurrent_inputs()
        np.testing.assert_allclose(saved_recurrent_actions(saved, sequence, reset),
                                   live_recurrent_actions(agent, sequence, reset), atol=1e-5)

    def test_write_saves_the_captured_policy_while_the_agent_changes(self):
        agent = make_agent(2, networks.FeedForwardGaussianPolicy)
        exporter = policy_export.PolicyExporter(agent, OBSERV_SPACE, BOX_ACTIONS)
        path = os.path.join(self.directory, 'policy', '200')
        observ = observations(10)
        captured = live_actions(agent, observ)
        exporter.capture(step=200, config='train.seed = 3')
        writer = threading.Thread(target=exporter.write, args=(path,))
        writer.start()
        for _ in range(20):  # Training goes on meanwhile.
            agent.policy.mean.bias.assign_add([[[0.5, -0.5]]])
            agent.observ_normalizer.update(observations(50, seed=7)[None] * 4)
        writer.join()
        saved = policy_export.SavedPolicy(path)
        np.testing.assert_array_equal(saved(observ, (), None)[0], captured)
        self.assertGreater(np.abs(live_actions(agent, observ) - captured).min(), 1.0)
        self.assertEqual((saved.step, saved.config), (200, 'train.seed = 3'))

    def test_refuses_to_replace_files_that_are_no_export(self):
        agent = make_agent(2, networks.FeedForwardGaussianPolicy)
        blocker = self.create_tempfile('file', content='keep').full_path
        with self.assertRaisesRegex(FileExistsError, 'it is a file'):
            policy_export.export_policy(agent, blocker, OBSERV_SPACE, BOX_ACTIONS)
        foreign = self.create_tempdir('foreign')
        foreign.create_file('notes.txt', content='keep')
        with self.assertRaisesRegex(FileExistsError, 'holds other files'):
            policy_export.export_policy(agent, foreign.full_path, OBSERV_SPACE, BOX_ACTIONS)
        self.assertEqual(os.listdir(foreign.full_path), ['notes.txt'])
        with open(blocker) as f:
            self.assertEqual(f.read(), 'keep')

    def test_failed_export_leaves_the_earlier_one_and_no_temporary(self):
        agent = make_agent(2, networks.FeedForwardGaussianPolicy)
        parent = os.path.join(self.directory, 'policy')
        path = self.export(agent, os.path.join('policy', '5'), BOX_ACTIONS, step=5)
        with mock.patch.object(tf.saved_model, 'save', side_effect=OSError('disk full')):
            with self.assertRaisesRegex(OSError, 'disk full'):
                policy_export.export_policy(agent, path, OBSERV_SPACE, BOX_ACTIONS, step=6)
            with self.assertRaisesRegex(OSError, 'disk full'):
                policy_export.export_policy(agent, os.path.join(parent, '7'), OBSERV_SPACE,
                                            BOX_ACTIONS, step=7)
        self.assertEqual(os.listdir(parent), ['5'])
        self.assertEqual(policy_export.SavedPolicy(path).step, 5)
        # An exporter's later exports write only the values, and fail as cleanly.
        exporter = policy_export.PolicyExporter(agent, OBSERV_SPACE, BOX_ACTIONS)
        exporter.export(os.path.join(parent, '8'), step=8)
        with mock.patch.object(tf.train.Checkpoint, 'write', side_effect=OSError('disk full')):
            for step in (8, 9):
                with self.assertRaisesRegex(OSError, 'disk full'):
                    exporter.export(os.path.join(parent, str(step)), step=step)
        self.assertEqual(sorted(os.listdir(parent)), ['5', '8'])
        self.assertEqual(policy_export.SavedPolicy(os.path.join(parent, '8')).step, 8)

    def test_prune_keeps_the_given_steps_and_other_files(self):
        parent = self.create_tempdir('policy')
        for name in ('100', '200', '300', 'notes'):
            parent.mkdir(name)
        parent.create_file('400')  # A file named like a step is not an export.
        self.assertEqual(run_dir.exported_steps(parent.full_path), [100, 200, 300])
        policy_export.prune_exports(parent.full_path, [200, 300, 500])
        self.assertEqual(sorted(os.listdir(parent.full_path)), ['200', '300', '400', 'notes'])
        self.assertEqual(run_dir.exported_steps(os.path.join(self.directory, 'no')), [])

    def test_loading_something_else_is_a_clear_error(self):
        with self.assertRaisesRegex(policy_export.PolicyLoadError, 'no saved_model.pb'):
            policy_export.SavedPolicy(self.directory)
        module = tf.Module()
        module.value = tf.Variable(1.0)
        other = os.path.join(self.directory, 'other')
        tf.saved_model.save(module, other)
        with self.assertRaisesRegex(policy_export.PolicyLoadError, 'not an exported policy'):
            policy_export.SavedPolicy(other)

    def test_damaged_saved_model_is_a_clear_error_naming_the_file(self):
        agent = make_agent(2, networks.FeedForwardGaussianPolicy)
        intact = self.export(agent, 'intact', BOX_ACTIONS)
        self.assertIsNone(policy_export.saved_model_problem(intact))
        data = os.path.join('variables', 'variables.data-00000-of-00001')

        def truncate(directory, name):
            path = os.path.join(directory, name)
            with open(path, 'r+b') as f:
                f.truncate(os.path.getsize(path) // 2)

        def overwrite(directory, name):
            path = os.path.join(directory, name)
            with open(path, 'r+b') as f:
                f.write(b'\x7f' * os.path.getsize(path))

        cases = {
            'truncated_program': (lambda directory: truncate(directory, 'saved_model.pb'),
                                  r'saved_model.pb does not parse \(Error parsing message'),
            'no_variables': (lambda directory: shutil.rmtree(os.path.join(directory,
                                                                           'variables')),
                             r'variables/variables does not read back \(variables.index is '
                             r'missing\)'),
            'truncated_variables': (lambda directory: truncate(directory, data),
                                    r'variables/variables does not read back \(Read less bytes '
                                    r'than requested\)'),
            'overwritten_variables': (lambda directory: overwrite(directory, data),
                                      r'variables/variables does not read back \(.*[Cc]hecksum'),
        }
        for name, (damage, problem) in cases.items():
            directory = os.path.join(self.directory, name)
            shutil.copytree(intact, directory)
            damage(directory)
            with self.assertRaisesRegex(policy_export.PolicyLoadError,
                                        rf'^{directory} holds a damaged SavedModel: {problem}'):
                policy_export.SavedPolicy(directory)

    def test_missing_directory_is_named(self):
        missing = os.path.join(self.directory, 'missing')
        with self.assertRaisesRegex(policy_export.PolicyLoadError,
                                    rf'^policy {missing} does not exist or is not a directory$'):
            policy_export.SavedPolicy(missing)

    def test_export_with_xla_acts_alike(self):
        agent = make_agent(2, networks.FeedForwardGaussianPolicy)

        def compiled_with_xla(path):
            signature = tf.saved_model.load(path).signatures['deterministic_action']
            return any(function.attr['_XlaMustCompile'].b
                       for function in signature.graph.as_graph_def().library.function)

        self.assertFalse(compiled_with_xla(self.export(agent, 'plain', BOX_ACTIONS)))
        path = self.export(agent, 'xla', BOX_ACTIONS, jit_compile=True)
        self.assertTrue(compiled_with_xla(path))
        observ = observations(100)
        np.testing.assert_allclose(policy_export.SavedPolicy(path)(observ, (), None)[0],
                                   live_actions(agent, observ), atol=1e-5)

    def test_observation_space_must_fit_the_agent(self):
        agent = make_agent(2, networks.FeedForwardGaussianPolicy)
        with self.assertRaisesRegex(ValueError, 'does not match the policy'):
            policy_export.PolicyExporter(agent, gym.spaces.Box(-1, 1, (4,)), BOX_ACTIONS)


class GinBindingTest(gin_testing.BindingTestCase):
    """A binding of PolicyExporter either takes effect where our code makes one, or is refused."""

    def test_bindings_of_arguments_the_caller_sets_are_refused(self):
        self.assert_bindings_refused('PolicyExporter', policy_export.NOT_GIN_BINDABLE)

    def test_bindings_of_seed_and_jit_compile_take_effect(self):
        gin.parse_config(['PolicyExporter.seed = 5', 'PolicyExporter.jit_compile = True'])
        agent = make_agent(2, networks.FeedForwardGaussianPolicy)
        # As the trainer (loop.py) and the export tool (scripts/export.py) make it.
        exporter = policy_export.PolicyExporter(agent, OBSERV_SPACE, BOX_ACTIONS)
        np.testing.assert_array_equal(exporter._module.random.state.numpy(),
                                      tf.random.Generator.from_seed(5).state.numpy())
        for name in policy_export.SIGNATURES:
            self.assertTrue(getattr(exporter._module, name)._jit_compile, name)


if __name__ == '__main__':
    absltest.main()
