"""Native TensorFlow environments: classic-control tasks stepped by TF ops, no Python per step.

`make(env_id, num_envs, seed)` gives the native twin of a Gymnasium id as a batch env with the
interface of `agents.tools.in_graph_batch_env.InGraphBatchEnv`.
"""

from agents.envs.registry import ENVS, get_env, has_native_env, make

__all__ = ['ENVS', 'get_env', 'has_native_env', 'make']
