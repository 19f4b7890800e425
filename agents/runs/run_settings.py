"""A run's settings: the `train.*` bindings as one frozen value, checked before anything is built.

`RunSettings.validate` checks everything a user can get wrong in them without building
environments, networks or graphs, so that a trainer, a sweep's packer and a spec check find the
same mistakes with the same messages, and nothing is written before.
"""

import dataclasses

import gin
import tensorflow as tf

from agents.algorithms import algorithm as algorithm_lib
from agents.algorithms import registry
from agents.runs import environments, faults, memory_bound, run_config, run_dir
from agents.storage import failures

# A lone on-policy run of at most this many environments compiles without XLA by default: XLA's
# compilation delays its first returns more than it speeds its iterations. An off-policy
# algorithm's iterations are a few steps and gradient steps each, thousands of them, where
# TensorFlow's per-op dispatch outweighs the work unless XLA compiles them.
SMALL_RUN_ENVS = 64


@gin.configurable('train')
@dataclasses.dataclass(frozen=True)
class RunSettings:
    """What `train.*` binds.

    Args:
      algorithm: the algorithm to train, a subclass of `Algorithm` (agents/algorithms/
        algorithm.py), e.g. `@PPO` or `@A2C`.
      env_id: a Gymnasium environment id (an EnvPool task id on the EnvPool backend).
      total_steps: training budget in environment steps (rounded up to whole iterations).
      num_envs: environments stepped together for training.
      rollout_length: steps per environment between updates of an on-policy algorithm (T).
      env_mode: 'external' (worker processes, shared memory), 'in_process' or 'hybrid'
        (see `batch_env.BatchEnv`); the Gymnasium backend only (the configs bind it for that
        backend; the others ignore it).
      env_backend: 'gymnasium' (Gymnasium environments through the in-graph batch env),
        'native' (the TF twin of `env_id` from agents/envs: collecting and learning are one
        TF program, no Python per step) or 'envpool' (EnvPool's C++ pool of environments in
        sync mode, through the in-graph batch env, for training and the trainer's
        evaluations; needs `pip install 'batchppo[envpool]'`): the Gymnasium tasks EnvPool
        has (e.g. Pendulum-v1, CartPole-v1, HalfCheetah-v5, Hopper-v5) with the Gymnasium
        backend's spaces and seeds (EnvPool draws other initial states from a seed);
        `env_kwargs` go to `envpool.make` and the wrappers wrap the batch, and EnvPool's
        Atari games, from uint8 frames (whole games in evaluations); `env_kwargs['batch_size']`
        B below `num_envs` steps the training environments in groups of B, one stepping while
        the algorithm acts for the next (tools/pipelined_env.py: EnvPool's async mode, in a
        fixed order). `visualize` and `evaluate` act in Gymnasium's environments (EnvPool's,
        for Atari).
      native_dtype: 'float64' or 'float32', the physics dtype of the native training
        environments (evaluation always runs float64, Gymnasium-exact).
      jit_compile: compile iterations and evaluations with XLA; None: see
        `RunSettings.compiles_with_xla`.
      optimize_graphs: run TensorFlow's graph optimizer (Grappler) on the compiled
        functions; None: see `RunSettings.optimizes_graphs`. A setting of the whole process.
      num_workers: worker processes in external mode (default: the number of cores); the
        Gymnasium backend only (refused on the EnvPool backend, whose threads
        `env_kwargs = {'num_threads': n}` sets).
      env_kwargs: keyword arguments of `gymnasium.make` (of `envpool.make` on the EnvPool
        backend).
      wrappers: wrapper specs applied to each environment (see `wrappers.apply_wrappers`);
        by default bounded observations and actions are rescaled to [-1, 1] and the
        policy's actions clipped to the action space.
      anneal_learning_rate: anneal the algorithm's schedules (e.g. decay its learning rate
        linearly to zero) over the budget.
      eval_every_steps: evaluations (and checkpoints) come at the first iteration past each
        multiple of this many environment steps, and at the end.
      eval_episodes: episodes of the deterministic policy per evaluation.
      checkpoints_to_keep: how many checkpoints to keep.
      log_every_secs: seconds between progress lines.
      on_env_failure: when a training environment fails (raises, or its worker process
        dies): 'restart' rebuilds all training environments (the episodes in flight are
        dropped) and redoes the iteration; 'stop' ends the run with an error naming it.
      max_env_restarts: restarts allowed between two checkpoints; one more failure ends it.
      on_nonfinite: when the batch holds a non-finite observation or reward, or learning a
        non-finite quantity or parameter, the update is undone and 'stop' ends the run (the
        last checkpoint stays the last one) or 'skip' goes on with the next batch.
      iterations_per_call: the most training iterations one compiled call runs. A call never
        runs past an evaluation, nor (once the first calls are timed) much longer than a
        second, so that signals and progress lines are not held up. None: as many as fit
        (native backend, or an off-policy algorithm's iterations of a few steps), else one
        (an on-policy rollout of Gymnasium environments). The results are the same whatever
        the value; after a Gymnasium environment failed in a call, the iterations before it
        stand and the rest are redone.
      population: K > 1 trains K independent agents of seeds `seed`, ..., `seed` + K - 1 in
        one program (native backend, an algorithm with MEMBER_HYPERPARAMETERS), each on its
        own `num_envs` environments and with its own `eval_episodes`; each member's run is
        an ordinary run in `<logdir>/member-<k>/`, and `total_steps` is each member's budget.
      population_members: the K members' own bindings, a list of dicts, e.g.
        `[{'train.seed': 3, 'PPO.learning_rate': 1e-3}, ...]`: `train.seed` (default `seed` +
        k) and the hyperparameters in which members may differ (the algorithm's
        MEMBER_HYPERPARAMETERS). None: seeds alone.
      seed: seeds environments, network initialization and sampling.
    """
    algorithm: object = gin.REQUIRED
    env_id: str = gin.REQUIRED
    total_steps: int = gin.REQUIRED
    num_envs: int = 16
    rollout_length: int = 128
    env_mode: str = 'external'
    env_backend: str = 'gymnasium'
    native_dtype: str = 'float64'
    jit_compile: object = None
    optimize_graphs: object = None
    num_workers: object = None
    env_kwargs: object = None
    wrappers: tuple = environments.DEFAULT_WRAPPERS
    anneal_learning_rate: bool = True
    eval_every_steps: int = 20_000
    eval_episodes: int = 10
    checkpoints_to_keep: int = 3
    log_every_secs: float = 10.0
    on_env_failure: str = 'restart'
    max_env_restarts: int = 3
    on_nonfinite: str = 'stop'
    iterations_per_call: object = None
    population: int = 1
    population_members: object = None
    seed: int = 0

    @property
    def algorithm_class(self):
        """The class `algorithm` names (gin may pass a function that builds it)."""
        return getattr(self.algorithm, '__wrapped__', self.algorithm)

    @property
    def native(self):
        return self.env_backend == 'native'

    @property
    def member_hyperparameters(self):
        """What each member of a population (`population` > 1) may set; raises ValueError for
        an algorithm that does not train as a population."""
        return registry.member_hyperparameters(self.algorithm_class)

    def compiles_with_xla(self):
        """`jit_compile`, or by default: native environments, unless a small lone on-policy run."""
        if self.jit_compile is not None:
            return self.jit_compile
        return self.native and (
            self.population > 1 or self.num_envs > SMALL_RUN_ENVS
            or issubclass(self.algorithm_class, algorithm_lib.OffPolicyAlgorithm))

    def optimizes_graphs(self):
        """`optimize_graphs`, or by default for the Gymnasium backend (on the native one
        Grappler only lengthens the first iteration)."""
        return not self.native if self.optimize_graphs is None else self.optimize_graphs

    def iteration_length(self, cadence):
        """Steps per environment of an iteration: the rollout, or an off-policy algorithm's
        `train_freq`."""
        if isinstance(cadence, algorithm_lib.OffPolicy):
            return cadence.train_freq
        return self.rollout_length

    def num_iterations(self, cadence):
        return -(-self.total_steps // (self.num_envs * self.iteration_length(cadence)))

    def calls_of(self, cadence):
        """The most iterations one compiled call runs: enough for the iterations between two
        evaluations (native, or an off-policy algorithm's short iterations), else one."""
        if self.iterations_per_call is not None:
            return self.iterations_per_call
        if not self.native and not isinstance(cadence, algorithm_lib.OffPolicy):
            return 1
        return -(-self.eval_every_steps // (self.num_envs * self.iteration_length(cadence)))

    def member_overrides(self):
        """The members' hyperparameters (dicts of `seed` and the scalars they set) and their gin
        bindings ({'train.seed': ..., 'PPO.learning_rate': ...}) of a population."""
        population_members = self.population_members
        if population_members is None:
            population_members = [{} for _ in range(self.population)]
        name = self.algorithm_class.__name__
        allowed = {run_dir.SEED_BINDING} | {
            f'{name}.{scalar}' for scalar in self.member_hyperparameters}
        members, bindings = [], []
        for index, overrides in enumerate(population_members):
            unknown = sorted(set(overrides) - allowed) if isinstance(overrides, dict) else None
            if unknown is None or unknown:
                raise run_config.ConfigError(
                    f'train.population_members[{index}] is {overrides!r}: a member may bind only '
                    f'{", ".join(sorted(allowed))}')
            member_seed = overrides.get(run_dir.SEED_BINDING, self.seed + index)
            if not _is_int(member_seed) or member_seed < 0:
                raise run_config.ConfigError(
                    f'train.population_members[{index}]: train.seed must be a non-negative '
                    f'integer, got {member_seed!r}')
            scalars = {key: value for key, value in overrides.items()
                       if key != run_dir.SEED_BINDING}
            members.append({'seed': member_seed, **{
                key.split('.', 1)[1]: value for key, value in scalars.items()}})
            bindings.append({run_dir.SEED_BINDING: member_seed, **scalars})
        return members, bindings

    def validate(self):
        """Raises a ConfigError naming the first setting a run cannot train with."""
        check_algorithm(self.algorithm_class)
        environments.check_env_id(self.env_id, self.env_backend)
        self._check_numbers()
        for name, choices in (('env_mode', environments.MODES),
                              ('env_backend', environments.BACKENDS),
                              ('native_dtype', ('float64', 'float32')),
                              ('jit_compile', (None, True, False)),
                              ('optimize_graphs', (None, True, False)),
                              ('on_env_failure', faults.ENV_FAILURE_POLICIES),
                              ('on_nonfinite', faults.NONFINITE_POLICIES)):
            if getattr(self, name) not in choices:
                raise run_config.ConfigError(
                    f'train.{name} must be one of {", ".join(map(repr, choices))}; got '
                    f'{getattr(self, name)!r}')
        self._check_backend()
        # Before the members' bindings are made: a population too large to fit has too many.
        memory_bound.check_fits(self.population, self.num_envs, self.rollout_length)
        self._check_population()

    def _check_numbers(self):
        for name in ('total_steps', 'num_envs', 'population', 'rollout_length',
                     'eval_every_steps', 'eval_episodes', 'checkpoints_to_keep'):
            value = getattr(self, name)
            if not _is_int(value) or value < 1:
                raise run_config.ConfigError(
                    f'train.{name} must be a positive integer, got {value!r}')
        for name in ('seed', 'max_env_restarts'):
            value = getattr(self, name)
            if not _is_int(value) or value < 0:
                raise run_config.ConfigError(
                    f'train.{name} must be a non-negative integer, got {value!r}')
        if not isinstance(self.log_every_secs, int | float) or not self.log_every_secs > 0:
            raise run_config.ConfigError(
                f'train.log_every_secs must be a positive number, got {self.log_every_secs!r}')
        calls = self.iterations_per_call
        if calls is not None and (not _is_int(calls) or calls < 1):
            raise run_config.ConfigError('train.iterations_per_call must be a positive integer '
                                         f'or None, got {calls!r}')

    def _check_backend(self):
        if self.env_backend == 'envpool' and self.num_workers is not None:
            raise run_config.ConfigError(
                f'train.num_workers = {self.num_workers!r} does not apply to train.env_backend '
                "= 'envpool', which steps in EnvPool's threads: set train.env_kwargs = "
                "{'num_threads': n} instead")
        if self.population > 1 and not self.native:
            raise run_config.ConfigError(
                'train.population > 1 needs train.env_backend = \'native\': a population is one '
                'compiled program, environments included')
        if self.jit_compile and not self.native:
            raise run_config.ConfigError(
                'train.jit_compile = True needs train.env_backend = \'native\': Gymnasium '
                'environments are stepped by Python, which XLA cannot compile')

    def _check_population(self):
        if self.population > 1:
            try:
                self.member_hyperparameters  # noqa: B018 (raises for an algorithm without one)
            except ValueError as error:
                raise run_config.ConfigError(
                    f'train.population = {self.population}: {error}') from None
            members = self.population_members
            if not isinstance(members, list | tuple | type(None)) or (
                    members is not None and len(members) != self.population):
                raise run_config.ConfigError(
                    f'train.population_members must be a list of {self.population} dicts (one '
                    f'per member of train.population = {self.population}), got {members!r}')
            self.member_overrides()
        elif self.population_members is not None:
            raise run_config.ConfigError(
                'train.population_members needs train.population > 1')


def from_gin(**overrides):
    """The settings of the parsed gin config (with `overrides`), validated."""
    for name, missing in (('algorithm', 'no algorithm: bind train.algorithm in the config, e.g. '
                                        'train.algorithm = @PPO'),
                          ('env_id', 'no environment: bind train.env_id in the config')):
        if name in overrides:
            continue
        try:
            value = gin.query_parameter(f'train.{name}')
        except ValueError:
            raise run_config.ConfigError(missing) from None
        if name == 'algorithm' and isinstance(value, gin.config.ConfigurableReference):
            check_algorithm(getattr(value.scoped_configurable_fn, '__wrapped__',
                                    value.scoped_configurable_fn))
    try:
        settings = RunSettings(**overrides)
    except TypeError as error:  # An override that is no setting.
        raise run_config.ConfigError(f'train: {error}') from None
    except RuntimeError as error:  # Gin's error for a required setting left unbound.
        raise run_config.ConfigError(
            f'{failures.first_line(error)}: bind them in the config') from None
    settings.validate()
    return settings


def check_algorithm(algorithm):
    """Raises a ConfigError unless `algorithm` is a subclass of `Algorithm`."""
    if not (isinstance(algorithm, type) and issubclass(algorithm, algorithm_lib.Algorithm)):
        raise run_config.ConfigError(
            f'train.algorithm must name an algorithm (a subclass of agents.algorithms.algorithm.'
            f'Algorithm, e.g. @PPO or @A2C), got {getattr(algorithm, "__name__", repr(algorithm))}')


@gin.configurable
def configure_threads(inter_op_threads=1, intra_op_threads=0):
    """Sets TensorFlow's thread pools; must run before TensorFlow executes anything.

    One inter-op thread is fastest for the rollout (each step is a chain of small ops around
    the environment call, where more threads only add hand-offs); 0 lets TF choose.
    """
    tf.config.threading.set_inter_op_parallelism_threads(inter_op_threads)
    tf.config.threading.set_intra_op_parallelism_threads(intra_op_threads)


def apply_process_settings(settings):
    """The settings that are the whole process's: Grappler on or off."""
    tf.config.optimizer.set_experimental_options(
        {'disable_meta_optimizer': not settings.optimizes_graphs()})


def _is_int(value):
    return isinstance(value, int) and not isinstance(value, bool)
