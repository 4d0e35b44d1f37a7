"""Minari datasets read from local disk (never downloaded)."""

from __future__ import annotations

import json
import os

import numpy as np

from jaxrl.data.dataset import Dataset, DatasetError


def _minari_data_path(spec: str) -> str:
    """The ``.../<id>/data`` directory of a Minari dataset given by id or by path."""
    if os.path.isdir(spec):
        for cand in (spec, os.path.join(spec, "data")):
            if os.path.exists(os.path.join(cand, "metadata.json")):
                return cand
        raise DatasetError(
            f"{spec} is a directory but not a Minari dataset (no metadata.json in it or in "
            f"{os.path.join(spec, 'data')})."
        )
    if not spec.strip("/"):
        raise DatasetError(
            "minari: needs a dataset id, e.g. minari:mujoco/hopper/medium-v0 (a dataset under "
            "MINARI_DATASETS_PATH), or pass the dataset directory."
        )
    root = os.environ.get("MINARI_DATASETS_PATH") or os.path.join(
        os.path.expanduser("~"), ".minari", "datasets"
    )
    path = os.path.join(root, spec, "data")
    if not os.path.exists(os.path.join(path, "metadata.json")):
        local = []
        if os.path.isdir(root):
            for dirpath, _, files in os.walk(root):
                if "metadata.json" in files and os.path.basename(dirpath) == "data":
                    local.append(os.path.relpath(os.path.dirname(dirpath), root))
        raise DatasetError(
            f"Minari dataset {spec!r} is not on local disk under {root} (set "
            "MINARI_DATASETS_PATH to where it is, or pass the dataset directory). jaxrl never "
            f"downloads. Local datasets: {sorted(local) or 'none'}."
        )
    return path


def load_minari(spec: str, env_id: str | None = None) -> Dataset:
    """Read a Minari dataset by id (``MINARI_DATASETS_PATH``) or by directory, without download.

    Episodes become contiguous rows: ``observations[:-1]`` / ``observations[1:]`` per episode,
    ``terminations`` as terminals and ``truncations`` as timeouts. Reference scores and the env
    id come from Minari's metadata.
    """
    try:
        from minari.dataset.minari_dataset import MinariDataset
    except ImportError:  # pragma: no cover - minari is a dependency
        raise DatasetError("Reading Minari datasets needs the `minari` package.") from None
    path = _minari_data_path(spec)
    try:
        ds = MinariDataset(path)
        episodes = list(ds.iterate_episodes())
    except DatasetError:
        raise
    except Exception as err:  # minari asserts, KeyErrors, JSON and HDF5 errors: a broken copy
        raise DatasetError(
            f"{path} is not a readable Minari dataset ({type(err).__name__}: {err}); the copy "
            "is incomplete or corrupt (it needs metadata.json and its episode data). Copy or "
            "create it again."
        ) from None
    obs, acts, rews, nobs, terms, truncs = [], [], [], [], [], []
    for ep in episodes:
        o = ep.observations
        if isinstance(o, dict):
            raise DatasetError(
                f"Minari dataset {spec!r} has dict observations ({sorted(o)}); jaxrl needs flat "
                "vectors. Flatten them when collecting (gymnasium.wrappers.FlattenObservation)."
            )
        o = np.asarray(o, np.float32)
        obs.append(o[:-1])
        nobs.append(o[1:])
        acts.append(np.asarray(ep.actions, np.float32).reshape(len(ep.rewards), -1))
        rews.append(np.asarray(ep.rewards, np.float32))
        terms.append(np.asarray(ep.terminations, bool))
        tr = np.asarray(ep.truncations, bool).copy()
        tr[-1] = tr[-1] or not terms[-1][-1]
        truncs.append(tr)
    if not obs:
        raise DatasetError(f"Minari dataset {spec!r} has no episodes.")
    meta = dict(ds.storage.metadata)
    if env_id is None and meta.get("env_spec"):
        env_spec = meta["env_spec"]
        env_id = json.loads(env_spec)["id"] if isinstance(env_spec, str) else None
    refs = None
    if meta.get("ref_min_score") is not None and meta.get("ref_max_score") is not None:
        refs = (float(meta["ref_min_score"]), float(meta["ref_max_score"]))
    return Dataset(
        observations=np.concatenate(obs),
        actions=np.concatenate(acts),
        rewards=np.concatenate(rews),
        next_observations=np.concatenate(nobs),
        terminals=np.concatenate(terms),
        timeouts=np.concatenate(truncs),
        env_id=env_id,
        ref_returns=refs,
        metadata={k: v for k, v in meta.items() if np.ndim(v) == 0},
        source=f"minari:{spec}",
    )
