"""Sweeps and tuners: grid sweeps, Optuna, Ray Tune and PBT (``jaxrl sweep``).

Grid sweeps (``jaxrl.tune.grid``) train the members of a grid x seeds through the run layer
(``jaxrl.run``): one vmapped program per static setting on JAX envs and datasets, one process
per member on Gymnasium envs. The tuners search over ``jaxrl.run.train``.

Every trial is an ordinary jaxrl run: ``train`` runs it in-process into its own run directory
under ``out_root`` (``config.json``, ``metrics.csv``, ``summary.json``, ``checkpoints/``), and an
``jaxrl.loops.cadence.on_eval`` hook hands each evaluation to the tuner, which may end the run
there (Optuna's pruner, Ray's ASHA) or, with Ray's PBT, restart it from another trial's
checkpoint with mutated settings. A run whose agent holds NaN values (``nonfinite > 0`` at an
evaluation) or whose evaluation return is not finite is a failed trial (Optuna: FAIL, Ray:
ERROR), never a pruned one, and the sweep goes on.

Searches are written as ``FIELD=DIST:ARGS`` (``parse_search``) over the agent's config fields:
``actor_lr=loguniform:1e-5:1e-3``, ``tau=uniform:0.001:0.02``, ``batch_size=int:64:512``,
``n_step=choice:1,3,5`` (``hidden_dims=choice:64 64,256 256`` for tuples).

Both backends write ``out_root/best_config.json``: the best trial's ``config.json`` (same layout,
every field of ``agent_config``) plus a ``sweep`` section with the study, trial, value and
searched settings.

The code lives in ``space`` (search specs, shared trial plumbing), ``optuna_search``,
``ray_search``, ``pbt`` (PBT's checkpoint transplant) and ``workers`` (the spawn pool that runs
grid members and Optuna workers); this package re-exports their public
names. It may import ``jaxrl.run`` and everything below it, never ``jaxrl.cli``.
"""

from jaxrl.tune.optuna_search import optuna_sweep
from jaxrl.tune.pbt import check_pbt_search, transplant, with_settings
from jaxrl.tune.ray_search import ray_sweep
from jaxrl.tune.space import (
    DISTRIBUTIONS,
    SETTINGS_KEYS,
    Diverged,
    Param,
    Sweep,
    apply_settings,
    parse_search,
)

__all__ = [
    "DISTRIBUTIONS",
    "SETTINGS_KEYS",
    "Diverged",
    "Param",
    "Sweep",
    "apply_settings",
    "check_pbt_search",
    "optuna_sweep",
    "parse_search",
    "ray_sweep",
    "transplant",
    "with_settings",
]
