"""An algorithm acting in a `simulate.Simulator`: policy state kept in variables.

`Algorithm.act` (agents/algorithms/algorithm.py) is a pure function of (observation, policy state,
reset mask). The simulator's episode protocol calls `begin_episode` for environments that were reset
and `perform` once per step; this adapter keeps the policy state and the pending resets between
those calls in TF variables, so a whole rollout still compiles into one TF program, and a
checkpoint of them (`state_variables`) with the environments' lets a resumed run go on with the
episodes in flight.
"""

import tensorflow as tf

from agents.tools import simulate


class SimulatedAgent(simulate.Algorithm):
    """Acts with `agent` in `num_envs` environments, sampling or (if `greedy`) taking the mode."""

    def __init__(self, agent, num_envs, greedy=False):
        self._agent = agent
        self._num_envs = num_envs
        self._greedy = bool(greedy)
        self._state = tf.nest.map_structure(
            lambda tensor: tf.Variable(tensor, trainable=False),
            agent.initial_state(num_envs))
        # Every environment starts a new episode before its first step.
        self._reset = tf.Variable(tf.ones([num_envs], tf.bool), trainable=False)

    def state_variables(self):
        """The variables that carry acting from one rollout to the next, by name: the policy
        state (a list, empty for feed-forward policies) and the pending resets."""
        return {'policy_state': list(tf.nest.flatten(self._state)), 'pending_reset': self._reset}

    def begin_episode(self, agent_indices):
        updates = tf.ones_like(agent_indices, tf.bool)
        self._reset.scatter_nd_update(agent_indices[:, None], updates)

    def perform(self, agent_indices, observ):
        if agent_indices.shape[0] != self._num_envs:  # A group of environments (simulate.py).
            return self._perform_group(agent_indices, observ)
        state = tf.nest.map_structure(lambda variable: variable.read_value(), self._state)
        action, extras, new_state = self._agent.act(
            observ, state, self._reset.read_value(), greedy=self._greedy)
        tf.nest.map_structure(lambda variable, value: variable.assign(value), self._state,
                              new_state)
        self._reset.assign(tf.zeros_like(self._reset))
        return action, extras

    def _perform_group(self, agent_indices, observ):
        """`perform` for the environments at `agent_indices`: their rows of the policy state
        (`[K, N, ...]` of one member, the agent's) and of the pending resets."""
        if self._agent.num_members != 1:
            raise ValueError('a population acts on all its environments at once, not in groups')
        state = tf.nest.map_structure(
            lambda variable: tf.gather(variable, agent_indices, axis=1), self._state)
        action, extras, new_state = self._agent.act(
            observ, state, tf.gather(self._reset, agent_indices), greedy=self._greedy)
        rows = tf.stack([tf.zeros_like(agent_indices), agent_indices], 1)
        tf.nest.map_structure(lambda variable, value: variable.scatter_nd_update(rows, value[0]),
                              self._state, new_state)
        self._reset.scatter_nd_update(agent_indices[:, None],
                                      tf.zeros_like(agent_indices, tf.bool))
        return action, extras
