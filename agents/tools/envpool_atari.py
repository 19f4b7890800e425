"""EnvPool's Atari games: the settings training and evaluation play them with, and one game as a
Gymnasium environment for `evaluate` and `visualize`.

EnvPool preprocesses its Atari games itself as CleanRL's `ppo_atari_envpool.py` trains them
(4 frames skipped with the last two max-pooled, 84x84 grayscale, 4 stacked: uint8 (4, 84, 84)
observations; up to 30 no-ops and FIRE at a reset; sticky actions off), but its own defaults
(EnvPool 1.2.5) neither end an episode at a lost life nor clip rewards, which CleanRL passes to
`envpool.make`. Training does the same; evaluation plays whole games (every life) for their
unclipped score, the number the Atari literature reports. Gymnasium registers none of these ids
('Pong-v5', 'Breakout-v5'...): its own Atari environments come from ale_py, with other ids and
no preprocessing, so the tools play a run's policy in EnvPool's game as well.
"""

import gymnasium as gym
import numpy as np

from agents.tools import envpool_env
from agents.tools import wrappers as wrappers_lib

# What CleanRL's ppo_atari_envpool.py adds to EnvPool's defaults for training: a lost life ends
# the episode (the game goes on) and rewards are clipped to their sign. A run's env_kwargs win.
TRAINING_DEFAULTS = {'episodic_life': True, 'reward_clip': True}
# Evaluation plays whole games for their unclipped scores, whatever training used.
EVALUATION_OVERRIDES = {'episodic_life': False, 'reward_clip': False}
# The Atari 2600 draws 60 frames a second (NTSC); a step of the environment lasts `frame_skip`
# of them, and a video of one frame per step plays in real time at 60 / frame_skip frames/s.
ATARI_FPS = 60


def is_atari_task(env_id):
    """Whether `env_id` is one of EnvPool's Atari games (imports EnvPool, see import_envpool)."""
    envpool = envpool_env.import_envpool()
    return env_id in envpool.list_all_envs() and envpool_env.is_atari(envpool.make_spec(env_id))


def training_kwargs(env_kwargs=None):
    """The `envpool.make` arguments of an Atari game's training pool: TRAINING_DEFAULTS under
    the run's `env_kwargs`."""
    return {**TRAINING_DEFAULTS, **dict(env_kwargs or {})}


def training_episodes(env_kwargs=None):
    """The names of a training episode's return and length in the trainer's summaries, as
    `training_kwargs(env_kwargs)` makes them: ('life_return_clipped', 'life_length') with
    episodic life and clipped rewards (the defaults), and so on; evaluations play whole games
    with unclipped rewards, whose return is the game's score."""
    kwargs = training_kwargs(env_kwargs)
    episode = 'life' if kwargs['episodic_life'] else 'episode'
    clipped = '_clipped' if kwargs['reward_clip'] else ''
    return f'{episode}_return{clipped}', f'{episode}_length'


def evaluation_kwargs(env_kwargs=None):
    """The `envpool.make` arguments of an Atari game's evaluation (the run's evaluation pool,
    `evaluate` and `visualize`): the run's `env_kwargs` with EVALUATION_OVERRIDES, so that an
    episode is a whole game and its return the game's score, and without training's
    `batch_size` (its environments stepped in groups; an evaluation steps as one batch)."""
    kwargs = {key: value for key, value in dict(env_kwargs or {}).items() if key != 'batch_size'}
    return {**kwargs, **EVALUATION_OVERRIDES}


def make_env(env_id, env_kwargs=None, wrappers=()):
    """`AtariEnv(env_id, env_kwargs)` wrapped in `wrappers` (see `wrappers.apply_wrappers`).

    A module-level function, so that `functools.partial(make_env, ...)` pickles: `visualize`
    makes the environment in a worker process."""
    env = AtariEnv(env_id, env_kwargs)
    try:
        return wrappers_lib.apply_wrappers(env, tuple(wrappers))
    except BaseException:
        env.close()
        raise


class AtariEnv(gym.Env):
    """One of EnvPool's Atari games as a Gymnasium environment: a pool of one.

    `reset(seed=...)` makes a new pool (EnvPool fixes seeds when a pool is made, see
    EnvPoolBatchEnv); `step` gives EnvPool's uint8 frames and float rewards; `render` the full
    ALE screen, uint8 (210, 160, 3), when made with env_kwargs `render_mode='rgb_array'`.
    """

    def __init__(self, env_id, env_kwargs=None):
        """Makes the pool.

        Args:
          env_id: one of EnvPool's Atari games, e.g. 'Pong-v5'.
          env_kwargs: arguments of `envpool.make` as they are (see `evaluation_kwargs`), e.g.
            `render_mode='rgb_array'`; not num_envs, batch_size or seed.

        Raises:
          ValueError: `env_id` is not one of EnvPool's Atari games, or a render mode other
            than 'rgb_array' (EnvPool's 'human' one needs OpenCV's windows).
          EnvPoolMissingError: EnvPool cannot be imported.
        """
        if not is_atari_task(env_id):
            raise ValueError(f"{env_id!r} is not one of EnvPool's Atari games")
        env_kwargs = dict(env_kwargs or {})
        self.render_mode = env_kwargs.get('render_mode')
        if self.render_mode not in (None, 'rgb_array'):
            raise ValueError(f"render_mode must be None or 'rgb_array', got {self.render_mode!r}")
        self._pool = envpool_env.EnvPoolBatchEnv(env_id, 1, env_kwargs=env_kwargs)
        self.observation_space = self._pool.single_observation_space
        self.action_space = self._pool.single_action_space
        self.metadata = {'render_modes': ['rgb_array'],
                         'render_fps': ATARI_FPS / self._pool.config.frame_skip}

    def reset(self, *, seed=None, options=None):
        """Starts a new game (in a new pool if seeded); returns (observation, info)."""
        if options:
            raise ValueError(f'AtariEnv resets take no options, got {sorted(options)}')
        observations, infos = self._pool.reset(seed=seed)
        return observations[0], _unbatch(infos)

    def step(self, action):
        """(observation, reward, terminated, truncated, info) of one step of the game."""
        observations, rewards, terminations, truncations, infos = self._pool.step(
            np.asarray(action)[None])
        return (observations[0], float(rewards[0]), bool(terminations[0]),
                bool(truncations[0]), _unbatch(infos))

    def render(self):
        return self._pool.render()[0]

    def close(self):
        self._pool.close()

    def __repr__(self):
        return f'AtariEnv({self._pool.env_id!r})'


def _unbatch(infos):
    """The info dict of the pool's one env."""
    return {key: _unbatch(value) if isinstance(value, dict) else value[0]
            for key, value in infos.items() if not key.startswith('_')}
