"""Tests the PPO module: losses by hand, learning on tiny problems, checkpoints and bad input.

Metrics and most of the agent's variables are [K], one entry per member: [1] for a lone agent.
"""

import gin
import numpy as np
import tensorflow as tf
from absl.testing import absltest, parameterized

from agents.algorithms import networks
from agents.algorithms.ppo import ppo

# What the objective reports, each [K].
METRICS = ('loss', 'policy_loss', 'value_loss', 'entropy', 'kl', 'approx_kl', 'clip_fraction')
# Two members that differ in the member hyperparameters of the objective.
MEMBERS = ({'seed': 0, 'clip_ratio': 0.2, 'entropy_coef': 0.01},
           {'seed': 7, 'clip_ratio': 0.1, 'entropy_coef': 0.05})


def make_agent(*args, jit_compile=False, **kwargs):
    """Most tests skip XLA, whose compilation takes seconds; tests that need it ask for it."""
    return ppo.PPO(*args, jit_compile=jit_compile, **kwargs)


def make_population(members, *args, **kwargs):
    """The population of the lone agents `make_agent(*args, **kwargs, **member)`."""
    lone = [make_agent(*args, **{**kwargs, **member}) for member in members]
    return make_agent(*args, population=lone, **kwargs)


def stack(steps):
    return tf.nest.map_structure(lambda *tensors: tf.stack(tensors), *steps)


def bandit_batch(agent, observ, reward_fn):
    """A one-step-episode rollout (T=1) of `observ` [N, ...] with rewards `reward_fn(action)`."""
    num_envs = observ.shape[0]
    action, extras, _ = agent.act(observ, agent.initial_state(num_envs),
                                  tf.ones([num_envs], tf.bool))
    return {
        'observ': observ[None],
        'action': action[None],
        'reward': tf.cast(reward_fn(action), tf.float32)[None],
        'terminated': tf.ones([1, num_envs], tf.bool),
        'truncated': tf.zeros([1, num_envs], tf.bool),
        'next_observ': tf.zeros_like(observ)[None],
        'extras': tf.nest.map_structure(lambda tensor: tensor[None], extras),
    }


def random_rollout(agent, num_steps, num_envs, observ_size, seed=0):
    """A rollout on random observations with episode ends, recorded through `act`."""
    rng = np.random.default_rng(seed)
    observ = tf.constant(rng.normal(size=(num_steps + 1, num_envs, observ_size)) * 3 + 1,
                         tf.float32)
    terminated = rng.uniform(size=(num_steps, num_envs)) < 0.1
    truncated = (rng.uniform(size=(num_steps, num_envs)) < 0.1) & ~terminated
    done = terminated | truncated
    state = agent.initial_state(num_envs)
    actions, extras = [], []
    reset = tf.ones([num_envs], tf.bool)
    for step in range(num_steps):
        action, extra, state = agent.act(observ[step], state, reset)
        actions.append(action)
        extras.append(extra)
        reset = tf.constant(done[step])
    return {
        'observ': observ[:-1],
        'action': tf.stack(actions),
        'reward': tf.constant(rng.normal(size=(num_steps, num_envs)), tf.float32),
        'terminated': tf.constant(terminated),
        'truncated': tf.constant(truncated),
        'next_observ': observ[1:],
        'extras': stack(extras),
    }


def gaussian_log_prob(action, loc, scale):
    return np.sum(-0.5 * ((action - loc) / scale) ** 2 - np.log(scale) - 0.5 * np.log(2 * np.pi),
                  axis=-1)


def gaussian_kl(old_loc, old_scale, loc, scale):
    return np.sum(np.log(scale / old_scale) +
                  (old_scale ** 2 + (old_loc - loc) ** 2) / (2 * scale ** 2) - 0.5, axis=-1)


class LossTest(parameterized.TestCase):

    @parameterized.product(objective=('clipped', 'kl_penalty'), value_clip=(0.2, None),
                           num_members=(1, 2))
    def test_loss_matches_hand_computation(self, objective, value_clip, num_members):
        # A lone agent, or a population whose members differ in clip_ratio, entropy_coef and
        # KL penalty: each member's loss is the formula of its own settings on its own slice.
        settings = dict(num_envs=8, objective=objective, value_clip=value_clip,
                        value_coef=0.7, kl_target=0.075)
        members = MEMBERS[:num_members]
        agent = (make_population(members, (3,), 2, **settings) if num_members > 1 else
                 make_agent((3,), 2, **settings, **members[0]))
        penalties = np.array([2.5, 1.5][:num_members], np.float32)
        agent.kl_penalty.assign(penalties)
        rng = np.random.default_rng(0)
        shape = (num_members, 3, 8)  # [K, L, M]
        observ = rng.normal(size=shape + (3,)).astype(np.float32)
        params = agent.policy.sequence(observ, (), tf.zeros(shape, tf.bool))
        loc, scale = params['loc'].numpy(), params['scale'].numpy()
        value = agent.value(observ).numpy()
        old_loc = (loc + rng.normal(size=loc.shape) * 0.3).astype(np.float32)
        old_scale = (scale * np.exp(rng.normal(size=scale.shape) * 0.2)).astype(np.float32)
        action = (old_loc + old_scale * rng.normal(size=loc.shape)).astype(np.float32)
        old_log_prob = gaussian_log_prob(action, old_loc, old_scale).astype(np.float32)
        old_value = (value + rng.normal(size=value.shape) * 0.5).astype(np.float32)
        advantage = rng.normal(size=value.shape).astype(np.float32) * 2 + 1
        return_ = rng.normal(size=value.shape).astype(np.float32)
        minibatch = {
            'observ': observ, 'action': action, 'log_prob': old_log_prob, 'value': old_value,
            'policy_params': {'loc': old_loc, 'scale': old_scale}, 'advantage': advantage,
            'return': return_, 'reset': np.zeros(shape, bool)}
        loss, metrics = agent.loss(tf.nest.map_structure(tf.constant, minibatch), ())
        self.assertEqual(loss.shape, (num_members,))
        self.assertEqual({name: value.shape for name, value in metrics.items()},
                         {name: (num_members,) for name in METRICS})

        for k, member in enumerate(members):
            clip_ratio, entropy_coef = member['clip_ratio'], member['entropy_coef']
            log_ratio = gaussian_log_prob(action[k], loc[k], scale[k]) - old_log_prob[k]
            ratio = np.exp(log_ratio)
            normalized = (advantage[k] - advantage[k].mean()) / (advantage[k].std() + 1e-8)
            kl = gaussian_kl(old_loc[k], old_scale[k], loc[k], scale[k])
            if objective == 'clipped':
                expected_policy_loss = -np.mean(np.minimum(
                    ratio * normalized,
                    np.clip(ratio, 1 - clip_ratio, 1 + clip_ratio) * normalized))
                self.assertGreater(np.mean(np.abs(ratio - 1) > clip_ratio), 0.1)  # It matters.
            else:
                excess = np.maximum(kl.mean(0) - 2.0 * 0.075, 0.0)
                self.assertTrue(np.any(excess > 0) and np.any(excess == 0))  # The cutoff too.
                expected_policy_loss = (-np.mean(ratio * normalized) + penalties[k] * kl.mean() +
                                        1000.0 * np.mean(excess ** 2))
            value_error = (value[k] - return_[k]) ** 2
            if value_clip:
                clipped = old_value[k] + np.clip(value[k] - old_value[k], -value_clip, value_clip)
                value_error = np.maximum(value_error, (clipped - return_[k]) ** 2)
            expected_value_loss = 0.5 * value_error.mean()
            entropy = np.mean(np.sum(0.5 * np.log(2 * np.pi * np.e * scale[k] ** 2), -1))
            expected_loss = (expected_policy_loss + 0.7 * expected_value_loss
                             - entropy_coef * entropy)

            with self.subTest(member=k):
                np.testing.assert_allclose(metrics['policy_loss'][k], expected_policy_loss,
                                           rtol=1e-4)
                np.testing.assert_allclose(metrics['value_loss'][k], expected_value_loss,
                                           rtol=1e-4)
                np.testing.assert_allclose(metrics['entropy'][k], entropy, rtol=1e-5)
                np.testing.assert_allclose(metrics['kl'][k], kl.mean(), rtol=1e-4)
                np.testing.assert_allclose(metrics['approx_kl'][k],
                                           np.mean(ratio - 1 - log_ratio), rtol=1e-3)
                np.testing.assert_allclose(metrics['clip_fraction'][k],
                                           np.mean(np.abs(ratio - 1) > clip_ratio))
                np.testing.assert_allclose(loss[k], expected_loss, rtol=1e-4)
        if num_members > 1:
            # Member 1's clip ratio (0.1) clips ratios that member 0's (0.2) would not.
            deviation = np.abs(np.exp(gaussian_log_prob(action[1], loc[1], scale[1])
                                      - old_log_prob[1]) - 1)
            self.assertTrue(np.any((deviation > 0.1) & (deviation <= 0.2)))


class UpdateTest(parameterized.TestCase):

    def test_first_gradient_step_sees_the_behaviour_policy(self):
        # The log-probs and values recorded by act (with frozen observation statistics) must
        # match what update recomputes, also after the statistics changed.
        agent = make_agent((3,), 2, num_envs=4, num_epochs=1, num_minibatches=1)
        agent.update(random_rollout(agent, 16, 4, 3, seed=1))
        self.assertEqual(agent.observ_normalizer.count.numpy().tolist(), [64])
        before = [variable.numpy() for variable in agent.policy.trainable_variables]
        metrics = agent.update(random_rollout(agent, 16, 4, 3, seed=2))
        self.assertEqual(metrics['num_gradient_steps'].numpy().tolist(), [1])
        self.assertLess(abs(metrics['kl'].numpy()[0]), 1e-6)
        self.assertLess(abs(metrics['approx_kl'].numpy()[0]), 1e-6)
        self.assertEqual(metrics['clip_fraction'].numpy().tolist(), [0])
        # The one step changed the policy.
        self.assertTrue(any(not np.array_equal(variable.numpy(), value) for variable, value in
                            zip(agent.policy.trainable_variables, before, strict=True)))

    def test_update_counts_and_normalizer_statistics(self):
        agent = make_agent((3,), 2, num_envs=4, num_minibatches=4, num_epochs=3)
        batch = random_rollout(agent, 16, 4, 3)
        metrics = agent.update(batch)
        self.assertEqual(metrics['num_gradient_steps'].numpy().tolist(), [12])
        self.assertEqual(agent.update_count.numpy().tolist(), [1])
        self.assertEqual(agent.optimizer.iterations.numpy().tolist(), [12])
        observ = batch['observ'].numpy().reshape(-1, 3)
        np.testing.assert_allclose(agent.observ_normalizer.mean.numpy(), [observ.mean(0)],
                                   rtol=1e-5)
        self.assertEqual(agent.reward_scaler.return_statistics.count.numpy().tolist(), [64])
        nonfinite = metrics.pop('nonfinite')
        self.assertEqual({name: value.numpy().tolist() for name, value in nonfinite.items()},
                         {'loss': [False], 'gradient': [False]})
        for name, value in metrics.items():
            self.assertEqual(value.shape, (1,), name)
            self.assertTrue(np.all(np.isfinite(value.numpy())), name)

    def test_leftover_units_are_dropped(self):
        agent = make_agent((3,), 2, num_envs=5, num_minibatches=3, num_epochs=2)
        metrics = agent.update(random_rollout(agent, 4, 5, 3))  # 20 units: 3 x 6, 2 dropped.
        self.assertEqual(metrics['num_gradient_steps'].numpy().tolist(), [6])

    def test_learning_rate_annealing(self):
        agent = make_agent((3,), 2, num_envs=4, num_minibatches=2, num_epochs=1,
                        learning_rate=1e-3, lr_anneal_updates=4)
        batch = random_rollout(agent, 8, 4, 3)
        rates = [agent.update(batch)['learning_rate'].numpy() for _ in range(5)]
        np.testing.assert_allclose(rates, [[1e-3], [7.5e-4], [5e-4], [2.5e-4], [0.0]], atol=1e-9)

    def test_early_stop_on_kl(self):
        agent = make_agent((3,), 2, num_envs=4, num_minibatches=4, num_epochs=4,
                        early_stop_kl=1e-7, learning_rate=1e-2)
        before = [variable.numpy() for variable in agent.policy.trainable_variables]
        metrics = agent.update(random_rollout(agent, 16, 4, 3))
        # The first step starts at KL 0 and is applied; the second sees the changed policy.
        self.assertEqual(metrics['num_gradient_steps'].numpy().tolist(), [1])
        self.assertEqual(agent.optimizer.iterations.numpy().tolist(), [1])
        after = [variable.numpy() for variable in agent.policy.trainable_variables]
        self.assertTrue(any(not np.allclose(a, b) for a, b in zip(before, after, strict=True)))

    @parameterized.parameters((1e3, 1 / 1.5), (1e-9, 1.5), (None, 1.0))
    def test_adaptive_kl_penalty(self, kl_target, expected_change):
        objective = 'clipped' if kl_target is None else 'kl_penalty'
        agent = make_agent((3,), 2, num_envs=4, num_minibatches=2, num_epochs=2,
                        objective=objective, kl_target=kl_target or 0.01, kl_init_penalty=2.0)
        metrics = agent.update(random_rollout(agent, 8, 4, 3))
        if objective == 'kl_penalty':
            self.assertGreater(metrics['final_kl'].numpy()[0], 0)
        else:  # The clipped objective makes no pass over the batch for the KL after the update.
            self.assertNotIn('final_kl', metrics)
        np.testing.assert_allclose(agent.kl_penalty.numpy(), [2.0 * expected_change], rtol=1e-6)

    def test_each_member_stops_early_and_adapts_its_penalty_alone(self):
        # A member of a negligible learning rate keeps its KL far below the threshold and the
        # target: it takes every step and its penalty shrinks. The other stops after its first
        # step, and its penalty grows.
        agent = make_population(
            [{'seed': 0, 'learning_rate': 1e-9}, {'seed': 1, 'learning_rate': 1e-2}], (3,), 2,
            num_envs=4, num_minibatches=4, num_epochs=4, early_stop_kl=1e-7,
            objective='kl_penalty', kl_target=1e-8, kl_init_penalty=2.0)
        metrics = agent.update(random_rollout(agent, 16, 8, 3))
        self.assertEqual(metrics['num_gradient_steps'].numpy().tolist(), [16, 1])
        self.assertEqual(agent.optimizer.iterations.numpy().tolist(), [16, 1])
        self.assertEqual(agent.update_count.numpy().tolist(), [1, 1])
        self.assertLess(metrics['final_kl'].numpy()[0], 0.7e-8)
        np.testing.assert_allclose(agent.kl_penalty.numpy(), [2.0 / 1.5, 2.0 * 1.5], rtol=1e-6)

    def test_xla_and_graph_updates_agree(self):
        # XLA draws different random numbers, so both agents train on the same rollout (they
        # start from the same weights) in full-batch steps, where the shuffling does not matter.
        results = []
        batch = None
        for jit_compile in (False, True):
            agent = ppo.PPO((3,), 2, num_envs=4, num_minibatches=1, num_epochs=3,
                            jit_compile=jit_compile, seed=5)
            batch = batch or random_rollout(agent, 8, 4, 3)
            metrics = agent.update(batch)
            results.append((metrics, [v.numpy() for v in agent.trainable_variables]))
        (graph_metrics, graph_variables), (xla_metrics, xla_variables) = results
        for name in ('loss', 'policy_loss', 'value_loss', 'kl'):
            np.testing.assert_allclose(xla_metrics[name].numpy(), graph_metrics[name].numpy(),
                                       rtol=1e-3, atol=1e-6, err_msg=name)
        for xla_variable, graph_variable in zip(xla_variables, graph_variables, strict=True):
            np.testing.assert_allclose(xla_variable, graph_variable, rtol=1e-3, atol=1e-5)


    def test_act_compiles_apart_from_the_update(self):
        # XLA samples other random numbers than a graph does from the same seed, which tells
        # how the act was compiled.
        observ = tf.constant(np.random.default_rng(0).normal(size=(4, 3)), tf.float32)

        def sampled(**kwargs):
            agent = ppo.PPO((3,), 2, num_envs=4, num_minibatches=1, seed=5, **kwargs)
            return agent.act(observ, (), tf.ones([4], tf.bool))[0].numpy()

        graph = sampled(jit_compile=False)
        # By default only the update is compiled with XLA.
        np.testing.assert_array_equal(sampled(jit_compile=True), graph)
        self.assertFalse(np.allclose(sampled(jit_compile=True, jit_compile_act=True), graph))
        self.assertFalse(np.allclose(sampled(jit_compile=False, jit_compile_act=True), graph))


class LearningTest(parameterized.TestCase):

    @parameterized.parameters(('clipped', True), ('kl_penalty', False))
    def test_gaussian_bandit_learns_rewarded_action(self, objective, jit_compile):
        agent = make_agent((2,), 1, num_envs=64, objective=objective, num_minibatches=4,
                           learning_rate=3e-3, seed=1, jit_compile=jit_compile)
        observ = tf.random.normal([64, 2], seed=2)
        target = 0.7
        for _ in range(30):
            agent.update(bandit_batch(agent, observ, lambda a: -(a[:, 0] - target) ** 2))
        action, _, _ = agent.act(observ, (), tf.ones([64], tf.bool), greedy=True)
        np.testing.assert_allclose(action.numpy(), np.full((64, 1), target), atol=0.15)
        self.assertLess(np.exp(agent.policy.log_std.numpy()[0, 0]), 0.8)  # Exploration shrank.

    @parameterized.parameters(('clipped', False), ('kl_penalty', True))
    def test_categorical_bandit_picks_rewarded_arm(self, objective, jit_compile):
        agent = make_agent((2,), 3, num_envs=64, objective=objective, num_minibatches=4,
                           policy_network=networks.FeedForwardCategoricalPolicy,
                           learning_rate=3e-3, seed=1, jit_compile=jit_compile)
        observ = tf.random.normal([64, 2], seed=2)
        for _ in range(20):
            agent.update(bandit_batch(agent, observ, lambda a: tf.cast(a == 2, tf.float32)))
        params, _ = agent.policy.step(agent.normalize(observ[None]), ())  # One member.
        probs = agent.policy.distribution(params).probs().numpy()[0]
        self.assertGreater(probs[:, 2].min(), 0.9)

    def test_recurrent_policy_learns_to_remember_a_cue(self):
        # Each episode has two steps: the first shows a cue of +-1, the second shows nothing.
        # Both steps reward actions close to the cue, so the second needs the GRU's memory.
        num_envs, num_steps = 32, 8
        agent = make_agent((2,), 1, num_envs=num_envs, chunk_length=4, num_minibatches=4,
                        policy_network=lambda **kwargs: networks.RecurrentGaussianPolicy(
                            gru_units=16, **kwargs),
                           learning_rate=3e-3, normalize_observ=False, seed=3,
                           jit_compile=True)
        rng = np.random.default_rng(0)

        def observe(cue, first):
            return tf.constant(np.stack([cue * first, np.full_like(cue, first)], -1), tf.float32)

        def rollout():
            state = agent.initial_state(num_envs)
            steps = []
            for step in range(num_steps):
                first = float(step % 2 == 0)
                if first:
                    cue = rng.choice([-1.0, 1.0], size=num_envs)
                observ = observe(cue, first)
                action, extras, state = agent.act(observ, state, tf.fill([num_envs], first > 0))
                steps.append({
                    'observ': observ, 'action': action, 'extras': extras,
                    'reward': -tf.square(action[:, 0] - cue),
                    'terminated': tf.fill([num_envs], first == 0),
                    'truncated': tf.zeros([num_envs], tf.bool),
                    'next_observ': observe(cue, 0.0)})
            return stack(steps)

        for _ in range(15):
            agent.update(rollout())
        cue = np.array([-1.0, 1.0] * (num_envs // 2))
        state = agent.initial_state(num_envs)
        _, _, state = agent.act(observe(cue, 1.0), state, tf.ones([num_envs], tf.bool),
                                greedy=True)
        action, _, _ = agent.act(observe(cue, 0.0), state, tf.zeros([num_envs], tf.bool),
                                 greedy=True)
        np.testing.assert_array_equal(np.sign(action.numpy()[:, 0]), cue)
        self.assertLess(np.abs(action.numpy()[:, 0] - cue).mean(), 0.5)


class CompiledLoopTest(absltest.TestCase):

    def test_rollout_and_update_in_one_tf_function(self):
        agent = make_agent((2,), 1, num_envs=32, num_minibatches=2, learning_rate=3e-3,
                           jit_compile=True)

        @tf.function
        def iteration():
            # A bandit made of TF ops: a whole iteration is one TF program.
            observ = tf.random.normal([32, 2])
            return agent.update(bandit_batch(agent, observ, lambda a: -(a[:, 0] - 1.0) ** 2))

        for _ in range(15):
            metrics = iteration()
        self.assertEqual(agent.update_count.numpy().tolist(), [15])
        self.assertTrue(np.all(np.isfinite(metrics['loss'].numpy())))
        self.assertEqual(iteration.experimental_get_tracing_count(), 1)
        action, _, _ = agent.act(tf.zeros([1, 2]), (), tf.ones([1], tf.bool), greedy=True)
        self.assertGreater(action.numpy()[0, 0], 0.3)  # Moved from ~0 towards 1.

    def test_act_is_deterministic_when_greedy_and_samples_otherwise(self):
        agent = make_agent((2,), 3, num_envs=4, jit_compile=True,
                           policy_network=networks.FeedForwardCategoricalPolicy)
        observ = tf.random.normal([500, 2])
        reset = tf.ones([500], tf.bool)
        greedy = [agent.act(observ, (), reset, greedy=True)[0].numpy() for _ in range(2)]
        np.testing.assert_array_equal(*greedy)
        samples = [agent.act(observ, (), reset)[0].numpy() for _ in range(2)]
        self.assertFalse(np.array_equal(*samples))
        self.assertEqual(samples[0].dtype, np.int32)
        self.assertLen(np.unique(samples[0]), 3)


class ConcurrentNetworksTest(parameterized.TestCase):
    """`concurrent_networks`: the policy and the value network trained side by side."""

    def updated(self, concurrent_networks, steps=1, num_minibatches=4, **kwargs):
        agent = ppo.PPO((3,), 2, num_envs=8, num_minibatches=num_minibatches, num_epochs=3,
                        seed=5, concurrent_networks=concurrent_networks, **kwargs)
        batch = random_rollout(agent, 8, 8, 3)
        metrics = None
        for _ in range(steps):
            metrics = agent.update(batch)
        return agent, metrics

    def test_without_a_norm_clip_it_is_the_joint_update(self):
        # Adam works weight by weight, so two Adams over the two networks take the joint
        # update's steps exactly when no global norm ties the networks together. Full-batch
        # steps: the joint update shuffles inside XLA, which draws other random numbers than
        # the graph around the two programs.
        joint, joint_metrics = self.updated(False, steps=2, num_minibatches=1,
                                            max_grad_norm=None)
        side_by_side, metrics = self.updated(True, steps=2, num_minibatches=1,
                                             max_grad_norm=None)
        for variable, joint_variable in zip(side_by_side.trainable_variables,
                                            joint.trainable_variables, strict=True):
            np.testing.assert_allclose(variable.numpy(), joint_variable.numpy(),
                                       rtol=1e-4, atol=1e-6, err_msg=variable.name)
        for name in ('loss', 'policy_loss', 'value_loss', 'entropy', 'kl', 'clip_fraction',
                     'num_gradient_steps'):
            np.testing.assert_allclose(metrics[name].numpy(), joint_metrics[name].numpy(),
                                       rtol=1e-4, atol=1e-6, err_msg=name)
        self.assertEqual(side_by_side.optimizer.iterations.numpy().tolist(), [6])
        self.assertEqual(side_by_side.value_optimizer.iterations.numpy().tolist(), [6])

    def test_each_network_clips_its_own_gradient(self):
        # Under one global clip, the policy's objective (here its entropy bonus, which changes
        # the policy's gradient norm) reaches the value's steps through the shared clip
        # factor; with a clip per network it does not.
        # The joint update needs no XLA to show it, and compiles sooner without.
        def value_weights(concurrent_networks, entropy_coef):
            agent, metrics = self.updated(concurrent_networks, max_grad_norm=0.05,
                                          entropy_coef=entropy_coef,
                                          jit_compile=concurrent_networks)
            self.assertGreater(metrics['gradient_norm'].numpy()[0], 0.05)  # The clip acted.
            return [variable.numpy() for variable in agent.value.trainable_variables]

        for weights, other_weights in zip(value_weights(True, 0.0), value_weights(True, 0.5),
                                          strict=True):
            np.testing.assert_allclose(weights, other_weights, rtol=1e-6, atol=1e-7)
        self.assertFalse(all(
            np.allclose(weights, other_weights, rtol=1e-4, atol=1e-6)
            for weights, other_weights in zip(value_weights(False, 0.0),
                                              value_weights(False, 0.5), strict=True)))

    def test_early_stop_on_kl_stops_the_policy_alone(self):
        agent, metrics = self.updated(True, early_stop_kl=1e-9)
        self.assertEqual(metrics['num_gradient_steps'].numpy().tolist(), [1.0])
        self.assertEqual(agent.optimizer.iterations.numpy().tolist(), [1])
        self.assertEqual(agent.value_optimizer.iterations.numpy().tolist(), [12])

    def test_learning_rate_anneals_for_both_networks(self):
        # The second of 4 annealed updates trains at 3/4 of the initial rate.
        agent, _ = self.updated(True, steps=2, lr_anneal_updates=4, learning_rate=1e-3)
        np.testing.assert_allclose(agent.optimizer.learning_rate.numpy(), [7.5e-4], rtol=1e-6)
        np.testing.assert_allclose(agent.value_optimizer.learning_rate.numpy(), [7.5e-4],
                                   rtol=1e-6)

    def test_checkpoint_holds_the_value_optimizer(self):
        directory = self.create_tempdir().full_path
        agent, _ = self.updated(True)
        batch = random_rollout(agent, 8, 8, 3, seed=1)
        path = tf.train.Checkpoint(agent=agent).save(f'{directory}/saved')
        restored = ppo.PPO((3,), 2, num_envs=8, num_minibatches=4, num_epochs=3, seed=9,
                           concurrent_networks=True)
        tf.train.Checkpoint(agent=restored).restore(path).assert_consumed()
        self.assertEqual(restored.value_optimizer.iterations.numpy().tolist(), [12])
        undone = {variable.ref() for variable in agent.undo_variables()}
        for variable in (agent.value_optimizer.iterations,
                         agent.value_optimizer.slots['velocity'][-1]):
            self.assertIn(variable.ref(), undone)
        agent.update(batch)
        restored.update(batch)
        for variable, restored_variable in zip(agent.trainable_variables,
                                               restored.trainable_variables, strict=True):
            np.testing.assert_array_equal(variable.numpy(), restored_variable.numpy())

    def test_needs_xla(self):
        with self.assertRaisesRegex(ValueError, 'concurrent_networks needs jit_compile'):
            ppo.PPO((3,), 2, num_envs=8, jit_compile=False, concurrent_networks=True)


class CheckpointTest(absltest.TestCase):

    def test_round_trip_restores_every_variable_and_the_next_update(self):
        directory = self.create_tempdir().full_path

        def make_kl_agent(seed):
            return make_agent((3,), 2, num_envs=4, num_minibatches=2, num_epochs=2,
                              objective='kl_penalty', seed=seed)

        agent = make_kl_agent(seed=0)
        batch = random_rollout(agent, 8, 4, 3)
        agent.update(batch)
        path = tf.train.Checkpoint(agent=agent).save(f'{directory}/saved')
        restored_agent = make_kl_agent(seed=123)
        tf.train.Checkpoint(agent=restored_agent).restore(path).assert_consumed()
        resaved = tf.train.Checkpoint(agent=restored_agent).save(f'{directory}/resaved')

        saved, reloaded = tf.train.load_checkpoint(path), tf.train.load_checkpoint(resaved)
        names = [name for name, _ in tf.train.list_variables(path)
                 if 'save_counter' not in name and name != '_CHECKPOINTABLE_OBJECT_GRAPH']
        for part in ('optimizer/slots/momentum', 'optimizer/slots/velocity',
                     'optimizer/iterations', 'optimizer/learning_rate', 'observ_normalizer/mean',
                     'observ_normalizer/count', 'sum_squared_deviations', 'return_statistics',
                     'running_return', 'update_count', 'kl_penalty', 'log_std',
                     'sampling_seeds/', 'policy/', 'value/'):
            self.assertTrue(any(part in name for name in names), part)
        for name in names:
            np.testing.assert_array_equal(saved.get_tensor(name), reloaded.get_tensor(name), name)
        self.assertEqual(restored_agent.update_count.numpy().tolist(), [1])
        self.assertGreater(restored_agent.observ_normalizer.count.numpy()[0], 0)
        self.assertGreater(
            np.abs(restored_agent.optimizer.slots['velocity'][-1].numpy()).sum(), 0)
        # The restored seeds are the saved agent's, not those it was built with.
        self.assertEqual(restored_agent.sampling_seeds.seeds.numpy().tolist(), [0])

        # Restored agents continue identically, down to action sampling and shuffling.
        original, restored = agent.update(batch), restored_agent.update(batch)
        tf.nest.map_structure(
            lambda value, other: np.testing.assert_array_equal(value.numpy(), other.numpy()),
            original, restored)
        for variable, restored_variable in zip(agent.trainable_variables,
                                               restored_agent.trainable_variables, strict=True):
            np.testing.assert_array_equal(variable.numpy(), restored_variable.numpy())
        observ = tf.zeros([4, 3])
        np.testing.assert_array_equal(agent.act(observ, (), tf.ones([4], tf.bool))[0].numpy(),
                                      restored_agent.act(observ, (), tf.ones([4], tf.bool))[0])


class BadInputTest(parameterized.TestCase):

    def setUp(self):
        super().setUp()
        self.agent = make_agent((3,), 2, num_envs=4, num_minibatches=2)
        self.batch = random_rollout(self.agent, 8, 4, 3)

    def test_unknown_objective(self):
        with self.assertRaisesRegex(ValueError, r"Unknown objective 'trpo'.*'clipped'"):
            ppo.PPO((3,), 2, num_envs=4, objective='trpo')

    @parameterized.parameters(
        ({'num_epochs': 0}, 'num_epochs must be a positive integer'),
        ({'num_minibatches': 2.5}, 'num_minibatches must be a positive integer'),
        ({'clip_ratio': -0.1}, 'clip_ratio must be positive'),
        ({'kl_tolerance': (1.3, 0.7)}, 'kl_tolerance'),
        ({'discount': 1.5}, 'discount'),
        ({'chunk_length': 4}, 'chunk_length only applies to recurrent policies'),
        ({'num_envs': 0}, 'num_envs must be a positive integer'))
    def test_bad_hyperparameters(self, overrides, message):
        kwargs = {'observ_shape': (3,), 'action_size': 2, 'num_envs': 4, **overrides}
        with self.assertRaisesRegex(ValueError, message):
            ppo.PPO(**kwargs)

    def assert_update_fails(self, batch, message, error=ValueError):
        with self.assertRaisesRegex(error, message):
            self.agent.update(batch)
        # A failed update leaves the agent untouched.
        self.assertEqual(self.agent.update_count.numpy().tolist(), [0])
        self.assertEqual(self.agent.observ_normalizer.count.numpy().tolist(), [0])
        self.assertEqual(self.agent.optimizer.iterations.numpy().tolist(), [0])

    def test_missing_keys(self):
        batch = dict(self.batch)
        del batch['next_observ']
        batch['extras'] = {'value': batch['extras']['value']}
        self.assert_update_fails(
            batch, r"missing \['next_observ', 'extras/log_prob', 'extras/policy_params'\]")

    def test_mismatched_observation_shape(self):
        batch = dict(self.batch, observ=tf.zeros([8, 4, 5]))
        self.assert_update_fails(batch, r"batch\['observ'\] has shape \(8, 4, 5\), expected")

    def test_mismatched_time_steps(self):
        batch = dict(self.batch, terminated=self.batch['terminated'][:-1])
        self.assert_update_fails(batch, r"batch\['terminated'\] has shape \(7, 4\)")

    def test_wrong_number_of_envs(self):
        batch = tf.nest.map_structure(lambda tensor: tensor[:, :3], self.batch)
        self.assert_update_fails(batch, 'batch has 3 environments but the agent was built for '
                                 'num_envs=4')

    def test_batch_major_reward(self):
        self.assert_update_fails(dict(self.batch, reward=tf.zeros([8, 4, 1])),
                                 r'reward must be time-major \[T, N\]')

    def test_discrete_actions_for_gaussian_policy(self):
        batch = dict(self.batch, action=tf.zeros([8, 4, 2], tf.int32))
        self.assert_update_fails(batch, 'action dtype int32 does not suit '
                                 'FeedForwardGaussianPolicy')

    def test_too_many_minibatches(self):
        self.agent = make_agent((3,), 2, num_envs=4, num_minibatches=64)
        self.assert_update_fails(random_rollout(self.agent, 8, 4, 3),
                                 'num_minibatches=64 exceeds the 32 training units')

    def test_too_many_minibatches_with_unknown_rollout_length(self):
        self.agent = make_agent((3,), 2, num_envs=4, num_minibatches=64)
        batch = random_rollout(self.agent, 8, 4, 3)
        update = tf.function(self.agent.update, input_signature=[tf.nest.map_structure(
            lambda x: tf.TensorSpec([None] + x.shape[1:], x.dtype), batch)])
        with self.assertRaisesRegex(tf.errors.InvalidArgumentError,
                                    'num_minibatches exceeds the number of training units'):
            update(batch)
        self.assertEqual(self.agent.update_count.numpy().tolist(), [0])
        self.assertEqual(self.agent.reward_scaler.return_statistics.count.numpy().tolist(), [0])

    def test_recurrent_batch_needs_state_and_divisible_length(self):
        self.agent = make_agent((3,), 2, num_envs=4, num_minibatches=2, chunk_length=3,
                             policy_network=networks.RecurrentGaussianPolicy)
        batch = random_rollout(self.agent, 8, 4, 3)
        self.assert_update_fails(batch, 'chunk_length=3 must divide the rollout length T=8')
        batch['extras'] = dict(batch['extras'])
        del batch['extras']['policy_state']
        self.assert_update_fails(batch, r"missing \['extras/policy_state'\]")

    def test_not_a_dict(self):
        with self.assertRaisesRegex(TypeError, 'batch must be a dict'):
            self.agent.update(list(self.batch.values()))


class GinTest(absltest.TestCase):

    def tearDown(self):
        gin.clear_config()
        super().tearDown()

    def test_configure_through_gin(self):
        gin.parse_config("""
            import agents.algorithms.networks
            PPO.objective = 'kl_penalty'
            PPO.num_epochs = 3
            PPO.policy_network = @FeedForwardCategoricalPolicy
            FeedForwardCategoricalPolicy.hidden_sizes = (8,)
        """)
        agent = ppo.PPO((3,), 4, num_envs=2)
        self.assertIsInstance(agent.policy, networks.FeedForwardCategoricalPolicy)
        self.assertEqual(agent.policy.logits.kernel.shape, (1, 8, 4))  # One member.
        self.assertEqual(agent.objective_name, 'kl_penalty')
        self.assertEqual(agent._num_epochs, 3)


if __name__ == '__main__':
    absltest.main()
