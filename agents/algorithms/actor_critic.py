"""What PPO and A2C share: an actor-critic agent of K members, everything but the objective.

An `ActorCritic` holds a policy and a value network (networks.py), streaming observation
statistics and a reward scaler (normalize.py), an optimizer over both networks (optimizers.py)
and a stream of sampling seeds. It acts, and gives its subclasses the parts of an update that do
not depend on the objective: the batch check, reward scaling with GAE targets, learning-rate
annealing and a clipped gradient step that a non-finite loss or gradient never reaches. A
subclass writes its objective and its update from these parts, as TF-Agents' agents are thin
variants of one.

Every part carries the member axis (members.py): a lone agent is a population of one, and a
population of K is built from K lone agents (`members`), whose seeds and member
hyperparameters it takes and which stay its checkpointed form. The batch an agent sees is the
loop's, `[T, K * num_envs, ...]` with member k's environments in the k-th block; the update
works on it member-major, `[K, T, num_envs, ...]`, and its metrics are `[K]`.

Neither `act` nor `update` changes Python-side state: everything they read or write lives in TF
variables, so both run inside the loop's compiled iteration. Observation statistics are frozen
while acting and during the update, and take in the batch at its end, so the values `act`
recorded are the values the update sees.
"""

import functools

import tensorflow as tf

from agents.algorithms import advantages, algorithm, members, normalize

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
    MEMBER_HYPERPARAMETERS = ('learning_rate', 'entropy_coef', 'discount', 'gae_lambda')
    POLICY_NETWORK_ARGUMENT = 'policy_network'

    def __init__(self, observ_shape, action_size, num_envs, policy_network, value_network,
                 optimizer, hyperparameters, lr_anneal_updates, max_grad_norm, normalize_observ,
                 observ_clip, scale_reward, reward_clip, jit_compile, jit_compile_act, seed,
                 population, name):
        """Builds the networks, normalizers and optimizer. `optimizer`: `(variables,
        learning_rates) -> optimizers.Adam or RMSprop`; `hyperparameters`: this agent's values
        of MEMBER_HYPERPARAMETERS; `population`: None, or the lone agents whose seeds and
        hyperparameters the members take. The other arguments are those of the subclasses."""
        super().__init__(name=name)
        check_arguments(
            positive_int=('num_envs', 'lr_anneal_updates'),
            positive=('learning_rate', 'max_grad_norm', 'observ_clip', 'reward_clip'),
            unit_interval=('discount', 'gae_lambda'), non_negative=('entropy_coef',),
            num_envs=num_envs, lr_anneal_updates=lr_anneal_updates,
            max_grad_norm=max_grad_norm, observ_clip=observ_clip, reward_clip=reward_clip,
            **hyperparameters)
        self._population = _Population(population, type(self))
        self.seeds = self._population.seeds or members.seeds_of(seed)
        self.hyperparameters = self._population.hyperparameters or {
            name: (float(value),) for name, value in hyperparameters.items()}
        self.observ_shape = tuple(int(size) for size in observ_shape)
        self.num_envs = num_envs  # Of each member.
        self._lr_anneal_updates = lr_anneal_updates
        self._max_grad_norm = max_grad_norm
        self.jit_compile = bool(jit_compile)  # Of the update.
        self._normalize_observ = normalize_observ
        self._scale_reward = scale_reward
        num_members = len(self.seeds)
        self.policy = policy_network(
            observ_shape=self.observ_shape, action_size=action_size, seed=self.seeds)
        # A policy with a value head (a shared torso) estimates the values itself.
        if self.policy.has_value_head and value_network is not None:
            raise ValueError(f'{type(self.policy).__name__} estimates state values on its own '
                             'torso: set value_network = None.')
        if not self.policy.has_value_head and value_network is None:
            raise ValueError(f'value_network = None needs a policy with a value head (e.g. '
                             f'SharedTorsoCategoricalPolicy); {type(self.policy).__name__} has '
                             'none.')
        if self.policy.takes_frames and normalize_observ:
            raise ValueError(f'{type(self.policy).__name__} scales uint8 frames by 1/255 itself: '
                             'set normalize_observ = False (frames are not standardized).')
        self.value = value_network and value_network(
            observ_shape=self.observ_shape, seed=[seed + 1000 for seed in self.seeds])
        self.observ_normalizer = normalize.StreamingNormalizer(
            self.observ_shape, center=True, scale=True, clip=observ_clip,
            num_members=num_members, name='observ_normalizer')
        self.reward_scaler = normalize.RewardScaler(
            num_envs, self.hyperparameters['discount'], clip=reward_clip,
            num_members=num_members, name='reward_scaler')
        self.optimizer = optimizer(self._trainable, self.hyperparameters['learning_rate'])
        self.update_count = tf.Variable(tf.zeros([num_members], tf.int64), trainable=False,
                                        name='update_count')
        self.sampling_seeds = members.SeedStream(self.seeds)
        self._sampling_act = tf.function(functools.partial(self._act, greedy=False),
                                         jit_compile=bool(jit_compile_act), autograph=False)
        self._greedy_act = tf.function(
            functools.partial(self._act, greedy=True), autograph=False)
        self._compiled_update = tf.function(self._update, jit_compile=jit_compile,
                                            autograph=False)

    @property
    def _trainable(self):
        """Policy then value weights (a property so the checkpoint keys them by network)."""
        value = self.value.trainable_variables if self.value else ()
        return list(self.policy.trainable_variables + value)

    # The Algorithm interface.

    @property
    def num_members(self):
        return len(self.seeds)

    @property
    def members(self):
        return self._population.agents or [self]

    def to_members(self):
        self._population.copy(self, to_members=True)

    def from_members(self):
        self._population.copy(self, to_members=False)

    @property
    def action_dtype(self):
        return self.policy.action_dtype

    def initial_state(self, batch_size):
        return self.policy.initial_state(batch_size // self.num_members)

    def act(self, observ, state, reset_mask, greedy=False):
        """One policy step of `observ` [K * N, ...] (member k's environments in the k-th block):
        `(action, extras, state)`.

        `reset_mask` marks environments whose episode starts at this step; their state is zeroed
        first. `greedy` (a Python bool) picks the distribution's mode instead of sampling.
        """
        act = self._greedy_act if greedy else self._sampling_act
        return act(observ, state, reset_mask)

    def update(self, batch):
        """Trains each member on its block of one time-major rollout `[T, K * num_envs, ...]`
        (see algorithm.py); returns `[K]` metrics.

        A non-finite loss or gradient is never applied; the `nonfinite` metric names it
        ({quantity: [K] bool} of NONFINITE_QUANTITIES). Statistics updates happen regardless:
        the loop undoes them.
        """
        self._check_batch(batch)
        return self._compiled_update(batch)

    def undo_variables(self):
        return list(self.variables)

    def undo(self, undo_mask, pairs):
        if self.num_members == 1:  # All or nothing: one conditional, no per-element selects.
            return super().undo(undo_mask, pairs)
        return [variable.assign(tf.where(members.broadcast(undo_mask, variable), saved, variable))
                for variable, saved in pairs]

    def acting_modules(self):
        modules = {'policy': self.policy, 'observ_normalizer': self.observ_normalizer}
        if self.value:
            modules['value'] = self.value
        return modules

    def exported_policy(self):
        return self.policy, self.observ_normalizer if self._normalize_observ else None

    # For the subclasses.

    @classmethod
    def nonfinite_report(cls, code):
        """{quantity: [K] bool} of `_gradient_step`'s [K] codes (0: none)."""
        return {name: tf.equal(code, index + 1)
                for index, name in enumerate(cls.NONFINITE_QUANTITIES)}

    def hyperparameter(self, name):
        """The members' values of a MEMBER_HYPERPARAMETERS name: float32 [K]."""
        return tf.constant(self.hyperparameters[name], tf.float32)

    @property
    def normalizes_observ(self):
        """Whether `normalize` standardizes observations (else it only casts them)."""
        return self._normalize_observ

    def normalize(self, observ):
        """The observation `[K, ...]` as the networks see it: normalized if configured, else as
        the environment gave it (the networks cast it; frames stay bytes to the torso)."""
        if not self._normalize_observ:
            return observ
        return self.observ_normalizer.normalize(tf.cast(observ, tf.float32))

    def state_value(self, observ):
        """`V(observ)` `[K, *batch]` of the normalized `observ`: of the value network, or of
        the policy's value head."""
        return self.policy.value(observ) if self.policy.has_value_head else self.value(observ)

    def params_and_value(self, observ, state, reset_mask):
        """The policy's parameters of the chunks `observ` `[K, L, B, ...]` (see
        `networks.sequence`) and their state values; one pass through a shared torso."""
        if self.policy.has_value_head:
            return self.policy.params_and_value(observ)
        return self.policy.sequence(observ, state, reset_mask), self.value(observ)

    def member_major(self, tensor):
        """`[T, K * N, ...]` -> `[K, T, N, ...]`."""
        tensor = members.split(tensor, self.num_members, axis=1)
        return tf.transpose(tensor, [1, 0] + list(range(2, tensor.shape.rank)))

    def sample(self, params):
        """One draw of each member's distribution of `params` [K, ...] with its own seed."""
        seeds = self.sampling_seeds.next()
        if self.num_members == 1:  # The same draw as of its slice, in fewer ops.
            return self.policy.distribution(params).sample(seed=seeds[0])
        return tf.stack([
            self.policy.distribution(tf.nest.map_structure(lambda x, k=k: x[k], params))
            .sample(seed=seeds[k]) for k in range(self.num_members)])

    def _act(self, observ, state, reset_mask, greedy):
        observ = self.normalize(members.split(observ, self.num_members))
        state = self.policy.reset_state(state, members.split(reset_mask, self.num_members))
        if self.policy.has_value_head:  # Feed-forward: the state stays `()`.
            (params, value), new_state = self.policy.params_and_value(observ), state
        else:
            (params, new_state), value = self.policy.step(observ, state), self.value(observ)
        policy = self.policy.distribution(params)
        action = policy.mode() if greedy else self.sample(params)
        extras = {}
        if 'log_prob' in self.EXTRAS_KEYS:
            extras['log_prob'] = policy.log_prob(action)
        extras['value'] = value
        if 'policy_params' in self.EXTRAS_KEYS:
            extras['policy_params'] = params
        if self.policy.recurrent:
            extras['policy_state'] = state
        return members.merge(action), tf.nest.map_structure(members.merge, extras), new_state

    def _update(self, batch):
        """The update as one TF program (compiled as `_compiled_update`): metrics."""
        raise NotImplementedError

    def _targets(self, batch):
        """Scales the rewards (updating the scaler) and computes GAE(lambda) on the
        member-major `batch`.

        Returns (scaled reward, advantage, return, done), each `[K, T, N]`.
        """
        terminated = tf.cast(batch['terminated'], tf.bool)
        truncated = tf.cast(batch['truncated'], tf.bool)
        done = terminated | truncated
        reward = tf.cast(batch['reward'], tf.float32)
        if self._scale_reward:
            self.reward_scaler.update(reward, done)
            reward = self.reward_scaler.scale(reward)
        next_value = self._next_value(batch, truncated)

        def time_major(tensor):  # [K, T, N] <-> [T, K, N]: GAE recurs over time.
            return tf.transpose(tensor, [1, 0, 2])

        advantage, return_ = advantages.generalized_advantage_estimation(
            *map(time_major, (reward, batch['extras']['value'], next_value, terminated,
                              truncated)),
            self.hyperparameter('discount')[:, None], self.hyperparameter('gae_lambda')[:, None])
        return reward, time_major(advantage), time_major(return_), done

    def _next_value(self, batch, truncated):
        """V(next_observ) `[K, T, N]` where GAE reads it. Where an episode goes on, the next
        observation is the one the next step acted on, whose value the rollout recorded with the
        same weights and observation statistics (they change only in the update); so, as in
        CleanRL and SB3, only the last step's next observations take a pass of the value
        network, unless an episode was truncated before the last step (its final observation
        bootstraps): then every step's do, for that member alone. For frames that saves a pass
        over the batch."""
        last = self.state_value(self.normalize(batch['next_observ'][:, -1:]))
        recorded = tf.concat([batch['extras']['value'][:, 1:], last], axis=1)
        truncated_before_last = tf.reduce_any(truncated[:, :-1], axis=[1, 2])  # [K]

        def computed():
            return tf.where(truncated_before_last[:, None, None],
                            self.state_value(self.normalize(batch['next_observ'])), recorded)

        return tf.cond(tf.reduce_any(truncated_before_last), computed, lambda: recorded)

    def _anneal_learning_rate(self):
        """Sets each member's learning rate for this update: linear decay to zero over
        `lr_anneal_updates` updates, if given."""
        if self._lr_anneal_updates:
            progress = tf.cast(self.update_count, tf.float32) / self._lr_anneal_updates
            self.optimizer.learning_rate.assign(
                self.hyperparameter('learning_rate') * tf.maximum(0.0, 1.0 - progress))

    def _gradient(self, losses, tape, variables):
        """Each member's gradient of its loss (`losses` [K]), clipped to `max_grad_norm`: the
        gradients, their [K] norms and [K] nonfinite codes (1: loss, 2: gradient)."""
        # Of the sum of the losses: member k's loss depends on member k's slices alone. A
        # variable the losses do not reach has a zero gradient (it does not move).
        gradients = tape.gradient(losses, variables,
                                  unconnected_gradients=tf.UnconnectedGradients.ZERO)
        if self._max_grad_norm:
            gradients, norm = members.clip_by_global_norm(gradients, self._max_grad_norm)
        else:
            norm = members.global_norm(gradients)
        # A gradient with a NaN or an infinity has a non-finite norm.
        nonfinite = tf.where(~tf.math.is_finite(losses), 1,
                             tf.where(~tf.math.is_finite(norm), 2, 0))
        return gradients, norm, nonfinite

    def _gradient_step(self, losses, tape):
        """Applies each member's clipped gradient unless its loss or gradient is not finite;
        returns ([K] applied flags, [K] norms, [K] nonfinite codes)."""
        gradients, norm, nonfinite = self._gradient(losses, tape, self._trainable)
        applied = tf.equal(nonfinite, 0)
        self.optimizer.apply(gradients, self._trainable, applied)
        return applied, norm, nonfinite

    def _finish_update(self, batch):
        """What ends every update: the observation statistics take in the member-major batch;
        the update is counted."""
        if self._normalize_observ:
            self.observ_normalizer.update(batch['observ'])
        self.update_count.assign_add(tf.ones_like(self.update_count))

    @staticmethod
    def _summary(reward, advantage, return_, value):
        """The [K] metrics every actor-critic update reports besides its objective's."""
        variance = functools.partial(tf.math.reduce_variance, axis=[1, 2])
        return {
            'advantage_mean': members.mean(advantage),
            'return_mean': members.mean(return_),
            'value_mean': members.mean(value),
            'scaled_reward_mean': members.mean(reward),
            'explained_variance': 1.0 - variance(return_ - value) / tf.maximum(
                variance(return_), 1e-8),
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
        envs = self.num_members * self.num_envs
        if steps[1] is not None and steps[1] != envs:
            built = (f'{self.num_members} members of num_envs={self.num_envs}'
                     if self.num_members > 1 else f'num_envs={self.num_envs}')
            raise ValueError(f'batch has {steps[1]} environments but the agent was built for '
                             f'{built}.')
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


class _Population:
    """The lone agents a population is made of, kept apart from the population's variables
    (a plain object: neither `tf.Module.variables` nor a checkpoint of the population looks
    inside), and the compiled copies of their state to and from the member axis."""

    def __init__(self, agents, cls):
        self.agents = list(agents or [])
        # Checked first: the members' hyperparameters are those of `cls`.
        for agent in self.agents:
            if type(agent) is not cls or agent.num_members != 1:
                member = ('a population' if type(agent) is cls
                          else f'an agent of {type(agent).__name__}')
                raise ValueError(f'a population is made of lone agents of one algorithm: the '
                                 f'{cls.__name__} population got {member} as a member.')
        self.seeds = tuple(seed for agent in self.agents for seed in agent.seeds)
        self.hyperparameters = {
            name: tuple(value for agent in self.agents for value in agent.hyperparameters[name])
            for name in cls.MEMBER_HYPERPARAMETERS} if self.agents else None
        self._copies = None

    def copy(self, population, to_members):
        """Copies the population's state into its members' or back (nothing for a lone
        agent)."""
        if not self.agents:
            return
        if self._copies is None:
            self._copies = self._compile(population)
        self._copies[to_members]()

    def _compile(self, population):
        """The two copies, each one call: op by op, K members' variables cost a save more than
        its write."""
        stacked = population.variables
        lone = [agent.variables for agent in self.agents]
        if any(tuple(variable.shape[1:] for variable in variables) !=
               tuple(variable.shape[1:] for variable in stacked) for variables in lone):
            raise ValueError('population members differ in more than their seeds and '
                             f'{", ".join(population.MEMBER_HYPERPARAMETERS)}: their variables '
                             'have different shapes.')
        return {
            True: tf.function(lambda: members.copy_to_members(stacked, lone), autograph=False),
            False: tf.function(lambda: members.copy_from_members(stacked, lone),
                               autograph=False)}
