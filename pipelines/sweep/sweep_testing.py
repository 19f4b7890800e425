"""The tiny sweep the tests of the sweep binary run: its spec and how to start the launcher."""

import os
import sys
import textwrap

from agents.runs import run_config


def tiny_spec(gin_file='configs/pendulum.gin', env_steps=2048, timeout_s=600):
    """A spec whose trials train Pendulum on 4 environments, evaluated every 1024 steps with
    one episode: about 10 s of training per 2048 steps. Their update runs as a graph that
    neither XLA nor Grappler optimizes: no sweep test is about compilation, which would cost
    each trial seconds."""
    return f"""\
gin_files: [{gin_file}]
bindings:
  PPO.jit_compile: false
  train.optimize_graphs: false
  train.num_envs: 4
  train.rollout_length: 256
  train.eval_every_steps: 1024
  train.eval_episodes: 1
  PPO.num_minibatches: 4
budget: {{env_steps: {env_steps}, timeout_s: {timeout_s}}}
"""


# Two evaluations of one episode per trial.
TINY_SPEC = tiny_spec()


def write_spec(directory, text='', name='spec.yaml'):
    """Writes TINY_SPEC followed by `text` (dedented) to `directory`/`name`; returns its path."""
    path = os.path.join(directory, name)
    with open(path, 'w') as f:
        f.write(TINY_SPEC + textwrap.dedent(text))
    return path


def sweep_command(*args):
    return [sys.executable, '-m', 'pipelines.sweep', *args]


def environment(cwd, base=None):
    """The launcher's environment: this tree importable, `cwd` as the caller's directory."""
    return dict(os.environ if base is None else base, PYTHONPATH=run_config.PACKAGE_ROOT,
                BUILD_WORKING_DIRECTORY=cwd)
