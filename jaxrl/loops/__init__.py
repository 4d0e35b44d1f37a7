"""The training loops: one harness and three thin loops on top of it.

- ``config``: the loop options (``TrainConfig``) and ``config.json``.
- ``harness``: run directory, resume, logging, checkpoints, progress, summary.
- ``cadence``: when to log, evaluate and checkpoint; the ``on_eval`` hooks; the stop flag.
- ``device``: strongly typed state, one compiled chunk per length, the NaN guard.
- ``host``: Gymnasium envs, one jitted update-and-act call per env step.
- ``host_state``: what the host loop keeps on the host between env steps (sampler, episodes).
- ``fused``: JAX envs, acting, simulating, storing and learning as one XLA program per chunk.
- ``offline``: gradient steps on a device-resident dataset.

Every loop takes the agent's registry entry (``jaxrl.registry.AgentSpec``).
"""

# ruff: noqa: F401  (re-exports: ``__all__`` extends ``jaxrl._LOOP_NAMES``, which ruff cannot read)

from jaxrl import _LOOP_NAMES
from jaxrl.evaluation import evaluate, evaluate_jax
from jaxrl.loops.cadence import Cadence, Points
from jaxrl.loops.config import TrainConfig, default_out, prepare_run_dir, run_config
from jaxrl.loops.device import NONFINITE, nonfinite, strongly_typed
from jaxrl.loops.fused import FusedState, init_fused_state, train_fused
from jaxrl.loops.harness import Harness
from jaxrl.loops.host import LoopState, init_loop_state, train_host
from jaxrl.loops.offline import OfflineState, train_offline

# The names ``jaxrl`` re-exports are listed once, in ``jaxrl._LOOP_NAMES``.
__all__ = [
    "NONFINITE",
    "Cadence",
    "Harness",
    "Points",
    "default_out",
    "nonfinite",
    "strongly_typed",
    *_LOOP_NAMES,
]
