"""Rollout videos: evaluation episodes rendered to mp4, in the run directory, TensorBoard, wandb.

``episode_frames`` renders deterministic evaluation episodes of an agent (or planner) on any env
kind: a Gymnasium env steps on the host and renders each step; a JAX env runs the episode in one
compiled rollout that keeps only what the frames need (``record_jax``), pulled to the host once
and rendered there (``jaxrl.envs.render``). ``Videos`` does this at every Nth evaluation point of
a training run (``--video-every``): ``DIR/videos/step_<k>.mp4``, a TensorBoard video summary and
the wandb log. Nothing here runs between those points, so training speed is unchanged.
"""

from __future__ import annotations

import io
import os
import warnings
from contextlib import closing
from typing import Any

import jax
import numpy as np

from jaxrl.envs.gym import HostEnv, make_env
from jaxrl.errors import ConfigError, EnvError
from jaxrl.loops.acting import POLICY, Acting
from jaxrl.loops.evaluation import evaluate, record_jax
from jaxrl.loops.mesh import host_array


def check_rendering(env_id: str) -> None:
    """Raise before anything is written if ``env_id`` cannot be rendered on this machine.

    Raises:
        EnvError: MuJoCo scenes but no working OpenGL backend (naming the packages to
            install), or a classic-control env without pygame.
    """
    from jaxrl.envs.render import gl_backend, needs_gl

    if needs_gl(env_id):
        gl_backend()
    elif not env_id.startswith(("jax:", "brax:")):
        try:
            import pygame  # noqa: F401
        except ImportError:
            raise EnvError(
                f"Rendering {env_id!r} needs pygame (Gymnasium's classic-control renderer): "
                "pip install pygame."
            ) from None


def _fit(frame: np.ndarray, width: int, height: int) -> np.ndarray:
    """``frame`` scaled to fit ``width`` x ``height`` and padded (classic-control frames)."""
    if frame.shape[:2] == (height, width):
        return frame
    from PIL import Image, ImageOps

    image = ImageOps.pad(Image.fromarray(frame), (width, height), color=(255, 255, 255))
    return np.asarray(image)


def episode_frames(
    agent: Any,
    env: Any,
    seed: int,
    size: tuple[int, int],
    episodes: int = 1,
    obs_stats: Any = None,
    policy: Acting = POLICY,
    rollout: Any = None,
) -> tuple[np.ndarray, float]:
    """Frames ``[T, height, width, 3]`` (uint8) of ``episodes`` evaluation episodes, and the fps.

    Args:
        agent: the agent (its ``eval_actions``, or the planner ``policy``).
        env: a Gymnasium env id (a one-copy render env is built per episode, episode ``i``
            seeded ``seed + i`` as copy ``i`` of an evaluation), or a JAX evaluation env with
            at least ``episodes`` copies (keyed ``jax.random.key(seed)``, as evaluations are).
        seed: the evaluation seed.
        size: ``(width, height)`` in pixels.
        episodes: how many episodes, one after the other.
        obs_stats: a JAX env's frozen observation statistics (``NormalizeObservation``).
        policy: how the agent acts (``jaxrl.loops.acting``).
        rollout: a compiled ``record_jax`` to reuse (JAX envs), as ``videos_fn`` makes.
    """
    width, height = size
    if isinstance(env, str):
        frames: list[np.ndarray] = []
        for i in range(episodes):
            with closing(make_env(env, 1, render=size)) as host:
                evaluate(agent, host, seed + i, policy=policy, frames=frames)
                fps = host.frame_rate
        return np.stack([_fit(f, width, height) for f in frames]), fps
    from jaxrl.envs.render import frame_rate, render_frames

    if episodes > env.num_envs:
        raise ConfigError(f"{episodes} episodes asked for, but the env has {env.num_envs} copies.")
    rollout = rollout or jax.jit(lambda a, k, s: record_jax(a, env, k, s, policy))
    _, data, alive = jax.device_get(rollout(agent, jax.random.key(seed), obs_stats))
    clips = []
    for i in range(episodes):
        steps = int(np.asarray(alive)[:, i].sum())
        episode = jax.tree.map(lambda x, i=i, steps=steps: x[:steps, i], data)
        clips.append(render_frames(env.core, episode, *size))
    return np.concatenate(clips), frame_rate(env.name, env.core)


def write_video(path: str, frames: np.ndarray, fps: float, codec: str = "libx264") -> str:
    """Encode ``frames`` (``[T, H, W, 3]`` uint8) to ``path`` with imageio's ffmpeg plugin.

    Written to a temporary file first and moved into place, so a crash leaves no broken video.
    """
    try:
        import imageio.v2 as imageio
        import imageio_ffmpeg  # noqa: F401  (the plugin's ffmpeg binary)
    except ImportError:
        msg = "Writing mp4 videos needs imageio-ffmpeg: pip install imageio-ffmpeg."
        raise EnvError(msg) from None
    folder, name = os.path.split(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    root, ext = os.path.splitext(name)
    tmp = os.path.join(folder, f".{root}.partial{ext or '.mp4'}")
    with warnings.catch_warnings():  # ffmpeg is a subprocess (fork + exec), safe under JAX
        warnings.filterwarnings("ignore", "os.fork", RuntimeWarning)
        writer = imageio.get_writer(tmp, format="FFMPEG", fps=fps, codec=codec, macro_block_size=1)
        try:
            for frame in frames:
                writer.append_data(np.asarray(frame, np.uint8))
        finally:
            writer.close()
    os.replace(tmp, path)
    return path


def tensorboard_video(tag: str, frames: np.ndarray, fps: float) -> Any:
    """A TensorBoard summary showing ``frames`` as an animated GIF (a video summary)."""
    from PIL import Image
    from tensorboardX.proto.summary_pb2 import Summary

    images = [Image.fromarray(np.asarray(f, np.uint8)) for f in frames]
    buffer = io.BytesIO()
    duration = max(20, int(round(1000.0 / fps)))  # GIF delays are in ms; viewers floor at 20
    images[0].save(
        buffer, format="GIF", save_all=True, append_images=images[1:], duration=duration, loop=0
    )
    h, w = frames.shape[1:3]
    image = Summary.Image(height=h, width=w, colorspace=3, encoded_image_string=buffer.getvalue())
    return Summary(value=[Summary.Value(tag=tag, image=image)])


class Videos:
    """``--video-every N``: one evaluation episode per member at every Nth evaluation point.

    Evaluation points are numbered by the loop's step (``ceil(step / eval_every)``); the last
    one of a run is always filmed. Each member's video goes to ``DIR/videos/step_<k>.mp4`` (``k``
    the row's step), TensorBoard and wandb. Built by the loops; inert without ``video_every``.

    Args:
        cfg: the loop options (``video_*`` fields, ``eval_every``, ``total_steps``).
        loggers: each member's ``RunLogger``.
        env: the evaluation env: a Gymnasium id or the loop's JAX evaluation env.
        policy: how the agent acts.
        step_offset: steps of an earlier phase (the rows' numbering).
    """

    def __init__(
        self, cfg: Any, loggers: list, env: Any, policy: Acting = POLICY, step_offset: int = 0
    ):
        self.cfg, self.loggers, self.policy, self.offset = cfg, loggers, policy, step_offset
        self.env = env.env_id if isinstance(env, HostEnv) else env
        self._rollout = None

    def due(self, step: int) -> bool:
        """Whether the evaluation point at ``step`` (this loop's) is filmed."""
        every = self.cfg.video_every
        if not every:
            return False
        return step >= self.cfg.total_steps or (-(-step // self.cfg.eval_every)) % every == 0

    def __call__(self, step: int, agent: Any, i: int, seed: int, obs_stats: Any = None) -> None:
        """Film member ``i`` (``agent``, evaluation ``seed``) if ``step`` is due.

        Every process of a run calls it (the agent is gathered from all); process 0 films.
        """
        if not self.due(step):
            return
        if jax.process_count() > 1:  # every process takes part in gathering the member's agent
            agent, obs_stats = jax.tree.map(host_array, (agent, obs_stats))
        if not self.loggers[i].writes:  # process 0 renders and writes
            return
        cfg = self.cfg
        if not isinstance(self.env, str) and self._rollout is None:
            env, policy = self.env, self.policy
            self._rollout = jax.jit(lambda a, k, s: record_jax(a, env, k, s, policy))
        frames, fps = episode_frames(
            agent, self.env, seed, (cfg.video_width, cfg.video_height), 1, obs_stats,
            self.policy, self._rollout,
        )  # fmt: skip
        k = self.offset + step
        save_video(self.loggers[i], k, f"step_{k}", frames, cfg.video_fps or fps, cfg.video_codec)


def save_video(
    logger: Any, step: int, name: str, frames: np.ndarray, fps: float, codec: str = "libx264"
) -> str:
    """``frames`` to ``videos/<name>.mp4`` in ``logger``'s run directory and to its summaries."""
    path = write_video(os.path.join(logger.out_dir, "videos", f"{name}.mp4"), frames, fps, codec)
    logger.video(step, path, frames, fps)
    return path


__all__ = [
    "Videos",
    "check_rendering",
    "episode_frames",
    "save_video",
    "tensorboard_video",
    "write_video",
]
