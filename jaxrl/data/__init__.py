"""Datasets: the in-memory model, D4RL HDF5 and Minari IO, loading by path or id, reference scores.

- ``dataset``: ``Dataset`` (arrays, checks, episodes, Monte-Carlo returns, normalized scores).
- ``d4rl_io`` / ``minari_io``: read and write the D4RL HDF5 layout; read Minari datasets.
- ``loading``: ``load_dataset(PATH | minari:ID)``.
- ``scores``: D4RL reference returns and normalized scores.
- ``episodes``: fields that depend on later steps of an episode (next actions, Monte-Carlo
  returns), for datasets and for the online loops.

Datasets are generated locally from trained runs by ``jaxrl.run.collect`` (``jaxrl dataset
collect``): that replays a run's policy, so it sits in the run layer. May import: the core
modules at ``jaxrl``'s root only.
"""

from jaxrl.data.d4rl_io import load_d4rl, save_d4rl
from jaxrl.data.dataset import Dataset, DatasetError
from jaxrl.data.loading import load_dataset
from jaxrl.data.minari_io import load_minari
from jaxrl.data.scores import D4RL_REF_RETURNS, normalized_score, reference_returns

__all__ = [
    "D4RL_REF_RETURNS",
    "Dataset",
    "DatasetError",
    "load_d4rl",
    "load_dataset",
    "load_minari",
    "normalized_score",
    "reference_returns",
    "save_d4rl",
]
