"""What an algorithm gives the run loop, and nothing else.

The run loop (agents/runs/loop.py) builds the algorithm that `train.algorithm` names (a
gin-configurable subclass, e.g. `train.algorithm = @PPO`) by calling it with these keyword
arguments:

    observ_shape       shape of one observation (of the wrapped environment)
    action_size        action dimensions (Box) or number of actions (Discrete)
    num_envs           environments of a training rollout
    seed               seeds initialization and sampling
    lr_anneal_updates  updates of the whole run, over which schedules anneal; None: constant

Everything else an algorithm takes comes from its own gin bindings. Its methods must change no
Python-side state: the loop calls `act` and `update` inside one compiled TF function per
iteration (rollout, then update), so all state lives in TF variables.

The rollout `batch` that `update` trains on is time-major, `T` steps of `num_envs`
environments: observ, action, reward, terminated, truncated, next_observ (the observation after
the step; at an episode's end its final one) and `extras`, what `act` returned, stacked over
time.

A population (`train.population`; agents/algorithms/registry.py's POPULATIONS names the class of
an algorithm's populations, e.g. ppo/population.py) is an Algorithm over K blocks of
environments, one per member, whose `update` returns [K] metrics; it also has `members` (K lone
agents: what each member's run directory checkpoints and exports), `to_members()` and
`from_members()` (copying its state into them and back) and `undo_members(undo, pairs)`.
"""

import tensorflow as tf


class Algorithm(tf.Module):
    """The interface of an algorithm to the run loop; the module is its checkpointed state."""

    # The codes of the `nonfinite` metric of `update`: {code: the quantity that went non-finite
    # first}; 0 means none did.
    NONFINITE_QUANTITIES = {}

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
        `extras` is a nest of `[N, ...]` tensors the update needs (log-probs, values...).
        """
        raise NotImplementedError

    def update(self, batch):
        """Trains on one rollout (see the module docstring); returns {name: scalar tensor}, the
        quantities it reports, among them `nonfinite` (see NONFINITE_QUANTITIES). A non-finite
        update need not be clean: the loop undoes it from its copy of `train_variables`."""
        raise NotImplementedError

    def train_variables(self):
        """Every variable `update` may change (optimizer slots included), for undoing one."""
        raise NotImplementedError

    def acting_modules(self):
        """{attribute name: module} of what acting needs, restored alone by the tools that
        evaluate, visualize and export a run (e.g. not the optimizer)."""
        raise NotImplementedError

    def exported_policy(self):
        """(policy network, observation normalizer or None): what a policy export holds. The
        policy follows agents/algorithms/networks.py's interface; the normalizer has
        `normalize(observ)`."""
        raise NotImplementedError
