"""``load_dataset``: one entry point for every dataset format jaxrl reads."""

from __future__ import annotations

import os

from jaxrl.data.d4rl_io import load_d4rl
from jaxrl.data.dataset import Dataset, DatasetError
from jaxrl.data.minari_io import load_minari


def load_dataset(spec: str, env_id: str | None = None) -> Dataset:
    """Load ``spec``: a D4RL ``.hdf5`` path, a Minari dataset directory, or ``minari:ID``."""
    spec = os.fspath(spec)
    if spec.startswith("minari:"):
        return load_minari(spec[len("minari:") :], env_id)
    if os.path.isdir(spec):
        return load_minari(spec, env_id)
    if not os.path.exists(spec):
        raise DatasetError(
            f"Dataset {spec!r} not found: pass a D4RL-format .hdf5 file, a Minari dataset "
            "directory, or minari:ID (a dataset under MINARI_DATASETS_PATH). Create one with "
            "`jaxrl dataset collect`."
        )
    return load_d4rl(spec, env_id)
