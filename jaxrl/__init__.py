"""jaxrl: pure-functional, JIT-compiled deep RL for continuous control in JAX.

The package is layered; a module imports only from its own layer or the layers below::

    cli  ->  tune | export | analysis  ->  run  ->  loops  ->  registry
         ->  agents | offline  ->  envs | data  ->  core (the modules at this root)

Every public name below is loaded on first access (PEP 562), so ``import jaxrl`` or
``import jaxrl.networks`` loads no simulator, loop, tuner, exporter or plotting library.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

# name -> the module that defines it
_PUBLIC = {
    "Batch": "jaxrl.types",
    "Rollout": "jaxrl.types",
    "Transition": "jaxrl.types",
    "BufferState": "jaxrl.buffers",
    "ReplayBuffer": "jaxrl.buffers",
    "buffer_from_arrays": "jaxrl.buffers",
    "make_replay_buffer": "jaxrl.buffers",
    "sample_minibatches": "jaxrl.buffers",
    "sample_mixed": "jaxrl.buffers",
    "sample_sequences": "jaxrl.buffers",
    "JaxrlError": "jaxrl.errors",
    "ConfigError": "jaxrl.errors",
    "EnvError": "jaxrl.errors",
    "DatasetError": "jaxrl.errors",
    "CheckpointError": "jaxrl.errors",
    "MissingExtraError": "jaxrl.errors",
    "TanhNormal": "jaxrl.distributions",
    "EpisodeTracker": "jaxrl.data.episodes",
    "monte_carlo_returns": "jaxrl.data.episodes",
    "PlannerConfig": "jaxrl.planners",
    "PlanResult": "jaxrl.planners",
    "PlanState": "jaxrl.planners",
    "HostEnv": "jaxrl.envs",
    "can_terminate": "jaxrl.envs",
    "episode_length": "jaxrl.envs",
    "make_env": "jaxrl.envs",
    "make_jax_env": "jaxrl.envs",
    "Checkpointer": "jaxrl.loops",
    "FusedState": "jaxrl.loops",
    "LoopState": "jaxrl.loops",
    "OfflineState": "jaxrl.loops",
    "TrainConfig": "jaxrl.loops",
    "evaluate": "jaxrl.loops",
    "evaluate_jax": "jaxrl.loops",
    "init_fused_state": "jaxrl.loops",
    "init_loop_state": "jaxrl.loops",
    "prepare_run_dir": "jaxrl.loops",
    "run_config": "jaxrl.loops",
    "train_fused": "jaxrl.loops",
    "train_host": "jaxrl.loops",
    "train_offline": "jaxrl.loops",
    "train": "jaxrl.run",
    "load_run": "jaxrl.run",
}

_SUBPACKAGES = (
    "agents",
    "analysis",
    "cli",
    "data",
    "envs",
    "export",
    "loops",
    "offline",
    "run",
    "tune",
)


def __getattr__(name: str) -> object:
    """Load a public name, or a subpackage, on first access."""
    if name in _PUBLIC:
        value = getattr(importlib.import_module(_PUBLIC[name]), name)
        globals()[name] = value
        return value
    if name in _SUBPACKAGES:
        return importlib.import_module(f"jaxrl.{name}")
    raise AttributeError(f"module 'jaxrl' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_PUBLIC, *_SUBPACKAGES])


__all__ = sorted(_PUBLIC)
