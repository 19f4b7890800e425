"""The environments of a run, for each backend: what training and evaluation step.

With the Gymnasium backend, `num_envs` Gymnasium environments are stepped as one batch (in
worker processes or in-process, see tools/batch_env.py) behind the in-graph batch env, and the
evaluation environments in-process; with the native backend, both are TF environments from
agents/envs; with the EnvPool backend, both are pools of EnvPool's C++ environments
(tools/envpool_env.py, sync mode) behind the in-graph batch env, wrapped as a batch: Gymnasium's
tasks that EnvPool has too, and EnvPool's Atari games, which train as CleanRL trains them and
evaluate whole games for their unclipped scores (tools/envpool_atari.py). Mistakes of
the configuration (an unknown id, bad keyword arguments or wrappers, EnvPool missing) become a
`ConfigError` naming them.
"""

import contextlib
import difflib
import functools
import importlib
import re

import gymnasium as gym
import numpy as np
import tensorflow as tf

from agents import envs
from agents.runs import run_config
from agents.storage import failures
from agents.tools import (
    batch_env,
    envpool_atari,
    envpool_env,
    in_graph_batch_env,
    pipelined_env,
)
from agents.tools import wrappers as wrappers_lib

BACKENDS = ('gymnasium', 'native', 'envpool')
# The names of a training episode's return and length in the trainer's summaries.
DEFAULT_TRAINING_EPISODES = ('episode_return', 'episode_length')
MODES = ('external', 'in_process', 'hybrid')
# Bounded observations and actions rescaled to [-1, 1], the policy's actions clipped to the
# action space.
DEFAULT_WRAPPERS = ('range_normalize', 'ClipAction')
# Seeds of the evaluation environments: far from those of the training environments. The run
# reseeds them before each evaluation from its seed and step (`evaluator.evaluation_seed`).
EVAL_SEED_OFFSET = 1_000_000


class Environments:
    """The training and evaluation environments of a run (a context that closes them).

    `make_training()` makes fresh training environments (Gymnasium and EnvPool backends; None
    for the native one, whose environments run no code that could crash). A list of K seeds
    (native backend) makes K blocks of `num_envs` training and `eval_episodes` evaluation
    environments, one per member of a population, each seeded as a lone run of its seed.

    On the EnvPool backend `env_kwargs` are arguments of `envpool.make` (e.g. `num_threads`),
    the wrappers wrap each batch (Gymnasium's vector wrappers, see `wrappers.apply_wrappers`),
    Box actions are offered as float32 as Gymnasium's environments declare them, and `mode`
    and `num_workers` do not apply (EnvPool steps in its own C++ threads). Seeds are those of
    the Gymnasium backend (env i of training gets `seed` + i, of evaluation `seed` +
    EVAL_SEED_OFFSET + i, and each evaluation reseeds), but EnvPool draws other initial states
    from them than Gymnasium does. EnvPool's Atari games train with a lost life ending an
    episode and clipped rewards, and evaluate whole games unclipped (see `make_envpool_env`).
    """

    def __init__(self, env_id, backend, num_envs, eval_episodes, seed, env_kwargs=None,
                 wrappers=DEFAULT_WRAPPERS, mode='external', num_workers=None,
                 native_dtype='float64', check_inputs=True):
        self._stack = contextlib.ExitStack()
        self.make_training = None
        # What the summaries call a training episode's return and length: an Atari game's
        # lives and clipped rewards are not its whole, unclipped score (evaluations play that).
        self.training_episodes = DEFAULT_TRAINING_EPISODES
        # The whole games of an Atari run's training (envpool_env.GameLog) where its episodes
        # are not games, else None.
        self.training_games = None
        with self._stack:
            if backend == 'native':
                self.training, self.evaluation = _native_envs(
                    env_id, env_kwargs, wrappers, num_envs, eval_episodes, native_dtype,
                    check_inputs=check_inputs, seed=seed)
            elif backend == 'envpool':
                _check_envpool_task(env_id)  # EnvPool is there, and has the task.
                if envpool_atari.is_atari_task(env_id):
                    self.training_episodes = envpool_atari.training_episodes(env_kwargs)
                    if self.training_episodes != DEFAULT_TRAINING_EPISODES:
                        self.training_games = envpool_env.GameLog()
                self.make_training = functools.partial(
                    make_envpool_training, env_id, num_envs, env_kwargs, wrappers,
                    game_log=self.training_games)
                env_kwargs = _without_batch_size(env_kwargs)  # Evaluation steps as one batch.
                # Made with the seeds of its first reset, which then keeps the pool.
                self.training = in_graph_batch_env.InGraphBatchEnv(
                    _configured(functools.partial(self.make_training, seed=seed), env_id),
                    seed=seed)
                self._stack.callback(self.training.close)
                eval_seed = seed + EVAL_SEED_OFFSET
                self.evaluation = in_graph_batch_env.InGraphBatchEnv(
                    _configured(functools.partial(
                        make_envpool_env, env_id, eval_episodes, env_kwargs, wrappers,
                        seed=eval_seed, evaluation=True), env_id),
                    seed=eval_seed)
                self._stack.callback(self.evaluation.close)
            else:
                env_fn = env_factory(env_id, env_kwargs, wrappers)
                self.make_training = functools.partial(
                    make_vector_env, env_fn, num_envs, mode, num_workers)
                self.training = in_graph_batch_env.InGraphBatchEnv(
                    _configured(self.make_training, env_id), seed=seed)
                self._stack.callback(self.training.close)
                self.evaluation = in_graph_batch_env.InGraphBatchEnv(
                    _configured(functools.partial(
                        make_vector_env, env_fn, eval_episodes, 'in_process', None), env_id),
                    seed=seed + EVAL_SEED_OFFSET)
                self._stack.callback(self.evaluation.close)
            self._stack = self._stack.pop_all()

    def close(self):
        self._stack.close()

    def __enter__(self):
        return self

    def __exit__(self, *unused_exc_info):
        self.close()


def action_size(space):
    """What an algorithm is built with: action dimensions (Box) or number of actions."""
    if isinstance(space, gym.spaces.Discrete):
        return int(space.n)
    if isinstance(space, gym.spaces.Box) and len(space.shape) == 1:
        return int(space.shape[0])
    raise run_config.ConfigError(
        f'the algorithms support Discrete and one-dimensional Box action spaces, got {space}')


def check_env_id(env_id, backend='gymnasium'):
    """Raises a ConfigError unless `env_id` names an environment of `backend`: one Gymnasium
    knows (native backend too: agents/envs' twins have Gymnasium ids), or an EnvPool task that
    Gymnasium knows too or that is one of EnvPool's Atari games, which needs EnvPool installed.
    Makes no environment."""
    if not isinstance(env_id, str):
        raise run_config.ConfigError(f'train.env_id must be a string, got {env_id!r}')
    if backend == 'envpool':
        _check_envpool_task(env_id)
        return
    module, _, name = env_id.rpartition(':')
    try:
        if module:  # 'package.module:Env-v0', as gymnasium.make takes it.
            importlib.import_module(module)
        gym.spec(name)
    except (gym.error.Error, ImportError) as error:
        raise run_config.ConfigError(f'unknown env id {env_id!r}: {error}') from error


def _import_envpool():
    """The envpool module, or a ConfigError saying how to install it."""
    try:
        return envpool_env.import_envpool()
    except envpool_env.EnvPoolMissingError as error:
        raise run_config.ConfigError(f"train.env_backend = 'envpool': {error}") from error


def _check_envpool_task(env_id):
    """Raises a ConfigError unless EnvPool has `env_id` and Gymnasium registers it too, or it is
    one of EnvPool's Atari games: `evaluate` and `visualize` play the run's policy in Gymnasium's
    environment, or for Atari in EnvPool's game (see `plays_in_gymnasium`)."""
    tasks = _import_envpool().list_all_envs()
    if env_id not in tasks:
        close = difflib.get_close_matches(env_id, tasks, n=3)
        hint = (f'; did you mean {", ".join(map(repr, close))}?' if close
                else '; envpool.list_all_envs() lists them')
        raise run_config.ConfigError(
            f"train.env_backend = 'envpool': {env_id!r} is not an EnvPool task{hint}")
    if not (plays_in_gymnasium(env_id) or envpool_atari.is_atari_task(env_id)):
        raise run_config.ConfigError(
            f"train.env_backend = 'envpool': {env_id!r} is an EnvPool task but not a Gymnasium "
            "one; this backend trains those of both (evaluate and visualize play the policy in "
            "Gymnasium's environment)")


def plays_in_gymnasium(env_id):
    """Whether `evaluate` and `visualize` play a policy of a run on EnvPool's `env_id` in
    Gymnasium's environment of that id (e.g. 'Pendulum-v1'); the rest, EnvPool's Atari games,
    they play in EnvPool's game (envpool_atari.AtariEnv). Needs no EnvPool."""
    try:
        gym.spec(env_id)
    except gym.error.Error:
        return False
    return True


# Wrappers that do not fit Atari's uint8 frames and Discrete actions: range_normalize would
# rescale the frames into [-1, 1] in uint8 (which Gymnasium refuses), ClipAction needs Box actions.
_NOT_FOR_ATARI = ('range_normalize', 'ClipAction')


def make_envpool_training(env_id, num_envs, env_kwargs=None, wrappers=(), seed=None,
                          game_log=None):
    """The training environments on the EnvPool backend: `make_envpool_env`, or with
    `env_kwargs['batch_size']` B below `num_envs` (EnvPool's async mode) a PipelinedVectorEnv
    of `num_envs` / B pools of B, one stepping while the algorithm acts for the next
    (tools/pipelined_env.py); environment i is seeded `seed` + i either way. `game_log`: see
    `make_envpool_env`."""
    batch_size = dict(env_kwargs or {}).get('batch_size', num_envs)
    env_kwargs = _without_batch_size(env_kwargs)
    if batch_size == num_envs:
        return make_envpool_env(env_id, num_envs, env_kwargs, wrappers, seed=seed,
                                game_log=game_log)
    if (not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1
            or batch_size > num_envs or num_envs % batch_size):
        raise ValueError(f"env_kwargs['batch_size'] = {batch_size!r} must be a positive "
                         f'divisor of train.num_envs = {num_envs}: the environments step in '
                         'groups of batch_size')
    groups = []
    try:
        for start in range(0, num_envs, batch_size):
            groups.append(make_envpool_env(env_id, batch_size, env_kwargs, wrappers,
                                           seed=None if seed is None else seed + start,
                                           game_log=game_log))
        return pipelined_env.PipelinedVectorEnv(groups)
    except BaseException:
        for group in groups:
            group.close()
        raise


def _without_batch_size(env_kwargs):
    return {key: value for key, value in dict(env_kwargs or {}).items() if key != 'batch_size'}


def make_envpool_env(env_id, num_envs, env_kwargs=None, wrappers=(), seed=None,
                     evaluation=False, game_log=None):
    """`num_envs` EnvPool environments of `env_id` (`env_kwargs`: arguments of `envpool.make`)
    as a VectorEnv with explicit resets, wrapped as a batch in `wrappers`.

    Box actions are float32 (EnvPool declares float64 for MuJoCo tasks), as Gymnasium's
    environments declare them, so that the spaces, and a policy exported from the run, are the
    Gymnasium backend's. `seed`: that of the pool until a seeded reset (see EnvPoolBatchEnv).
    EnvPool's Atari games get `envpool_atari.training_kwargs(env_kwargs)` (episodic life and
    clipped rewards, as CleanRL), or with `evaluation` `envpool_atari.evaluation_kwargs` (whole
    games, unclipped scores). `game_log`: an envpool_env.GameLog that an Atari game's
    training environments add their whole games to.
    """
    _check_envpool_task(env_id)  # Before EnvPool's own errors for an unknown id.
    envpool = _import_envpool()
    spec = envpool.make_spec(env_id)
    box_actions = isinstance(spec.gymnasium_action_space, gym.spaces.Box)
    if envpool_env.is_atari(spec):
        unfit = [name for name in wrappers if isinstance(name, str) and name in _NOT_FOR_ATARI]
        if unfit:
            raise ValueError(
                f"train.wrappers {unfit} do not fit Atari's uint8 frames and Discrete actions; "
                'leave them out (train.wrappers = [], as the default has both)')
        make_kwargs = envpool_atari.evaluation_kwargs if evaluation else (
            envpool_atari.training_kwargs)
        env_kwargs = make_kwargs(env_kwargs)
    env = envpool_env.EnvPoolBatchEnv(
        env_id, num_envs, seed=seed, env_kwargs=env_kwargs,
        action_dtype=np.float32 if box_actions else None, game_log=game_log)
    try:
        return _FailureRecorder(wrappers_lib.apply_wrappers(env, tuple(wrappers)))
    except BaseException:
        env.close()
        raise


def env_factory(env_id, env_kwargs=None, wrappers=(), **make_kwargs):
    """A picklable function that makes one wrapped environment, as training sees it.

    `make_kwargs` (e.g. render_mode='rgb_array') go to `gymnasium.make` as well.
    """
    return functools.partial(
        batch_env.make_env, env_id, {**dict(env_kwargs or {}), **make_kwargs},
        (functools.partial(wrappers_lib.apply_wrappers, wrappers=tuple(wrappers)),))


def spaces(env_id, env_kwargs=None, wrappers=()):
    """(observation space, action space) of one wrapped environment, as training sees it (the
    native twin of `env_id` has the same); the environment is closed again."""
    env = env_factory(env_id, env_kwargs, wrappers)()
    try:
        return env.observation_space, env.action_space
    finally:
        env.close()


def make_vector_env(env_fn, num_envs, mode, num_workers):
    """`num_envs` environments from `env_fn` as a BatchEnv with explicit resets."""
    # The in-graph env ignores infos and copies observations itself: skip both per step.
    return _FailureRecorder(batch_env.BatchEnv(
        [env_fn] * num_envs, mode=mode, num_workers=num_workers,
        autoreset_mode=gym.vector.AutoresetMode.DISABLED, collect_infos=False, copy=False))


class _FailureRecorder(gym.vector.VectorWrapper):
    """Keeps the exception of a failed `step` or `reset`, which TF's error only quotes.

    `cancel_wait` and `waiting` reach the BatchEnv or EnvPoolBatchEnv inside, also through
    vector wrappers (Gymnasium's do not forward them)."""

    def __init__(self, env):
        super().__init__(env)
        self.failure = None

    def cancel_wait(self, reason):
        self.env.unwrapped.cancel_wait(reason)

    def waiting(self):
        return self.env.unwrapped.waiting()

    def step(self, actions):
        try:
            return self.env.step(actions)
        except Exception as error:
            self.failure = error
            raise

    def reset(self, *, seed=None, options=None):
        try:
            return self.env.reset(seed=seed, options=options)
        except Exception as error:
            self.failure = error
            raise


def _native_envs(env_id, env_kwargs, wrappers, num_envs, eval_episodes, dtype, check_inputs,
                 seed):
    """The native training and evaluation environments of `env_id` (see agents/envs)."""
    if not envs.has_native_env(env_id):
        raise run_config.ConfigError(
            f'train.env_backend = \'native\': no native environment for {env_id!r}; native '
            f'ones: {", ".join(sorted(envs.ENVS))}')
    if env_kwargs:
        raise run_config.ConfigError(
            f'train.env_kwargs = {env_kwargs!r}: native environments take no keyword arguments')
    blocks = len(seed) if isinstance(seed, list) else 1
    eval_seed = ([value + EVAL_SEED_OFFSET for value in seed] if isinstance(seed, list)
                 else seed + EVAL_SEED_OFFSET)
    try:
        train_env = envs.make(env_id, num_envs * blocks, seed=seed, wrappers=tuple(wrappers),
                              dtype=getattr(tf, dtype), check_inputs=check_inputs)
        # Float64 physics: evaluations agree with Gymnasium's environment to 1e-5.
        eval_env = envs.make(env_id, eval_episodes * blocks, seed=eval_seed,
                             wrappers=tuple(wrappers), dtype=tf.float64,
                             check_inputs=check_inputs)
    except (ValueError, TypeError) as error:
        raise run_config.ConfigError(
            f'cannot make native environment {env_id!r}: {failures.first_line(error)}') from error
    return train_env, eval_env


def _configured(make_env, env_id):
    """`make_env()`, its mistakes (bad env_kwargs, wrappers, spaces...) as a ConfigError."""
    try:
        return make_env()
    except (ValueError, TypeError, gym.error.Error, batch_env.EnvError) as error:
        # Which of the identical environments failed does not matter here.
        reason = re.sub(r'^Environment \d+ failed in make: (\w+Error: )?', '',
                        failures.first_line(error))
        raise run_config.ConfigError(f'cannot make environment {env_id!r}: {reason}') from error
