"""Every algorithm a run can name: importing this module registers their gin configurables.

A config names its algorithm with one binding, `train.algorithm = @PPO`; the binaries import
this module before parsing configs so that the name resolves. To add an algorithm, import its
module here (see docs/new_algorithm.md).
"""

from agents.algorithms.a2c import a2c
from agents.algorithms.ppo import population, ppo

ALGORITHMS = {
    'A2C': a2c.A2C,
    'PPO': ppo.PPO,
}
# The algorithms that train as populations (`train.population`), by the class of their members.
POPULATIONS = {
    ppo.PPO: population.PPOPopulation,
}


def population_class(algorithm):
    """The population class of an algorithm (a class, or gin's function that builds one);
    raises ValueError naming the algorithms that have one."""
    cls = getattr(algorithm, '__wrapped__', algorithm)
    if cls not in POPULATIONS:
        raise ValueError(
            f'{getattr(cls, "__name__", cls)} does not train as a population; '
            f'{", ".join(sorted(member.__name__ for member in POPULATIONS))} does')
    return POPULATIONS[cls]
