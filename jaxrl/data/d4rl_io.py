"""D4RL-format HDF5 files, read and written with h5py (no ``d4rl`` package)."""

from __future__ import annotations

import os
import tempfile
from typing import Any

import numpy as np

from jaxrl.data.dataset import Dataset, DatasetError, as_column, as_flags

REQUIRED_KEYS = ("observations", "actions", "rewards", "terminals")
"""Keys a D4RL file must have (``timeouts``, ``next_observations``, ``infos/`` are optional)."""


def _read_group(group: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, item in group.items():
        if hasattr(item, "keys"):
            out[key] = _read_group(item)
        else:
            value = item[()]
            if isinstance(value, bytes):
                value = value.decode()
            elif isinstance(value, np.ndarray) and value.dtype.kind in "SO" and value.ndim == 0:
                value = value.item().decode() if isinstance(value.item(), bytes) else value.item()
            elif isinstance(value, np.generic):  # numpy scalars -> Python (JSON-friendly)
                value = value.item()
            out[key] = value
    for key, value in group.attrs.items():
        out.setdefault(key, value.decode() if isinstance(value, bytes) else value)
    return out


def _qlearning_rows(
    obs: np.ndarray, terminals: np.ndarray, timeouts: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Rows kept and their next observations when the file has no ``next_observations``.

    As D4RL's ``qlearning_dataset``: row ``i`` gets ``observations[i + 1]``; the last row of a
    time-limited episode (``timeouts[i]``) and the file's last row are dropped because their next
    observation is not in the file. Terminal rows are kept (their next observation is never used
    for bootstrapping).
    """
    keep = ~timeouts.copy()
    keep[-1] = False
    idx = np.flatnonzero(keep)
    return idx, obs[np.minimum(idx + 1, len(obs) - 1)]


def load_d4rl(
    path: str | os.PathLike,
    env_id: str | None = None,
    max_episode_steps: int | None = None,
) -> Dataset:
    """Read a D4RL-format HDF5 file.

    Required keys: ``observations``, ``actions``, ``rewards``, ``terminals``. Optional:
    ``timeouts``, ``next_observations``, ``infos/``, ``metadata/`` (kept). Without
    ``next_observations`` the next observations are rebuilt as D4RL's ``qlearning_dataset`` does.

    Args:
        path: the ``.hdf5`` file.
        env_id: environment id; default from ``metadata/env_id`` (or D4RL's ``metadata/env``).
        max_episode_steps: without ``timeouts``, also end an episode every this many steps (D4RL
            used the env's time limit); without either, only terminals end episodes.

    Raises:
        DatasetError: missing file or keys, length mismatch, non-finite values.
    """
    import h5py

    path = os.fspath(path)
    if not os.path.exists(path):
        raise DatasetError(f"Dataset file {path!r} does not exist.")
    try:
        f = h5py.File(path, "r")
    except OSError as err:
        raise DatasetError(
            f"{path} is not a readable HDF5 file ({err}); D4RL datasets are HDF5 (.hdf5)."
        ) from None
    with f:
        missing = [k for k in REQUIRED_KEYS if k not in f]
        if missing:
            raise DatasetError(
                f"{path} lacks the D4RL key(s) {missing}; found {sorted(f.keys())}. A D4RL file "
                f"needs {list(REQUIRED_KEYS)} (plus optional timeouts, next_observations)."
            )
        groups = [k for k in REQUIRED_KEYS if hasattr(f[k], "keys")]
        if groups:
            raise DatasetError(
                f"{path}: {groups} are HDF5 groups, not arrays; a D4RL file stores each of "
                f"{list(REQUIRED_KEYS)} as one array with a row per transition (a Minari "
                "dataset is read from its directory or as minari:ID instead)."
            )
        data = {k: np.asarray(f[k]) for k in f if not hasattr(f[k], "keys")}
        infos = _read_group(f["infos"]) if "infos" in f else {}
        metadata = _read_group(f["metadata"]) if "metadata" in f else {}
    scalars = [k for k in (*REQUIRED_KEYS, "timeouts", "next_observations") if k in data]
    scalars = [k for k in scalars if data[k].ndim == 0]
    if scalars:
        raise DatasetError(
            f"{path}: {scalars} hold a single value; every key must have one row per transition."
        )
    n = len(data["rewards"])
    if n == 0:
        raise DatasetError(
            f"{path}: the dataset is empty (0 transitions); collect data into it first "
            "(`jaxrl dataset collect`)."
        )
    for key in (*REQUIRED_KEYS, "timeouts", "next_observations"):
        if key in data and data[key].shape[:1] != (n,):
            raise DatasetError(
                f"{path}: {key} has {data[key].shape[0] if data[key].ndim else 0} rows but rewards "
                f"has {n}; every key must have one row per transition."
            )
    terminals = as_flags(data["terminals"], "terminals", path)
    if "timeouts" in data:
        timeouts = as_flags(data["timeouts"], "timeouts", path)
    else:
        timeouts = np.zeros(n, bool)
        if max_episode_steps:
            step = 0
            for i in range(n):
                step += 1
                if terminals[i]:
                    step = 0
                elif step >= max_episode_steps:
                    timeouts[i], step = True, 0
    if "next_observations" in data:
        rows = np.arange(n)
        next_obs = data["next_observations"]
    else:
        rows, next_obs = _qlearning_rows(np.asarray(data["observations"]), terminals, timeouts)
        # A dropped timeout row ends its episode: mark the row before it as the episode's end.
        ends = np.zeros(n, bool)
        before = np.flatnonzero(timeouts) - 1
        ends[before[before >= 0]] = True
        timeouts = ends
    env_id = env_id or metadata.get("env_id") or metadata.get("env")
    refs = None
    if "ref_min_return" in metadata and "ref_max_return" in metadata:
        refs = (float(metadata["ref_min_return"]), float(metadata["ref_max_return"]))
    return Dataset(
        observations=data["observations"][rows],
        actions=data["actions"][rows],
        rewards=as_column(data["rewards"], "rewards", path)[rows],
        next_observations=next_obs,
        terminals=terminals[rows],
        timeouts=timeouts[rows],
        env_id=str(env_id) if env_id else None,
        ref_returns=refs,
        metadata=metadata,
        infos={k: v[rows] if np.shape(v)[:1] == (n,) else v for k, v in infos.items()},
        source=path,
    )


def _write_group(group: Any, values: dict[str, Any]) -> None:
    for key, value in values.items():
        if isinstance(value, dict):
            _write_group(group.create_group(key), value)
        elif value is None:
            continue
        elif isinstance(value, str):
            group[key] = value.encode()
        else:
            group[key] = np.asarray(value)


def save_d4rl(dataset: Dataset, path: str | os.PathLike) -> str:
    """Write ``dataset`` in the D4RL layout, atomically (a temporary file renamed when complete).

    Keys: ``observations``, ``actions``, ``next_observations``, ``rewards``, ``terminals``,
    ``timeouts``, ``infos/`` and ``metadata/`` (``env_id``, ``ref_min_return``,
    ``ref_max_return`` and whatever ``dataset.metadata`` holds, e.g. how it was collected).
    """
    import h5py

    path = os.fspath(path)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    metadata = dict(dataset.metadata)
    if dataset.env_id:
        metadata["env_id"] = dataset.env_id
    if dataset.ref_returns is not None:
        metadata["ref_min_return"], metadata["ref_max_return"] = map(float, dataset.ref_returns)
    fd, tmp = tempfile.mkstemp(suffix=".hdf5.tmp", dir=os.path.dirname(os.path.abspath(path)))
    os.close(fd)
    try:
        with h5py.File(tmp, "w") as f:
            f["observations"] = dataset.observations
            f["actions"] = dataset.actions
            f["next_observations"] = dataset.next_observations
            f["rewards"] = dataset.rewards
            f["terminals"] = dataset.terminals
            f["timeouts"] = dataset.timeouts
            _write_group(f.create_group("infos"), dataset.infos)
            _write_group(f.create_group("metadata"), metadata)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return path
