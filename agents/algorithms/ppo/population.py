"""A population of PPO agents trained together: K members computed as one batch.

PureJaxRL trains many agents in one program with `jax.vmap`. Here every variable of K lone PPO
agents is stacked along a leading member axis and acting and the update run as batched ops
(batched matmuls, per-member reductions, Adam elementwise), so a population costs about as many
TF ops as one agent: what bounds a small agent on a CPU is the number of ops, not their size.

The members are built by the lone agent's own constructor (`make_member`: seed and scalar
hyperparameters), so each starts from the weights a lone run of its seed starts from, and they
stay the checkpointed form of the population: `to_members` copies the stacked state into them,
`from_members` back, so a member checkpoints, restores, evaluates and exports as an ordinary run.
Each member samples with its own random generator, drawing as a lone run draws, so a member
follows its lone run up to float rounding (batched matmuls and reductions may round otherwise).

Members never mix: no op reduces across the member axis (the loss summed over members has
per-member gradients), and a member whose update meets a non-finite loss or gradient, or its
early-stopping KL, stops alone while the others go on.
"""

import tensorflow as tf

from agents.algorithms import advantages, algorithm, networks
from agents.algorithms.ppo import ppo

# The hyperparameters that may differ between members: per-member values of the batched program.
SCALARS = ('learning_rate', 'clip_ratio', 'entropy_coef', 'discount', 'gae_lambda')
METRIC_NAMES = ppo.METRIC_NAMES
_POLICIES = (networks.FeedForwardGaussianPolicy, networks.FeedForwardCategoricalPolicy)


class PPOPopulation(algorithm.OnPolicyAlgorithm):
    """K PPO agents acting in K blocks of `num_envs` environments and updated together.

    The environments of a population are one batch of K * num_envs, member k's being the k-th
    block; `act` takes and gives `[K * num_envs, ...]` and `update` a rollout `[T, K * num_envs,
    ...]`. Metrics are `[K]`, one per member.
    """

    NONFINITE_QUANTITIES = ppo.NONFINITE_QUANTITIES
    SCALARS = SCALARS

    def __init__(self, make_member, members, name=None):
        """Builds the members and the stacked state.

        Args:
          make_member: `(seed, **scalars) -> PPO`, the lone agent's constructor with everything
            but the seed and the names of `SCALARS` bound (the trainer's `build_algorithm`).
          members: one dict per member: `seed` and optionally values of `SCALARS`.
        """
        super().__init__(name=name)
        if not members:
            raise ValueError('a population needs at least one member.')
        for index, member in enumerate(members):
            unknown = sorted(set(member) - {'seed', *SCALARS})
            if unknown or 'seed' not in member:
                raise ValueError(
                    f'population member {index} is {member!r}: it needs a seed and may set only '
                    f'{", ".join(SCALARS)}' + (f' (not {", ".join(unknown)})' if unknown else ''))
        self._members = [make_member(**member) for member in members]
        first = self._members[0]
        _check_members(self._members)
        self.num_envs = first.num_envs  # Of one member.
        self.observ_shape = first.observ_shape
        self._template = first
        self._gaussian = isinstance(first.policy, networks.FeedForwardGaussianPolicy)
        self._activations = (first.policy.torso._activation, first.value.torso._activation)
        with self.name_scope:
            # One [K, ...] variable per variable of a lone member's state, in `_lone_state`'s
            # structure.
            self.state = tf.nest.map_structure(
                lambda *variables: tf.Variable(
                    tf.stack([variable.read_value() for variable in variables]),
                    trainable=False, name=variables[0].name.split(':')[0]),
                *[_lone_state(member) for member in self.members])
            self.scalars = {
                name: tf.Variable([float(getattr(member, f'_{name}')) for member in self.members],
                                  trainable=False, name=name) for name in SCALARS}
        self._trainable = self.state['trainable']
        self._stacked_of = {
            variable.ref(): stacked for variable, stacked in zip(
                tf.nest.flatten(_lone_state(first)), tf.nest.flatten(self.state), strict=True)}
        self._sampling_act = tf.function(
            lambda observ: self._act(observ, greedy=False), autograph=False)
        self._greedy_act = tf.function(
            lambda observ: self._act(observ, greedy=True), autograph=False)
        self._compiled_update = tf.function(
            self._update, jit_compile=first.jit_compile, autograph=False)
        # One call each: op by op, K members' variables cost a save more than its write.
        self._compiled_to_members = tf.function(self._to_members, autograph=False)
        self._compiled_from_members = tf.function(self._from_members, autograph=False)

    # Moving state between the stacked form and the members.

    @property
    def num_members(self):
        return len(self._members)

    @property
    def members(self):
        return list(self._members)

    def to_members(self):
        """Copies each member's slice of the stacked state into that member's variables."""
        self._compiled_to_members()

    def from_members(self):
        """Stacks the members' variables (e.g. restored from their checkpoints)."""
        self._compiled_from_members()

    def _to_members(self):
        for stacked, variables in zip(tf.nest.flatten(self.state), self._member_variables(),
                                      strict=True):
            for variable, value in zip(variables, tf.unstack(stacked), strict=True):
                variable.assign(value, read_value=False)

    def _from_members(self):
        for stacked, variables in zip(tf.nest.flatten(self.state), self._member_variables(),
                                      strict=True):
            stacked.assign(tf.stack([variable.read_value() for variable in variables]),
                           read_value=False)

    def undo(self, undo, pairs):
        """Ops that put back, for the members where `undo` ([K] bool) is true, the values
        `pairs` (of `train_variables()` and their copies) saved; the others' stay."""
        generators = {member.random.state.ref(): index
                      for index, member in enumerate(self.members)}
        ops = []
        for variable, saved in pairs:
            index = generators.get(variable.ref())
            mask = undo[index] if index is not None else _per_member(undo, variable)
            ops.append(variable.assign(tf.where(mask, saved, variable)))
        return ops

    def _member_variables(self):
        return zip(*[tf.nest.flatten(_lone_state(member)) for member in self.members],
                   strict=True)

    # The Algorithm interface.

    @property
    def action_dtype(self):
        return self._template.action_dtype

    def initial_state(self, batch_size):
        return ()

    def act(self, observ, state, reset_mask, greedy=False):
        del reset_mask  # Feed-forward policies only.
        action, extras = (self._greedy_act if greedy else self._sampling_act)(observ)
        return action, extras, state

    def update(self, batch):
        """Trains every member on its block of the rollout; returns {name: [K] metric}."""
        self._template._check_batch(tf.nest.map_structure(self._member_view, batch))
        return self._compiled_update(batch)

    def undo_variables(self):
        return [*tf.nest.flatten(self.state), *self.scalars.values(),
                *(member.random.state for member in self.members)]

    def acting_modules(self):
        raise NotImplementedError('a population acts through its members: use `members[k]`.')

    def exported_policy(self):
        raise NotImplementedError('a population exports its members: use `members[k]`.')

    # Batched networks.

    def _stacked(self, variable):
        return self._stacked_of[variable.ref()]

    def _mlp(self, torso, head, activation, inputs):
        """`inputs` [K, B, in] through a member-stacked MLP and its linear head."""
        for layer in torso.layers:
            inputs = activation(self._linear(layer, inputs))
        return self._linear(head, inputs)

    def _linear(self, layer, inputs):
        return tf.matmul(inputs, self._stacked(layer.kernel)) + self._stacked(layer.bias)[:, None]

    def _policy_params(self, observ):
        """Distribution parameters for normalized `observ` [K, B, ...]."""
        policy = self._template.policy
        flat = tf.reshape(observ, [self.num_members, -1, policy.observ_size])
        if self._gaussian:
            loc = self._mlp(policy.torso, policy.mean, self._activations[0], flat)
            scale = tf.exp(self._stacked(policy.log_std))[:, None]
            return {'loc': loc, 'scale': tf.broadcast_to(scale, tf.shape(loc))}
        return {'logits': self._mlp(policy.torso, policy.logits, self._activations[0], flat)}

    def _value(self, observ):
        value = self._template.value
        flat = tf.reshape(observ, [self.num_members, -1, value.observ_size])
        return self._mlp(value.torso, value.head, self._activations[1], flat)[..., 0]

    def _distribution(self, params):
        return self._template.policy.distribution(params)

    # Batched normalizers: the statistics of `normalize.StreamingNormalizer` per member.

    def _normalize(self, observ):
        """`observ` [K, ..., *observ_shape] as the members' networks see it."""
        observ = tf.cast(observ, tf.float32)
        if not self._template.normalizes_observ:
            return observ
        normalizer = self._template.observ_normalizer
        return self._standardize(observ, self._stacked(normalizer.count),
                                 self._stacked(normalizer.mean),
                                 self._stacked(normalizer.sum_squared_deviations),
                                 normalizer, center=True)

    def _standardize(self, values, count, mean, squared, normalizer, center):
        """`StreamingNormalizer.normalize` with [K] counts and [K, *shape] statistics."""
        extra = values.shape.rank - mean.shape.rank

        def per_member(statistic):
            return tf.reshape(statistic,
                              [self.num_members] + [1] * extra + list(statistic.shape[1:]))

        count = _per_member(count, values)
        ready = count > 1.0
        if center:
            values -= tf.cast(tf.where(ready, per_member(mean), 0.0), tf.float32)
        std = tf.sqrt(per_member(squared) / tf.maximum(count, 1.0) + normalizer._epsilon)
        values /= tf.cast(tf.where(ready, std, 1.0), tf.float32)
        if normalizer._clip is not None:
            values = tf.clip_by_value(values, -normalizer._clip, normalizer._clip)
        return values

    def _add_statistics(self, normalizer, values):
        """`StreamingNormalizer.update` per member: `values` [K, B, *shape]."""
        count = self._stacked(normalizer.count)
        mean = self._stacked(normalizer.mean)
        squared = self._stacked(normalizer.sum_squared_deviations)
        values = tf.cast(values, tf.float64)
        batch_count = tf.cast(tf.shape(values)[1], tf.float64)
        batch_mean = tf.reduce_mean(values, 1)
        batch_squared = tf.reduce_sum(tf.square(values - batch_mean[:, None]), 1)
        total = count + batch_count
        fraction = tf.reshape(batch_count / tf.maximum(total, 1.0),
                              [-1] + [1] * (mean.shape.rank - 1))
        old_count = tf.reshape(count, tf.shape(fraction))
        delta = batch_mean - mean
        squared.assign(squared + batch_squared + tf.square(delta) * old_count * fraction)
        mean.assign(mean + delta * fraction)
        count.assign(total)

    def _scale_rewards(self, reward, done):
        """`RewardScaler.update` and `scale` per member on `reward`, `done` [T, K, N]."""
        scaler = self._template.reward_scaler
        discount = self.scalars['discount'][:, None]
        running = self._stacked(scaler.running_return)

        def accumulate(carry, inputs):
            _, previous = carry
            reward_step, done_step = inputs
            discounted = previous * discount + reward_step
            return discounted, tf.where(done_step, tf.zeros_like(discounted), discounted)

        returns, restarted = tf.scan(accumulate, (reward, done), (running.value(), running.value()))
        statistics = scaler.return_statistics
        member_major = tf.reshape(tf.transpose(returns, [1, 0, 2]), [self.num_members, -1])
        self._add_statistics(statistics, member_major)
        running.assign(restarted[-1])
        scaled = self._standardize(
            tf.transpose(reward, [1, 0, 2]), self._stacked(statistics.count),
            self._stacked(statistics.mean), self._stacked(statistics.sum_squared_deviations),
            statistics, center=False)
        return tf.transpose(scaled, [1, 0, 2])

    # Acting and updating.

    def _member_view(self, tensor):
        """`[T, K * N, ...]` -> `[T, N, ...]` shaped like one member's (for the batch check)."""
        shape = tf.TensorShape(tensor.shape)
        if shape.rank is None or shape.rank < 2 or shape[1] is None:
            return tensor
        if shape[1] != self.num_members * self.num_envs:
            raise ValueError(f'batch has {shape[1]} environments but the population was built '
                             f'for {self.num_members} members of {self.num_envs}.')
        return tf.TensorSpec(shape[:1].concatenate([self.num_envs]).concatenate(shape[2:]),
                             tensor.dtype)

    def _split(self, tensor, axis=0):
        """`[..., K * N, ...]` -> `[..., K, N, ...]` at `axis` (N: a member's environments,
        of training or of evaluation)."""
        shape = tf.shape(tensor)
        return tf.reshape(tensor, tf.concat(
            [shape[:axis], [self.num_members, -1], shape[axis + 1:]], 0))

    def _merge(self, tensor, axis=0):
        """The inverse of `_split`."""
        shape = tf.shape(tensor)
        return tf.reshape(tensor, tf.concat([shape[:axis], [-1], shape[axis + 2:]], 0))

    def _act(self, observ, greedy):
        observ = self._normalize(self._split(observ))
        params = self._policy_params(observ)
        policy = self._distribution(params)
        if greedy:
            action = policy.mode()
        else:
            # Each member draws from its own generator, as its lone run does.
            action = tf.stack([
                self._distribution(tf.nest.map_structure(lambda x, k=index: x[k], params))
                .sample(seed=member._next_seed())
                for index, member in enumerate(self.members)])
        extras = {'log_prob': policy.log_prob(action), 'value': self._value(observ),
                  'policy_params': params}
        return self._merge(action), tf.nest.map_structure(self._merge, extras)

    def _update(self, batch):
        """PPO's update (ppo.py) for every member at once: [T, K, N] while time matters,
        member-major [K, T * N] for the minibatches."""
        split = tf.nest.map_structure(lambda tensor: self._split(tensor, axis=1), batch)
        terminated = tf.cast(split['terminated'], tf.bool)
        truncated = tf.cast(split['truncated'], tf.bool)
        done = terminated | truncated
        reward = tf.cast(split['reward'], tf.float32)
        if self._template._scale_reward:
            reward = self._scale_rewards(reward, done)

        def member_major(tensor):  # [T, K, N, ...] -> [K, T * N, ...]
            rank = tensor.shape.rank
            tensor = tf.transpose(tensor, [1, 0] + list(range(2, rank)))
            shape = tf.shape(tensor)
            return tf.reshape(tensor, tf.concat([[shape[0], -1], shape[3:]], 0))

        def time_major(tensor):  # [K, T * N] -> [T, K, N]
            return tf.transpose(tf.reshape(tensor, [self.num_members, -1, self.num_envs]),
                                [1, 0, 2])

        extras = split['extras']
        next_value = time_major(self._value(self._normalize(member_major(split['next_observ']))))
        advantage, return_ = advantages.generalized_advantage_estimation(
            reward, extras['value'], next_value, terminated, truncated,
            self.scalars['discount'][:, None], self.scalars['gae_lambda'][:, None])
        data = {
            'observ': self._normalize(member_major(split['observ'])),
            'action': tf.cast(member_major(split['action']), self.action_dtype),
            'log_prob': member_major(extras['log_prob']),
            'value': member_major(extras['value']),
            'policy_params': tf.nest.map_structure(member_major, extras['policy_params']),
            'advantage': member_major(advantage),
            'return': member_major(return_),
        }
        template = self._template
        learning_rate = self.scalars['learning_rate']
        if template._lr_anneal_updates:
            progress = tf.cast(self.state['update_count'], tf.float32) / (
                template._lr_anneal_updates)
            learning_rate = learning_rate * tf.maximum(0.0, 1.0 - progress)
        self.state['learning_rate'].assign(learning_rate)
        num_units = tf.shape(data['return'])[1]
        minibatch_size = num_units // template._num_minibatches
        orders = tf.stack([tf.argsort(tf.random.stateless_uniform(
            [template._num_epochs, num_units], seed=member._next_seed()), axis=1)
            for member in self.members])
        minibatch_indices = tf.reshape(
            orders[:, :, :minibatch_size * template._num_minibatches],
            [self.num_members, -1, minibatch_size])
        metrics = self._train_minibatches(data, minibatch_indices)

        with tf.control_dependencies(tf.nest.flatten(metrics)):
            if template.normalizes_observ:
                self._add_statistics(template.observ_normalizer, member_major(split['observ']))
            self.state['update_count'].assign_add(tf.ones([self.num_members], tf.int64))

        def mean(tensor):  # [T, K, N] -> [K]
            return tf.reduce_mean(tensor, axis=[0, 2])

        value = extras['value']
        residual = return_ - value
        metrics.update({
            'learning_rate': tf.identity(self.state['learning_rate']),
            'kl_penalty': tf.identity(self.state['kl_penalty']),
            'advantage_mean': mean(advantage),
            'return_mean': mean(return_),
            'value_mean': mean(value),
            'scaled_reward_mean': mean(reward),
            'explained_variance': 1.0 - _variance(residual) / tf.maximum(_variance(return_), 1e-8),
        })
        return metrics

    def _train_minibatches(self, data, minibatch_indices):
        """Epochs x minibatches of every member in one loop; a member that stops (non-finite
        loss or gradient, early-stopping KL) stops alone."""
        template = self._template
        num_members = self.num_members
        num_steps = tf.shape(minibatch_indices)[1]
        zeros = tf.zeros([num_members])
        zero_metrics = {name: zeros for name in METRIC_NAMES}

        def train_step(step, active, sums, applied, nonfinite):
            minibatch = tf.nest.map_structure(
                lambda x: tf.gather(x, minibatch_indices[:, step], axis=1, batch_dims=1), data)
            with tf.GradientTape() as tape:
                tape.watch(self._trainable)
                losses, metrics = self._loss(minibatch)
                total = tf.reduce_sum(losses)
            gradients = tape.gradient(total, self._trainable)
            norm = tf.sqrt(tf.add_n([
                tf.reduce_sum(tf.square(gradient), axis=list(range(1, gradient.shape.rank)))
                for gradient in gradients]))
            if template._max_grad_norm:
                # tf.clip_by_global_norm's scale, per member.
                scale = template._max_grad_norm * tf.minimum(1.0 / norm,
                                                             1.0 / template._max_grad_norm)
                gradients = [gradient * _per_member(scale, gradient) for gradient in gradients]
            metrics['gradient_norm'] = norm
            code = tf.where(~tf.math.is_finite(losses), 1, tf.where(~tf.math.is_finite(norm), 2, 0))
            stop = code > 0
            if template._early_stop_kl:
                stop |= metrics['kl'] > template._early_stop_kl
            apply = active & ~stop
            self._adam(gradients, apply)
            sums = {name: total + tf.where(apply, metrics[name], 0.0)
                    for name, total in sums.items()}
            nonfinite = tf.where(active, code, nonfinite)
            return step + 1, apply, sums, applied + tf.cast(apply, tf.float32), nonfinite

        _, _, sums, applied, nonfinite = tf.while_loop(
            lambda step, active, *unused: (step < num_steps) & tf.reduce_any(active),
            train_step, (tf.constant(0), tf.ones([num_members], tf.bool), zero_metrics, zeros,
                         tf.zeros([num_members], tf.int32)))
        metrics = {name: total / tf.maximum(applied, 1.0) for name, total in sums.items()}
        policy = self._distribution(self._policy_params(data['observ']))
        old_policy = self._distribution(data['policy_params'])
        metrics['final_kl'] = tf.reduce_mean(old_policy.kl_divergence(policy), axis=1)
        metrics['num_gradient_steps'] = applied
        metrics['nonfinite'] = ppo.PPO.nonfinite_report(nonfinite)
        return metrics

    def _loss(self, minibatch):
        """PPO-clip's objective (`PPO.objective`) of each member's minibatch [K, M, ...]: ([K]
        losses, {name: [K]})."""
        return self._template.objective(
            self._distribution(self._policy_params(minibatch['observ'])),
            self._value(minibatch['observ']), minibatch,
            self.scalars['clip_ratio'][:, None], self.scalars['entropy_coef'], axis=1)

    def _adam(self, gradients, apply):
        """Keras' Adam step (keras.optimizers.Adam.update_step) for the members in `apply`."""
        optimizer = self._template.optimizer
        iterations = self.state['iterations']
        step = tf.cast(iterations + 1, tf.float32)
        alpha = (self.state['learning_rate'] * tf.sqrt(1.0 - tf.pow(optimizer.beta_2, step))
                 / (1.0 - tf.pow(optimizer.beta_1, step)))
        for gradient, variable, momentum, velocity in zip(
                gradients, self._trainable, self.state['momentum'], self.state['velocity'],
                strict=True):
            mask = _per_member(apply, gradient)
            new_momentum = momentum + (gradient - momentum) * (1.0 - optimizer.beta_1)
            new_velocity = velocity + (tf.square(gradient) - velocity) * (1.0 - optimizer.beta_2)
            new_variable = variable - (new_momentum * _per_member(alpha, gradient)) / (
                tf.sqrt(new_velocity) + optimizer.epsilon)
            momentum.assign(tf.where(mask, new_momentum, momentum))
            velocity.assign(tf.where(mask, new_velocity, velocity))
            variable.assign(tf.where(mask, new_variable, variable))
        iterations.assign_add(tf.cast(apply, iterations.dtype))


def _lone_state(agent):
    """A lone PPO agent's variables (all but its random generator), as a structure the
    population stacks; Keras' optimizer variables by their tf.Variable."""
    optimizer = agent.optimizer
    trainable = agent._trainable
    slot = [optimizer._get_variable_index(variable) for variable in trainable]
    state = {
        'trainable': trainable,
        'momentum': [optimizer._momentums[index].value for index in slot],
        'velocity': [optimizer._velocities[index].value for index in slot],
        'iterations': optimizer.iterations.value,
        'learning_rate': optimizer.learning_rate.value,
        'update_count': agent.update_count,
        'kl_penalty': agent.kl_penalty,
    }
    for normalizer in (agent.observ_normalizer, agent.reward_scaler.return_statistics):
        state[normalizer.name] = [normalizer.count, normalizer.mean,
                                  normalizer.sum_squared_deviations]
    state['running_return'] = agent.reward_scaler.running_return
    return state


def _check_members(members):
    """Raises a ValueError unless the members are PPO agents that a population can batch."""
    first = members[0]
    for member in members:
        if not isinstance(member, ppo.PPO):
            raise ValueError(f'a population trains PPO agents, got {type(member).__name__}.')
    if not isinstance(first.policy, _POLICIES):
        raise ValueError(f'a population trains feed-forward policies '
                         f'({", ".join(cls.__name__ for cls in _POLICIES)}), not '
                         f'{type(first.policy).__name__}.')
    if not isinstance(first.value, networks.FeedForwardValue):
        raise ValueError(f'a population trains a FeedForwardValue, not '
                         f'{type(first.value).__name__}.')
    if first._objective != 'clipped':
        raise ValueError(f'a population trains PPO\'s clipped objective, not '
                         f'{first._objective!r}.')
    if first.concurrent_networks:
        raise ValueError('a population trains its members\' networks in one program; '
                         'PPO.concurrent_networks = True does not apply to it.')
    shapes = {tuple(tuple(variable.shape) for variable in tf.nest.flatten(_lone_state(member)))
              for member in members}
    if len(shapes) > 1:
        raise ValueError('population members differ in more than their seeds and '
                         f'{", ".join(SCALARS)}: their variables have different shapes.')


def _per_member(values, like):
    """[K] `values` shaped to broadcast against `like` [K, ...]."""
    return tf.reshape(values, [-1] + [1] * (like.shape.rank - 1))


def _variance(tensor):
    """Per-member variance of [T, K, N]."""
    return tf.math.reduce_variance(tensor, axis=[0, 2])

