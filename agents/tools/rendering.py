"""Headless rendering of environments: EGL for MuJoCo, with settings that keep it fast.

Without a display MuJoCo must render through EGL (Mesa's software rasterizer here), where its
default scene quality gives only a few frames per second. Importing this module makes EGL the
default backend (the user's own `MUJOCO_GL` wins); Gymnasium reads it when an environment
creates its renderer, so the import only has to come before the first render. Classic-control
environments render with pygame into arrays; without a display, SDL's dummy video driver
spares the attempt (and the error line) of opening one.
"""

import os
import sys

import gin

os.environ.setdefault('MUJOCO_GL', 'egl')
if not (os.environ.get('DISPLAY') or os.environ.get('WAYLAND_DISPLAY')):
    os.environ.setdefault('SDL_VIDEODRIVER', 'dummy')


@gin.configurable
def configure_fast_rendering(env, shadow_size=1024, offscreen_samples=0, shadows=False,
                             reflections=False):
    """Lowers MuJoCo's render quality where it costs most; other environments are unchanged.

    Must run before the environment's first `render()`, which fixes the buffer sizes. The
    defaults render MuJoCo scenes several times faster than with shadows and reflections on
    (benchmarks/render_fps.py; figures in benchmarks/README.md); only physics-free visual fields
    change.

    Args:
      env: a Gymnasium environment, wrapped or not.
      shadow_size: side of the shadow map in pixels (MuJoCo's default is 4096).
      offscreen_samples: multisampling of the offscreen buffer (anti-aliasing); 0 disables it.
      shadows: let lights cast shadows.
      reflections: keep reflective materials (e.g. the floor) reflective.

    Returns:
      `env`.
    """
    # A MuJoCo environment exists only if its module was imported: no import for the others.
    mujoco_env = sys.modules.get('gymnasium.envs.mujoco.mujoco_env')
    if mujoco_env is None or not isinstance(env.unwrapped, mujoco_env.MujocoEnv):
        return env
    model = env.unwrapped.model
    quality = model.vis.quality
    quality.shadowsize = shadow_size
    quality.offsamples = offscreen_samples
    if not shadows:
        model.light_castshadow[:] = 0
    if not reflections:
        model.mat_reflectance[:] = 0
    return env
