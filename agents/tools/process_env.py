"""One environment in a worker process, behind the plain single-environment API.

MuJoCo renders headless through Mesa (EGL), whose software rasterizer brings its own LLVM;
TensorFlow does too, and a process that loads both crashes (a segmentation fault when the
render context is created after TensorFlow is imported, or in TensorFlow after a context was
created). So a tool that acts with a TensorFlow policy and renders steps the environment here:
in a worker of `BatchEnv`'s external mode, which imports neither TensorFlow nor the caller's
main module. Frames come back through a pipe (its time per frame: benchmarks/README.md).
"""

import gymnasium as gym
import numpy as np

from agents.tools import batch_env


class ProcessEnv(gym.Env):
    """`env_fn()` run in a worker process; `reset`, `step`, `render` and `close` as usual.

    `env_fn` must be picklable (see `BatchEnv`). The worker starts from the forkserver, which
    preloads only numpy and gymnasium; 'spawn' would import the caller's main module (and with
    it TensorFlow) into the worker.
    """

    def __init__(self, env_fn):
        self._batch = batch_env.BatchEnv(
            [env_fn], mode='external', num_workers=1, start_method='forkserver',
            autoreset_mode=gym.vector.AutoresetMode.DISABLED)
        self.observation_space = self._batch.single_observation_space
        self.action_space = self._batch.single_action_space
        self.metadata = {key: value for key, value in self._batch.metadata.items()
                         if key != 'autoreset_mode'}
        self.render_mode = self._batch.render_mode

    def reset(self, *, seed=None, options=None):
        observ, infos = self._batch.reset(seed=None if seed is None else [seed], options=options)
        return observ[0], _unbatch(infos)

    def step(self, action):
        observ, reward, terminated, truncated, infos = self._batch.step(
            np.asarray(action)[None])
        return (observ[0], float(reward[0]), bool(terminated[0]), bool(truncated[0]),
                _unbatch(infos))

    def render(self):
        return self._batch.render()[0]

    def close(self):
        self._batch.close()


def _unbatch(infos):
    """The info dict of the single environment from gymnasium's batched infos."""
    return {key: _unbatch(value) if isinstance(value, dict) else value[0]
            for key, value in infos.items()
            if not key.startswith('_') and infos.get(f'_{key}', np.ones(1, bool))[0]}
