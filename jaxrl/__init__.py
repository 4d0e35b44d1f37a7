"""jaxrl: pure-functional, JIT-compiled deep RL for continuous control in JAX."""

from jaxrl.buffers import (
    BufferState,
    ReplayBuffer,
    buffer_from_arrays,
    make_replay_buffer,
    sample_minibatches,
    sample_mixed,
)
from jaxrl.checkpoint import Checkpointer, CheckpointError
from jaxrl.config import ConfigError
from jaxrl.distributions import TanhNormal
from jaxrl.envs import EnvError, HostEnv, make_env, make_jax_env
from jaxrl.episodes import EpisodeTracker, monte_carlo_returns
from jaxrl.planners import PlannerConfig, PlanResult, PlanState
from jaxrl.types import Batch, Rollout, Transition

__version__ = "0.1.0"

# The training loops load on first use, so that ``import jaxrl.offline`` (agents, datasets) or
# ``import jaxrl.envs`` does not load them.
_LOOP_NAMES = (
    "FusedState",
    "LoopState",
    "OfflineState",
    "TrainConfig",
    "evaluate",
    "evaluate_jax",
    "init_fused_state",
    "init_loop_state",
    "prepare_run_dir",
    "run_config",
    "train_fused",
    "train_host",
    "train_offline",
)


def __getattr__(name: str) -> object:
    """The loop names and ``jaxrl.loops``, imported on first access (PEP 562)."""
    if name in _LOOP_NAMES:
        from jaxrl import loops

        return getattr(loops, name)
    if name == "loops":
        import importlib

        return importlib.import_module("jaxrl.loops")
    raise AttributeError(f"module 'jaxrl' has no attribute {name!r}")


__all__ = [
    "Batch",
    "BufferState",
    "CheckpointError",
    "Checkpointer",
    "ConfigError",
    "EnvError",
    "EpisodeTracker",
    "HostEnv",
    "PlanResult",
    "PlanState",
    "PlannerConfig",
    "ReplayBuffer",
    "Rollout",
    "TanhNormal",
    "Transition",
    "buffer_from_arrays",
    "make_env",
    "make_jax_env",
    "make_replay_buffer",
    "monte_carlo_returns",
    "sample_minibatches",
    "sample_mixed",
    *_LOOP_NAMES,
]
