"""Synchronous advantage actor-critic (A2C): a `tf.Module` with TF-function `act` and `update`.

This follows Stable-Baselines3's A2C (stable_baselines3/a2c/a2c.py), the synchronous variant of the
A3C paper (Mnih et al. 2016, https://arxiv.org/abs/1602.01783): each update takes exactly one
gradient step on the whole rollout, `T` steps of `N = num_envs` environments, with

    loss = policy_loss + value_coef * value_loss - entropy_coef * entropy
    policy_loss = -mean(advantage * log pi(action | observ))
    value_loss = mean((return - V(observ))^2)      (SB3's F.mse_loss: no factor 0.5)

where advantages and returns come from GAE(lambda) over the rollout (lambda = 1 by default: plain
n-step returns bootstrapped from the value of the observation after the rollout's last step, or
after a truncated episode's last one). The mean is over all `T x N` steps.

The update expects a time-major rollout `batch` (see agents/algorithms/algorithm.py):

    observ       [T, N, *observ_shape]  observation acted upon (raw, not normalized)
    action       [T, N, *action_shape]  action returned by `act`
    reward       [T, N]                 raw reward
    terminated   [T, N] bool            the episode reached a terminal state at this step
    truncated    [T, N] bool            the episode was cut (time limit) at this step
    next_observ  [T, N, *observ_shape]  observation after the step; where the episode ended, its
                                        final observation (bootstraps truncated episodes)
    extras       what `act` returned, stacked over time: value [T, N] and, for recurrent
                 policies, policy_state [T, N, ...] (the state the policy started the step from;
                 the update reads only the first step's).

Unlike PPO's, the extras hold no log-probs or distribution parameters: A2C is on-policy with a
single gradient step, so the policy that acted is the one the update differentiates, and
recomputing its log-probs inside the gradient tape is all the update needs.

Observation statistics are frozen while acting and during the update, and take in the batch's
observations at its end, so the values recorded by `act` are the values the update's loss sees.
"""

import functools

import gin
import tensorflow as tf

from agents.algorithms import advantages, algorithm, networks, normalize

OPTIMIZERS = ('rmsprop', 'adam')
BATCH_KEYS = ('observ', 'action', 'reward', 'terminated', 'truncated', 'next_observ', 'extras')
EXTRAS_KEYS = ('value',)


class TorchRMSprop(tf.keras.optimizers.Optimizer):
    """RMSprop as PyTorch computes it, hence as SB3's A2C steps (`use_rms_prop=True`).

    `v = alpha * v + (1 - alpha) * g^2` (from zero), then `w -= lr * g / (sqrt(v) + epsilon)`.
    Keras' RMSprop adds epsilon inside the root, `sqrt(v + epsilon)`: with SB3's epsilon 1e-5 that
    floors the denominator at 3e-3 instead of 1e-5, so gradient entries below about 0.03 would
    take far smaller steps than in SB3. (SB3's optional RMSpropTFLike, the TF1 variant, also
    starts `v` at one; that is not this.)
    """

    def __init__(self, learning_rate, alpha=0.99, epsilon=1e-5, name='rmsprop'):
        super().__init__(learning_rate=learning_rate, name=name)
        self.alpha = alpha
        self.epsilon = epsilon

    def build(self, var_list):
        if self.built:
            return
        super().build(var_list)
        self._square_averages = self.add_optimizer_variables(var_list, 'square_average')

    def update_step(self, gradient, variable, learning_rate):
        square_average = self._square_averages[self._get_variable_index(variable)]
        gradient = tf.cast(gradient, variable.dtype)
        self.assign(square_average, self.alpha * square_average +
                    (1.0 - self.alpha) * tf.square(gradient))
        step = tf.cast(learning_rate, variable.dtype) * gradient / (
            tf.sqrt(square_average) + self.epsilon)
        self.assign_sub(variable, step)


def _check_arguments(positive=(), positive_int=(), unit_interval=(), non_negative=(),
                     **values):
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


@gin.configurable
class A2C(algorithm.Algorithm):
    """A2C agent: policy and value networks, optimizer, normalizers and update counter.

    The defaults are SB3's A2C defaults: learning rate 7e-4, RMSprop (alpha 0.99, epsilon 1e-5),
    discount 0.99, gae_lambda 1.0, value_coef 0.5, entropy_coef 0.0, gradient-norm clip 0.5, no
    advantage normalization; neither observations nor rewards are normalized (SB3 leaves that
    to a VecNormalize wrapper, which the zoo enables per environment). The rollout length
    (SB3's n_steps = 5) is the loop's, not the algorithm's.
    """

    NONFINITE_QUANTITIES = {1: 'loss', 2: 'gradient'}

    def __init__(
            self,
            observ_shape,
            action_size,
            num_envs,
            policy_network=networks.FeedForwardGaussianPolicy,
            value_network=networks.FeedForwardValue,
            discount=0.99,
            gae_lambda=1.0,
            learning_rate=7e-4,
            lr_anneal_updates=None,
            optimizer='rmsprop',
            rmsprop_alpha=0.99,
            optimizer_epsilon=1e-5,
            max_grad_norm=0.5,
            value_coef=0.5,
            entropy_coef=0.0,
            normalize_advantages=False,
            normalize_observ=False,
            observ_clip=10.0,
            scale_reward=False,
            reward_clip=10.0,
            jit_compile=True,
            jit_compile_act=False,
            seed=0,
            name=None):
        """Builds the agent.

        Args:
          observ_shape: shape of one observation.
          action_size: action dimensions (continuous) or number of actions (discrete); passed
            to `policy_network`.
          num_envs: environments in a rollout (the reward scaler keeps one discounted return
            per environment).
          policy_network: factory `(observ_shape, action_size, seed) -> policy` (networks.py).
            Recurrent policies train on the whole rollout as one sequence per environment.
          value_network: factory `(observ_shape, seed) -> value network`.
          discount: gamma.
          gae_lambda: GAE's lambda; SB3's A2C default 1.0 gives n-step returns.
          learning_rate: the optimizer's initial learning rate.
          lr_anneal_updates: updates over which the learning rate decays linearly to zero (as
            the zoo's `lin_7e-4`); None keeps it constant.
          optimizer: 'rmsprop' (SB3's `use_rms_prop=True`: PyTorch's RMSprop, see TorchRMSprop)
            or 'adam' (SB3's `use_rms_prop=False`: Adam with betas (0.9, 0.999)).
          rmsprop_alpha: RMSprop's decay of the squared-gradient average (PyTorch's alpha,
            Keras' rho).
          optimizer_epsilon: epsilon of either optimizer (SB3: rms_prop_eps 1e-5; for Adam its
            ActorCriticPolicy also sets 1e-5).
          max_grad_norm: global gradient-norm clip (over policy and value weights together, as
            SB3 clips all the policy's parameters); None disables clipping.
          value_coef, entropy_coef: weights of the value loss and of the entropy bonus.
          normalize_advantages: standardize the rollout's advantages as SB3 does, with the
            unbiased standard deviation: `(A - mean) / (std + 1e-8)`.
          normalize_observ: standardize observations by streaming statistics (VecNormalize's
            norm_obs).
          observ_clip: clip normalized observations to +- this value (VecNormalize's clip_obs
            10); None: no clip.
          scale_reward: divide rewards by the std of the discounted return (VecNormalize's
            norm_reward).
          reward_clip: clip scaled rewards to +- this value (VecNormalize's clip_reward 10);
            None: no clip.
          jit_compile: compile `update` with XLA.
          jit_compile_act: compile the sampling `act` with XLA; off by default for the reason
            PPO's docstring measures (XLA's spinning intra-op threads slow environment workers).
          seed: seeds network initialization and action sampling.
          name: module name.
        """
        super().__init__(name=name)
        if optimizer not in OPTIMIZERS:
            raise ValueError(f'Unknown optimizer {optimizer!r}; expected one of {OPTIMIZERS}.')
        _check_arguments(
            positive_int=('num_envs', 'lr_anneal_updates'),
            positive=('learning_rate', 'optimizer_epsilon', 'max_grad_norm', 'observ_clip',
                      'reward_clip'),
            unit_interval=('discount', 'gae_lambda'),
            non_negative=('value_coef', 'entropy_coef'),
            num_envs=num_envs, lr_anneal_updates=lr_anneal_updates,
            learning_rate=learning_rate, optimizer_epsilon=optimizer_epsilon,
            max_grad_norm=max_grad_norm, observ_clip=observ_clip, reward_clip=reward_clip,
            discount=discount, gae_lambda=gae_lambda, value_coef=value_coef,
            entropy_coef=entropy_coef)
        if not 0.0 <= rmsprop_alpha < 1.0:
            raise ValueError(f'rmsprop_alpha must lie in [0, 1), got {rmsprop_alpha!r}.')
        self.observ_shape = tuple(int(size) for size in observ_shape)
        self.num_envs = num_envs
        self._discount = discount
        self._gae_lambda = gae_lambda
        self._learning_rate = learning_rate
        self._lr_anneal_updates = lr_anneal_updates
        self._max_grad_norm = max_grad_norm
        self._value_coef = value_coef
        self._entropy_coef = entropy_coef
        self._normalize_advantages = normalize_advantages
        self._normalize_observ = normalize_observ
        self._scale_reward = scale_reward

        self.policy = policy_network(
            observ_shape=self.observ_shape, action_size=action_size, seed=seed)
        self.value = value_network(observ_shape=self.observ_shape, seed=seed + 1000)
        self.observ_normalizer = normalize.StreamingNormalizer(
            self.observ_shape, center=True, scale=True, clip=observ_clip, name='observ_normalizer')
        self.reward_scaler = normalize.RewardScaler(
            num_envs, discount, clip=reward_clip, name='reward_scaler')
        if optimizer == 'rmsprop':
            self.optimizer = TorchRMSprop(learning_rate, alpha=rmsprop_alpha,
                                          epsilon=optimizer_epsilon)
        else:
            self.optimizer = tf.keras.optimizers.Adam(learning_rate=learning_rate,
                                                      epsilon=optimizer_epsilon)
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

    @property
    def action_dtype(self):
        return self.policy.action_dtype

    def initial_state(self, batch_size):
        return self.policy.initial_state(batch_size)

    def _normalize(self, observ):
        """The observation as the networks see it: float32, normalized if configured."""
        observ = tf.cast(observ, tf.float32)
        return self.observ_normalizer.normalize(observ) if self._normalize_observ else observ

    def _next_seed(self):
        return tf.cast(self.random.make_seeds(1)[:, 0], tf.int32)

    def act(self, observ, state, reset_mask, greedy=False):
        """One policy step: `(observ [N, ...], state, reset_mask [N]) -> action, extras, state`.

        `reset_mask` marks environments whose episode starts at this step; their state is zeroed
        first. `greedy` (a Python bool) takes the distribution's mode instead of sampling.
        `extras` holds only what `update` reads: the value estimate `[N]` (GAE's baseline) and,
        for recurrent policies, the state the step started from.
        """
        act = self._greedy_act if greedy else self._sampling_act
        return act(observ, state, reset_mask)

    def _act(self, observ, state, reset_mask, greedy):
        observ = self._normalize(observ)
        state = self.policy.reset_state(state, reset_mask)
        params, new_state = self.policy.step(observ, state)
        policy = self.policy.distribution(params)
        action = policy.mode() if greedy else policy.sample(seed=self._next_seed())
        extras = {'value': self.value(observ)}
        if self.policy.recurrent:
            extras['policy_state'] = state
        return action, extras, new_state

    def update(self, batch):
        """One gradient step on the whole rollout (see the module docstring); scalar metrics.

        A non-finite loss or gradient skips the step (the weights and optimizer slots stay
        as they were) and the `nonfinite` metric names it (see NONFINITE_QUANTITIES). The
        statistics updates happen regardless; the loop undoes them from its copy of
        `train_variables`.
        """
        self._check_batch(batch)
        return self._compiled_update(batch)

    def _update(self, batch):
        """The update as one TF program: reward scaling, GAE, the gradient step, statistics."""
        extras = batch['extras']
        terminated = tf.cast(batch['terminated'], tf.bool)
        truncated = tf.cast(batch['truncated'], tf.bool)
        done = terminated | truncated
        reward = tf.cast(batch['reward'], tf.float32)
        if self._scale_reward:
            self.reward_scaler.update(reward, done)
            reward = self.reward_scaler.scale(reward)
        value = tf.cast(extras['value'], tf.float32)
        advantage, return_ = advantages.generalized_advantage_estimation(
            reward, value, self.value(self._normalize(batch['next_observ'])),
            terminated, truncated, self._discount, self._gae_lambda)
        data = {
            'observ': self._normalize(batch['observ']),
            'action': tf.cast(batch['action'], self.policy.action_dtype),
            'advantage': advantage,
            'return': return_,
            # The state recorded at the first step is already reset; later steps restart it
            # after every episode end.
            'reset': tf.concat([tf.zeros_like(done[:1]), done[:-1]], 0),
            'policy_state': tf.nest.map_structure(
                lambda state: state[0], extras.get('policy_state', ())),
        }

        if self._lr_anneal_updates:
            progress = tf.cast(self.update_count, tf.float32) / self._lr_anneal_updates
            self.optimizer.learning_rate.assign(
                self._learning_rate * tf.maximum(0.0, 1.0 - progress))
        with tf.GradientTape() as tape:
            loss, metrics = self.loss(data)
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
        with tf.control_dependencies([applied]):
            if self._normalize_observ:
                self.observ_normalizer.update(batch['observ'])
            self.update_count.assign_add(1)
        metrics.update({
            'gradient_norm': norm,
            'learning_rate': tf.identity(self.optimizer.learning_rate),
            'explained_variance': 1.0 - tf.math.reduce_variance(return_ - value) / tf.maximum(
                tf.math.reduce_variance(return_), 1e-8),
            'advantage_mean': tf.reduce_mean(advantage),
            'return_mean': tf.reduce_mean(return_),
            'value_mean': tf.reduce_mean(value),
            'nonfinite': tf.cast(nonfinite, tf.float32),  # See NONFINITE_QUANTITIES.
        })
        return metrics

    def loss(self, data):
        """The whole A2C objective on a rollout of time-major `[T, N, ...]` data: (loss, metrics).

        `data` holds observ (normalized), action, advantage, return, reset (restart the policy
        state before step t) and policy_state (the state at step 0; `()` for feed-forward
        policies). Advantages and returns are targets, not differentiated through.
        """
        params = self.policy.sequence(data['observ'], data['policy_state'], data['reset'])
        policy = self.policy.distribution(params)
        advantage = tf.stop_gradient(data['advantage'])
        if self._normalize_advantages:
            # SB3 divides by torch's std, which is the unbiased one.
            count = tf.cast(tf.size(advantage), tf.float32)
            mean, variance = tf.nn.moments(advantage, axes=[0, 1])
            std = tf.sqrt(variance * count / tf.maximum(count - 1.0, 1.0))
            advantage = (advantage - mean) / (std + 1e-8)
        policy_loss = -tf.reduce_mean(advantage * policy.log_prob(data['action']))
        value_loss = tf.reduce_mean(
            tf.square(tf.stop_gradient(data['return']) - self.value(data['observ'])))
        entropy = tf.reduce_mean(policy.entropy())
        loss = policy_loss + self._value_coef * value_loss - self._entropy_coef * entropy
        metrics = {'loss': loss, 'policy_loss': policy_loss, 'value_loss': value_loss,
                   'entropy': entropy}
        return loss, metrics

    def train_variables(self):
        """Networks, normalizer and scaler statistics, update counter, optimizer slots (Keras
        variables, which `tf.Module.variables` does not find) and the sampling generator."""
        optimizer_variables = [variable.value for variable in self.optimizer.variables]
        seen, variables = set(), []
        for variable in (list(self.variables) + optimizer_variables + [self.random.state]):
            if variable.ref() not in seen:
                seen.add(variable.ref())
                variables.append(variable)
        return variables

    def acting_modules(self):
        return {'policy': self.policy, 'value': self.value,
                'observ_normalizer': self.observ_normalizer}

    def exported_policy(self):
        return self.policy, (self.observ_normalizer if self._normalize_observ else None)

    @tf.autograph.experimental.do_not_convert
    def _check_batch(self, batch):
        """Static (trace-time) validation with errors that name the offending entry."""
        if not isinstance(batch, dict):
            raise TypeError(f'batch must be a dict with keys {BATCH_KEYS}, got {type(batch)}.')
        extras = batch.get('extras', {})
        needed_extras = EXTRAS_KEYS + (('policy_state',) if self.policy.recurrent else ())
        missing = [key for key in BATCH_KEYS if key not in batch]
        missing += [f'extras/{key}' for key in needed_extras if key not in extras]
        if missing:
            raise ValueError(f'batch is missing {missing}.')
        steps = tf.TensorShape(batch['reward'].shape)
        if steps.rank != 2:
            raise ValueError(f'reward must be time-major [T, N], got shape {steps}.')
        if steps[1] is not None and steps[1] != self.num_envs:
            raise ValueError(f'batch has {steps[1]} environments but the agent was built for '
                             f'num_envs={self.num_envs}.')
        tensors = {key: batch[key] for key in BATCH_KEYS if key != 'extras'}
        tensors['extras/value'] = extras['value']
        expected = {
            'observ': steps.concatenate(self.observ_shape),
            'next_observ': steps.concatenate(self.observ_shape),
            'action': steps.concatenate(self.policy.action_shape),
        }
        for key, tensor in tensors.items():
            shape = expected.get(key, steps)
            if not tf.TensorShape(tensor.shape).is_compatible_with(shape):
                raise ValueError(f'batch[{key!r}] has shape {tensor.shape}, expected {shape} '
                                 '(time-major [T, N, ...] like reward).')
        for tensor in tf.nest.flatten(extras.get('policy_state', ())):
            if not tf.TensorShape(tensor.shape)[:2].is_compatible_with(steps):
                raise ValueError(f'batch extras/policy_state has an entry of shape '
                                 f'{tensor.shape}, expected it to start with [T, N] = {steps}.')
        action_dtype = tf.as_dtype(batch['action'].dtype)
        if action_dtype.is_integer != self.policy.action_dtype.is_integer:
            raise ValueError(f'batch action dtype {action_dtype.name} does not suit '
                             f'{type(self.policy).__name__} ({self.policy.action_dtype.name}).')
