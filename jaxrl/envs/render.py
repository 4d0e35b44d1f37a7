"""Rendering envs to RGB frames: Gymnasium envs, Brax / MJX envs and the pure-JAX classic envs.

* Gymnasium MuJoCo envs render through MuJoCo's offscreen renderer, classic-control envs
  through their own ``rgb_array`` mode (``make_env(..., render=(width, height))``).
* Brax / MJX envs: a rollout keeps, on the device, only what a frame needs (``render_data``:
  the joint positions, and the drawn model of a randomized env); the host renders those with
  ``MujocoFrames`` on the env's MuJoCo model, each episode with its own drawn parameters.
* The classic ``jax:`` envs are drawn from their state with numpy (``jaxrl.envs.draw``): no
  OpenGL is needed.

MuJoCo needs an OpenGL backend. ``gl_backend`` takes the user's ``MUJOCO_GL`` or finds one that
works (EGL, else OSMesa) in a child process, so a broken driver gives one clear error naming
the system package to install, never a crash inside OpenGL.
"""

from __future__ import annotations

import functools
import importlib
import os
import subprocess
import sys
from typing import Any

import jax
import numpy as np

from jaxrl.envs.ids import is_jax_env, parse_env_id, split_env_id
from jaxrl.errors import EnvError

GL_BACKENDS = ("egl", "osmesa", "glfw")
"""The OpenGL backends MuJoCo renders through on Linux (``MUJOCO_GL``)."""

GL_PACKAGES = {
    "egl": "libegl1 libgl1, EGL through a GPU driver or Mesa",
    "osmesa": "libosmesa6, software rendering",
    "glfw": "libglfw3 and a display (DISPLAY set)",
}
"""The Debian/Ubuntu packages each backend needs."""

_PROBE = (  # a context that MuJoCo can draw with (GLFW without a display only warns at first)
    "import importlib, sys, mujoco; m = importlib.import_module('mujoco.' + sys.argv[1]); "
    "c = m.GLContext(16, 16); c.make_current(); "
    "model = mujoco.MjModel.from_xml_string('<mujoco/>'); "
    "mujoco.MjrContext(model, mujoco.mjtFontScale.mjFONTSCALE_100).free(); c.free()"
)


def _probe(backend: str) -> str | None:
    """None if ``backend`` makes a GL context in a fresh process, else its last error line."""
    env = {**os.environ, "MUJOCO_GL": backend}
    if backend != "glfw":
        env["PYOPENGL_PLATFORM"] = backend
    try:
        done = subprocess.run(
            [sys.executable, "-c", _PROBE, backend], env=env, capture_output=True, timeout=120
        )
    except subprocess.TimeoutExpired:
        return "timed out making a context"
    if done.returncode == 0:
        return None
    lines = [ln for ln in done.stderr.decode(errors="replace").splitlines() if ln.strip()]
    return lines[-1].strip() if lines else f"exit status {done.returncode}"


def gl_backend() -> str:
    """The OpenGL backend MuJoCo renders with here: ``MUJOCO_GL``, or the first that works.

    Sets ``MUJOCO_GL`` (Gymnasium's MuJoCo renderer reads it) to the one found. The search
    runs once per process and ``MUJOCO_GL`` value.

    Raises:
        EnvError: none works; the message names the packages to install.
    """
    backend = _working_backend(os.environ.get("MUJOCO_GL", "").strip().lower())
    os.environ["MUJOCO_GL"] = backend
    if backend != "glfw":
        os.environ.setdefault("PYOPENGL_PLATFORM", backend)
    return backend


@functools.cache
def _working_backend(chosen: str) -> str:
    if chosen and chosen not in GL_BACKENDS:
        raise EnvError(
            f"MUJOCO_GL={chosen!r} is not an OpenGL backend MuJoCo renders with; use one of "
            f"{', '.join(GL_BACKENDS)}, or unset it to let jaxrl pick one."
        )
    failures = {}
    for backend in (chosen,) if chosen else ("egl", "osmesa"):
        error = _probe(backend)
        if error is None:
            return backend
        failures[backend] = error
    tried = "; ".join(f"{b}: {e}" for b, e in failures.items())
    packages = "; ".join(f"{b}: {GL_PACKAGES[b]}" for b in failures)
    raise EnvError(
        f"Cannot render MuJoCo scenes: no OpenGL backend works here ({tried}). The system "
        f"packages it needs ({packages}) are missing: on Debian/Ubuntu run `sudo apt-get install "
        "libegl1 libgl1 libosmesa6` (or `sudo make gl`), then unset MUJOCO_GL or set it to egl "
        "or osmesa. Pendulum-v1 and the jax: envs render without OpenGL."
    )


def needs_gl(env_id: str) -> bool:
    """Whether rendering ``env_id`` needs OpenGL (MuJoCo scenes: Gymnasium MuJoCo, Brax)."""
    if is_jax_env(env_id):
        return parse_env_id(env_id)[0] == "brax"
    import gymnasium as gym

    return "mujoco" in str(gym.spec(split_env_id(env_id)[0]).entry_point)


class MujocoFrames:
    """Offscreen renderer of one MuJoCo model through an explicit OpenGL context.

    The camera tracks body 1 (the torso or cart) from the side, at most 3.5 m away (closer for
    small models).
    ``model`` is this renderer's own copy: ``use`` writes an episode's drawn parameters into it.

    Args:
        model: a ``mujoco.MjModel`` (copied).
        width: frame width in pixels.
        height: frame height in pixels.
    """

    def __init__(self, model: Any, width: int, height: int):
        import copy

        import mujoco

        context = importlib.import_module(f"mujoco.{gl_backend()}").GLContext
        self.model = copy.copy(model)
        self.model.vis.global_.offwidth = max(width, self.model.vis.global_.offwidth)
        self.model.vis.global_.offheight = max(height, self.model.vis.global_.offheight)
        self.data = mujoco.MjData(self.model)
        self._ctx = context(width, height)
        self._ctx.make_current()
        self._scene = mujoco.MjvScene(self.model, maxgeom=10_000)
        self._con = mujoco.MjrContext(self.model, mujoco.mjtFontScale.mjFONTSCALE_150)
        mujoco.mjr_setBuffer(mujoco.mjtFramebuffer.mjFB_OFFSCREEN, self._con)
        self._rect = mujoco.MjrRect(0, 0, width, height)
        self._opt = mujoco.MjvOption()
        self._cam = mujoco.MjvCamera()
        mujoco.mjv_defaultFreeCamera(self.model, self._cam)
        if self.model.nbody > 1:
            self._cam.type = mujoco.mjtCamera.mjCAMERA_TRACKING
            self._cam.trackbodyid = 1
            self._cam.distance = min(1.5 * float(self.model.stat.extent), 3.5)
            self._cam.elevation = -20.0
            self._cam.azimuth = 90.0
        self.size = (height, width)

    def use(self, fields: dict[str, Any]) -> None:
        """Write model fields (an episode's drawn ``body_mass``, ``geom_friction``, ...)."""
        for name, value in fields.items():
            getattr(self.model, name)[...] = np.asarray(value)

    def frame(self, qpos: Any) -> np.ndarray:
        """The ``[height, width, 3]`` uint8 image of the model at joint positions ``qpos``."""
        import mujoco

        self._ctx.make_current()
        self.data.qpos[:] = np.asarray(qpos, np.float64)
        mujoco.mj_forward(self.model, self.data)
        mujoco.mjv_updateScene(
            self.model, self.data, self._opt, None, self._cam, mujoco.mjtCatBit.mjCAT_ALL,
            self._scene,
        )  # fmt: skip
        mujoco.mjr_render(self._rect, self._scene, self._con)
        rgb = np.empty((*self.size, 3), np.uint8)
        mujoco.mjr_readPixels(rgb, None, self._rect, self._con)
        return np.flipud(rgb).copy()

    def close(self) -> None:
        """Release the GL context."""
        self._con.free()
        self._ctx.free()


def render_data(core: Any, sim: Any) -> Any:
    """What a frame of one env needs from its simulator state ``sim`` (traceable, unbatched).

    Brax: ``{"q": joint positions}`` and, for a randomized env, ``"model"``: the drawn MuJoCo
    fields (``randomization.MODEL_FIELDS``). Classic ``jax:`` envs: their state.
    """
    from jaxrl.envs.brax_core import BraxCore

    if not isinstance(core, BraxCore):
        return sim
    if core.ranges is None:
        return {"q": sim.pipeline_state.q}
    from jaxrl.envs.randomization import MODEL_FIELDS

    model, inner = sim
    return {"q": inner.pipeline_state.q, "model": {f: getattr(model, f) for f in MODEL_FIELDS}}


def render_frames(core: Any, data: Any, width: int, height: int) -> np.ndarray:
    """Frames ``[T, height, width, 3]`` (uint8) of one episode's ``render_data`` (leading ``T``).

    A randomized Brax episode renders on its own drawn model (the first step's; a model is
    drawn once per episode).
    """
    from jaxrl.envs.brax_core import BraxCore

    data = jax.device_get(data)
    if not isinstance(core, BraxCore):
        from jaxrl.envs.draw import draw

        return np.stack([draw(core, s, width, height) for s in np.asarray(data)])
    renderer = mujoco_renderer(core, width, height)
    try:
        if "model" in data:
            renderer.use({k: v[0] for k, v in data["model"].items()})
        return np.stack([renderer.frame(q) for q in data["q"]])
    finally:
        renderer.close()


def mujoco_renderer(core: Any, width: int, height: int) -> MujocoFrames:
    """A ``MujocoFrames`` on the MuJoCo model of a Brax core."""
    return MujocoFrames(core.env.sys.mj_model, width, height)


def frame_rate(env_id: str, core: Any) -> float:
    """Frames per second of a real-time video of a JAX env: one frame per agent step."""
    from jaxrl.envs.brax_core import BraxCore

    dt = float(core.env.dt) if isinstance(core, BraxCore) else float(core.dt)
    return 1.0 / (dt * int(parse_env_id(env_id)[2].get("decimation", 1)))


__all__ = [
    "GL_BACKENDS",
    "GL_PACKAGES",
    "MujocoFrames",
    "frame_rate",
    "gl_backend",
    "mujoco_renderer",
    "needs_gl",
    "render_data",
    "render_frames",
]
