"""jaxrl: pure-functional, JIT-compiled deep RL for continuous control in JAX."""

from jaxrl.buffers import BufferState, ReplayBuffer, buffer_from_arrays, make_replay_buffer
from jaxrl.checkpoint import Checkpointer, CheckpointError
from jaxrl.config import ConfigError
from jaxrl.distributions import TanhNormal
from jaxrl.envs import EnvError, HostEnv, make_env
from jaxrl.training import (
    LoopState,
    TrainConfig,
    evaluate,
    init_loop_state,
    prepare_run_dir,
    run_config,
    train_host,
)
from jaxrl.types import Batch, Transition

__version__ = "0.1.0"

__all__ = [
    "Batch",
    "BufferState",
    "CheckpointError",
    "Checkpointer",
    "ConfigError",
    "EnvError",
    "HostEnv",
    "LoopState",
    "ReplayBuffer",
    "TanhNormal",
    "TrainConfig",
    "Transition",
    "buffer_from_arrays",
    "evaluate",
    "init_loop_state",
    "make_env",
    "make_replay_buffer",
    "prepare_run_dir",
    "run_config",
    "train_host",
]
