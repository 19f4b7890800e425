"""Every algorithm a run can name: importing this module registers their gin configurables.

A config names its algorithm with one binding, `train.algorithm = @PPO`; the binaries import
this module before parsing configs so that the name resolves. To add an algorithm, import its
module here (see docs/new_algorithm.md).
"""

from agents.algorithms import algorithm as algorithm_lib
from agents.algorithms import shared_torso  # noqa: F401 (the policies on frames and their torsos)
from agents.algorithms.a2c import a2c
from agents.algorithms.ppo import ppo
from agents.algorithms.sac import sac

ALGORITHMS = {
    'A2C': a2c.A2C,
    'PPO': ppo.PPO,
    'SAC': sac.SAC,
}


def member_hyperparameters(algorithm):
    """What each member of a population of `algorithm` (a class, or gin's function that builds
    one) may set; raises ValueError naming the algorithms that train as populations."""
    cls = getattr(algorithm, '__wrapped__', algorithm)
    if not (isinstance(cls, type) and issubclass(cls, algorithm_lib.Algorithm)
            and cls.MEMBER_HYPERPARAMETERS is not None):
        populations = sorted(name for name, known in ALGORITHMS.items()
                             if known.MEMBER_HYPERPARAMETERS is not None)
        raise ValueError(f'{getattr(cls, "__name__", cls)} does not train as a population; '
                         f'{", ".join(populations)} do')
    return cls.MEMBER_HYPERPARAMETERS
