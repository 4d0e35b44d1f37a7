"""A run's configuration: the loop options (``TrainConfig``) and its ``config.json``.

``config.json`` is part of the run-directory contract (scripts, sweeps and plots read it): it
records the resolved agent and loop configs, and a run resumes only with the same ones.
"""

from __future__ import annotations

import dataclasses
import json
import os
from functools import partial
from typing import Any, Literal

import jax

from jaxrl.config import check_choice, check_positive, check_range, config_to_dict
from jaxrl.errors import ConfigError
from jaxrl.loops.device import NONFINITE_MODES
from jaxrl.loops.logging import write_json
from jaxrl.loops.mesh import parse_devices, primary


@partial(dataclasses.dataclass, frozen=True)
class TrainConfig:
    """Options of the training loop (the agent's hyperparameters live in its own config)."""

    env: str = "Pendulum-v1"
    """Environment id: 'HalfCheetah-v5' (Gymnasium), 'brax:ant', 'jax:pendulum'. With --dataset
    and no --env, the dataset's env."""
    dataset: str | None = None
    """Offline data: a D4RL-format .hdf5 file, a Minari dataset directory, or minari:ID."""
    offline_steps: int | None = None
    """With --dataset: offline gradient steps before going online (default: --total-steps)."""
    online_steps: int | None = None
    """With --dataset: env steps online after the offline phase (rlpd: the run's env steps)."""
    offline_ratio: float = 0.5
    """Online with --dataset: share of each minibatch from the dataset (0 = drop it online)."""
    online_lr_schedule: Literal["constant", "cosine"] = "constant"
    """Online phase of an offline agent with a schedule (iql, idql, diffusion-ql): 'constant'
    (every network at its base rate; the IQL authors' fine-tuning) or 'cosine' (a new decay to 0
    over the online updates). The offline phase's schedule always ends with it."""
    total_steps: int = 100_000
    """Environment steps to train for (summed over parallel envs); offline: gradient steps."""
    seed: int = 0
    """Seed of the agent, the environments and the loop."""
    num_envs: int | None = None
    """Parallel environment copies (default: 1 for Gymnasium envs, 64 for JAX envs)."""
    num_seeds: int = 1
    """Train this many seeds (seed, seed+1, ...) at once with jax.vmap (JAX envs, and offline
    agents on a dataset)."""
    updates_per_step: int | None = None
    """Gradient steps per vectorized env step (off-policy); default utd_ratio x num_envs."""
    out: str | None = None
    """Run directory (default runs/<agent>-<env>-s<seed>); resumes if it has a checkpoint."""
    eval_every: int = 10_000
    """Evaluate the deterministic policy every this many environment steps."""
    eval_episodes: int = 10
    """Episodes per evaluation (run in parallel, one per eval env copy)."""
    log_every: int = 1_000
    """Log training metrics every this many environment steps."""
    checkpoint_every: int | None = None
    """Checkpoint every this many environment steps; default = eval_every."""
    progress: bool = True
    """Show a progress bar."""
    tensorboard: bool = True
    """Write TensorBoard event files."""
    wandb_project: str | None = None
    """Also log to this wandb project (opt-in; needs the wandb extra)."""
    video_every: int | None = None
    """Render one evaluation episode at every Nth evaluation point and the last one, to
    DIR/videos/step_<step>.mp4, TensorBoard and wandb (MuJoCo scenes need OpenGL: EGL/OSMesa)."""
    video_width: int = 320
    """Video frame width in pixels (even)."""
    video_height: int = 240
    """Video frame height in pixels (even)."""
    video_fps: float | None = None
    """Video frames per second (default: real time, one frame per control step)."""
    video_codec: str = "libx264"
    """ffmpeg video codec of the mp4 files."""
    on_nonfinite: Literal["stop", "skip", "warn"] = "stop"
    """When an update leaves NaN in the agent: 'stop' (report the step and the non-finite losses,
    keep the last good checkpoint, exit with status 3), 'skip' (discard such updates and count
    them in train/nonfinite_updates), or 'warn' (say so once and go on)."""
    max_to_keep: int = 2
    """Checkpoints kept per run directory (the newest ones)."""
    devices: str = "1"
    """Devices to train on: a number, or 'all' (every process's, when distributed). Several
    seeds spread over them (each device trains whole seeds); one seed is split over them (its
    envs, buffer rows and minibatches; gradients averaged). JAX envs and datasets only."""
    coordinator: str | None = None
    """Several processes (hosts): HOST:PORT of process 0, where jax.distributed meets; give it
    with --num-processes and --process-id to every process. Under SLURM or Open MPI with
    several tasks JAX finds these itself. Process 0 writes the run directory."""
    num_processes: int | None = None
    """With --coordinator: how many processes take part."""
    process_id: int | None = None
    """With --coordinator: this process's index, 0 .. num_processes - 1."""

    def __post_init__(self) -> None:
        check_positive(
            self,
            "total_steps",
            "num_envs",
            "num_seeds",
            "updates_per_step",
            "eval_every",
            "eval_episodes",
            "log_every",
            "checkpoint_every",
            "online_steps",
            "max_to_keep",
            "video_every",
            "video_width",
            "video_height",
            "video_fps",
        )
        check_video_size(self.video_width, self.video_height, "--video-width and --video-height")
        check_range(self, "seed", 0, 2**31 - 1)
        if self.offline_steps is not None:
            check_range(self, "offline_steps", 0, float("inf"))
        check_range(self, "offline_ratio", 0.0, 1.0)
        check_choice(self, "online_lr_schedule", ("constant", "cosine"))
        check_choice(self, "on_nonfinite", NONFINITE_MODES)
        parse_devices(self.devices)
        given = [self.coordinator, self.num_processes, self.process_id]
        if any(v is not None for v in given) and any(v is None for v in given):
            raise ConfigError(
                "--coordinator, --num-processes and --process-id go together: give all three "
                "to every process (e.g. --coordinator node0:1234 --num-processes 2 "
                "--process-id 0 on node0), or none."
            )
        check_positive(self, "num_processes")
        if self.process_id is not None:
            check_range(self, "process_id", 0, (self.num_processes or 1) - 1)


def check_video_size(width: int, height: int, flags: str) -> None:
    """Refuse a video size that is not even and positive (H.264 needs even sides).

    Raises:
        ConfigError: naming ``flags``, the options that set the size.
    """
    if width % 2 or height % 2 or width < 2 or height < 2:
        raise ConfigError(
            f"{flags} must be even and positive (H.264 needs even sides); got {width}x{height}."
        )


def run_config(agent_name: str, agent_config: Any, cfg: TrainConfig) -> dict[str, Any]:
    """The resolved config recorded in ``config.json``."""
    import flax
    import gymnasium

    return {
        "agent": agent_name,
        "env": cfg.env,
        "dataset": cfg.dataset,
        "seed": cfg.seed,
        "train": config_to_dict(cfg),
        "agent_config": config_to_dict(agent_config),
        "versions": {
            "jax": jax.__version__,
            "flax": flax.__version__,
            "gymnasium": gymnasium.__version__,
        },
    }


def default_out(agent_name: str, cfg: TrainConfig) -> str:
    """``runs/<agent>-<dataset or env>-s<seed>``, the default ``--out``."""
    seeds = f"s{cfg.seed}" if cfg.num_seeds == 1 else f"s{cfg.seed}-{cfg.seed + cfg.num_seeds - 1}"
    where = cfg.env.split("?")[0]
    if cfg.dataset:
        where = os.path.splitext(os.path.basename(os.path.normpath(cfg.dataset)))[0]
    name = f"{agent_name}-{where}-{seeds}"
    return os.path.join("runs", name.replace(":", "_"))


def prepare_run_dir(out: str, config: dict[str, Any], check_only: bool = False) -> None:
    """Create ``out`` and write ``config.json``; refuse to resume a run with another config.

    When ``out`` already holds a run with the same settings (budgets such as ``total_steps``
    may differ), its ``config.json`` is left as it is and the new one is written beside it as
    ``config.pending.json``; the loop's resume replaces ``config.json`` with it once the
    newest checkpoint has been restored (``commit_run_config``), so a resume that fails leaves
    the run's record unchanged. ``check_only`` refuses another config but writes nothing (a
    caller that leaves a finished run alone).
    """
    if not primary():  # several processes: process 0 writes the run directory
        return
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, "config.json")
    config = json.loads(json.dumps(config))  # tuples -> lists, as they are stored
    if not os.path.exists(path):
        if not check_only:
            claim_run_dir(out)
            write_json(path, config)
        return
    try:
        with open(path) as f:
            old = json.load(f)
    except (OSError, json.JSONDecodeError) as err:
        raise ConfigError(
            f"{path} is not readable JSON ({err}), so {out} cannot be resumed safely. Restore "
            "the file (it records the run's settings) or use a new --out directory."
        ) from None
    if not isinstance(old, dict):
        raise ConfigError(f"{path} does not hold a run's settings; use a new --out directory.")
    # Budgets may grow (resume a finished run for longer; fine-tune an offline run online).
    ignore = {"total_steps", "online_steps", "offline_ratio", "online_lr_schedule"}
    ignore |= {"progress", "out"}
    ignore |= {"wandb_project", "tensorboard", "on_nonfinite", "max_to_keep"}
    ignore |= {"video_every", "video_width", "video_height", "video_fps", "video_codec"}
    # A checkpoint restores on any number of devices and processes.
    ignore |= {"devices", "coordinator", "num_processes", "process_id"}
    for section in ("agent", "env", "seed", "agent_config", "train"):
        a, b = old.get(section), config.get(section)
        if isinstance(a, dict) and isinstance(b, dict):
            # A field the old run does not record is newer than the run: it ran the default.
            diff = {k: (a[k], b.get(k)) for k in a if k not in ignore and a[k] != b.get(k)}
        else:
            diff = {} if a == b else {section: (a, b)}
        if diff:
            changes = "; ".join(
                f"{k}: {was!r} in the run, {now!r} now" for k, (was, now) in sorted(diff.items())
            )
            raise ConfigError(
                f"{out} holds a run with a different configuration ({section}: {changes}). Use "
                "a new --out directory, or the same options as before to resume."
            )
    if check_only:
        return
    claim_run_dir(out)
    if old != config:
        write_json(os.path.join(out, PENDING), config)
    elif os.path.exists(os.path.join(out, PENDING)):  # left by an earlier resume that failed
        os.remove(os.path.join(out, PENDING))


PENDING = "config.pending.json"
LOCK = ".lock"
_CLAIMED: dict[str, Any] = {}  # run directory (real path) -> the open lock file this process holds


def claim_run_dir(out: str) -> None:
    """Make this process the only one training ``out``, or refuse while another one does.

    An exclusive ``flock`` on ``out/.lock``, held until ``release_run_dirs`` (the harness calls it
    when the run ends) or the process exits, whichever comes first; the OS drops it when a
    process dies, so a killed run leaves nothing to clean up. Two processes writing one run
    directory would interleave their checkpoints and metrics rows. Claiming a directory this
    process already holds does nothing. Where the filesystem has no ``flock`` (some network
    mounts) or the OS none (Windows), there is no guard.
    """
    key = os.path.realpath(out)
    if key in _CLAIMED or not primary():
        return
    try:
        import fcntl
    except ImportError:  # not a POSIX system
        return
    handle = open(os.path.join(out, LOCK), "a")  # noqa: SIM115 (held open while the run lasts)
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        raise ConfigError(
            f"{out} is being trained by another process (it holds {os.path.join(out, LOCK)}). "
            "Wait for that run to end or stop it (it resumes later from its checkpoint), or use "
            "a new --out directory."
        ) from None
    except OSError:  # no flock on this filesystem
        handle.close()
        return
    _CLAIMED[key] = handle


def run_dir_in_use(out: str) -> bool:
    """True while another process holds ``out``'s lock (``claim_run_dir``): it is training there.

    False where ``out`` was never claimed, where this process holds it, and where there is no
    ``flock`` (the same cases in which ``claim_run_dir`` does not guard).
    """
    if os.path.realpath(out) in _CLAIMED:
        return False
    try:
        import fcntl
    except ImportError:
        return False
    try:
        with open(os.path.join(out, LOCK)) as handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return True
            fcntl.flock(handle, fcntl.LOCK_UN)
    except OSError:  # no lock file (never trained), or no flock on this filesystem
        return False
    return False


def release_run_dirs(outs: list[str]) -> None:
    """Let other processes train ``outs`` again (``claim_run_dir``); nothing where not held."""
    for out in outs:
        handle = _CLAIMED.pop(os.path.realpath(out), None)
        if handle is not None:
            handle.close()


def commit_run_config(out: str, keep: bool = True) -> None:
    """Make the settings ``prepare_run_dir`` left pending the run's ``config.json``.

    Args:
        out: the run directory.
        keep: False drops them instead (the resume failed; the run stays as it was).
    """
    pending = os.path.join(out, PENDING)
    if primary() and os.path.exists(pending):
        if keep:
            os.replace(pending, os.path.join(out, "config.json"))
        else:
            os.remove(pending)


__all__ = [
    "TrainConfig",
    "claim_run_dir",
    "commit_run_config",
    "default_out",
    "prepare_run_dir",
    "release_run_dirs",
    "run_config",
]
