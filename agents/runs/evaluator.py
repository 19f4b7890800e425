"""Evaluation: one episode of the deterministic policy in each evaluation environment.

The environments' first reset is seeded by the run's seed and the step alone, and the policy
takes the mode of its distribution (no random numbers), so an evaluation depends on the weights
and the step only: an extra one (at a stop) shifts no later one, and a resumed run's evaluations
are those of the run uninterrupted.
"""

import numpy as np
import tensorflow as tf

from agents.runs import environments, simulated_agent
from agents.tools import simulate

# Steps of the evaluation environments per compiled call (Gymnasium backend), between which the
# run checks for stop signals.
CHUNK = 100
# InGraphBatchEnv's refusal of a NaN action, which ends a rollout before its checks.
NONFINITE_ACTION = 'action contains NaN or infinity'


def evaluation_seed(seed, steps):
    """The seed of the evaluation environments' first reset in the evaluation at `steps` of a
    run of `seed`: a 62-bit hash of both, far from the seeds of training (which count from
    `seed`) and of other steps' evaluations."""
    words = np.random.SeedSequence(
        [seed, environments.EVAL_SEED_OFFSET, steps]).generate_state(2, np.uint32)
    return (int(words[0]) << 30) | (int(words[1]) >> 2)


class Evaluator:
    """Evaluates `agent` on `eval_env`: native environments run whole episodes in one compiled
    call, Gymnasium's in calls of `CHUNK` steps."""

    def __init__(self, agent, eval_env, jit_compile):
        self._env = eval_env
        self._sim = simulate.Simulator(
            eval_env, simulated_agent.SimulatedAgent(agent, len(eval_env), greedy=True))
        self.whole_episodes = eval_env.vector_env is None
        self.rollout = tf.function(
            self._episodes_graph if self.whole_episodes else self._chunk_graph,
            autograph=False, jit_compile=jit_compile)

    def trace(self):
        """Traces the compiled evaluation (executes nothing)."""
        self.rollout.get_concrete_function(tf.TensorSpec([], tf.bool))

    def evaluate(self, seeds, between_calls):
        """(returns [N], lengths [N]) of one episode per environment, the first reset seeded by
        `seeds` (one, or one per member's block); `between_calls()` runs before each call."""
        self._env.seed_next_reset(seeds)
        num_envs = len(self._env)
        returns = np.zeros(num_envs)
        lengths = np.zeros(num_envs, np.int64)
        finished = np.zeros(num_envs, bool)
        reset = True
        while not finished.all():
            between_calls()
            summary = self.rollout(tf.constant(reset))
            reset = False
            done = (summary['terminated'] | summary['truncated']).numpy()
            episode_return = summary['episode_return'].numpy()
            episode_length = summary['episode_length'].numpy()
            for step in range(done.shape[0]):
                new = done[step] & ~finished
                returns[new] = episode_return[step][new]
                lengths[new] = episode_length[step][new]
                finished |= new
        return returns, lengths

    def _chunk_graph(self, reset):
        """`CHUNK` steps of the evaluation environments: what ended where, [T, N]."""
        transitions = self._sim.rollout(CHUNK, reset=reset)
        return {'terminated': transitions.terminated, 'truncated': transitions.truncated,
                'episode_return': transitions.episode_return,
                'episode_length': transitions.episode_length}

    def _episodes_graph(self, reset):
        """Chunks until every environment's first episode ended, in one call (native
        environments); returns the result as a single step [1, N] at which every episode ends,
        which `evaluate` reads as it reads chunks."""
        num_envs = len(self._env)
        columns = tf.range(num_envs)

        def body(reset, finished, returns, lengths):
            chunk = self._chunk_graph(reset)
            ends = (chunk['terminated'] | chunk['truncated']) & ~finished[None]
            first_end = tf.stack(
                [tf.argmax(tf.cast(ends, tf.int32), axis=0, output_type=tf.int32), columns], 1)
            ended = tf.reduce_any(ends, axis=0)
            returns = tf.where(ended, tf.gather_nd(chunk['episode_return'], first_end), returns)
            lengths = tf.where(ended, tf.gather_nd(chunk['episode_length'], first_end), lengths)
            return tf.constant(False), finished | ended, returns, lengths

        _, _, returns, lengths = tf.while_loop(
            lambda unused_reset, finished, *unused: ~tf.reduce_all(finished), body,
            (reset, tf.zeros([num_envs], tf.bool), tf.zeros([num_envs], tf.float32),
             tf.zeros([num_envs], tf.int32)), parallel_iterations=1)
        return {'terminated': tf.ones([1, num_envs], tf.bool),
                'truncated': tf.zeros([1, num_envs], tf.bool),
                'episode_return': returns[None], 'episode_length': lengths[None]}
