"""EnvPool's C++ pool of environments as the VectorEnv that InGraphBatchEnv drives.

EnvPool steps a batch of environments in C++ threads, which beats Python workers on cheap
environments. Its Gymnasium API autoresets in NEXT_STEP mode only: the step after an episode
ends returns the next episode's first observation and ignores that step's action. InGraphBatchEnv
needs AutoresetMode.DISABLED instead (it resets ended environments itself and bootstraps
truncated episodes from their final observations), so `EnvPoolBatchEnv` behaves as a BatchEnv
with autoreset disabled does:

- `reset(options={'reset_mask': mask})` resets the masked environments by id and puts the rows
  EnvPool returns (only theirs) into the full batch of observations;
- stepping while an environment's episode has ended is refused, since EnvPool would spend that
  step on its autoreset;
- seeds follow BatchEnv's (env i gets seed + i), but EnvPool fixes them when the pool is made, so
  a seeded reset makes a new pool;
- Atari's episodic life (`episodic_life=True`, as CleanRL trains) keeps its meaning: a lost life
  ends an episode, and that env's reset continues the same game, as EnvPool's own autoreset
  does. EnvPool's reset by id would start a new game (5 lives again in Breakout), so the reset
  of an env whose last step lost a life is that autoreset step instead: the env stepped alone,
  its action ignored, giving the next life's first observation.

Sync mode only (EnvPool's batch_size = num_envs). EnvPool is an optional dependency: it is
imported when an EnvPoolBatchEnv is made, so this module imports without it.
"""

import numbers
import threading
import warnings

import gymnasium as gym
import numpy as np

from agents.tools import batch_env, env_group

AutoresetMode = gym.vector.AutoresetMode

# How users get EnvPool (the project's extra; a checkout has it from the lock).
INSTALL_COMMAND = "pip install 'batchppo[envpool]'"
# EnvPool takes int32 seeds; larger ones (evaluation seeds are 62-bit hashes) are taken modulo.
SEED_MODULUS = 2**31
# How the refusal of a Box action found while EnvPool stepped with it ends.
STEP_DISCARDED = ('EnvPool had stepped with it (Box actions are checked while EnvPool steps), '
                  'so that step was discarded and every env needs a full reset() before the '
                  'next step')
# Arguments of envpool.make that the adapter sets itself.
_OWN_ARGUMENTS = ('task_id', 'env_type', 'num_envs', 'batch_size', 'seed')


class EnvPoolMissingError(ImportError):
    """EnvPool cannot be imported; the one-line message says how to install it."""


def import_envpool():
    """The envpool module, or EnvPoolMissingError."""
    try:
        import envpool
    except (ImportError, FileNotFoundError) as error:
        if isinstance(error, ImportError) and error.name == 'envpool':
            problem = 'EnvPool is not installed'
        else:  # A broken install, e.g. without its asset packages, which the import reads.
            cause = (str(error).strip().splitlines() or [''])[0]
            problem = f'EnvPool cannot be imported ({type(error).__name__}: {cause})'
        raise EnvPoolMissingError(f'{problem}; install it with: {INSTALL_COMMAND}') from error
    return envpool


class GameLog:
    """The whole Atari games that ended in training, for the trainer to report between its
    compiled calls: their unclipped scores and lengths (steps), which the training episodes
    (a life each, rewards clipped) are not. EnvPoolBatchEnv adds to it from TensorFlow's thread
    while a call runs; `take` empties it (thread-safe)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._scores, self._lengths = [], []

    def add(self, scores, lengths):
        """Adds ended games: their scores and lengths, arrays of one value per game."""
        with self._lock:
            self._scores.extend(np.asarray(scores, np.float64).tolist())
            self._lengths.extend(np.asarray(lengths, np.int64).tolist())

    def take(self):
        """(scores, lengths) of the games added since the last `take`, as float64 and int64
        arrays, in the order they ended."""
        with self._lock:
            scores, lengths = self._scores, self._lengths
            self._scores, self._lengths = [], []
        return np.array(scores, np.float64), np.array(lengths, np.int64)


class EnvPoolBatchEnv(gym.vector.VectorEnv):
    """EnvPool's environments with autoreset disabled, as BatchEnv(autoreset_mode=DISABLED).

    A full `reset()` is needed before the first step, and environments whose episode ended must
    be reset with `reset(options={'reset_mask': mask})` before the next step. `step_async` sends
    the actions to EnvPool's threads and `step_wait` collects the results. Where EnvPool makes
    it differ from BatchEnv:

    - a seeded reset makes a new pool, so it resets every environment (no `reset_mask`); seeds
      are taken modulo 2**31, and the same seed gives other initial states than Gymnasium's;
    - rewards are EnvPool's float32 (BatchEnv's are float64); observations come in the
      observation space's dtype, which for the tasks checked is EnvPool's and Gymnasium's;
    - infos are EnvPool's (`env_id`, `elapsed_step` and the task's own, zero at a reset); those
      of a partial reset are batched as Gymnasium does, with `_key` masks of the reset rows;
    - with Atari's `episodic_life`, a reset continues the game of an env whose last step lost a
      life (see the module docstring); other resets start new games;
    - `render` gives EnvPool's frames (env_kwargs `render_mode='rgb_array'`); no `call`,
      `get_attr` or `set_attr`; `cancel_wait` and `waiting` do nothing, as for BatchEnv
      in-process (there are no workers to wait for).

    Bad actions are refused as BatchEnv refuses them (`batch_env.ActionChecker`): a wrong
    shape (which EnvPool would read out of bounds, or abort the process on), dtypes of another
    kind, NaN and values outside the action space. Other spaces' are refused before EnvPool
    sees them, with nothing stepped. A Box action's NaN (which EnvPool passes on) or value out
    of bounds (which it clips) is found while EnvPool steps, as checking first slows a cheap
    task's step (benchmarks/README.md, "EnvPool stepping"): the step is discarded and the
    refusal says that every env needs a full `reset()`.
    """

    def __init__(self, env_id, num_envs, seed=None, env_kwargs=None, action_dtype=None,
                 game_log=None):
        """Makes the pool.

        Args:
          env_id: an EnvPool task id, e.g. 'HalfCheetah-v5' or 'Pong-v5'.
          num_envs: number of environments, all stepped together.
          seed: None (random), an int (env i gets seed + i) or one int per env; seeds the pool
            until a seeded reset.
          env_kwargs: other arguments of `envpool.make`, e.g. `num_threads`,
            `max_episode_steps`, Atari's `episodic_life`, `reward_clip` and `stack_num`, or
            `render_mode='rgb_array'` for `render`.
          action_dtype: float dtype of the Box action space to offer instead of EnvPool's;
            e.g. float32, which Gymnasium's MuJoCo environments declare where EnvPool declares
            float64, for the same spaces as the Gymnasium backend. Actions are cast to
            EnvPool's dtype when sent.
          game_log: a GameLog to add each whole game that ends to (its score from EnvPool's
            unclipped `info['reward']`, its length in steps); Atari games only. A reset that
            starts a new game drops the unfinished one.

        Raises:
          EnvPoolMissingError: EnvPool cannot be imported.
          ValueError, TypeError: bad arguments (EnvPool's TypeError for unknown env_kwargs).
        """
        super().__init__()
        self._pool = None  # Set first: `close` must work whatever fails below.
        if not isinstance(env_id, str):
            raise TypeError(f'env_id must be a string, got {env_id!r}')
        if (not isinstance(num_envs, numbers.Integral) or isinstance(num_envs, bool)
                or num_envs < 1):
            raise ValueError(f'num_envs must be a positive int, got {num_envs!r}')
        env_kwargs = dict(env_kwargs or {})
        own = sorted(set(env_kwargs) & set(_OWN_ARGUMENTS))
        if own:
            raise ValueError(f'env_kwargs {own} are set by EnvPoolBatchEnv (sync mode: '
                             'batch_size = num_envs)')
        self._envpool = import_envpool()
        if env_id not in self._envpool.list_all_envs():
            raise ValueError(
                f'{env_id!r} is not an EnvPool task; envpool.list_all_envs() lists them')
        self.env_id = env_id
        self.num_envs = int(num_envs)
        self._env_kwargs = env_kwargs
        self._pool_seeds = self._seeds(
            np.random.default_rng().integers(SEED_MODULUS) if seed is None else seed)
        self._pool = self._make_pool(self._pool_seeds)
        self._fresh = True  # Not reset since it was made: a reset with its seeds can keep it.
        try:
            self._set_spaces(self._pool.observation_space, self._pool.action_space, action_dtype)
        except Exception:
            self.close()
            raise
        self.render_mode = env_kwargs.get('render_mode')
        self.metadata = {'autoreset_mode': AutoresetMode.DISABLED,
                         'render_modes': [] if self.render_mode is None else [self.render_mode]}
        self._pending = None  # 'step' between step_async and step_wait.
        self._needs_reset = True
        self._ended = np.zeros(self.num_envs, bool)
        # Atari with episodic life: a lost life ends an episode but not the game.
        atari = is_atari(self._pool.spec)
        self._lives_are_episodes = atari and self.config.episodic_life
        if game_log is not None and not atari:
            self.close()
            raise ValueError(f'game_log is for Atari games, and {env_id!r} is not one')
        self._game_log = game_log
        self._game_scores = np.zeros(self.num_envs, np.float64)  # Of the games in progress.
        self._game_lengths = np.zeros(self.num_envs, np.int64)
        self._life_lost = np.zeros(self.num_envs, bool)  # Ended by a lost life; game goes on.
        self._observations = np.zeros(
            (self.num_envs, *self.single_observation_space.shape),
            self.single_observation_space.dtype)

    def _make_pool(self, seeds):
        pool = self._envpool.make(
            self.env_id, env_type='gymnasium', num_envs=self.num_envs,
            batch_size=self.num_envs, seed=seeds, **self._env_kwargs)
        with warnings.catch_warnings():
            # A pool builds its spaces when first asked (at the latest in its first reset) and
            # keeps them. EnvPool's float32 spaces get float64 bounds (e.g. Pendulum's
            # observations), which Gymnasium warns it rounds: nothing to act on, in every run.
            warnings.filterwarnings('ignore', r'.*precision lowered by casting to float32')
            pool.observation_space  # noqa: B018 (builds it)
            pool.action_space  # noqa: B018
        return pool

    def _set_spaces(self, observation_space, action_space, action_dtype):
        # BatchEnv's check: structured spaces (some EnvPool tasks have Dict ones) are refused.
        env_group.array_spec(observation_space, 'observation')
        env_group.array_spec(action_space, 'action')
        if action_dtype is not None:
            action_space = _box_of_dtype(action_space, action_dtype)
        self.single_observation_space = observation_space
        self.single_action_space = action_space
        self.observation_space = gym.vector.utils.batch_space(observation_space, self.num_envs)
        self.action_space = gym.vector.utils.batch_space(action_space, self.num_envs)
        self._check_actions = batch_env.ActionChecker(action_space, self.num_envs)
        # EnvPool clips a Box action or passes NaN on, which is harmless to a step that is
        # then discarded; it would read other spaces' bad values out of bounds.
        self._values_checked_while_stepping = isinstance(action_space, gym.spaces.Box)

    @property
    def config(self):
        """EnvPool's configuration of the pool (a namedtuple: `frame_skip`, `episodic_life`...)."""
        return self._pool.spec.config

    def _check_running(self):
        if self.closed:
            raise gym.error.ClosedEnvironmentError('the EnvPoolBatchEnv was closed')

    def reset(self, *, seed=None, options=None):
        """Resets all envs, or those in `options['reset_mask']` (a bool array), like BatchEnv.

        `seed` is None, an int (env i gets seed + i) or a list of ints, one per env; a seeded
        reset makes a new pool and so takes no reset_mask. Unseeded, an env whose last step lost
        an Atari life (episodic life) goes on with its game. Returns (observations, infos).
        """
        self._check_running()
        if self._pending:
            raise gym.error.AlreadyPendingCallError(
                'reset while a step_async awaits its step_wait', self._pending)
        mask = self._reset_mask(options)
        if seed is not None:
            if mask is not None:
                raise ValueError(
                    'EnvPool fixes its seeds when the pool is made: a seeded reset makes a new '
                    "pool and resets every env, so it takes no options['reset_mask']")
            self._reseed(self._seeds(seed))
            self._life_lost[:] = False  # New games.
        self._fresh = False
        ids = np.arange(self.num_envs) if mask is None else np.flatnonzero(mask)
        continuing = self._life_lost[ids]
        if mask is None and not continuing.any():
            observations, infos = self._pool.reset()
        else:
            observations = self._observations.copy()
            parts = []
            for part, start in ((ids[~continuing], self._pool.reset),
                                (ids[continuing], self._continue_games)):
                if part.size:
                    rows, part_infos = start(part.astype(np.int32))
                    observations[part_infos['env_id']] = rows  # In the order of EnvPool's rows.
                    parts.append(part_infos)
            infos = _scatter_infos(parts, self.num_envs)
        if mask is None:
            self._needs_reset = False
        new_games = ids[~continuing]
        self._game_scores[new_games] = 0.0
        self._game_lengths[new_games] = 0
        self._ended[ids] = False
        self._life_lost[ids] = False
        self._observations = np.asarray(observations, self.single_observation_space.dtype)
        return self._observations, infos

    def _continue_games(self, ids):
        """(observations, infos) of the next lives of the games of envs `ids`, whose last step
        lost a life: EnvPool's autoreset step, the envs stepped alone (the action is ignored).

        As for a reset, the reward is 0 and the episode not ended; `elapsed_step` counts on from
        the game's start."""
        space = self._pool.action_space
        observations, _, _, _, infos = self._pool.step(
            np.zeros((len(ids), *space.shape), space.dtype), ids)
        return observations, infos

    def _reseed(self, seeds):
        """Replaces the pool by one of `seeds`, unless it is fresh and has them already."""
        if self._fresh and seeds == self._pool_seeds:
            return
        pool = self._make_pool(seeds)
        self._pool.close()
        self._pool, self._pool_seeds = pool, seeds

    def _seeds(self, seed):
        """One EnvPool seed per env from an int or a list, as BatchEnv takes them."""
        # Unlike a Gymnasium env, an EnvPool env cannot be left unseeded: no None.
        seeds = batch_env.env_seeds(seed, self.num_envs, unseeded=False)
        if min(seeds) < 0:
            raise ValueError(f'seeds must be non-negative, got {seed!r}')
        return [value % SEED_MODULUS for value in seeds]

    def _reset_mask(self, options):
        """The reset mask of `options` or None, checked like Gymnasium (and BatchEnv) do."""
        if options is None:
            return None
        others = sorted(set(options) - {'reset_mask'})
        if others:
            raise ValueError(f'EnvPool resets take no options but reset_mask, got {others}')
        return batch_env.check_reset_mask(options.get('reset_mask'), self.num_envs)

    def step(self, actions):
        """Steps every env with its row of `actions`; returns (obs, rewards, terminations,
        truncations, infos)."""
        self.step_async(actions)
        return self.step_wait()

    def step_async(self, actions):
        """Checks `actions` as BatchEnv does (`batch_env.ActionChecker`) and sends them to
        EnvPool, which steps at once; Box actions' values are checked while it steps."""
        self._check_running()
        batch_env.check_step_allowed('EnvPoolBatchEnv', self._pending, self._needs_reset,
                                     self._ended)
        actions = self._check_actions.checked_form(actions)
        if not self._values_checked_while_stepping:
            self._check_actions.check_values(actions)
        try:
            self._pool.send(actions)  # Cast to EnvPool's dtype.
        except Exception:
            self._needs_reset = True
            raise
        if self._values_checked_while_stepping:
            try:
                self._check_actions.check_values(actions, STEP_DISCARDED)
            except ValueError:
                self._needs_reset = True
                self._pool.recv()  # The discarded step; the pool is ready for a reset.
                raise
        self._pending = 'step'

    def step_wait(self, timeout=None):
        """The results of the step that `step_async` started.

        `timeout` is accepted as BatchEnv takes it and ignored, as BatchEnv in-process does:
        EnvPool's wait cannot be cut short.
        """
        del timeout
        self._check_running()
        if self._pending != 'step':
            raise gym.error.NoAsyncCallError('step_wait without step_async', 'step')
        self._pending = None
        try:
            observations, rewards, terminations, truncations, infos = self._pool.recv()
        except Exception:
            self._needs_reset = True
            raise
        # In sync mode EnvPool returns the rows in the order of the env ids sent: 0, 1, ...
        self._observations = np.asarray(observations, self.single_observation_space.dtype)
        np.logical_or(terminations, truncations, out=self._ended)
        if self._lives_are_episodes:
            # Atari's info['terminated'] is the game's end; a time limit ends the game too.
            self._life_lost = terminations & ~truncations & (infos['terminated'] == 0)
        if self._game_log is not None:
            self._log_games(infos['reward'])
        return self._observations, rewards, terminations, truncations, infos

    def _log_games(self, unclipped_rewards):
        """Counts a step into the games in progress; adds those it ended to the game log."""
        self._game_scores += unclipped_rewards
        self._game_lengths += 1
        over = self._ended & ~self._life_lost
        if np.count_nonzero(over):
            self._game_log.add(self._game_scores[over], self._game_lengths[over])
            self._game_scores[over] = 0.0
            self._game_lengths[over] = 0

    def render(self):
        """EnvPool's frames of every env, e.g. uint8 (num_envs, 210, 160, 3) for Atari; needs
        env_kwargs `render_mode='rgb_array'`.

        MuJoCo tasks need a current GL context to render, or EnvPool ends the process
        (docs/envpool_findings.md); Atari and classic control draw without one."""
        self._check_running()
        return self._pool.render(env_ids=np.arange(self.num_envs))

    def cancel_wait(self, reason):
        """Nothing to cancel: EnvPool's step is one call into C++ (BatchEnv in-process's no-op)."""
        del reason

    def waiting(self):
        """None: no workers are waited for (as BatchEnv in-process)."""
        return None

    def close_extras(self, terminate=False):
        """Closes the pool; `terminate`, which BatchEnv takes for its workers, changes nothing."""
        del terminate
        if self._pool is not None:
            self._pool.close()
            self._pool = None

    def __repr__(self):
        return f'EnvPoolBatchEnv({self.env_id!r}, num_envs={self.num_envs})'


def is_atari(spec):
    """Whether an EnvPool task's spec (`envpool.make_spec(id)`, or a pool's `spec`) is one of
    EnvPool's Atari games."""
    return isinstance(spec, import_envpool().atari.AtariEnvSpec)


def _box_of_dtype(space, dtype):
    """`space`, a Box, with float `dtype`."""
    dtype = np.dtype(dtype)
    if not isinstance(space, gym.spaces.Box) or dtype.kind != 'f':
        raise ValueError(
            f'action_dtype must be a float dtype for a Box action space; got {dtype} for {space}')
    return gym.spaces.Box(space.low.astype(dtype), space.high.astype(dtype), space.shape, dtype)


def _scatter_infos(parts, num_envs):
    """EnvPool's infos of some envs (`parts`, each of the envs its `env_id` lists) batched as
    Gymnasium batches a partial reset's: each value in a num_envs array (zero elsewhere), `_key`
    marking the reset envs."""
    batched = {}
    for infos in parts:
        _scatter_into(batched, infos, infos['env_id'], num_envs)
    return batched


def _scatter_into(batched, infos, ids, num_envs):
    for key, value in infos.items():
        if isinstance(value, dict):
            _scatter_into(batched.setdefault(key, {}), value, ids, num_envs)
        else:
            value = np.asarray(value)
            if key not in batched:
                batched[key] = np.zeros((num_envs, *value.shape[1:]), value.dtype)
            batched[key][ids] = value
        if f'_{key}' not in batched:
            batched[f'_{key}'] = np.zeros(num_envs, bool)
        batched[f'_{key}'][ids] = True
