"""``jaxrl eval DIR [--episodes N] [--env ENV] [--step S] [--video [FILE.mp4]]``.

Prints one JSON line with the evaluation return (and the video's path).
"""

from __future__ import annotations

import dataclasses
import json
from typing import Annotated

import tyro

from jaxrl.cli.common import guard, parse


@dataclasses.dataclass(frozen=True)
class EvalArgs:
    """The options of ``jaxrl eval``."""

    run_dir: Annotated[str, tyro.conf.Positional]
    """the run directory whose checkpoint is evaluated"""
    episodes: int | None = None
    """evaluation episodes (default: the run's --eval-episodes)"""
    env: str | None = None
    """evaluate on this env instead (same spaces): e.g. the real system's model of a sim-to-real
    run, or a perturbed simulator such as jax:pendulum?m=1.3"""
    step: int | None = None
    """evaluate the checkpoint of this step (default: the newest)"""
    video: str | None = None
    """render the evaluation episodes to this mp4 file; a bare --video writes
    DIR/videos/eval_step_<step>.mp4"""
    width: int = 320
    """video frame width in pixels (even)"""
    height: int = 240
    """video frame height in pixels (even)"""
    fps: float | None = None
    """video frames per second (default: real time, one frame per control step)"""


def run(argv: list[str]) -> None:
    """Parse ``argv``, evaluate the run and print the result as one JSON line."""
    description = "Evaluate (and film) the deterministic policy of a run directory's checkpoint."
    a = parse(EvalArgs, _bare_video(argv), "jaxrl eval", description)
    print(json.dumps(guard(lambda: _evaluate(a))))


_BARE = "<default>"


def _bare_video(argv: list[str]) -> list[str]:
    """``--video`` without a file name gets a marker for the default path."""
    out = list(argv)
    for i, arg in enumerate(out):
        if arg == "--video" and (i + 1 == len(out) or out[i + 1].startswith("--")):
            out.insert(i + 1, _BARE)
            break
    return out


def _evaluate(a: EvalArgs) -> dict:
    """Check the video options and evaluate."""
    from jaxrl.errors import ConfigError
    from jaxrl.loops.config import check_video_size
    from jaxrl.run.commands import evaluate_run

    if a.video is not None:
        check_video_size(a.width, a.height, "--width and --height")
    if a.fps is not None and not a.fps > 0:
        raise ConfigError(f"--fps must be positive, got {a.fps}.")
    video = True if a.video == _BARE else a.video
    return evaluate_run(a.run_dir, a.episodes, a.env, a.step, video, (a.width, a.height), a.fps)
