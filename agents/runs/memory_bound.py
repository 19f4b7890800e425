"""A lower bound of the memory a run needs, to refuse sizes that cannot fit before anything is
built (`train.population = 100000` would otherwise start and grow until the machine kills it).

The bound counts only what every algorithm holds per environment step of an iteration: the
rollout (observation and next observation of at least one number each, action, reward, two
flags, the policy's value, log-probability and at least two distribution parameters: 9 x 4
bytes) and the update's copies of it (member-major, its training data, GAE's temporaries: about
23 x 4 bytes more). Networks, optimizer slots, environments and TensorFlow itself come on top,
so a run refused here could never have fit.
"""

from agents.runs import run_config
from agents.tools import memory

BYTES_PER_ENV_STEP = 128


def check_fits(population, num_envs, rollout_length, available=None):
    """Raises ConfigError naming the estimate when the run's iteration alone cannot fit in
    `available` bytes (default: this machine's memory)."""
    available = memory.physical_bytes() if available is None else available
    needed = population * num_envs * rollout_length * BYTES_PER_ENV_STEP
    if needed <= available:
        return
    sizes = f'train.num_envs = {num_envs} x train.rollout_length = {rollout_length}'
    if population > 1:
        sizes = f'train.population = {population} x {sizes}'
    raise run_config.ConfigError(
        f'{sizes} needs at least {memory.describe(needed)} ({BYTES_PER_ENV_STEP} bytes per '
        f'environment step of an iteration, for the rollout and its copies in the update), more '
        f'than this machine\'s {memory.describe(available)}; use fewer members, environments or '
        'steps per iteration')
