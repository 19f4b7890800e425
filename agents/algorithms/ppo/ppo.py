"""Proximal Policy Optimization: an actor-critic (actor_critic.py) with PPO's update.

Each update trains `num_epochs` passes of shuffled minibatches over one rollout with the clipped
surrogate objective (CleanRL, SB3) or batch-ppo's adaptive KL penalty, all in one TF program.
Besides the value, `act` records the log-prob and the distribution's parameters of each action
(the rollout `batch`'s extras: log_prob [T, N], value [T, N], policy_params {name: [T, N, ...]}
and, for recurrent policies, policy_state [T, N, ...]), so the update can rebuild the behaviour
policy for the ratio and an exact KL. Observation statistics are frozen while acting and
updated at the end of `update`, so what `act` recorded matches what `update` recomputes before
its first gradient step.
"""

import functools

import gin
import tensorflow as tf

from agents.algorithms import actor_critic, members, networks, optimizers

OBJECTIVES = ('clipped', 'kl_penalty')
METRIC_NAMES = ('loss', 'policy_loss', 'value_loss', 'entropy', 'kl', 'approx_kl',
                'clip_fraction', 'gradient_norm')
# What the `nonfinite` metric of an update names (the update stopped before applying the
# gradient step where one went non-finite).
NONFINITE_QUANTITIES = actor_critic.ActorCritic.NONFINITE_QUANTITIES


@gin.configurable
class PPO(actor_critic.ActorCritic):
    """PPO agent: policy and value networks, optimizer, normalizers and update counter.

    Defaults follow CleanRL / SB3 for the clipped objective; the `kl_*` arguments default to
    batch-ppo's adaptive KL penalty with its quadratic cutoff (`objective='kl_penalty'`).
    """

    EXTRAS_KEYS = ('log_prob', 'value', 'policy_params')
    MEMBER_HYPERPARAMETERS = ('clip_ratio', *actor_critic.ActorCritic.MEMBER_HYPERPARAMETERS)

    def __init__(
            self, observ_shape, action_size, num_envs,
            policy_network=networks.FeedForwardGaussianPolicy,
            value_network=networks.FeedForwardValue, objective='clipped',
            discount=0.99, gae_lambda=0.95, num_epochs=10, num_minibatches=32, chunk_length=None,
            learning_rate=3e-4, lr_anneal_updates=None, adam_epsilon=1e-5, max_grad_norm=0.5,
            clip_ratio=0.2, value_clip=0.2, value_coef=0.5, entropy_coef=0.0,
            normalize_advantages=True, early_stop_kl=None,
            kl_target=0.01, kl_cutoff_factor=2.0, kl_cutoff_coef=1000.0, kl_init_penalty=1.0,
            kl_tolerance=(0.7, 1.3), kl_penalty_change=1.5,
            normalize_observ=True, observ_clip=5.0, scale_reward=True, reward_clip=10.0,
            jit_compile=True, jit_compile_act=False, concurrent_networks=False, seed=0,
            population=None, name=None):
        """Builds the agent.

        Args:
          observ_shape: shape of one observation.
          action_size: action dimensions (continuous) or number of actions (discrete); passed
            to `policy_network`.
          num_envs: number of environments in a batch (the reward scaler keeps one discounted
            return per environment).
          policy_network: factory `(observ_shape, action_size, seed) -> policy` (see networks.py).
          value_network: factory `(observ_shape, seed) -> value network`; None for a policy
            with a value head of its own (shared_torso.py).
          objective: 'clipped' (PPO-clip) or 'kl_penalty' (batch-ppo's adaptive KL penalty).
          discount, gae_lambda: GAE(lambda) parameters.
          num_epochs: passes over the batch per update.
          num_minibatches: minibatches per epoch; units left over by the division are dropped
            from that epoch (a different random subset each epoch).
          chunk_length: for recurrent policies, length of the time-major sequence chunks trained on
            (must divide T); None trains on whole rollouts. Feed-forward policies use single steps.
          learning_rate: Adam's initial learning rate.
          lr_anneal_updates: number of updates over which the learning rate decays linearly to
            zero; None keeps it constant.
          adam_epsilon: Adam's epsilon (1e-5 as in CleanRL / PyTorch PPO implementations).
          max_grad_norm: global gradient-norm clip; None disables clipping.
          clip_ratio: PPO-clip's epsilon.
          value_clip: clip the value change around the old value estimate; None disables it.
          value_coef, entropy_coef: weights of the value loss and of the entropy bonus.
          normalize_advantages: standardize advantages within each minibatch.
          early_stop_kl: stop the update before a minibatch step whose mean KL(old || new)
            exceeds this value; None disables early stopping.
          kl_target: the KL the adaptive penalty aims for.
          kl_cutoff_factor, kl_cutoff_coef: quadratic penalty `coef * (kl - factor * target)^2`
            on sequences whose KL exceeds `factor * target`.
          kl_init_penalty: initial coefficient of the KL penalty.
          kl_tolerance: the penalty changes when the KL leaves `kl_tolerance * kl_target`.
          kl_penalty_change: factor by which the penalty grows or shrinks then.
          normalize_observ: standardize observations by streaming statistics.
          observ_clip: clip normalized observations to +- this value (None: no clip).
          scale_reward: divide rewards by the std of the discounted return.
          reward_clip: clip scaled rewards to +- this value (None: no clip).
          jit_compile: compile `update` with XLA (measured faster on CPU).
          jit_compile_act: compile the sampling `act` with XLA. Off by default: XLA runs the
            act's work on TF's intra-op threads, and the woken thread then spins on the core
            that environment worker processes need (measured slower with worker processes;
            see benchmarks/README.md, "Sampling without XLA").
          concurrent_networks: train the policy and the value network in two XLA programs that
            run side by side, on two cores (benchmarks/README.md, "Policy and value side by
            side"). Each network then has its own Adam and its own `max_grad_norm` clip, as
            in Spinning Up's PPO; `early_stop_kl`, or a non-finite loss or gradient, stops
            that network's steps alone. Needs `jit_compile`, and two TF inter-op threads
            (`configure_threads.inter_op_threads = 2`) to run the programs at once; the run
            loop then compiles the rollout alone, since one XLA program around the update would
            make its two programs one again.
          seed: seeds network initialization, action sampling and minibatch shuffling.
          population: None for a lone agent; for a population, the lone agents (of these
            settings but for their seeds and MEMBER_HYPERPARAMETERS) that are its members.
          name: module name.
        """
        if objective not in OBJECTIVES:
            raise ValueError(f'Unknown objective {objective!r}; expected one of {OBJECTIVES}.')
        actor_critic.check_arguments(
            positive_int=('num_epochs', 'num_minibatches', 'chunk_length'),
            positive=('adam_epsilon', 'clip_ratio', 'value_clip', 'early_stop_kl', 'kl_target',
                      'kl_cutoff_factor', 'kl_init_penalty', 'kl_penalty_change'),
            num_epochs=num_epochs, num_minibatches=num_minibatches, chunk_length=chunk_length,
            adam_epsilon=adam_epsilon, clip_ratio=clip_ratio, value_clip=value_clip,
            early_stop_kl=early_stop_kl, kl_target=kl_target, kl_cutoff_factor=kl_cutoff_factor,
            kl_init_penalty=kl_init_penalty, kl_penalty_change=kl_penalty_change)
        if len(kl_tolerance) != 2 or not 0 < kl_tolerance[0] <= kl_tolerance[1]:
            raise ValueError(f'kl_tolerance must be (low, high) with 0 < low <= high, '
                             f'got {kl_tolerance!r}.')
        if concurrent_networks and not jit_compile:
            raise ValueError('concurrent_networks needs jit_compile: the networks train side '
                             'by side as two XLA programs.')
        if concurrent_networks and value_network is None:
            raise ValueError('concurrent_networks trains the policy and the value network side '
                             'by side; with value_network = None (a shared torso) there is one '
                             'network.')
        adam = functools.partial(optimizers.Adam, epsilon=adam_epsilon)
        super().__init__(
            observ_shape, action_size, num_envs, policy_network, value_network, adam,
            dict(learning_rate=learning_rate, clip_ratio=clip_ratio, entropy_coef=entropy_coef,
                 discount=discount, gae_lambda=gae_lambda),
            lr_anneal_updates, max_grad_norm, normalize_observ, observ_clip, scale_reward,
            reward_clip, jit_compile, jit_compile_act, seed, population, name)
        if chunk_length is not None and not self.policy.recurrent:
            raise ValueError('chunk_length only applies to recurrent policies; feed-forward '
                             'policies train on single steps.')
        self._chunk_length = chunk_length if self.policy.recurrent else 1
        self.objective_name = objective
        self._num_epochs = num_epochs
        self._num_minibatches = num_minibatches
        self._value_clip = value_clip
        self._value_coef = value_coef
        self._normalize_advantages = normalize_advantages
        self._early_stop_kl = early_stop_kl
        self._kl = dict(target=kl_target, cutoff_factor=kl_cutoff_factor,
                        cutoff_coef=kl_cutoff_coef, tolerance=tuple(kl_tolerance),
                        penalty_change=kl_penalty_change)
        self.kl_penalty = tf.Variable(tf.fill([self.num_members], float(kl_init_penalty)),
                                      trainable=False, name='kl_penalty')
        self.concurrent_networks = bool(concurrent_networks)
        if self.concurrent_networks:
            self._build_concurrent_networks(adam)

    def _build_concurrent_networks(self, adam):
        """The value network's optimizer (`self.optimizer` then steps the policy alone) and the
        two networks' programs."""
        self.optimizer = adam(self.policy.trainable_variables,
                              self.hyperparameters['learning_rate'])
        self.value_optimizer = adam(self.value.trainable_variables,
                                    self.hyperparameters['learning_rate'])
        # The update's own graph stays outside XLA, so that TF's executor runs the two programs
        # at once.
        self._compiled_update = tf.function(self._update, autograph=False)
        self._network_programs = {
            network: tf.function(functools.partial(self._network_steps, network),
                                 jit_compile=True, autograph=False)
            for network in ('policy', 'value')}

    def update(self, batch):
        """Trains each member on its block of one time-major rollout (see algorithm.py);
        returns `[K]` metrics.

        A non-finite loss or gradient stops that member's update before the gradient step is
        applied; the `nonfinite` metric then names it ({quantity: [K] bool} of
        NONFINITE_QUANTITIES). Steps applied before it and the statistics updates stay: a caller
        that must drop the whole batch restores the variables it saved (as the run loop does).
        """
        self._check_batch(batch)
        if isinstance(self._num_units(batch), tf.Tensor):
            # A rollout of unknown length (in a graph): check before any variable changes, since
            # everything in the update depends on the checked batch.
            with tf.control_dependencies([tf.debugging.assert_greater_equal(
                    self._num_units(batch), self._num_minibatches,
                    'num_minibatches exceeds the number of training units in the batch.')]):
                batch = tf.nest.map_structure(tf.identity, batch)
        return self._compiled_update(batch)

    def _num_units(self, batch):
        """Training units of each member in the batch: steps, or sequence chunks for recurrent
        policies."""
        num_steps, num_envs = tf.TensorShape(batch['reward'].shape)
        if num_steps is None or num_envs is None:
            size = tf.shape(batch['reward'])
            num_steps, num_envs = size[0], size[1]
        return num_steps // (self._chunk_length or num_steps) * (num_envs // self.num_members)

    def _update(self, batch):
        """The update as one TF program: normalization, GAE, epochs x minibatches, statistics."""
        num_units = self._num_units(batch)
        batch = tf.nest.map_structure(self.member_major, batch)  # [K, T, N, ...]
        extras = batch['extras']
        reward, advantage, return_, done = self._targets(batch)

        num_steps = tf.shape(reward)[1]
        length = self._chunk_length or num_steps
        # The state recorded at a chunk start is already reset; inside a chunk the policy resets
        # its state before every step that follows an episode end.
        starts_chunk = tf.equal(tf.range(num_steps) % length, 0)[:, None]
        follows_done = tf.concat([tf.zeros_like(done[:, :1]), done[:, :-1]], 1)
        data = {
            'observ': self.normalize(batch['observ']),
            'action': tf.cast(batch['action'], self.policy.action_dtype),
            'log_prob': extras['log_prob'],
            'value': extras['value'],
            'policy_params': extras['policy_params'],
            'advantage': advantage,
            'return': return_,
            'reset': follows_done & ~starts_chunk,
        }
        data = tf.nest.map_structure(lambda tensor: self._to_chunks(tensor, length), data)
        initial_state = tf.nest.map_structure(
            lambda state: tf.reshape(state[:, ::length],
                                     tf.concat([[self.num_members, -1], tf.shape(state)[3:]], 0)),
            extras.get('policy_state', ()))

        self._anneal_learning_rate()
        minibatch_size = num_units // self._num_minibatches
        seeds = self.sampling_seeds.next()
        order = tf.stack([tf.argsort(tf.random.stateless_uniform(
            [self._num_epochs, num_units], seed=seeds[member]), axis=1)
            for member in range(self.num_members)])
        minibatch_indices = tf.reshape(order[:, :, :minibatch_size * self._num_minibatches],
                                       [self.num_members, -1, minibatch_size])
        metrics = self._train_minibatches(data, initial_state, minibatch_indices)

        with tf.control_dependencies(tf.nest.flatten(metrics)):
            self._finish_update(batch)
        metrics.update({
            'learning_rate': tf.identity(self.optimizer.learning_rate),
            'kl_penalty': tf.identity(self.kl_penalty),
            **self._summary(reward, advantage, return_, extras['value']),
        })
        return metrics

    @property
    def concurrent_update(self):
        return self.concurrent_networks

    def _anneal_learning_rate(self):
        super()._anneal_learning_rate()
        if self.concurrent_networks:
            self.value_optimizer.learning_rate.assign(self.optimizer.learning_rate)

    def _train_minibatches(self, data, initial_state, minibatch_indices):
        """Epochs x shuffled minibatches as one in-graph loop (or two side by side, one per
        network), then, for the KL penalty objective, its adaptation."""
        if self.concurrent_networks:
            policy, value = (self._network_programs[network](data, initial_state,
                                                              minibatch_indices)
                             for network in ('policy', 'value'))
            num_applied, sums, nonfinite = policy
            value_applied, value_sums, value_nonfinite = value
            metrics = {name: total / tf.maximum(num_applied, 1.0) for name, total in sums.items()}
            metrics['value_loss'] = value_sums['value_loss'] / tf.maximum(value_applied, 1.0)
            metrics['loss'] = (metrics['policy_loss'] + self._value_coef * metrics['value_loss']
                               - self.hyperparameter('entropy_coef') * metrics['entropy'])
            # Of the networks' mean norms, as the joint update's norm is of their steps' norms.
            metrics['gradient_norm'] = tf.sqrt(
                tf.square(metrics['gradient_norm']) +
                tf.square(value_sums['gradient_norm'] / tf.maximum(value_applied, 1.0)))
            nonfinite = tf.where(nonfinite > 0, nonfinite, value_nonfinite)
        else:
            num_applied, sums, nonfinite = self._steps(
                self.loss, self._trainable, self.optimizer, self._early_stop_kl,
                data, initial_state, minibatch_indices)
            metrics = {name: total / tf.maximum(num_applied, 1.0) for name, total in sums.items()}

        if self.objective_name == 'kl_penalty':
            # The penalty adapts to the KL between the behaviour policy and the updated one over
            # the whole batch: one more pass of the policy, which the clipped objective skips
            # (as CleanRL and SB3; its `kl` metric is the mean over the gradient steps).
            policy = self.policy.distribution(
                self.policy.sequence(data['observ'], initial_state, data['reset']))
            old_policy = self.policy.distribution(data['policy_params'])
            final_kl = members.mean(old_policy.kl_divergence(policy))
            low, high = self._kl['tolerance']
            target, change = self._kl['target'], self._kl['penalty_change']
            self.kl_penalty.assign(self.kl_penalty * tf.where(
                final_kl > high * target, change,
                tf.where(final_kl < low * target, 1.0 / change, 1.0)))
            metrics['final_kl'] = final_kl
        metrics['num_gradient_steps'] = num_applied
        metrics['nonfinite'] = self.nonfinite_report(nonfinite)
        return metrics

    def _network_steps(self, network, data, initial_state, minibatch_indices):
        """One network's epochs x minibatches (`concurrent_networks`): the objective with the
        other network's part fixed at what the rollout recorded, stepped by the network's own
        optimizer."""
        if network == 'policy':
            def loss(minibatch, state):
                params = self.policy.sequence(minibatch['observ'], state, minibatch['reset'])
                return self.objective(self.policy.distribution(params), minibatch['value'],
                                      minibatch)
            return self._steps(loss, self.policy.trainable_variables, self.optimizer,
                               self._early_stop_kl, data, initial_state, minibatch_indices)

        def loss(minibatch, unused_state):
            behaviour = self.policy.distribution(minibatch['policy_params'])
            return self.objective(behaviour, self.value(minibatch['observ']), minibatch)
        return self._steps(loss, self.value.trainable_variables, self.value_optimizer, None,
                           data, initial_state, minibatch_indices)

    def _steps(self, loss_fn, variables, optimizer, early_stop_kl, data, initial_state,
               minibatch_indices):
        """Gradient steps of `loss_fn` on `variables`, one per column of `minibatch_indices`
        ([K, steps, M]), in one in-graph loop: ([K] steps applied, the metrics' [K] sums over
        them, [K] nonfinite codes). A member that stops (non-finite loss or gradient, the
        early-stopping KL) stops alone; the loop ends when every member has stopped."""
        num_members = self.num_members
        num_steps = tf.shape(minibatch_indices)[1]
        zeros = tf.zeros([num_members])
        zero_metrics = {name: zeros for name in METRIC_NAMES}

        def gather(indices):  # [K, M] of each member's units.
            minibatch = tf.nest.map_structure(
                lambda x: tf.gather(x, indices, axis=2, batch_dims=1), data)
            state = tf.nest.map_structure(
                lambda x: tf.gather(x, indices, axis=1, batch_dims=1), initial_state)
            return minibatch, state

        def train_step(step, active, sums, applied, nonfinite):
            minibatch, state = gather(minibatch_indices[:, step])
            with tf.GradientTape() as tape:
                losses, metrics = loss_fn(minibatch, state)
            for value in tf.nest.flatten((losses, metrics)):
                # The loop's variables keep their static [K] shape, also where a rollout of
                # unknown length left the minibatch's member axis unknown.
                value.set_shape([num_members])
            gradients, norm, code = self._gradient(losses, tape, variables)
            metrics['gradient_norm'] = norm
            # A non-finite loss or gradient stops the member's update before it reaches the
            # weights.
            stop = code > 0
            if early_stop_kl:
                stop |= metrics['kl'] > early_stop_kl
            apply = active & ~stop
            optimizer.apply(gradients, variables, apply)
            sums = {name: total + tf.where(apply, metrics[name], 0.0)
                    for name, total in sums.items()}
            nonfinite = tf.where(active, code, nonfinite)
            return step + 1, apply, sums, applied + tf.cast(apply, tf.float32), nonfinite

        _, _, sums, applied, nonfinite = tf.while_loop(
            lambda step, active, *unused: (step < num_steps) & tf.reduce_any(active),
            train_step, (tf.constant(0), tf.ones([num_members], tf.bool), zero_metrics, zeros,
                         tf.zeros([num_members], tf.int32)))
        return applied, sums, nonfinite

    def loss(self, minibatch, initial_state):
        """The whole PPO objective for each member's minibatch of chunks `[K, L, M, ...]`:
        ([K] losses, {name: [K]})."""
        params, value = self.params_and_value(minibatch['observ'], initial_state,
                                              minibatch['reset'])
        return self.objective(self.policy.distribution(params), value, minibatch)

    def objective(self, policy, value, minibatch):
        """PPO's objective of `policy` and `value` (what the networks give for the minibatch's
        observations `[K, L, M, ...]`): ([K] losses, {name: [K]}), each member's mean over its
        minibatch."""
        clip_ratio = members.broadcast(self.hyperparameter('clip_ratio'), minibatch['log_prob'])
        old_policy = self.policy.distribution(minibatch['policy_params'])
        log_ratio = policy.log_prob(minibatch['action']) - minibatch['log_prob']
        ratio = tf.exp(log_ratio)
        kl = old_policy.kl_divergence(policy)  # [K, L, M]
        advantage = minibatch['advantage']
        if self._normalize_advantages:
            mean, variance = tf.nn.moments(advantage, axes=[1, 2], keepdims=True)
            advantage = (advantage - mean) / (tf.sqrt(variance) + 1e-8)

        surrogate = ratio * advantage
        if self.objective_name == 'clipped':
            clipped_ratio = tf.clip_by_value(ratio, 1.0 - clip_ratio, 1.0 + clip_ratio)
            policy_loss = -members.mean(tf.minimum(surrogate, clipped_ratio * advantage))
        else:
            # batch-ppo: adaptive penalty on the KL plus a steep quadratic cost on every sequence
            # whose mean KL exceeds the cutoff, which catches the rare very large policy steps.
            sequence_kl = tf.reduce_mean(kl, axis=1)
            excess = tf.nn.relu(sequence_kl - self._kl['cutoff_factor'] * self._kl['target'])
            policy_loss = (-members.mean(surrogate) + self.kl_penalty * members.mean(kl) +
                           self._kl['cutoff_coef'] * members.mean(tf.square(excess)))

        value_error = tf.square(value - minibatch['return'])
        if self._value_clip:
            clipped_value = minibatch['value'] + tf.clip_by_value(
                value - minibatch['value'], -self._value_clip, self._value_clip)
            value_error = tf.maximum(value_error, tf.square(clipped_value - minibatch['return']))
        value_loss = 0.5 * members.mean(value_error)

        entropy = members.mean(policy.entropy())
        loss = (policy_loss + self._value_coef * value_loss
                - self.hyperparameter('entropy_coef') * entropy)
        metrics = {
            'loss': loss,
            'policy_loss': policy_loss,
            'value_loss': value_loss,
            'entropy': entropy,
            'kl': members.mean(kl),
            'approx_kl': members.mean(ratio - 1.0 - log_ratio),
            'clip_fraction': members.mean(
                tf.cast(tf.abs(ratio - 1.0) > clip_ratio, tf.float32)),
        }
        return loss, metrics

    @staticmethod
    def _to_chunks(tensor, length):
        """`[K, T, N, ...]` -> `[K, length, (T / length) * N, ...]`: chunk c of env n is column
        c*N+n."""
        shape = tf.shape(tensor)
        rank = tensor.shape.rank
        chunks = tf.reshape(tensor, tf.concat([shape[:1], [shape[1] // length, length],
                                               shape[2:]], 0))
        chunks = tf.transpose(chunks, [0, 2, 1] + list(range(3, rank + 1)))
        return tf.reshape(chunks, tf.concat([shape[:1], [length, -1], shape[3:]], 0))

    @tf.autograph.experimental.do_not_convert
    def _check_batch(self, batch):
        """The shared checks, and that the rollout divides into chunks and minibatches."""
        super()._check_batch(batch)
        num_steps = tf.TensorShape(batch['reward'].shape)[0]
        length = self._chunk_length
        if length and num_steps is not None and num_steps % length:
            raise ValueError(f'chunk_length={length} must divide the rollout length T={num_steps}.')
        num_units = self._num_units(batch)
        if not isinstance(num_units, tf.Tensor) and num_units < self._num_minibatches:
            raise ValueError(f'num_minibatches={self._num_minibatches} exceeds the {num_units} '
                             'training units (steps, or chunks for recurrent policies) in the '
                             'batch.')
