"""Tests of A2C: the objective against numpy, the single RMSprop step, non-finite updates,
argument checking, acting and recurrent policies.

A lone agent is a population of one (members.py): its networks take and give a leading member
axis of 1 (`[None]` below) and its metrics are `[1]`."""

import functools

import numpy as np
import tensorflow as tf
from absl.testing import absltest, parameterized

from agents.algorithms import networks, optimizers
from agents.algorithms.a2c import a2c

OBSERV_SIZE, ACTION_SIZE, NUM_ENVS, NUM_STEPS = 3, 2, 3, 4
# Episode ends of the hand-made rollout: a termination and truncations mid-rollout and at its
# end, so that both bootstrapping and the cut of the advantage recursion show in the loss.
TERMINATED = np.array([[0, 0, 0], [1, 0, 0], [0, 0, 0], [0, 0, 1]], bool)
TRUNCATED = np.array([[0, 0, 0], [0, 0, 0], [0, 1, 0], [0, 0, 0]], bool)


def _agent(categorical=False, recurrent=False, **kwargs):
    if recurrent:
        policy = functools.partial(networks.RecurrentGaussianPolicy, hidden_sizes=(8,),
                                   gru_units=4)
    elif categorical:
        policy = functools.partial(networks.FeedForwardCategoricalPolicy, hidden_sizes=(8,))
    else:
        policy = functools.partial(networks.FeedForwardGaussianPolicy, hidden_sizes=(8,))
    kwargs.setdefault('jit_compile', False)
    kwargs.setdefault('seed', 0)
    return a2c.A2C(observ_shape=(OBSERV_SIZE,), action_size=ACTION_SIZE, num_envs=NUM_ENVS,
                   policy_network=policy,
                   value_network=functools.partial(networks.FeedForwardValue, hidden_sizes=(8,)),
                   **kwargs)


def _batch(agent, seed=0):
    """A feed-forward rollout whose recorded values are what `act` would have returned."""
    rng = np.random.default_rng(seed)
    shape = (NUM_STEPS, NUM_ENVS)
    observ = rng.normal(size=shape + (OBSERV_SIZE,)).astype(np.float32)
    if agent.action_dtype.is_integer:
        action = rng.integers(0, ACTION_SIZE, size=shape).astype(np.int32)
    else:
        action = rng.normal(size=shape + (ACTION_SIZE,)).astype(np.float32)
    return {
        'observ': observ,
        'action': action,
        'reward': rng.normal(size=shape).astype(np.float32),
        'terminated': TERMINATED,
        'truncated': TRUNCATED,
        'next_observ': rng.normal(size=shape + (OBSERV_SIZE,)).astype(np.float32),
        'extras': {'value': agent.value(observ[None])[0].numpy()},
    }


def _numpy_gae(reward, value, next_value, terminated, truncated, discount, gae_lambda):
    advantage = np.zeros_like(reward)
    following = np.zeros_like(reward[0])
    for t in reversed(range(len(reward))):
        delta = reward[t] + discount * (1 - terminated[t]) * next_value[t] - value[t]
        following = delta + discount * gae_lambda * (1 - (terminated[t] | truncated[t])) * following
        advantage[t] = following
    return advantage, advantage + value


def _numpy_log_prob_entropy(params, action):
    if 'logits' in params:
        logits = params['logits'].astype(np.float64)
        log_softmax = logits - np.log(np.sum(np.exp(logits), -1, keepdims=True))
        log_prob = np.take_along_axis(log_softmax, action[..., None], -1)[..., 0]
        entropy = -np.sum(np.exp(log_softmax) * log_softmax, -1)
        return log_prob, entropy
    loc, scale = params['loc'].astype(np.float64), params['scale'].astype(np.float64)
    log_prob = np.sum(-0.5 * ((action - loc) / scale) ** 2 - np.log(scale) -
                      0.5 * np.log(2 * np.pi), -1)
    entropy = np.sum(0.5 + 0.5 * np.log(2 * np.pi) + np.log(scale), -1)
    return log_prob, entropy


def _numpy_objective(agent, batch, log_prob, entropy, discount=0.99, gae_lambda=1.0,
                     value_coef=0.5, entropy_coef=0.0, normalize_advantages=False):
    value = batch['extras']['value'].astype(np.float64)
    next_value = agent.value(batch['next_observ'][None])[0].numpy().astype(np.float64)
    advantage, return_ = _numpy_gae(batch['reward'].astype(np.float64), value, next_value,
                                    batch['terminated'], batch['truncated'], discount, gae_lambda)
    used_advantage = advantage
    if normalize_advantages:
        used_advantage = (advantage - advantage.mean()) / (advantage.std(ddof=1) + 1e-8)
    policy_loss = -np.mean(used_advantage * log_prob)
    value_loss = np.mean((return_ - value) ** 2)  # The networks have not changed since acting.
    entropy = np.mean(entropy)
    return {
        'loss': policy_loss + value_coef * value_loss - entropy_coef * entropy,
        'policy_loss': policy_loss,
        'value_loss': value_loss,
        'entropy': entropy,
        'advantage_mean': advantage.mean(),
        'return_mean': return_.mean(),
        'value_mean': value.mean(),
        'explained_variance': 1 - np.var(return_ - value) / np.var(return_),
    }


def _weights(agent):
    return [variable.numpy() for variable in agent._trainable]


class LossTest(parameterized.TestCase):

    @parameterized.named_parameters(
        ('gaussian_defaults', False, {}),
        ('categorical_options', True, {'discount': 0.9, 'gae_lambda': 0.8, 'value_coef': 0.7,
                                       'entropy_coef': 0.01, 'normalize_advantages': True}),
    )
    def test_matches_numpy_reference(self, categorical, options):
        agent = _agent(categorical, **options)
        batch = _batch(agent)
        params = agent.policy.sequence(batch['observ'][None], (),
                                       np.zeros((1, NUM_STEPS, NUM_ENVS), bool))
        log_prob, entropy = _numpy_log_prob_entropy(
            {key: value[0].numpy() for key, value in params.items()}, batch['action'])
        expected = _numpy_objective(agent, batch, log_prob, entropy, **options)
        metrics = agent.update(batch)  # Reports the loss before its gradient step.
        for name, value in expected.items():
            self.assertEqual(metrics[name].shape, (1,), name)
            np.testing.assert_allclose(metrics[name].numpy(), [value], rtol=1e-5, atol=1e-5,
                                       err_msg=name)
        self.assertEqual({name: value.numpy().tolist()
                          for name, value in metrics['nonfinite'].items()},
                         {'loss': [False], 'gradient': [False]})
        np.testing.assert_allclose(metrics['learning_rate'].numpy(), [7e-4], rtol=1e-7)

    def test_loss_is_readable_on_its_own(self):
        agent = _agent()
        batch = _batch(agent)
        # Member-major [K, T, N, ...] data of the one member.
        data = {'observ': batch['observ'], 'action': batch['action'],
                'advantage': np.ones((NUM_STEPS, NUM_ENVS), np.float32),
                'return': batch['extras']['value'],
                'reset': np.zeros((NUM_STEPS, NUM_ENVS), bool)}
        data = {key: value[None] for key, value in data.items()}
        loss, metrics = agent.loss({**data, 'policy_state': ()})
        self.assertEqual(set(metrics), {'loss', 'policy_loss', 'value_loss', 'entropy'})
        self.assertEqual(loss.shape, (1,))
        np.testing.assert_allclose(metrics['value_loss'].numpy(), [0.0], atol=1e-6)
        np.testing.assert_allclose(loss.numpy(), metrics['policy_loss'].numpy(), atol=1e-6)


class UpdateTest(absltest.TestCase):

    def test_one_rmsprop_step_with_clipped_gradient(self):
        agent = _agent(entropy_coef=0.01)
        batch = _batch(agent)
        value = batch['extras']['value']
        next_value = agent.value(batch['next_observ'][None])[0].numpy()
        advantage, return_ = _numpy_gae(batch['reward'], value, next_value, TERMINATED,
                                        TRUNCATED, 0.99, 1.0)
        # The objective written out independently of A2C.loss, differentiated by a tape.
        with tf.GradientTape() as tape:
            params = agent.policy.sequence(batch['observ'][None], (), None)
            loc, scale = params['loc'][0], params['scale'][0]
            log_prob = tf.reduce_sum(-0.5 * tf.square((batch['action'] - loc) / scale) -
                                     tf.math.log(scale) - 0.5 * np.log(2 * np.pi), -1)
            entropy = tf.reduce_sum(0.5 + 0.5 * np.log(2 * np.pi) + tf.math.log(scale), -1)
            loss = (-tf.reduce_mean(advantage * log_prob) +
                    0.5 * tf.reduce_mean(
                        tf.square(return_ - agent.value(batch['observ'][None])[0])) -
                    0.01 * tf.reduce_mean(entropy))
        gradients = [gradient.numpy() for gradient in tape.gradient(loss, agent._trainable)]
        norm = np.sqrt(sum(np.sum(gradient ** 2) for gradient in gradients))
        self.assertGreater(norm, 0.5)  # Else the clip would go untested.
        gradients = [gradient * 0.5 / norm for gradient in gradients]
        # PyTorch's RMSprop from zero: v = 0.01 g^2, w -= lr g / (sqrt(v) + eps).
        expected = [weight - 7e-4 * gradient / (np.sqrt(0.01 * gradient ** 2) + 1e-5)
                    for weight, gradient in zip(_weights(agent), gradients, strict=True)]

        metrics = agent.update(batch)
        self.assertIsInstance(agent.optimizer, optimizers.RMSprop)
        np.testing.assert_allclose(metrics['loss'].numpy(), [loss.numpy()], rtol=1e-5)
        np.testing.assert_allclose(metrics['gradient_norm'].numpy(), [norm], rtol=1e-4)
        self.assertEqual(agent.optimizer.iterations.numpy().tolist(), [1])
        self.assertEqual(agent.update_count.numpy().tolist(), [1])
        for actual, wanted in zip(_weights(agent), expected, strict=True):
            np.testing.assert_allclose(actual, wanted, rtol=1e-4, atol=2e-6)
        for average, gradient in zip(agent.optimizer.slots['square_average'], gradients,
                                     strict=True):
            np.testing.assert_allclose(average.numpy(), 0.01 * gradient ** 2, rtol=1e-4,
                                       atol=1e-12)

    def test_loss_decreases_on_repeated_updates(self):
        for optimizer in a2c.OPTIMIZERS:
            agent = _agent(categorical=True, optimizer=optimizer)
            batch = _batch(agent)
            losses = []
            for _ in range(15):
                # Recorded values follow the network, as a fresh rollout's would.
                batch['extras']['value'] = agent.value(batch['observ'][None])[0].numpy()
                losses.append(agent.update(batch)['loss'].numpy())
            self.assertEqual(agent.optimizer.iterations.numpy().tolist(), [15], optimizer)
            self.assertLess(losses[-1][0], losses[0][0] - 0.1, optimizer)

    def test_learning_rate_anneals_linearly(self):
        agent = _agent(lr_anneal_updates=4, learning_rate=1e-3)
        batch = _batch(agent)
        rates = [agent.update(batch)['learning_rate'].numpy() for _ in range(5)]
        np.testing.assert_allclose(rates, [[1e-3], [7.5e-4], [5e-4], [2.5e-4], [0.0]],
                                   atol=1e-9)

    def test_nonfinite_reward_leaves_weights_unchanged(self):
        agent = _agent(jit_compile=True)  # The loop's setting: XLA.
        batch = _batch(agent)
        batch['reward'][1, 2] = np.nan
        before = _weights(agent)
        metrics = agent.update(batch)
        self.assertEqual({name: value.numpy().tolist()
                          for name, value in metrics['nonfinite'].items()},
                         {'loss': [True], 'gradient': [False]})
        self.assertEqual(agent.optimizer.iterations.numpy().tolist(), [0])
        for actual, wanted in zip(_weights(agent), before, strict=True):
            np.testing.assert_array_equal(actual, wanted)
        self.assertLen(agent.optimizer.slots['square_average'], len(before))
        for variable in agent.optimizer.slots['square_average']:
            np.testing.assert_array_equal(variable.numpy(), 0.0)

    def test_update_and_act_inside_one_compiled_function(self):
        agent = _agent(normalize_observ=True, scale_reward=True, jit_compile=True)
        batch = _batch(agent)

        @tf.function(autograph=False)
        def iteration(batch):
            action, extras, _ = agent.act(batch['observ'][0], (), tf.ones([NUM_ENVS], tf.bool))
            return agent.update(batch), action, extras

        metrics, action, extras = iteration(batch)
        self.assertEqual(action.shape, (NUM_ENVS, ACTION_SIZE))
        self.assertEqual(set(extras), {'value'})
        self.assertFalse(any(bool(value) for value in metrics.pop('nonfinite').values()))
        for name, value in metrics.items():
            self.assertEqual(value.shape, (1,), name)
            self.assertTrue(np.all(np.isfinite(value.numpy())), name)
        # Observation statistics take in the batch at the end of the update.
        self.assertEqual(agent.observ_normalizer.count.numpy().tolist(), [NUM_STEPS * NUM_ENVS])
        self.assertEqual(agent.reward_scaler.return_statistics.count.numpy().tolist(),
                         [NUM_STEPS * NUM_ENVS])

    def test_checkpoint_restores_every_train_variable(self):
        agent = _agent(categorical=True)
        agent.update(_batch(agent))  # Gives the RMSprop slots non-zero values.
        path = tf.train.Checkpoint(agent=agent).save(self.create_tempdir().full_path + '/c')
        other = _agent(categorical=True, seed=5)
        tf.train.Checkpoint(agent=other).restore(path).assert_consumed()
        for saved, restored in zip(agent.undo_variables(), other.undo_variables(),
                                   strict=True):
            np.testing.assert_array_equal(restored.numpy(), saved.numpy(), saved.name)

    def test_state_accessors(self):
        agent = _agent(normalize_observ=True)
        variables = agent.undo_variables()
        self.assertLen({variable.ref() for variable in variables}, len(variables))
        refs = {variable.ref() for variable in variables}
        for variable in (agent._trainable + [agent.update_count, agent.sampling_seeds.draws,
                                             agent.optimizer.iterations,
                                             agent.optimizer.learning_rate,
                                             agent.observ_normalizer.count,
                                             agent.reward_scaler.running_return]):
            self.assertIn(variable.ref(), refs, variable.name)
        for variable in agent.optimizer.slots['square_average']:
            self.assertIn(variable.ref(), refs, variable.name)
        self.assertEqual(set(agent.acting_modules()), {'policy', 'value', 'observ_normalizer'})
        for name, module in agent.acting_modules().items():
            self.assertIs(getattr(agent, name), module)
        self.assertEqual(agent.exported_policy(), (agent.policy, agent.observ_normalizer))
        plain = _agent()
        self.assertEqual(plain.exported_policy(), (plain.policy, None))


class ArgumentTest(parameterized.TestCase):

    @parameterized.parameters(
        ('learning_rate', 0.0), ('learning_rate', -1e-3), ('discount', 1.5),
        ('discount', -0.1), ('gae_lambda', 1.01), ('optimizer', 'sgd'), ('num_envs', 0),
        ('max_grad_norm', 0.0), ('rmsprop_alpha', 1.0), ('optimizer_epsilon', 0.0),
        ('entropy_coef', -0.1), ('lr_anneal_updates', 0),
    )
    def test_bad_argument_is_named(self, name, value):
        kwargs = {'num_envs': NUM_ENVS}
        kwargs[name] = value
        with self.assertRaisesRegex(ValueError, name):
            a2c.A2C(observ_shape=(OBSERV_SIZE,), action_size=ACTION_SIZE, **kwargs)

    def test_bad_batch_is_named(self):
        agent = _agent()
        batch = _batch(agent)
        del batch['extras']['value']
        with self.assertRaisesRegex(ValueError, 'extras/value'):
            agent.update(batch)
        batch = _batch(agent)
        batch['truncated'] = batch['truncated'][:, :2]
        with self.assertRaisesRegex(ValueError, "'truncated'"):
            agent.update(batch)
        with self.assertRaisesRegex(ValueError, 'num_envs=3'):
            agent.update(tf.nest.map_structure(lambda tensor: tensor[:, :2], _batch(agent)))
        batch = _batch(agent)
        batch['observ'] = batch['observ'][..., :2]
        with self.assertRaisesRegex(ValueError, "'observ'"):
            agent.update(batch)
        categorical = _agent(categorical=True)
        batch = _batch(categorical)
        batch['action'] = batch['action'].astype(np.float32)
        with self.assertRaisesRegex(ValueError, 'action dtype'):
            categorical.update(batch)


class ActTest(absltest.TestCase):

    def test_greedy_act_is_the_mode(self):
        observ = np.random.default_rng(1).normal(size=(NUM_ENVS, OBSERV_SIZE)).astype(np.float32)
        reset = np.ones(NUM_ENVS, bool)
        for categorical in (False, True):
            agent = _agent(categorical)
            params, _ = agent.policy.step(observ[None], ())
            mode = (np.argmax(params['logits'][0], -1) if categorical
                    else params['loc'][0].numpy())
            first, extras, _ = agent.act(observ, (), reset, greedy=True)
            second, _, _ = agent.act(observ, (), reset, greedy=True)
            np.testing.assert_allclose(first, mode, rtol=1e-5, atol=1e-8)
            np.testing.assert_array_equal(first, second)
            self.assertEqual(set(extras), {'value'})
            np.testing.assert_allclose(extras['value'], agent.value(observ[None])[0],
                                       rtol=1e-6)

    def test_sampling_follows_the_seed(self):
        observ = np.zeros((NUM_ENVS, OBSERV_SIZE), np.float32)
        reset = np.ones(NUM_ENVS, bool)

        def samples(seed, count):
            agent = _agent(seed=seed)
            return [agent.act(observ, (), reset)[0].numpy() for _ in range(count)]

        first, second = samples(0, 2)
        self.assertFalse(np.allclose(first, second))
        np.testing.assert_array_equal(samples(0, 1)[0], first)
        self.assertFalse(np.allclose(samples(1, 1)[0], first))


class RecurrentTest(absltest.TestCase):

    def test_whole_rollout_sequence_matches_stepwise_acting(self):
        agent = _agent(recurrent=True)
        rng = np.random.default_rng(2)
        done = TERMINATED | TRUNCATED
        state = agent.initial_state(NUM_ENVS)
        observs, actions, extras, log_probs = [], [], [], []
        reset = np.ones(NUM_ENVS, bool)
        for t in range(NUM_STEPS):
            observ = rng.normal(size=(NUM_ENVS, OBSERV_SIZE)).astype(np.float32)
            # What the acting policy's log-prob of its action was, stepped independently.
            params, _ = agent.policy.step(observ[None],
                                          agent.policy.reset_state(state, reset[None]))
            action, step_extras, state = agent.act(observ, state, reset)
            log_probs.append(
                agent.policy.distribution(params).log_prob(action[None])[0].numpy())
            observs.append(observ)
            actions.append(action.numpy())
            extras.append(step_extras)
            reset = done[t]
        self.assertEqual(set(extras[0]), {'value', 'policy_state'})
        batch = {
            'observ': np.stack(observs),
            'action': np.stack(actions),
            'reward': rng.normal(size=(NUM_STEPS, NUM_ENVS)).astype(np.float32),
            'terminated': TERMINATED,
            'truncated': TRUNCATED,
            'next_observ': rng.normal(size=(NUM_STEPS, NUM_ENVS, OBSERV_SIZE)).astype(
                np.float32),
            'extras': tf.nest.map_structure(lambda *steps: tf.stack(steps), *extras),
        }
        batch['extras'] = tf.nest.map_structure(lambda tensor: tensor.numpy(), batch['extras'])
        entropy = np.zeros((NUM_STEPS, NUM_ENVS))  # Entropy is state-independent here.
        expected = _numpy_objective(agent, batch, np.stack(log_probs), entropy)
        metrics = agent.update(batch)
        np.testing.assert_allclose(metrics['policy_loss'].numpy(), [expected['policy_loss']],
                                   rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(metrics['value_loss'].numpy(), [expected['value_loss']],
                                   rtol=1e-5, atol=1e-6)
        self.assertEqual(agent.optimizer.iterations.numpy().tolist(), [1])

        del batch['extras']['policy_state']
        with self.assertRaisesRegex(ValueError, 'extras/policy_state'):
            agent.update(batch)


if __name__ == '__main__':
    absltest.main()
