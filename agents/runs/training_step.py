"""The compiled training step: collect, learn, and undo what came out non-finite.

An iteration is the simulator's rollout of `rollout_length` steps of the training environments
followed by the algorithm's `learn` (algorithm.py: an on-policy update of the rollout, or an
off-policy algorithm's observe and train). Several iterations run in one compiled call (native
environments), which stops early after an iteration that went non-finite. Before learning, the
algorithm's `undo_variables` are copied; a member whose batch, learning or parameters went
non-finite gets them back, and the iteration reports what went non-finite first, by name.
"""

import functools
import types

import numpy as np
import tensorflow as tf
from absl import logging

from agents.runs import simulated_agent
from agents.tools import simulate

# What the step itself checks for non-finite values, by the names its errors use.
OBSERVATION = 'observation from the environments'
REWARD = 'reward from the environments'
PARAMETER = 'parameter'
ACTION = 'action (the policy acted on a non-finite observation, or its parameters are not finite)'


class TrainingStep:
    """Up to `iterations_per_call` training iterations of `agent` on `train_env` per call."""

    def __init__(self, agent, train_env, rollout_length, env_steps, iterations_per_call,
                 jit_compile):
        self._agent = agent
        self._train_env = train_env
        self._members = agent.num_members
        self._env_steps = env_steps
        self.iterations_per_call = iterations_per_call
        self.acting = simulated_agent.SimulatedAgent(agent, len(train_env))
        self.simulator = simulate.Simulator(train_env, self.acting)
        # An algorithm whose update runs programs side by side calls them itself: one XLA
        # program around the iteration would fuse them into one again, so XLA then compiles the
        # rollout alone.
        concurrent = agent.concurrent_update
        self.rollout = functools.partial(self.simulator.rollout, rollout_length)
        if jit_compile and concurrent:
            self.rollout = tf.function(self.rollout, autograph=False, jit_compile=True)
        if concurrent and tf.config.threading.get_inter_op_parallelism_threads() == 1:
            logging.warning('The agent trains its networks side by side, but TensorFlow has one '
                            'inter-op thread, which runs them one after the other; set '
                            'configure_threads.inter_op_threads = 2.')
        # Autograph off: the code has no tensor-dependent Python control flow, and converting
        # it lengthens the first iteration's tracing by seconds.
        self.compiled = tf.function(self._iterations_graph, autograph=False,
                                    jit_compile=jit_compile and not concurrent)
        seen, self._variables = set(), []
        for variable in agent.undo_variables():
            if variable.ref() not in seen:
                seen.add(variable.ref())
                self._variables.append(variable)
        self.undone_variables = tuple(self._variables)  # What each iteration copies first.
        self._backups = [tf.Variable(variable.read_value(), trainable=False)
                         for variable in self._variables]
        self.float_variables = [variable for variable in self._variables
                                if variable.dtype.is_floating]
        # What a `nonfinite` code k > 0 names: the (k-1)-th; the algorithm's quantities are
        # known once the iteration is traced.
        self.nonfinite_quantities = None

    def episodes_in_flight(self):
        """A checkpoint of the training episodes in flight (native environments, whose state
        lives in variables), which a resumed run continues."""
        return tf.train.Checkpoint(
            env=self._train_env, episode_score=self.simulator.score,
            episode_length=self.simulator.length,
            agent=tf.train.Checkpoint(**self.acting.state_variables()))

    def trace(self):
        """Traces the compiled call (executes nothing)."""
        self.compiled.get_concrete_function(tf.TensorSpec([], tf.bool), tf.TensorSpec([], tf.int32))

    def __call__(self, reset, count):
        """Runs up to `count` iterations, the first resetting every environment if `reset`.

        Returns (iterations, report): each iteration as a namespace of its metrics, the number
        of its training episodes that ended and their summed return and length, and `dropped`
        ([K] bool, set by the caller); the report of the last iteration: `nonfinite` ([K]
        codes), `nonfinite_envs` and `finite_variables`.
        """
        outputs = self.compiled(tf.constant(reset), tf.constant(count))
        stats = {name: values.numpy() for name, values in outputs.pop('stats').items()}
        iterations = []
        for index in range(int(outputs.pop('ran'))):
            metrics = {name: values[index] for name, values in stats.items()}
            iterations.append(types.SimpleNamespace(
                episodes=metrics.pop('episodes'), return_sum=metrics.pop('return_sum'),
                length_sum=metrics.pop('length_sum'), metrics=metrics,
                dropped=np.zeros(self._members, bool)))
        return iterations, {name: value.numpy() for name, value in outputs.items()}

    def describe_nonfinite(self, member, code, report, steps, name=''):
        """The sentence of what went non-finite (`code`, of `report`) for `member` (`name`:
        its run directory's, '' for a lone run) in the iteration that ended at `steps`."""
        quantity = self.nonfinite_quantities[code - 1]
        where = ''
        if quantity in (OBSERVATION, REWARD):
            envs = report['nonfinite_envs'].reshape(self._members, -1)[member]
            where = f' {np.flatnonzero(envs).tolist()}'
        elif quantity == PARAMETER:
            names = [variable.name for variable, finite in zip(
                self.float_variables, report['finite_variables'][:, member], strict=True)
                if not finite]
            where = f' ({", ".join(names[:3])}{" ..." if len(names) > 3 else ""})'
        of_member = f' of {name}' if name else ''
        return (f'non-finite {quantity}{where}{of_member} in the iteration that ended at step '
                f'{steps}; its update was undone')

    def _iterations_graph(self, reset, count):
        """Up to `count` iterations (at most `iterations_per_call`) in one compiled call; stops
        early after an iteration that went non-finite (its update undone)."""
        members = self._members

        def iteration(reset):
            summary, metrics = self._iteration_graph(reset)
            ended = ((summary['terminated'] | summary['truncated'])
                     & tf.math.is_finite(summary['episode_return']))

            def member_sum(values):  # [T, K * N] -> [K]
                return tf.reduce_sum(tf.reshape(values, [tf.shape(values)[0], members, -1]),
                                     axis=[0, 2])

            def ended_sum(values):
                return member_sum(tf.where(ended, tf.cast(values, tf.float64), 0.0))

            # Every statistic per member: [K] (a lone run's metrics are scalars).
            stats = dict({name: tf.reshape(value, [members]) for name, value in metrics.items()},
                         episodes=member_sum(tf.cast(ended, tf.int32)),
                         return_sum=ended_sum(summary['episode_return']),
                         length_sum=ended_sum(summary['episode_length']))
            report = {name: summary[name] for name in (
                'nonfinite', 'nonfinite_envs', 'finite_variables')}
            return stats, report

        size = self.iterations_per_call
        if size == 1:
            stats, report = iteration(reset)
            return dict(report, ran=tf.constant(1),
                        stats={name: value[None] for name, value in stats.items()})
        # The loop's variables need the outputs' structure, which a trace of the body tells;
        # the loop then calls that trace rather than tracing the body a second time (running
        # the first iteration outside the loop instead makes XLA compile it twice).
        traced = tf.function(iteration, autograph=False).get_concrete_function(
            tf.TensorSpec([], tf.bool))
        stats, report = traced.structured_outputs
        stacked = {name: tf.zeros([size] + value.shape, value.dtype)
                   for name, value in stats.items()}
        report = {name: tf.zeros(value.shape, value.dtype) for name, value in report.items()}

        def body(index, reset, stacked, unused_report):
            stats, report = traced(reset)
            stacked = {name: tf.tensor_scatter_nd_update(values, [[index]], [stats[name]])
                       for name, values in stacked.items()}
            return index + 1, tf.constant(False), stacked, report

        ran, _, stacked, report = tf.while_loop(
            lambda index, unused_reset, unused_stacked, report: (index < count) & (
                tf.reduce_all(report['nonfinite'] == 0)),
            body, (tf.constant(0), reset, stacked, report), parallel_iterations=1,
            maximum_iterations=size)
        return dict(report, ran=ran, stats=stacked)

    def _iteration_graph(self, reset):
        """One iteration: the rollout and learning, undone for the members where anything went
        non-finite."""
        transitions = self.rollout(reset=reset)
        batch = {
            'observ': transitions.observ, 'action': transitions.action,
            'reward': transitions.reward, 'terminated': transitions.terminated,
            'truncated': transitions.truncated, 'next_observ': transitions.next_observ,
            'extras': transitions.extras}
        bad_observ = tf.zeros([len(self._train_env)], tf.bool)
        if transitions.observ.dtype.is_floating:
            for observ in (transitions.observ, transitions.next_observ):
                flat = tf.reshape(observ, tf.concat([tf.shape(observ)[:2], [-1]], 0))
                bad_observ |= tf.reduce_any(~tf.math.is_finite(flat), axis=[0, 2])
        bad_reward = tf.reduce_any(~tf.math.is_finite(transitions.reward), axis=0)
        save = [backup.assign(variable) for backup, variable in zip(
            self._backups, self._variables, strict=True)]
        with tf.control_dependencies(save):
            batch = tf.nest.map_structure(tf.identity, batch)
        members = self._members

        def per_member(values):  # What went non-finite per member: [K].
            return tf.reduce_any(tf.reshape(values, [members, -1]), axis=1)

        metrics, learned = self._agent.learn(batch, ~per_member(bad_observ | bad_reward))
        finite_variables = tf.stack([  # [V, K]
            ~per_member(~tf.math.is_finite(variable)) for variable in self.float_variables])
        checks = [(OBSERVATION, per_member(bad_observ)), (REWARD, per_member(bad_reward)),
                  *((name, tf.reshape(value, [members])) for name, value in learned.items()),
                  (PARAMETER, ~tf.reduce_all(finite_variables, axis=0))]
        self.nonfinite_quantities = [name for name, _ in checks]
        nonfinite = tf.zeros([members], tf.int32)
        for code, (_, bad) in reversed(list(enumerate(checks, 1))):  # The first one wins.
            nonfinite = tf.where(bad, code, nonfinite)
        with tf.control_dependencies(tf.nest.flatten(metrics) + [finite_variables]):
            undone = self._agent.undo(
                nonfinite > 0, list(zip(self._variables, self._backups, strict=True)))
        with tf.control_dependencies(undone):
            self._env_steps.assign_add(
                tf.cast(tf.size(transitions.reward) // members, tf.int64))
        summary = {
            'terminated': transitions.terminated, 'truncated': transitions.truncated,
            'episode_return': transitions.episode_return,
            'episode_length': transitions.episode_length,
            'nonfinite': nonfinite, 'nonfinite_envs': bad_observ | bad_reward,
            'finite_variables': finite_variables}
        return summary, metrics
