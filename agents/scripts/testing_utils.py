"""Helpers for the tests of the command-line tools: tiny training runs and running binaries."""

import os
import subprocess
import sys
import tempfile

import gin

from agents.algorithms import registry  # noqa: F401 (registers PPO)
from agents.runs import loop

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Two evaluations (steps 256 and 512), so two checkpoints and two exported policies; about 10 s.
TINY_RUN = """
train.algorithm = @PPO
train.total_steps = 512
train.num_envs = 4
train.rollout_length = 64
train.env_mode = 'in_process'
train.eval_every_steps = 256
train.eval_episodes = 1
PPO.num_minibatches = 4
"""

# Bindings for a tiny run whose tests are not about compilation: the update runs as a graph that
# neither XLA nor Grappler optimizes, which would take longer than the run itself.
UNCOMPILED = """
PPO.jit_compile = False
train.optimize_graphs = False
"""


def train_tiny_run(logdir, env_id='Pendulum-v1', bindings=''):
    """Trains a tiny run into `logdir` through gin, as the train binary would."""
    gin.clear_config()
    try:
        gin.parse_config(f'{TINY_RUN}\ntrain.env_id = {env_id!r}\n{bindings}')
        loop.train(logdir)
    finally:
        gin.clear_config()
    return logdir


def run_script(name, *args, timeout=600, env=None):
    """Runs `python -m agents.scripts.<name> args...` in `env` (default this process's) with
    this tree importable; returns the CompletedProcess."""
    env = dict(os.environ if env is None else env, PYTHONPATH=ROOT)
    return subprocess.run([sys.executable, '-m', f'agents.scripts.{name}', *args], env=env,
                          capture_output=True, text=True, timeout=timeout, check=False)


def local_copies(directory=None):
    """The local copies of remote directories that a binary left in `directory` (default the
    temporary directory)."""
    return {name for name in os.listdir(directory or tempfile.gettempdir())
            if name.startswith('batchppo-copy-')}


def error_lines(stderr):
    """The lines of `stderr` telling an error, without TensorFlow's own (E0000 ...)."""
    return [line for line in stderr.splitlines() if 'error' in line.lower()
            and not line.startswith(('E0000', 'W0000', 'I0000'))]


def snapshot(directory):
    """Every file under `directory` with its bytes, to show that nothing changed."""
    files = {}
    for parent, _, names in os.walk(directory):
        for name in names:
            path = os.path.join(parent, name)
            with open(path, 'rb') as f:
                files[os.path.relpath(path, directory)] = f.read()
    return files
