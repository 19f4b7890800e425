"""What an algorithm gives the run loop, and nothing else.

The run loop (agents/runs/) builds the algorithm that `train.algorithm` names (a gin-configurable
subclass, e.g. `train.algorithm = @PPO`) by calling it with these keyword arguments:

    observ_shape       shape of one observation (of the wrapped environment)
    action_size        action dimensions (Box) or number of actions (Discrete)
    num_envs           environments of a training rollout
    seed               seeds initialization and sampling
    lr_anneal_updates  iterations of the whole run, over which schedules anneal; None: constant
    population         (populations only) the K lone agents, built alike but for their seeds and
                       MEMBER_HYPERPARAMETERS, whose members the population trains

Everything else an algorithm takes comes from its own gin bindings. Its methods change no
Python-side state: the loop calls `act` and `learn` inside one compiled TF function per
iteration, so all state lives in TF variables.

An algorithm declares how it learns by its base class, as Stable-Baselines3's do:

- `OnPolicyAlgorithm` (PPO, A2C): each iteration is a rollout of `train.rollout_length` steps,
  which `update` trains on and then forgets.
- `OffPolicyAlgorithm`: each iteration is `train_freq` steps, whose transitions `observe` keeps
  in the algorithm's own storage (a replay buffer); once `learning_starts` environment steps were
  observed, `train` takes `gradient_steps` gradient steps per iteration.

The batch of an iteration is time-major, `T` steps of `num_envs` environments: observ, action,
reward, terminated, truncated, next_observ (the observation after the step; at an episode's end
its final one) and `extras`, what `act` returned, stacked over time.

What a non-finite update must put back (`undo_variables`: networks, optimizer, generator) is
apart from what a checkpoint holds (`checkpointed`: by default the whole module, a replay buffer
included). Learning reports `(metrics, nonfinite)`: `nonfinite` maps the name of each quantity
the algorithm checks (e.g. 'loss', 'gradient') to a boolean, true where it went non-finite; the
loop then undoes the update and names the first such quantity.

A population trains K members of one algorithm on K blocks of environments in the same compiled
calls: `num_members` is K, metrics and `nonfinite` are `[K]`, `members` are K lone agents (what
each member's run directory checkpoints and exports), filled by `to_members` before a save and
read back by `from_members` after a restore. An algorithm that trains populations declares the
hyperparameters in which members may differ (`MEMBER_HYPERPARAMETERS`; None: no populations).
A lone agent is a population of one: the loop treats both alike.
"""

import dataclasses

import tensorflow as tf


@dataclasses.dataclass(frozen=True)
class OnPolicy:
    """Train on each rollout of the loop's `rollout_length` steps."""


@dataclasses.dataclass(frozen=True)
class OffPolicy:
    """Observe every step; train every `train_freq` steps once `learning_starts` were observed."""
    learning_starts: int
    train_freq: int
    gradient_steps: int


class Algorithm(tf.Module):
    """The interface of an algorithm to the run loop."""

    # The hyperparameters each member of a population may set for itself (`population`), or
    # None: the algorithm does not train as a population.
    MEMBER_HYPERPARAMETERS = None
    # The argument that chooses the policy network (which fits discrete or continuous actions),
    # for the message that names it; None: the algorithm's policy is its own, for one kind.
    POLICY_NETWORK_ARGUMENT = None
    # (low, high): the range every component of a continuous action falls in (e.g. a
    # tanh-squashed policy's (-1, 1)), which a bounded action space must match; None: any.
    ACTION_BOUNDS = None

    @property
    def cadence(self):
        """`OnPolicy()` or `OffPolicy(...)`: when the loop collects and the algorithm learns."""
        raise NotImplementedError

    @property
    def num_members(self):
        """K, the members trained together (1: a lone agent)."""
        return 1

    @property
    def members(self):
        """The K lone agents whose state each member's run directory saves and exports."""
        return [self]

    def to_members(self):
        """Copies the population's state into `members` (nothing for a lone agent)."""

    def from_members(self):
        """Reads the state of `members` back (e.g. restored from their checkpoints)."""

    @property
    def concurrent_update(self):
        """Whether `learn` runs programs side by side that one XLA program around the whole
        iteration would fuse into one (the loop then compiles the rollout alone)."""
        return False

    @property
    def action_dtype(self):
        """The dtype of the actions: integer for discrete action spaces, else floating."""
        raise NotImplementedError

    def initial_state(self, batch_size):
        """The policy state of `batch_size` new episodes (`()` for feed-forward policies)."""
        raise NotImplementedError

    def act(self, observ, state, reset_mask, greedy=False):
        """One step of the policy: `(observ [N, ...], state, reset_mask [N] bool)` ->
        `(action, extras, new_state)`.

        `reset_mask` marks the environments whose episode starts at this step. `greedy` (a
        Python bool) acts for evaluation: deterministically, e.g. the distribution's mode.
        `extras` is a nest of `[N, ...]` tensors learning needs (log-probs, values...).
        """
        raise NotImplementedError

    def learn(self, batch, batch_finite):
        """One iteration's learning from its `batch`: `(metrics, nonfinite)` (module docstring).

        `batch_finite` ([K] bool) tells for each member whether the batch's observations and
        rewards are finite; the loop undoes the update of a member whose batch is not, so an
        algorithm that keeps transitions must not keep those.
        """
        raise NotImplementedError

    def undo_variables(self):
        """Every variable `learn` may change that undoing a non-finite update puts back."""
        raise NotImplementedError

    def undo(self, undo_mask, pairs):
        """Ops that put back the saved values of `pairs` (`(variable, saved)` of
        `undo_variables()`) for the members where `undo_mask` ([K] bool) is true."""
        def restore():
            with tf.control_dependencies([variable.assign(saved) for variable, saved in pairs]):
                return tf.constant(True)
        return [tf.cond(undo_mask[0], restore, lambda: tf.constant(False))]

    def checkpointed(self):
        """What a checkpoint holds under `agent`: by default the whole module."""
        return self

    def acting_modules(self):
        """{attribute name: module} of what acting needs, restored alone by the tools that
        evaluate, visualize and export a run (e.g. not the optimizer)."""
        raise NotImplementedError

    def exported_policy(self):
        """(policy network, observation normalizer or None): what a policy export holds. The
        policy follows agents/algorithms/networks.py's interface; the normalizer has
        `normalize(observ)`."""
        raise NotImplementedError


class OnPolicyAlgorithm(Algorithm):
    """An algorithm that trains on each rollout (`update`) and keeps no transitions."""

    @property
    def cadence(self):
        return OnPolicy()

    def learn(self, batch, batch_finite):
        del batch_finite  # The loop undoes the update of a non-finite batch.
        metrics = dict(self.update(batch))
        return metrics, metrics.pop('nonfinite')

    def update(self, batch):
        """Trains on one rollout: its metrics, among them `nonfinite` ({quantity: bool}). A
        non-finite update need not be clean: the loop undoes it from its copy of
        `undo_variables`."""
        raise NotImplementedError


class OffPolicyAlgorithm(Algorithm):
    """An algorithm that keeps transitions (`observe`) and trains from them (`train`).

    Subclasses call `__init__` with their cadence and define `observe`, `train` and the
    metrics `train` reports (`TRAIN_METRICS`).
    """

    # The names of the metrics `train` returns, NaN (not logged) in iterations that do not train.
    TRAIN_METRICS = ()
    # The names of the quantities in `train`'s `nonfinite`.
    NONFINITE_QUANTITIES = ()

    def __init__(self, learning_starts, train_freq, gradient_steps, name=None):
        super().__init__(name=name)
        for key, value, least in (('learning_starts', learning_starts, 0),
                                  ('train_freq', train_freq, 1),
                                  ('gradient_steps', gradient_steps, 1)):
            if not isinstance(value, int) or isinstance(value, bool) or value < least:
                raise ValueError(f'{key} must be an integer of at least {least}, got {value!r}.')
        self._cadence = OffPolicy(learning_starts, train_freq, gradient_steps)
        self.observed_steps = tf.Variable(0, dtype=tf.int64, trainable=False,
                                          name='observed_steps')

    @property
    def cadence(self):
        return self._cadence

    def learn(self, batch, batch_finite):
        """Keeps a finite batch (`observe`), then trains once `learning_starts` steps were seen."""
        steps = tf.cast(tf.size(batch['reward']), tf.int64)
        finite = tf.reduce_all(batch_finite)
        with tf.control_dependencies([self.observe(batch, finite)]):
            kept = self.observed_steps.assign_add(tf.where(finite, steps, 0))

        def skip():
            return ({name: tf.constant(float('nan')) for name in self.TRAIN_METRICS},
                    {name: tf.constant(False) for name in self.NONFINITE_QUANTITIES})

        with tf.control_dependencies([kept]):
            ready = finite & (self.observed_steps >= self._cadence.learning_starts)
            return tf.cond(ready, lambda: self.train(self._cadence.gradient_steps), skip)

    def observe(self, batch, keep):
        """Stores the batch's transitions if `keep` ([] bool; false for a non-finite batch);
        returns an op (or tensor) that does it. Without a branch on `keep`: XLA copies the whole
        of a storage that a conditional writes, every iteration (e.g.
        `replay_buffer.ReplayBuffer.add(batch, keep)`)."""
        raise NotImplementedError

    def train(self, gradient_steps):
        """`gradient_steps` gradient steps from the stored transitions: `(metrics, nonfinite)`
        with the keys of `TRAIN_METRICS` and `NONFINITE_QUANTITIES`."""
        raise NotImplementedError
