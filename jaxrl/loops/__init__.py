"""The training loops: one harness and the thin loops on top of it.

- ``config``: the loop options (``TrainConfig``) and ``config.json``.
- ``harness``: run directory, resume, logging, checkpoints, progress, summary.
- ``cadence``: when to log, evaluate and checkpoint; the ``on_eval`` hooks; the stop flag.
- ``device``: strongly typed state, one compiled chunk per length, the NaN guard (the update
  call of every loop, ``guarded_update``, which applies ``--on-nonfinite``).
- ``host``: Gymnasium envs, one jitted update-and-act call per env step.
- ``host_state``: what the host loop keeps on the host between env steps (sampler, episodes).
- ``fused``: JAX envs, acting, simulating, storing and learning as one XLA program per chunk.
- ``fused_metrics``: what a fused chunk reports, and the metrics rows the host logs from it.
- ``offline``: gradient steps on a device-resident dataset.
- ``plan``: model-predictive control on the true simulator (``jaxrl plan``), on the harness.
- ``acting`` / ``evaluation``: how a registry entry acts (policy or planner) and evaluation.
- ``video``: evaluation episodes rendered to mp4 (``--video-every``, ``jaxrl eval --video``).
- ``checkpoint`` / ``logging``: atomic orbax checkpoints; metrics, TensorBoard, JSON, plots.
- ``mesh``: the device mesh (members x data, ``--devices``), where each array lives, what the
  host reads back, and which process writes.

May import: ``jaxrl.registry`` and everything below it; never the run layer or above.

Every loop takes the agent's registry entry (``jaxrl.registry.AgentSpec``).
"""

from jaxrl.loops.cadence import Cadence, Points
from jaxrl.loops.checkpoint import Checkpointer
from jaxrl.loops.config import TrainConfig, default_out, prepare_run_dir, run_config
from jaxrl.loops.device import (
    NONFINITE,
    NONFINITE_MODES,
    guarded_update,
    guarded_updates,
    nonfinite,
    strongly_typed,
    update_step,
)
from jaxrl.loops.evaluation import evaluate, evaluate_jax
from jaxrl.loops.fused import FusedState, init_fused_state, train_fused
from jaxrl.loops.harness import Harness
from jaxrl.loops.host import LoopState, init_loop_state, train_host
from jaxrl.loops.offline import OfflineState, train_offline

__all__ = [
    "NONFINITE",
    "NONFINITE_MODES",
    "Cadence",
    "Checkpointer",
    "FusedState",
    "Harness",
    "LoopState",
    "OfflineState",
    "Points",
    "TrainConfig",
    "default_out",
    "evaluate",
    "evaluate_jax",
    "guarded_update",
    "guarded_updates",
    "init_fused_state",
    "init_loop_state",
    "nonfinite",
    "prepare_run_dir",
    "run_config",
    "strongly_typed",
    "train_fused",
    "train_host",
    "train_offline",
    "update_step",
]
