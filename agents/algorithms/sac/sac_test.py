"""Tests of SAC: the squashed Gaussian and one gradient step against numpy, the Polyak update,
what undo and checkpoints hold, learning a bandit, and a run through the loop.

The networks carry a leading member axis (members.py): the actor's is 1, the twin critics are
the two members of one network, so their variables are `[2, ...]`."""

import os

import gin
import numpy as np
import tensorflow as tf
from absl.testing import absltest, parameterized

from agents.algorithms.sac import sac
from agents.runs import loop, metrics, policy_export, run_dir

OBSERV_SIZE, ACTION_SIZE = 2, 2


def _agent(**kwargs):
    settings = dict(observ_shape=(OBSERV_SIZE,), action_size=ACTION_SIZE, num_envs=2,
                    buffer_size=64, learning_starts=0, batch_size=8, actor_hidden_sizes=(3,),
                    critic_hidden_sizes=(3,), jit_compile=False, seed=3)
    settings.update(kwargs)
    return sac.SAC(**settings)


def _transitions(steps=3, envs=2, seed=0):
    """A time-major batch with a termination and a truncation: only the first stops the
    bootstrap."""
    rng = np.random.default_rng(seed)
    shape = (steps, envs)
    terminated = np.zeros(shape, bool)
    truncated = np.zeros(shape, bool)
    terminated[1, 0] = truncated[2, 1] = True
    return {
        'observ': rng.normal(size=shape + (OBSERV_SIZE,)).astype(np.float32),
        'action': rng.uniform(-1, 1, size=shape + (ACTION_SIZE,)).astype(np.float32),
        'reward': rng.normal(size=shape).astype(np.float32),
        'next_observ': rng.normal(size=shape + (OBSERV_SIZE,)).astype(np.float32),
        'terminated': terminated, 'truncated': truncated, 'extras': {}}


def _randomize(module, rng, scale=0.5):
    """Gives every variable of `module` random values (biases too), so that no term of the
    update is zero by construction."""
    for variable in module.trainable_variables:
        variable.assign(rng.normal(scale=scale, size=variable.shape).astype(np.float32))


def _numpy_hidden(inputs, layers):
    """One member's ReLU hidden layers, (kernel, bias) pairs."""
    for kernel, bias in layers:
        inputs = np.maximum(inputs @ kernel + bias, 0.0)
    return inputs


def _numpy_weights(mlp, member):
    """One member's weights of an MLP's layers as float64 (kernel, bias) pairs."""
    return [(layer.kernel.numpy()[member].astype(np.float64),
             layer.bias.numpy()[member, 0].astype(np.float64)) for layer in mlp.layers]


def _numpy_policy(policy, observ, noise):
    """SAC's squashed Gaussian in float64: (action, log-prob) of the pre-squash draw
    `mean + std * noise`."""
    hidden = _numpy_hidden(observ.astype(np.float64), _numpy_weights(policy.torso, 0))
    mean, log_std = (hidden @ head.kernel.numpy()[0] + head.bias.numpy()[0, 0]
                     for head in (policy.mean, policy.log_std))
    log_std = np.clip(log_std, *sac.LOG_STD_BOUNDS)
    presquash = mean + np.exp(log_std) * noise
    return np.tanh(presquash), _numpy_log_prob(presquash, mean, np.exp(log_std))


def _numpy_log_prob(presquash, loc, scale):
    """log pi(tanh(u)) by the change of variables, with log(1 - tanh(u)^2) = -2 log cosh(u)
    (exact in float64 far into the tails)."""
    gaussian = -0.5 * ((presquash - loc) / scale) ** 2 - np.log(scale) - 0.5 * np.log(2 * np.pi)
    log_cosh = np.logaddexp(presquash, -presquash) - np.log(2.0)
    return np.sum(gaussian + 2.0 * log_cosh, axis=-1)


def _numpy_q(critic, observ, action):
    """Both critics' values in float64: [2, B]."""
    inputs = np.concatenate([observ, action], -1).astype(np.float64)
    return np.stack([
        _numpy_hidden(inputs, _numpy_weights(critic.torso, member))
        @ critic.head.kernel.numpy()[member, :, 0] + critic.head.bias.numpy()[member, 0, 0]
        for member in (0, 1)])


class TanhGaussianTest(absltest.TestCase):

    def test_log_prob_is_the_gaussians_minus_the_log_jacobian_of_tanh(self):
        rng = np.random.default_rng(0)
        loc = rng.normal(size=(1, 5, 3))
        scale = np.exp(rng.normal(size=(1, 5, 3)))
        # Far into the tails too, where tanh(u) rounds to +-1 in float32.
        presquash = loc + scale * rng.normal(size=loc.shape) * 3.0
        presquash[0, 0] = [12.0, -15.0, 30.0]
        distribution = sac.TanhGaussian(loc.astype(np.float32), scale.astype(np.float32))
        log_prob = distribution.log_prob_presquash(presquash.astype(np.float32)).numpy()
        self.assertEqual(log_prob.shape, (1, 5))
        np.testing.assert_allclose(log_prob, _numpy_log_prob(presquash, loc, scale),
                                   rtol=1e-5, atol=1e-4)
        self.assertTrue(np.isfinite(log_prob).all())

    def test_log_jacobian_is_that_of_tanh_by_autodiff(self):
        presquash = tf.constant(np.linspace(-6.0, 6.0, 25)[:, None], tf.float64)
        with tf.GradientTape() as tape:
            tape.watch(presquash)
            action = tf.tanh(presquash)
        jacobian = tape.gradient(action, presquash)
        distribution = sac.TanhGaussian(tf.zeros_like(presquash), tf.ones_like(presquash))
        gaussian = -0.5 * presquash[:, 0] ** 2 - 0.5 * np.log(2 * np.pi)
        np.testing.assert_allclose(
            distribution.log_prob_presquash(presquash).numpy(),
            gaussian.numpy() - np.log(jacobian.numpy()[:, 0]), rtol=1e-9, atol=1e-9)

    def test_sample_mode_and_log_prob_of_a_draw(self):
        loc = tf.constant([[[0.3, -2.0]]])
        scale = tf.constant([[[0.5, 0.1]]])
        distribution = sac.TanhGaussian(loc, scale)
        seed = tf.constant([4, 2])
        action, log_prob = distribution.sample_with_log_prob(seed)
        presquash = loc + scale * tf.random.stateless_normal([1, 1, 2], seed=seed)
        np.testing.assert_allclose(action, tf.tanh(presquash), rtol=1e-6)
        np.testing.assert_allclose(distribution.sample(seed), action)
        np.testing.assert_allclose(log_prob, _numpy_log_prob(
            presquash.numpy(), loc.numpy(), scale.numpy()), rtol=1e-5)
        np.testing.assert_allclose(distribution.mode(), np.tanh(loc.numpy()), rtol=1e-6)


class GradientStepTest(absltest.TestCase):

    def test_target_and_losses_against_numpy(self):
        rng = np.random.default_rng(1)
        agent = _agent(learning_rate=0.05, discount=0.9, tau=0.1, ent_coef_init=0.7)
        for module in (agent.policy, agent.critic, agent.critic_target):
            _randomize(module, rng)
        agent.observe(_transitions(), True)
        before = {name: [variable.numpy() for variable in module.variables]
                  for name, module in (('critic', agent.critic),
                                       ('target', agent.critic_target))}
        # What the step draws with its seed: the minibatch, then the noise of the next
        # observations' actions and of the observations' actions.
        seed = tf.constant([7, 3])
        sample_seed, next_seed, policy_seed = tf.unstack(
            tf.random.experimental.stateless_split(seed, 3))
        data = {name: values.numpy() for name, values in agent.buffer.sample(
            8, sample_seed).items()}
        self.assertTrue(data['terminated'].any() and not data['terminated'].all())
        next_noise, noise = (tf.random.stateless_normal([1, 8, ACTION_SIZE], seed=s).numpy()[0]
                             for s in (next_seed, policy_seed))
        alpha, target_entropy = 0.7, -float(ACTION_SIZE)

        # The numpy reference of everything before the critics' step.
        action_pi, log_prob = _numpy_policy(agent.policy, data['observ'], noise)
        next_action, next_log_prob = _numpy_policy(agent.policy, data['next_observ'],
                                                   next_noise)
        next_q = _numpy_q(agent.critic_target, data['next_observ'], next_action).min(axis=0)
        target = data['reward'] + 0.9 * (1.0 - data['terminated']) * (
            next_q - alpha * next_log_prob)
        q = _numpy_q(agent.critic, data['observ'], data['action'])
        critic_loss = 0.5 * np.sum(np.mean((q - target) ** 2, axis=1))
        ent_coef_loss = -np.mean(np.log(alpha) * (log_prob + target_entropy))

        step_metrics, nonfinite = agent.gradient_step(seed)
        self.assertFalse(any(bool(value) for value in nonfinite.values()))
        self.assertEqual(int(agent.gradient_step_count), 1)
        got = {name: float(value) for name, value in step_metrics.items()}
        self.assertAlmostEqual(got['critic_loss'], critic_loss, delta=1e-5 * abs(critic_loss))
        self.assertAlmostEqual(got['ent_coef_loss'], ent_coef_loss, delta=1e-5)
        self.assertAlmostEqual(got['ent_coef'], alpha, delta=1e-6)
        self.assertAlmostEqual(got['entropy'], -np.mean(log_prob), delta=1e-5)
        self.assertAlmostEqual(got['q_mean'], np.mean(q), delta=1e-5)
        # The actor's loss takes the critics after their step (SB3's order).
        actor_loss = np.mean(alpha * log_prob - _numpy_q(agent.critic, data['observ'],
                                                         action_pi).min(axis=0))
        self.assertAlmostEqual(got['actor_loss'], actor_loss, delta=1e-5 * abs(actor_loss))
        for variable, old in zip(agent.critic.variables, before['critic'], strict=True):
            self.assertFalse(np.allclose(variable.numpy(), old))
        # The temperature's first Adam step is learning_rate against the sign of its gradient,
        # -mean(log pi + target_entropy): up while the entropy is below its target.
        gradient = -np.mean(log_prob + target_entropy)
        self.assertAlmostEqual(float(agent.log_ent_coef[0]),
                               np.log(alpha) - 0.05 * np.sign(gradient), delta=1e-5)
        # The targets followed the critics by Polyak averaging with tau.
        for variable, target, old in zip(agent.critic.variables, agent.critic_target.variables,
                                         before['target'], strict=True):
            np.testing.assert_allclose(target.numpy(), 0.9 * old + 0.1 * variable.numpy(),
                                       rtol=1e-6, atol=1e-7)

    def test_only_termination_stops_the_bootstrap(self):
        agent = _agent(buffer_size=8)
        batch = _transitions()
        agent.observe(batch, True)
        # The buffer keeps `terminated` alone: a truncation is a transition to bootstrap from.
        np.testing.assert_array_equal(agent.buffer.storage['terminated'].numpy()[:6],
                                      batch['terminated'].reshape(-1))
        np.testing.assert_array_equal(agent.buffer.storage['next_observ'].numpy()[:6],
                                      batch['next_observ'].reshape(-1, OBSERV_SIZE))

    def test_fixed_temperature_is_not_learned(self):
        agent = _agent(learn_ent_coef=False, ent_coef_init=0.2)
        agent.observe(_transitions(), True)
        step_metrics, _ = agent.gradient_step(tf.constant([1, 2]))
        self.assertAlmostEqual(float(tf.exp(agent.log_ent_coef[0])), 0.2, delta=1e-7)
        self.assertTrue(np.isnan(float(step_metrics['ent_coef_loss'])))
        self.assertEqual(int(agent.ent_coef_optimizer.iterations[0]), 0)

    def test_a_nonfinite_critic_loss_is_not_applied_and_stops_training(self):
        agent = _agent()
        agent.observe(_transitions(), True)
        agent.buffer.storage['reward'].assign(tf.fill([64], float('nan')))
        critic = [variable.numpy() for variable in agent.critic.variables]
        train_metrics, nonfinite = agent.train(3)
        self.assertTrue(bool(nonfinite['critic_loss']))
        self.assertEqual(int(agent.gradient_step_count), 1)
        for variable, old in zip(agent.critic.variables, critic, strict=True):
            np.testing.assert_array_equal(variable.numpy(), old)
        self.assertEqual(agent.critic_optimizer.iterations.numpy().tolist(), [0, 0])
        self.assertEqual(set(train_metrics), set(sac.SAC.TRAIN_METRICS))


class PolyakTest(absltest.TestCase):

    def test_polyak_update_is_exact(self):
        rng = np.random.default_rng(2)
        source = rng.normal(size=(2, 5, 3)).astype(np.float32)
        target = rng.normal(size=(2, 5, 3)).astype(np.float32)
        for tau in (0.005, 0.3, 1.0, 0.0):
            variable = tf.Variable(target)
            sac.polyak_update([variable], [tf.Variable(source)], tau)
            np.testing.assert_array_equal(
                variable.numpy(),
                target * np.float32(1.0 - tau) + source * np.float32(tau), err_msg=tau)
        variable = tf.Variable(target)
        sac.polyak_update([variable], [tf.Variable(source)], 1.0)
        np.testing.assert_array_equal(variable.numpy(), source)

    def test_targets_follow_every_target_update_interval_steps(self):
        agent = _agent(target_update_interval=2, tau=0.25)
        agent.observe(_transitions(), True)
        targets = [variable.numpy() for variable in agent.critic_target.variables]
        agent.train(1)
        for variable, old in zip(agent.critic_target.variables, targets, strict=True):
            np.testing.assert_array_equal(variable.numpy(), old)
        agent.train(1)
        for target, critic, old in zip(agent.critic_target.variables, agent.critic.variables,
                                       targets, strict=True):
            np.testing.assert_array_equal(
                target.numpy(), old * np.float32(0.75) + critic.numpy() * np.float32(0.25))

    def test_targets_start_as_copies_of_the_critics(self):
        agent = _agent()
        for target, critic in zip(agent.critic_target.variables, agent.critic.variables,
                                  strict=True):
            np.testing.assert_array_equal(target.numpy(), critic.numpy())
        # The twin critics differ.
        self.assertFalse(np.allclose(agent.critic.head.kernel[0], agent.critic.head.kernel[1]))


class StateTest(parameterized.TestCase):

    def test_the_buffer_is_checkpointed_but_never_undone(self):
        agent = _agent()
        undone = {variable.ref() for variable in agent.undo_variables()}
        self.assertFalse(undone & {variable.ref() for variable in agent.buffer.variables})
        self.assertNotIn(agent.observed_steps.ref(), undone)
        for module in (agent.policy, agent.critic, agent.critic_target, agent.actor_optimizer,
                       agent.critic_optimizer, agent.ent_coef_optimizer, agent.sampling_seeds):
            self.assertLessEqual({variable.ref() for variable in module.variables}, undone)
        self.assertIn(agent.log_ent_coef.ref(), undone)

        agent.learn(_transitions(), tf.constant([True]))
        path = tf.train.Checkpoint(agent=agent.checkpointed()).write(
            os.path.join(self.create_tempdir().full_path, 'ckpt'))
        names = [name for name, _ in tf.train.list_variables(path)]
        self.assertTrue([name for name in names if name.startswith('agent/buffer/storage/')])
        restored = _agent()
        tf.train.Checkpoint(agent=restored.checkpointed()).read(path).assert_consumed()
        for field, values in agent.buffer.storage.items():
            np.testing.assert_array_equal(restored.buffer.storage[field], values, err_msg=field)
        self.assertEqual(int(restored.buffer.added), 6)
        np.testing.assert_array_equal(restored.critic.head.kernel, agent.critic.head.kernel)

    def test_a_checkpoint_may_leave_the_buffer_out(self):
        agent = _agent(checkpoint_buffer=False)
        path = tf.train.Checkpoint(agent=agent.checkpointed()).write(
            os.path.join(self.create_tempdir().full_path, 'ckpt'))
        names = [name for name, _ in tf.train.list_variables(path)]
        self.assertFalse([name for name in names if 'buffer' in name or 'observed' in name])
        self.assertTrue([name for name in names if name.startswith('agent/critic_target/')])

    def test_networks_may_start_as_sb3s(self):
        agent = _agent(network_initializer='torch_default', actor_hidden_sizes=(16,),
                       critic_hidden_sizes=(16,))
        for layer in (agent.policy.mean, agent.policy.log_std, agent.critic.head):
            self.assertLessEqual(np.abs(layer.kernel.numpy()).max(), 0.25)  # 1 / sqrt(16).
            self.assertTrue(np.abs(layer.bias.numpy()).max() > 0)
        for target, critic in zip(agent.critic_target.variables, agent.critic.variables,
                                  strict=True):
            np.testing.assert_array_equal(target.numpy(), critic.numpy())

    @parameterized.parameters(
        dict(tau=1.5), dict(discount=-0.1), dict(batch_size=0), dict(learning_rate=0.0),
        dict(critic_learning_rate=-1e-3), dict(ent_coef_init=0.0), dict(target_entropy='max'),
        dict(train_freq=0), dict(buffer_size=0), dict(target_update_interval=0),
        dict(network_initializer='xavier'))
    def test_bad_arguments_are_refused(self, **kwargs):
        with self.assertRaises(ValueError):
            _agent(**kwargs)


class ActingTest(absltest.TestCase):

    def test_acts_uniformly_until_learning_starts_then_with_the_policy(self):
        agent = _agent(learning_starts=6)
        observ = tf.zeros([500, OBSERV_SIZE])
        reset = tf.ones([500], tf.bool)
        # The policy's samples of a zero observation cluster (its std starts near 1 before
        # tanh); uniform draws fill [-1, 1] evenly.
        uniform, extras, state = agent.act(observ, (), reset)
        self.assertEqual((uniform.shape, extras, state), ((500, ACTION_SIZE), {}, ()))
        self.assertLess(abs(float(tf.reduce_mean(uniform))), 0.1)
        self.assertAlmostEqual(float(tf.math.reduce_variance(uniform)), 1 / 3, delta=0.05)
        agent.learn(_transitions(), tf.constant([True]))  # 6 steps observed.
        sampled, _, _ = agent.act(observ, (), reset)
        params, _ = agent.policy.step(observ[None], ())
        presquash = tf.atanh(tf.clip_by_value(sampled, -0.999999, 0.999999))
        # A sample of the policy: its pre-squash values are Gaussian around the mean.
        z = (presquash - params['loc'][0]) / params['scale'][0]
        self.assertLess(abs(float(tf.reduce_mean(z))), 0.2)
        self.assertAlmostEqual(float(tf.math.reduce_std(z)), 1.0, delta=0.15)
        greedy, _, _ = agent.act(observ, (), reset, greedy=True)
        np.testing.assert_allclose(greedy, tf.tanh(params['loc'][0]), rtol=1e-6)


def _bandit(rng, steps, envs):
    """One-step episodes whose reward is -|action - (0.5, -0.3)|^2, whatever the observation."""
    observ = rng.normal(size=(steps, envs, OBSERV_SIZE)).astype(np.float32)
    action = rng.uniform(-1, 1, size=(steps, envs, ACTION_SIZE)).astype(np.float32)
    reward = -np.sum((action - np.array([0.5, -0.3])) ** 2, -1).astype(np.float32)
    return {'observ': observ, 'action': action, 'reward': reward, 'next_observ': observ,
            'terminated': np.ones((steps, envs), bool),
            'truncated': np.zeros((steps, envs), bool), 'extras': {}}


class LearningTest(absltest.TestCase):

    def test_learns_the_best_action_of_a_bandit(self):
        agent = _agent(buffer_size=4096, batch_size=128, gradient_steps=25, learning_rate=3e-3,
                       actor_hidden_sizes=(32, 32), critic_hidden_sizes=(32, 32),
                       jit_compile=True, seed=5)
        learn = tf.function(agent.learn, autograph=False)
        rng = np.random.default_rng(4)
        losses = []
        for _ in range(16):
            step_metrics, nonfinite = learn(_bandit(rng, 32, 4), tf.constant([True]))
            self.assertFalse(any(bool(value) for value in nonfinite.values()))
            losses.append(float(step_metrics['critic_loss']))
        self.assertLess(np.mean(losses[-4:]), np.mean(losses[:2]) / 4)
        greedy, _, _ = agent.act(tf.constant(rng.normal(size=(16, OBSERV_SIZE)), tf.float32),
                                 (), tf.ones([16], tf.bool), greedy=True)
        np.testing.assert_allclose(greedy, np.tile([[0.5, -0.3]], [16, 1]), atol=0.15)
        # Little entropy is worth its cost here: the temperature fell from 1.
        self.assertLess(float(tf.exp(agent.log_ent_coef[0])), 0.8)


class LoopTest(absltest.TestCase):
    """SAC through the unchanged run loop, on the native Pendulum."""

    def setUp(self):
        super().setUp()
        gin.clear_config()
        gin.parse_config('\n'.join([
            'SAC.learning_starts = 64', 'SAC.batch_size = 32', 'SAC.buffer_size = 1024',
            'SAC.actor_hidden_sizes = (16,)', 'SAC.critic_hidden_sizes = (16,)']))
        self.addCleanup(gin.clear_config)

    def test_trains_evaluates_and_exports_tanh_of_the_mean(self):
        logdir = self.create_tempdir().full_path
        with loop.training_run(
                logdir, algorithm=sac.SAC, env_id='Pendulum-v1', env_backend='native',
                num_envs=2, total_steps=256, eval_every_steps=128, eval_episodes=1,
                seed=1) as run:
            run.run()
            agent = run.agent
        evaluations = metrics.evaluations(os.path.join(logdir, run_dir.METRICS_FILE))
        self.assertEqual([record['step'] for record in evaluations], [128, 256])
        self.assertEqual(int(agent.buffer.added), 256)
        # Iterations of 2 envs x 1 step, training from the one that reaches 64 steps.
        self.assertEqual(int(agent.gradient_step_count), (256 - 64) // 2 + 1)
        policy = policy_export.SavedPolicy(os.path.join(logdir, run_dir.POLICY_DIR, '256'))
        observ = np.random.default_rng(0).uniform(-1, 1, size=(7, 3)).astype(np.float32)
        action, _ = policy(observ, (), None)
        expected, _, _ = agent.act(tf.constant(observ), (), tf.ones([7], tf.bool), greedy=True)
        np.testing.assert_allclose(action, expected, rtol=1e-6, atol=1e-7)
        self.assertTrue((np.abs(action) <= 1.0).all())


if __name__ == '__main__':
    absltest.main()
