"""What PPO and A2C share: an actor-critic agent, everything but the objective.

An `ActorCritic` holds a policy and a value network (networks.py), streaming observation
statistics and a reward scaler (normalize.py), an optimizer over both networks and a random
generator for sampling. It acts, and gives its subclasses the parts of an update that do not
depend on the objective: the batch check, reward scaling with GAE targets, learning-rate
annealing and a clipped gradient step that a non-finite loss or gradient never reaches. A
subclass writes its objective and its update from these parts, as TF-Agents' agents are thin
variants of one.

Neither `act` nor `update` changes Python-side state: everything they read or write lives in TF
variables, so both run inside the loop's compiled iteration. Observation statistics are frozen
while acting and during the update, and take in the batch at its end, so the values `act`
recorded are the values the update sees.
"""

import functools

import tensorflow as tf

from agents.algorithms import advantages, algorithm, normalize

BATCH_KEYS = ('observ', 'action', 'reward', 'terminated', 'truncated', 'next_observ', 'extras')


def check_arguments(positive=(), positive_int=(), unit_interval=(), non_negative=(), **values):
    """Raises a ValueError naming the first argument outside its range; None always passes."""
    for name, value in values.items():
        if value is None:
            continue
        if name in positive_int and (not isinstance(value, int) or isinstance(value, bool) or
                                     value < 1):
            raise ValueError(f'{name} must be a positive integer, got {value!r}.')
        if name in positive and not value > 0:
            raise ValueError(f'{name} must be positive, got {value!r}.')
        if name in unit_interval and not 0.0 <= value <= 1.0:
            raise ValueError(f'{name} must lie in [0, 1], got {value!r}.')
        if name in non_negative and not value >= 0:
            raise ValueError(f'{name} must be non-negative, got {value!r}.')


class ActorCritic(algorithm.OnPolicyAlgorithm):
    """A policy and a value network trained on rollouts; subclasses define `_update`."""

    # What `nonfinite` names; `_gradient_step` reports code k for the k-th (0: none).
    NONFINITE_QUANTITIES = ('loss', 'gradient')
    # What `act` records for the update, of 'log_prob', 'value' and 'policy_params' (the
    # distribution's parameters); recurrent policies add 'policy_state'.
    EXTRAS_KEYS = ('value',)

    def __init__(self, observ_shape, action_size, num_envs, policy_network, value_network,
                 optimizer, discount, learning_rate, lr_anneal_updates, max_grad_norm,
                 normalize_observ, observ_clip, scale_reward, reward_clip, jit_compile,
                 jit_compile_act, seed, name):
        """Builds the networks, normalizers and generator; `optimizer` is a Keras optimizer
        (built here over both networks). The arguments are those of the subclasses."""
        super().__init__(name=name)
        check_arguments(
            positive_int=('num_envs', 'lr_anneal_updates'),
            positive=('learning_rate', 'max_grad_norm', 'observ_clip', 'reward_clip'),
            unit_interval=('discount',),
            num_envs=num_envs, lr_anneal_updates=lr_anneal_updates, learning_rate=learning_rate,
            max_grad_norm=max_grad_norm, observ_clip=observ_clip, reward_clip=reward_clip,
            discount=discount)
        self.observ_shape = tuple(int(size) for size in observ_shape)
        self.num_envs = num_envs
        self._discount = discount
        self._learning_rate = learning_rate
        self._lr_anneal_updates = lr_anneal_updates
        self._max_grad_norm = max_grad_norm
        self.jit_compile = bool(jit_compile)  # Of the update.
        self._normalize_observ = normalize_observ
        self._scale_reward = scale_reward
        self.policy = policy_network(
            observ_shape=self.observ_shape, action_size=action_size, seed=seed)
        self.value = value_network(observ_shape=self.observ_shape, seed=seed + 1000)
        self.observ_normalizer = normalize.StreamingNormalizer(
            self.observ_shape, center=True, scale=True, clip=observ_clip, name='observ_normalizer')
        self.reward_scaler = normalize.RewardScaler(
            num_envs, discount, clip=reward_clip, name='reward_scaler')
        self.optimizer = optimizer
        self.optimizer.build(self._trainable)
        self.update_count = tf.Variable(0, dtype=tf.int64, trainable=False, name='update_count')
        self.random = tf.random.Generator.from_seed(seed)
        self._sampling_act = tf.function(functools.partial(self._act, greedy=False),
                                         jit_compile=bool(jit_compile_act), autograph=False)
        self._greedy_act = tf.function(
            functools.partial(self._act, greedy=True), autograph=False)
        self._compiled_update = tf.function(self._update, jit_compile=jit_compile,
                                            autograph=False)

    @property
    def _trainable(self):
        """Policy then value weights (a property so the checkpoint keys them by network)."""
        return list(self.policy.trainable_variables + self.value.trainable_variables)

    # The Algorithm interface.

    @property
    def action_dtype(self):
        return self.policy.action_dtype

    def initial_state(self, batch_size):
        return self.policy.initial_state(batch_size)

    def act(self, observ, state, reset_mask, greedy=False):
        """One policy step: `(observ [N, ...], state, reset_mask [N]) -> action, extras, state`.

        `reset_mask` marks environments whose episode starts at this step; their state is zeroed
        first. `greedy` (a Python bool) picks the distribution's mode instead of sampling.
        """
        act = self._greedy_act if greedy else self._sampling_act
        return act(observ, state, reset_mask)

    def update(self, batch):
        """Trains on one time-major rollout (see algorithm.py); returns scalar metrics.

        A non-finite loss or gradient is never applied; the `nonfinite` metric names it
        ({quantity: bool} of NONFINITE_QUANTITIES). Statistics updates happen regardless: the
        loop undoes them.
        """
        self._check_batch(batch)
        return self._compiled_update(batch)

    def undo_variables(self):
        # Neither Keras' optimizer variables (`value` is the tf.Variable) nor the generator are
        # tf.Modules, whose variables `self.variables` finds.
        return [*self.variables, *(variable.value for variable in self.optimizer.variables),
                self.random.state]

    def acting_modules(self):
        return {'policy': self.policy, 'value': self.value,
                'observ_normalizer': self.observ_normalizer}

    def exported_policy(self):
        return self.policy, self.observ_normalizer if self._normalize_observ else None

    # For the subclasses.

    @classmethod
    def nonfinite_report(cls, code):
        """{quantity: bool} of a `_gradient_step` code ([] or [K] int; 0: none)."""
        return {name: tf.equal(code, index + 1)
                for index, name in enumerate(cls.NONFINITE_QUANTITIES)}

    @property
    def normalizes_observ(self):
        """Whether `normalize` standardizes observations (else it only casts them)."""
        return self._normalize_observ

    def normalize(self, observ):
        """The observation as the networks see it: float32, normalized if configured."""
        observ = tf.cast(observ, tf.float32)
        return self.observ_normalizer.normalize(observ) if self._normalize_observ else observ

    def _next_seed(self):
        return tf.cast(self.random.make_seeds(1)[:, 0], tf.int32)

    def _act(self, observ, state, reset_mask, greedy):
        observ = self.normalize(observ)
        state = self.policy.reset_state(state, reset_mask)
        params, new_state = self.policy.step(observ, state)
        policy = self.policy.distribution(params)
        action = policy.mode() if greedy else policy.sample(seed=self._next_seed())
        extras = {}
        if 'log_prob' in self.EXTRAS_KEYS:
            extras['log_prob'] = policy.log_prob(action)
        extras['value'] = self.value(observ)
        if 'policy_params' in self.EXTRAS_KEYS:
            extras['policy_params'] = params
        if self.policy.recurrent:
            extras['policy_state'] = state
        return action, extras, new_state

    def _update(self, batch):
        """The update as one TF program (compiled as `_compiled_update`): metrics."""
        raise NotImplementedError

    def _targets(self, batch, gae_lambda):
        """Scales the rewards (updating the scaler) and computes GAE(lambda) on the batch.

        Returns (scaled reward, advantage, return, done), each `[T, N]`.
        """
        terminated = tf.cast(batch['terminated'], tf.bool)
        truncated = tf.cast(batch['truncated'], tf.bool)
        done = terminated | truncated
        reward = tf.cast(batch['reward'], tf.float32)
        if self._scale_reward:
            self.reward_scaler.update(reward, done)
            reward = self.reward_scaler.scale(reward)
        advantage, return_ = advantages.generalized_advantage_estimation(
            reward, batch['extras']['value'], self.value(self.normalize(batch['next_observ'])),
            terminated, truncated, self._discount, gae_lambda)
        return reward, advantage, return_, done

    def _anneal_learning_rate(self):
        """Sets the learning rate for this update: linear decay to zero over
        `lr_anneal_updates` updates, if given."""
        if self._lr_anneal_updates:
            progress = tf.cast(self.update_count, tf.float32) / self._lr_anneal_updates
            self.optimizer.learning_rate.assign(
                self._learning_rate * tf.maximum(0.0, 1.0 - progress))

    def _gradient_step(self, loss, tape):
        """Clips the gradient of `loss` and applies it unless the loss or the gradient is not
        finite; returns (the applied flag, the gradient's global norm, the nonfinite code)."""
        gradients = tape.gradient(loss, self._trainable)
        if self._max_grad_norm:
            gradients, norm = tf.clip_by_global_norm(gradients, self._max_grad_norm)
        else:
            norm = tf.linalg.global_norm(gradients)
        # A gradient with a NaN or an infinity has a non-finite global norm.
        nonfinite = tf.where(~tf.math.is_finite(loss), 1,
                             tf.where(~tf.math.is_finite(norm), 2, 0))

        def apply():
            self.optimizer.apply_gradients(zip(gradients, self._trainable, strict=True))
            return tf.constant(True)

        applied = tf.cond(nonfinite > 0, lambda: tf.constant(False), apply)
        return applied, norm, nonfinite

    def _finish_update(self, batch):
        """What ends every update: the observation statistics take in the batch; the update
        is counted."""
        if self._normalize_observ:
            self.observ_normalizer.update(batch['observ'])
        self.update_count.assign_add(1)

    @staticmethod
    def _summary(reward, advantage, return_, value):
        """The metrics every actor-critic update reports besides its objective's."""
        return {
            'advantage_mean': tf.reduce_mean(advantage),
            'return_mean': tf.reduce_mean(return_),
            'value_mean': tf.reduce_mean(value),
            'scaled_reward_mean': tf.reduce_mean(reward),
            'explained_variance': 1.0 - tf.math.reduce_variance(return_ - value) / tf.maximum(
                tf.math.reduce_variance(return_), 1e-8),
        }

    @tf.autograph.experimental.do_not_convert
    def _check_batch(self, batch):
        """Static (trace-time) validation with errors that name the offending entry."""
        if not isinstance(batch, dict):
            raise TypeError(f'batch must be a dict with keys {BATCH_KEYS}, got {type(batch)}.')
        extras = batch.get('extras', {})
        needed = self.EXTRAS_KEYS + (('policy_state',) if self.policy.recurrent else ())
        missing = [key for key in BATCH_KEYS if key not in batch]
        missing += [f'extras/{key}' for key in needed if key not in extras]
        if missing:
            raise ValueError(f'batch is missing {missing}.')
        steps = tf.TensorShape(batch['reward'].shape)
        if steps.rank != 2:
            raise ValueError(f'reward must be time-major [T, N], got shape {steps}.')
        if steps[1] is not None and steps[1] != self.num_envs:
            raise ValueError(f'batch has {steps[1]} environments but the agent was built for '
                             f'num_envs={self.num_envs}.')
        expected = {
            'observ': steps.concatenate(self.observ_shape),
            'next_observ': steps.concatenate(self.observ_shape),
            'action': steps.concatenate(self.policy.action_shape),
            'terminated': steps,
            'truncated': steps,
            **{f'extras/{key}': steps for key in ('log_prob', 'value') if key in needed},
        }
        for key, shape in expected.items():
            tensor = extras[key[7:]] if key.startswith('extras/') else batch[key]
            if not tf.TensorShape(tensor.shape).is_compatible_with(shape):
                raise ValueError(f'batch[{key!r}] has shape {tensor.shape}, expected {shape} '
                                 '(time-major [T, N, ...] like reward).')
        for key in ('policy_params', 'policy_state'):
            for tensor in tf.nest.flatten(extras.get(key, ())):
                if not tf.TensorShape(tensor.shape)[:2].is_compatible_with(steps):
                    raise ValueError(f'batch extras/{key} has an entry of shape {tensor.shape}, '
                                     f'expected it to start with [T, N] = {steps}.')
        action_dtype = tf.as_dtype(batch['action'].dtype)
        if action_dtype.is_integer != self.policy.action_dtype.is_integer:
            raise ValueError(f'batch action dtype {action_dtype.name} does not suit '
                             f'{type(self.policy).__name__} ({self.policy.action_dtype.name}).')
