"""Every algorithm a run can name: importing this module registers their gin configurables.

A config names its algorithm with one binding, `train.algorithm = @PPO`; the binaries import
this module before parsing configs so that the name resolves. To add an algorithm, import its
module here (see docs/new_algorithm.md).
"""

from agents.algorithms.a2c import a2c
from agents.algorithms.ppo import ppo

ALGORITHMS = {
    'A2C': a2c.A2C,
    'PPO': ppo.PPO,
}
