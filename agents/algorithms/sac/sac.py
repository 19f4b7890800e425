"""Soft Actor-Critic (SAC) with a learned entropy temperature, an off-policy algorithm.

This follows Haarnoja et al. 2018, "Soft Actor-Critic Algorithms and Applications"
(https://arxiv.org/abs/1812.05905), as Stable-Baselines3 (stable_baselines3/sac/sac.py) implements
it, whose defaults `SAC` takes, with the whole gradient step in one function as CleanRL's
sac_continuous_action.py writes it (`SAC.gradient_step`):

- The policy is a Gaussian squashed by tanh: `a = tanh(u)`, `u ~ N(mean(s), std(s))`, both heads
  of one MLP, the log-std clipped to [-20, 2] (SB3's bounds). Its log-density is the Gaussian's
  minus the log-Jacobian of tanh, `sum(log(1 - tanh(u)^2))`, computed as
  `2 * (log 2 - u - softplus(-2u))`, which is exact where `tanh(u)` rounds to +-1 in float32
  (SB3 and CleanRL add 1e-6 inside the log instead, which caps the correction).
- Twin Q networks and their target copies, which follow by Polyak averaging
  (`target <- (1 - tau) * target + tau * online`) after every `target_update_interval`-th
  gradient step. The two critics are one `networks.FeedForwardValue` of two members (the
  networks' leading axis, members.py): both run in the same batched ops.
- The temperature alpha is learned on `log(alpha)` against `target_entropy` (default
  `-action_size`, SAC's heuristic), with SB3's loss `-mean(log_alpha * (log pi + target))`.

Each gradient step, as SB3's `train` orders it (alpha is its value before the step throughout):

    a~, log pi(a~|s) ~ policy(s)                  (the policy before this step)
    temperature:  L = -mean(log_alpha * stop(log pi(a~|s) + target_entropy))
    critic:       y = r + discount * (1 - terminated) * (min_i Q'_i(s', a') - alpha log pi(a'|s'))
                  L = 0.5 * sum_i mean((Q_i(s, a) - y)^2),         a' ~ policy(s')
    actor:        L = mean(alpha * log pi(a~|s) - min_i Q_i(s, a~))  (the critic after its step)
    targets:      Q'_i <- (1 - tau) Q'_i + tau Q_i

Only `terminated` stops the bootstrap: at a time-limit truncation the batch's `next_observ` is the
episode's final observation, and the target bootstraps from it (SB3's
`handle_timeout_termination`). The replay buffer keeps `terminated` alone for that reason.

Actions live in [-1, 1], the action space of the wrapped environment under the default wrappers
(`range_normalize` rescales a bounded action space to it, as SB3 rescales its policies' actions),
and that is what the exported policy gives: the deterministic action `tanh(mean)` (the policy's
distribution's mode) or a squashed sample. Until `learning_starts` steps were observed the agent
acts uniformly at random in [-1, 1], as SB3 and CleanRL do. There is no observation normalizer
(neither SB3's SAC nor rl-zoo's settings for it normalize).

The replay buffer (replay_buffer.py, TF variables) is part of the checkpoint
(`checkpoint_buffer`), never of `undo_variables`: a non-finite step puts back the networks,
optimizers, temperature and seeds, and the transitions already kept stay.
"""

import math

import gin
import tensorflow as tf

from agents.algorithms import (
    actor_critic,
    algorithm,
    members,
    networks,
    optimizers,
    replay_buffer,
)

# SB3's bounds of the policy's log-std (stable_baselines3/sac/policies.py).
LOG_STD_BOUNDS = (-20.0, 2.0)
_LOG_TWO = math.log(2.0)
_HALF_LOG_TWO_PI = 0.5 * math.log(2.0 * math.pi)


class TanhGaussian:
    """A diagonal Gaussian over `u` squashed to `a = tanh(u)`; statistics sum over the last
    axis (the action's components). Has what the run loop's acting and the policy export need
    of a distribution (`sample`, `mode`; distributions.py) and what SAC needs
    (`sample_with_log_prob`)."""

    def __init__(self, loc, scale):
        self.loc = tf.convert_to_tensor(loc)
        self.scale = tf.convert_to_tensor(scale, self.loc.dtype)

    @property
    def dtype(self):
        return self.loc.dtype

    def mode(self):
        """`tanh(mean)`: the deterministic action (the squashed distribution's mode is not
        exactly this, but this is what SB3 and CleanRL act with and evaluate)."""
        return tf.tanh(self.loc)

    def sample(self, seed):
        return self.sample_with_log_prob(seed)[0]

    def sample_with_log_prob(self, seed):
        """`(a, log pi(a))` of one reparameterized draw for the stateless `seed` ([2] int32):
        differentiable in the mean and scale."""
        noise = tf.random.stateless_normal(tf.shape(self.loc), seed=seed, dtype=self.dtype)
        presquash = self.loc + self.scale * noise
        return tf.tanh(presquash), self.log_prob_presquash(presquash)

    def log_prob_presquash(self, presquash):
        """`log pi(tanh(u))` of the pre-squash value `u`: the Gaussian's log-density of `u` minus
        `sum(log(1 - tanh(u)^2))`, the latter as `2 * (log 2 - u - softplus(-2u))`."""
        gaussian = (-0.5 * tf.square((presquash - self.loc) / self.scale)
                    - tf.math.log(self.scale) - _HALF_LOG_TWO_PI)
        log_jacobian = 2.0 * (_LOG_TWO - presquash - tf.nn.softplus(-2.0 * presquash))
        return tf.reduce_sum(gaussian - log_jacobian, axis=-1)


class SquashedGaussianPolicy(networks.FeedForwardPolicy):
    """SAC's actor: an MLP whose two heads give the mean and the (clipped) log-std of a
    `TanhGaussian`; follows networks.py's policy interface (so the run loop's tools act with
    it and export it)."""

    action_dtype = tf.float32

    def __init__(self, observ_shape, action_size, hidden_sizes=(256, 256), activation='relu',
                 log_std_bounds=LOG_STD_BOUNDS, output_gain=0.01, seed=0,
                 initializer='orthogonal', name=None):
        super().__init__(observ_shape, seed, name=name)
        self.action_shape = (action_size,)
        self._log_std_bounds = tuple(float(bound) for bound in log_std_bounds)
        self.torso = networks.MLP(self.observ_size, hidden_sizes, activation, self.seeds,
                                  initializer)
        # Orthogonal: small output layers, the policy starts near tanh(N(0, 1)) in every state.
        self.mean = networks.Linear(self.torso.output_size, action_size, output_gain,
                                    [seed + 100 for seed in self.seeds], initializer)
        self.log_std = networks.Linear(self.torso.output_size, action_size, output_gain,
                                       [seed + 200 for seed in self.seeds], initializer)

    def _params(self, observ):
        flat, batch_shape = self._flatten_observ(observ)
        hidden = self.torso(flat)
        log_std = tf.clip_by_value(self.log_std(hidden), *self._log_std_bounds)
        return {'loc': self._unflatten(self.mean(hidden), batch_shape),
                'scale': self._unflatten(tf.exp(log_std), batch_shape)}

    def distribution(self, params):
        return TanhGaussian(params['loc'], params['scale'])


def polyak_update(targets, sources, tau):
    """`target <- (1 - tau) * target + tau * source` for each pair (SB3's `polyak_update`)."""
    return [target.assign(target * (1.0 - tau) + source * tau)
            for target, source in zip(targets, sources, strict=True)]


@gin.configurable
class SAC(algorithm.OffPolicyAlgorithm):
    """SAC agent: actor, twin critics and their targets, temperature, optimizers, replay buffer.

    The defaults are SB3's SAC defaults: a buffer of 1M transitions, 100 steps before learning,
    minibatches of 256, tau 0.005, discount 0.99, one gradient step per environment step, Adam
    with learning rate 3e-4 for actor, critics and temperature, two hidden layers of 256 ReLU
    units for each network, the temperature learned from 1.0 towards an entropy of
    `-action_size`.
    """

    TRAIN_METRICS = ('critic_loss', 'actor_loss', 'ent_coef_loss', 'ent_coef', 'q_mean',
                     'entropy')
    # A loss, or (`gradient`) any of the three gradients, that went non-finite; such a
    # gradient is never applied, and `train` stops at that step.
    NONFINITE_QUANTITIES = ('critic_loss', 'actor_loss', 'ent_coef_loss', 'gradient')
    ACTION_BOUNDS = (-1.0, 1.0)  # tanh-squashed.

    def __init__(
            self,
            observ_shape,
            action_size,
            num_envs,
            seed=0,
            lr_anneal_updates=None,
            buffer_size=1_000_000,
            learning_starts=100,
            batch_size=256,
            tau=0.005,
            discount=0.99,
            train_freq=1,
            gradient_steps=1,
            target_update_interval=1,
            learning_rate=3e-4,
            actor_learning_rate=None,
            critic_learning_rate=None,
            ent_coef_learning_rate=None,
            adam_epsilon=1e-8,
            actor_hidden_sizes=(256, 256),
            critic_hidden_sizes=(256, 256),
            activation='relu',
            network_initializer='orthogonal',
            learn_ent_coef=True,
            ent_coef_init=1.0,
            target_entropy='auto',
            checkpoint_buffer=True,
            jit_compile=True,
            name=None):
        """Builds the agent.

        Args:
          observ_shape: shape of one observation.
          action_size: action dimensions (a Box action space, rescaled to [-1, 1]).
          num_envs: environments stepped together (each iteration stores num_envs x
            train_freq transitions); SAC keeps no per-environment state.
          seed: seeds network initialization, sampling of actions and of minibatches.
          lr_anneal_updates: unused (the loop passes None to off-policy algorithms); SAC's
            learning rates are constant, as SB3's defaults.
          buffer_size: transitions the replay buffer keeps (the oldest are overwritten).
          learning_starts: environment steps (over all environments) observed before the
            first gradient step; until then actions are uniform in [-1, 1].
          batch_size: transitions per gradient step, drawn uniformly with replacement.
          tau: Polyak coefficient of the target critics (1: copy).
          discount: gamma.
          train_freq: steps of every environment between training phases (the loop's
            iteration length).
          gradient_steps: gradient steps of each training phase.
          target_update_interval: the targets follow after every this-many gradient steps,
            counted over the whole run (CleanRL's `target_network_frequency`; SB3 counts
            within a training phase, the same for its default of 1).
          learning_rate: Adam's learning rate for actor, critics and temperature.
          actor_learning_rate, critic_learning_rate, ent_coef_learning_rate: override
            `learning_rate` for one of them (CleanRL: 3e-4 for the actor, 1e-3 for the
            critics); None: `learning_rate`.
          adam_epsilon: Adam's epsilon (PyTorch's default, as SB3's).
          actor_hidden_sizes, critic_hidden_sizes: hidden layer sizes (SB3's net_arch).
          activation: of the hidden layers, a callable or the name of a tf.nn function.
          network_initializer: 'orthogonal' (hidden gain sqrt 2, the actor's heads 0.01, the
            critics' 1; zero biases) or 'torch_default' (PyTorch's `nn.Linear` default, which
            SB3's and CleanRL's SAC keep); networks.INITIALIZERS.
          learn_ent_coef: learn the temperature (SB3's ent_coef='auto'); False keeps it at
            `ent_coef_init` (SB3's ent_coef=<float>).
          ent_coef_init: the temperature's initial value (SB3's 'auto_<init>', default 1.0).
          target_entropy: the entropy the temperature steers towards; 'auto' is
            `-action_size`.
          checkpoint_buffer: keep the replay buffer in checkpoints, so that a resumed run goes
            on as if never stopped; False leaves it out (a resumed run then refills
            `learning_starts` steps before it trains again).
          jit_compile: compile `train` (all its gradient steps) with XLA.
          name: module name.
        """
        super().__init__(learning_starts, train_freq, gradient_steps, name=name)
        del num_envs, lr_anneal_updates  # No per-environment state, no schedules.
        learning_rates = {
            name: learning_rate if rate is None else rate
            for name, rate in (('actor', actor_learning_rate), ('critic', critic_learning_rate),
                               ('ent_coef', ent_coef_learning_rate))}
        actor_critic.check_arguments(
            positive_int=('batch_size', 'target_update_interval'),
            positive=('learning_rate', 'actor_learning_rate', 'critic_learning_rate',
                      'ent_coef_learning_rate', 'adam_epsilon', 'ent_coef_init'),
            unit_interval=('tau', 'discount'),
            batch_size=batch_size, target_update_interval=target_update_interval,
            learning_rate=learning_rate, actor_learning_rate=actor_learning_rate,
            critic_learning_rate=critic_learning_rate,
            ent_coef_learning_rate=ent_coef_learning_rate, adam_epsilon=adam_epsilon,
            ent_coef_init=ent_coef_init, tau=tau, discount=discount)
        if target_entropy == 'auto':
            target_entropy = -float(action_size)
        elif not isinstance(target_entropy, int | float) or isinstance(target_entropy, bool):
            raise ValueError(f"target_entropy must be 'auto' or a number, got "
                             f'{target_entropy!r}.')
        self.observ_shape = tuple(int(size) for size in observ_shape)
        observ_size = math.prod(self.observ_shape)
        self.policy = SquashedGaussianPolicy(
            self.observ_shape, action_size, actor_hidden_sizes, activation, seed=seed,
            initializer=network_initializer)
        # Twin critics Q(s, a) of the concatenated observation and action: two members.
        critic_seeds = [seed + 1000, seed + 2000]
        self.critic = networks.FeedForwardValue(
            (observ_size + action_size,), critic_hidden_sizes, activation, critic_seeds,
            initializer=network_initializer)
        self.critic_target = networks.FeedForwardValue(
            (observ_size + action_size,), critic_hidden_sizes, activation, critic_seeds,
            initializer=network_initializer)
        for target, source in zip(self.critic_target.variables, self.critic.variables,
                                  strict=True):
            target.assign(source)
        self.log_ent_coef = tf.Variable([math.log(ent_coef_init)], name='log_ent_coef')
        self.actor_optimizer = optimizers.Adam(
            self.policy.trainable_variables, learning_rates['actor'], epsilon=adam_epsilon,
            name='actor_optimizer')
        self.critic_optimizer = optimizers.Adam(
            self.critic.trainable_variables, learning_rates['critic'], epsilon=adam_epsilon,
            name='critic_optimizer')
        self.ent_coef_optimizer = optimizers.Adam(
            [self.log_ent_coef], learning_rates['ent_coef'], epsilon=adam_epsilon,
            name='ent_coef_optimizer')
        self.buffer = replay_buffer.ReplayBuffer(buffer_size, self.observ_shape, (action_size,))
        self.sampling_seeds = members.SeedStream([seed])
        self.gradient_step_count = tf.Variable(0, dtype=tf.int64, trainable=False,
                                               name='gradient_step_count')
        self._batch_size = batch_size
        self._tau = tau
        self._discount = discount
        self._target_update_interval = target_update_interval
        self._learn_ent_coef = bool(learn_ent_coef)
        self.target_entropy = float(target_entropy)
        self._checkpoint_buffer = checkpoint_buffer
        self._compiled_train = tf.function(self._train, jit_compile=bool(jit_compile),
                                           autograph=False)

    @property
    def batch_size(self):
        """Transitions sampled from the replay buffer for each gradient step."""
        return self._batch_size

    # The Algorithm interface.

    @property
    def action_dtype(self):
        return tf.float32

    def initial_state(self, batch_size):
        return ()

    def act(self, observ, state, reset_mask, greedy=False):
        """`tanh(mean)` if greedy, else a squashed sample; uniform in [-1, 1] before
        `learning_starts` steps were observed. No extras: the update needs none."""
        del reset_mask  # Feed-forward.
        # The networks' leading member axis: SAC is one member.
        params, state = self.policy.step(tf.cast(observ, tf.float32)[None], state)
        policy = self.policy.distribution(params)
        if greedy:
            return policy.mode()[0], {}, state
        sample_seed, uniform_seed = tf.unstack(
            tf.random.experimental.stateless_split(self.sampling_seeds.next()[0], 2))
        action = policy.sample(sample_seed)[0]
        uniform = tf.random.stateless_uniform(tf.shape(action), uniform_seed, -1.0, 1.0)
        warming_up = self.observed_steps < self.cadence.learning_starts
        return tf.where(warming_up, uniform, action), {}, state

    def observe(self, batch, keep):
        return self.buffer.add(batch, keep)

    def train(self, gradient_steps):
        return self._compiled_train(tf.constant(gradient_steps))

    def undo_variables(self):
        return [*self.policy.variables, *self.critic.variables, *self.critic_target.variables,
                self.log_ent_coef, *self.actor_optimizer.variables,
                *self.critic_optimizer.variables, *self.ent_coef_optimizer.variables,
                *self.sampling_seeds.variables, self.gradient_step_count]

    def checkpointed(self):
        """Everything, or (`checkpoint_buffer=False`) all but the buffer and its count of
        observed steps."""
        if self._checkpoint_buffer:
            return self
        return tf.train.Checkpoint(
            policy=self.policy, critic=self.critic, critic_target=self.critic_target,
            log_ent_coef=self.log_ent_coef, actor_optimizer=self.actor_optimizer,
            critic_optimizer=self.critic_optimizer, ent_coef_optimizer=self.ent_coef_optimizer,
            sampling_seeds=self.sampling_seeds, gradient_step_count=self.gradient_step_count)

    def acting_modules(self):
        return {'policy': self.policy}

    def exported_policy(self):
        return self.policy, None

    # The update.

    def _train(self, gradient_steps):
        """`gradient_steps` gradient steps (one TF program): the metrics averaged over the steps
        taken, and what went non-finite (the loop stops after a step where something did)."""
        sums = {name: tf.constant(0.0) for name in self.TRAIN_METRICS}
        bad = {name: tf.constant(False) for name in self.NONFINITE_QUANTITIES}

        def step(index, sums, bad):
            metrics, step_bad = self.gradient_step(self.sampling_seeds.next()[0])
            return (index + 1, {name: sums[name] + metrics[name] for name in sums},
                    {name: bad[name] | step_bad[name] for name in bad})

        taken, sums, bad = tf.while_loop(
            lambda index, unused_sums, bad: (index < gradient_steps) & ~tf.reduce_any(
                tf.stack(list(bad.values()))),
            step, (tf.constant(0), sums, bad))
        return {name: total / tf.cast(taken, tf.float32) for name, total in sums.items()}, bad

    def gradient_step(self, seed):
        """One gradient step of temperature, critics and actor on a minibatch drawn with the
        stateless `seed` ([2] int32), then the targets' Polyak update: (metrics, nonfinite)."""
        sample_seed, next_seed, policy_seed = tf.unstack(
            tf.random.experimental.stateless_split(seed, 3))
        data = self.buffer.sample(self._batch_size, sample_seed)
        observ, next_observ = data['observ'], data['next_observ']
        alpha = tf.exp(self.log_ent_coef[0])  # Its value before this step, throughout.

        # The policy's actions for the batch, by the policy before this step.
        with tf.GradientTape() as actor_tape:
            action_pi, log_prob = self._policy_sample(observ, policy_seed)

        # Temperature: raise alpha while the entropy (-log pi) is below its target.
        with tf.GradientTape() as tape:
            ent_coef_loss = -tf.reduce_mean(
                self.log_ent_coef[0] * tf.stop_gradient(log_prob + self.target_entropy))
        bad_ent_coef = self._apply(self.ent_coef_optimizer, ent_coef_loss, tape,
                                   [self.log_ent_coef], skip=not self._learn_ent_coef)

        # Critics: soft TD targets from the target critics; truncation bootstraps.
        next_action, next_log_prob = self._policy_sample(next_observ, next_seed)
        next_q = tf.reduce_min(self._q(self.critic_target, next_observ, next_action), axis=0)
        not_terminated = 1.0 - tf.cast(data['terminated'], tf.float32)
        target_q = tf.stop_gradient(data['reward'] + self._discount * not_terminated * (
            next_q - alpha * next_log_prob))
        with tf.GradientTape() as tape:
            q = self._q(self.critic, observ, data['action'])  # [2, B]
            critic_loss = 0.5 * tf.reduce_sum(tf.reduce_mean(tf.square(q - target_q), axis=1))
        bad_critic = self._apply(self.critic_optimizer, critic_loss, tape,
                                 self.critic.trainable_variables)

        # Actor: the actions drawn above, judged by the critics after their step.
        with actor_tape:
            q_pi = tf.reduce_min(self._q(self.critic, observ, action_pi), axis=0)
            actor_loss = tf.reduce_mean(alpha * log_prob - q_pi)
        bad_actor = self._apply(self.actor_optimizer, actor_loss, actor_tape,
                                self.policy.trainable_variables)

        count = self.gradient_step_count.assign_add(1)
        tf.cond(tf.equal(count % self._target_update_interval, 0),
                lambda: tf.group(polyak_update(self.critic_target.variables,
                                               self.critic.variables, self._tau)),
                tf.no_op)
        metrics = {
            'critic_loss': critic_loss, 'actor_loss': actor_loss,
            'ent_coef_loss': (ent_coef_loss if self._learn_ent_coef
                              else tf.constant(float('nan'))),
            'ent_coef': alpha, 'q_mean': tf.reduce_mean(q), 'entropy': -tf.reduce_mean(log_prob)}
        nonfinite = {
            'critic_loss': bad_critic.loss, 'actor_loss': bad_actor.loss,
            'ent_coef_loss': bad_ent_coef.loss,
            'gradient': bad_critic.gradient | bad_actor.gradient | bad_ent_coef.gradient}
        return metrics, nonfinite

    def _policy_sample(self, observ, seed):
        """A reparameterized action of the policy for each observation `[B, ...]` and its
        log-probability: ([B, A], [B])."""
        params, _ = self.policy.step(observ[None], ())
        action, log_prob = self.policy.distribution(params).sample_with_log_prob(seed)
        return action[0], log_prob[0]

    def _q(self, critic, observ, action):
        """Both critics' values of `observ` [B, ...] and `action` [B, A]: [2, B]."""
        inputs = tf.concat([tf.reshape(observ, [tf.shape(observ)[0], -1]), action], -1)
        return critic(tf.stack([inputs, inputs]))

    @staticmethod
    def _apply(optimizer, loss, tape, variables, skip=False):
        """Steps `variables` down the gradient of `loss` unless the loss or the gradient is not
        finite (or `skip`); returns which was not."""
        gradients = tape.gradient(loss, variables)
        bad = _Nonfinite(~tf.math.is_finite(loss),
                         ~tf.math.is_finite(tf.linalg.global_norm(gradients)))
        if skip:
            return _Nonfinite(tf.constant(False), tf.constant(False))
        apply = ~(bad.loss | bad.gradient)
        optimizer.apply(gradients, variables, tf.fill(tf.shape(optimizer.iterations), apply))
        return bad


class _Nonfinite:
    """Whether a loss and its gradient went non-finite ([] bool each)."""

    def __init__(self, loss, gradient):
        self.loss = loss
        self.gradient = gradient
