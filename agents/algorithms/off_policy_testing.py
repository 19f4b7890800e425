"""A small off-policy algorithm that proves the run loop's off-policy half (tests only).

`OffPolicyTesting` keeps every transition in a replay buffer (replay_buffer.py) and trains a Q
network on TD targets and a tanh-squashed Gaussian policy's mean to maximize Q, as DDPG does
(Lillicrap et al. 2016), without target networks: enough to learn from a replay buffer, train
every `train_freq` steps with `gradient_steps` gradient steps once `learning_starts` steps were
observed, resume with or without its buffer, and be undone after a non-finite step without its
buffer being copied.
"""

import gin
import tensorflow as tf

from agents.algorithms import algorithm, networks, replay_buffer


@gin.configurable
class OffPolicyTesting(algorithm.OffPolicyAlgorithm):
    """A replay buffer, a Q network and a policy trained to maximize it."""

    TRAIN_METRICS = ('q_loss', 'policy_loss', 'q_mean')
    NONFINITE_QUANTITIES = ('q_loss', 'policy_loss')

    def __init__(self, observ_shape, action_size, num_envs, seed=0, lr_anneal_updates=None,
                 buffer_size=4096, learning_starts=64, train_freq=1, gradient_steps=1,
                 batch_size=32, discount=0.9, learning_rate=1e-3, hidden_sizes=(16,),
                 checkpoint_buffer=True, nonfinite_at_train=None, name=None):
        """`nonfinite_at_train` (k, or None): the k-th call of `train` (1, 2, ...; undone calls
        count too) computes a NaN Q loss, as a diverging update would."""
        super().__init__(learning_starts, train_freq, gradient_steps, name=name)
        del num_envs, lr_anneal_updates  # No per-environment state, no schedules.
        observ_size = int(tf.TensorShape(observ_shape).num_elements())
        self.policy = networks.FeedForwardGaussianPolicy(
            observ_shape, action_size, hidden_sizes, init_std=0.5, seed=seed)
        self.q = networks.FeedForwardValue((observ_size + action_size,), hidden_sizes,
                                           seed=seed + 1000)
        self.policy_optimizer = tf.keras.optimizers.Adam(learning_rate)
        self.policy_optimizer.build(self.policy.trainable_variables)
        self.q_optimizer = tf.keras.optimizers.Adam(learning_rate)
        self.q_optimizer.build(self.q.trainable_variables)
        self.buffer = replay_buffer.ReplayBuffer(buffer_size, observ_shape, (action_size,))
        self.random = tf.random.Generator.from_seed(seed)
        self.train_calls = tf.Variable(0, dtype=tf.int64, trainable=False, name='train_calls')
        # Counts undone calls too: not among `undo_variables`.
        self.train_attempts = tf.Variable(0, dtype=tf.int64, trainable=False,
                                          name='train_attempts')
        self._batch_size = batch_size
        self._discount = discount
        self._checkpoint_buffer = checkpoint_buffer
        self._nonfinite_at_train = nonfinite_at_train

    @property
    def action_dtype(self):
        return tf.float32

    def initial_state(self, batch_size):
        return ()

    def act(self, observ, state, reset_mask, greedy=False):
        # The networks' leading member axis: this algorithm is one member.
        params, state = self.policy.step(tf.cast(observ, tf.float32)[None], state)
        policy = self.policy.distribution(params)
        action = policy.mode() if greedy else policy.sample(seed=self._next_seed())
        return tf.tanh(action[0]), {}, state  # In [-1, 1], where Q is trained.

    def observe(self, batch, keep):
        return self.buffer.add(batch, keep)

    def train(self, gradient_steps):
        self.train_calls.assign_add(1)
        attempt = self.train_attempts.assign_add(1)
        poison = (tf.where(tf.equal(attempt, self._nonfinite_at_train), float('nan'), 1.0)
                  if self._nonfinite_at_train else tf.constant(1.0))
        zeros = {name: tf.constant(0.0) for name in self.TRAIN_METRICS}

        def step(index, sums, bad):
            metrics, step_bad = self._gradient_step(poison)
            return (index + 1, {name: sums[name] + metrics[name] for name in sums},
                    {name: bad[name] | step_bad[name] for name in bad})

        _, sums, bad = tf.while_loop(
            lambda index, *unused: index < gradient_steps, step,
            (tf.constant(0), zeros, {name: tf.constant(False)
                                     for name in self.NONFINITE_QUANTITIES}))
        return {name: total / gradient_steps for name, total in sums.items()}, bad

    def _gradient_step(self, poison):
        """One Q step on TD targets, then one policy step up the Q function."""
        sample = self.buffer.sample(self._batch_size, self._next_seed())
        next_action = self._mean_action(sample['next_observ'])
        not_done = 1.0 - tf.cast(sample['terminated'], tf.float32)
        target = tf.stop_gradient(sample['reward'] + self._discount * not_done * self._q(
            sample['next_observ'], next_action))
        with tf.GradientTape() as tape:
            q_value = self._q(sample['observ'], sample['action'])
            q_loss = tf.reduce_mean(tf.square(q_value - target)) * poison
        q_bad = self._apply(q_loss, tape, self.q, self.q_optimizer)
        with tf.GradientTape() as tape:
            policy_loss = -tf.reduce_mean(self._q(sample['observ'],
                                                  self._mean_action(sample['observ'])))
        policy_bad = self._apply(policy_loss, tape, self.policy, self.policy_optimizer,
                                 skip=q_bad)
        metrics = {'q_loss': q_loss, 'policy_loss': policy_loss,
                   'q_mean': tf.reduce_mean(q_value)}
        return metrics, {'q_loss': q_bad, 'policy_loss': policy_bad}

    @staticmethod
    def _apply(loss, tape, network, optimizer, skip=False):
        """Applies the gradient of `loss` unless it or `skip` is not finite; returns whether
        the loss was non-finite."""
        variables = network.trainable_variables
        gradients = tape.gradient(loss, variables)
        bad = ~tf.math.is_finite(loss)

        def apply():
            optimizer.apply_gradients(zip(gradients, variables, strict=True))
            return tf.constant(True)

        tf.cond(bad | skip, lambda: tf.constant(False), apply)
        return bad

    def _q(self, observ, action):
        return self.q(tf.concat(
            [tf.reshape(observ, [tf.shape(observ)[0], -1]), action], -1)[None])[0]

    def _mean_action(self, observ):
        return tf.tanh(self.policy.step(observ[None], ())[0]['loc'][0])

    def _next_seed(self):
        return tf.cast(self.random.make_seeds(1)[:, 0], tf.int32)

    def undo_variables(self):
        return [*self.policy.variables, *self.q.variables,
                *(variable.value for variable in self.policy_optimizer.variables),
                *(variable.value for variable in self.q_optimizer.variables),
                self.random.state, self.train_calls]

    def checkpointed(self):
        """Everything, or (`checkpoint_buffer=False`) all but the buffer and its count of
        observed steps: a resumed run then refills `learning_starts` steps before it trains."""
        if self._checkpoint_buffer:
            return self
        return tf.train.Checkpoint(
            policy=self.policy, q=self.q, policy_optimizer=self.policy_optimizer,
            q_optimizer=self.q_optimizer, random=self.random, train_calls=self.train_calls)

    def acting_modules(self):
        return {'policy': self.policy}

    def exported_policy(self):
        return self.policy, None
