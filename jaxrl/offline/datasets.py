"""Offline datasets: D4RL-format HDF5 files and Minari datasets, read from disk and validated.

```python
ds = load_dataset("data/hopper-medium.hdf5")        # D4RL layout (h5py, no d4rl package)
ds = load_dataset("minari:mujoco/hopper/medium-v0")  # Minari, local only (no download)
ds.validate_for_env(obs_dim, action_low, action_high)
buffer_state = ds.buffer(action_low, action_high)    # the shared replay buffer, ready to sample
```

A ``Dataset`` keeps rows in file order. ``next_observations`` is either read from the file or
reconstructed the way D4RL's ``qlearning_dataset`` does (the next row's observation, dropping the
last step of every time-limited episode, so nothing bootstraps across an episode boundary).
Episodes end where ``terminals | timeouts``. Actions are stored in the environment's units; they
are mapped to ``[-1, 1]`` (the agents' convention) only when the buffer is built.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import tempfile
from typing import Any

import numpy as np

from jaxrl.buffers import BufferState, buffer_from_arrays
from jaxrl.episodes import monte_carlo_returns
from jaxrl.types import Transition

REQUIRED_KEYS = ("observations", "actions", "rewards", "terminals")

# D4RL's reference returns (d4rl/infos.py REF_MIN_SCORE / REF_MAX_SCORE: a random policy and the
# SAC expert of each locomotion task); normalized score = 100 * (R - min) / (max - min).
D4RL_REF_RETURNS: dict[str, tuple[float, float]] = {
    "halfcheetah": (-280.178953, 12135.0),
    "hopper": (-20.272305, 3234.3),
    "walker2d": (1.629008, 4592.3),
    "ant": (-325.6, 3879.7),
}


class DatasetError(ValueError):
    """A dataset cannot be used; the message names the problem and how to fix it."""


def d4rl_family(env_id: str | None) -> str | None:
    """The D4RL task family of a Gymnasium or D4RL id (``'Hopper-v5'`` -> ``'hopper'``), or None."""
    if not env_id:
        return None
    name = env_id.split("/")[-1].split("?")[0].lower()
    name = re.sub(r"^(brax:|jax:)", "", name)
    head = re.split(r"[-_]", name)[0]
    return head if head in D4RL_REF_RETURNS else None


def reference_returns(env_id: str | None) -> tuple[float, float] | None:
    """D4RL ``(random, expert)`` reference returns for ``env_id``'s family, or None."""
    family = d4rl_family(env_id)
    return D4RL_REF_RETURNS[family] if family else None


def normalized_score(ret: float, ref: tuple[float, float] | None) -> float | None:
    """D4RL normalized score ``100 * (ret - min) / (max - min)``; None without references."""
    if ref is None:
        return None
    lo, hi = ref
    return 100.0 * (float(ret) - lo) / (hi - lo)


@dataclasses.dataclass
class Dataset:
    """Transitions of an offline dataset, in file order (episodes are contiguous).

    Attributes:
        observations: ``[N, obs_dim]`` float32.
        actions: ``[N, act_dim]`` float32, in the environment's units.
        rewards: ``[N]`` float32.
        next_observations: ``[N, obs_dim]`` float32, the true next observations.
        terminals: ``[N]`` bool, the episode terminated (no bootstrapping).
        timeouts: ``[N]`` bool, the episode was cut by a time limit or the end of collection.
        env_id: the environment the data comes from (from metadata, or given), or None.
        ref_returns: ``(min, max)`` reference returns for normalized scores, or None.
        metadata: the file's ``metadata/`` group (and Minari metadata), kept as read.
        infos: the file's ``infos/`` group, row-aligned arrays, kept as read.
        source: where it was read from.
    """

    observations: np.ndarray
    actions: np.ndarray
    rewards: np.ndarray
    next_observations: np.ndarray
    terminals: np.ndarray
    timeouts: np.ndarray
    env_id: str | None = None
    ref_returns: tuple[float, float] | None = None
    metadata: dict[str, Any] = dataclasses.field(default_factory=dict)
    infos: dict[str, Any] = dataclasses.field(default_factory=dict)
    source: str = "<memory>"

    def __post_init__(self) -> None:
        self.observations = np.asarray(self.observations, np.float32)
        self.actions = np.asarray(self.actions, np.float32)
        self.rewards = np.asarray(self.rewards, np.float32).reshape(-1)
        self.next_observations = np.asarray(self.next_observations, np.float32)
        self.terminals = np.asarray(self.terminals).reshape(-1).astype(bool)
        self.timeouts = np.asarray(self.timeouts).reshape(-1).astype(bool)
        self._check()

    def __len__(self) -> int:
        return int(self.rewards.shape[0])

    # ------------------------------------------------------------------------------- validation

    def _check(self) -> None:
        src = self.source
        arrays = {
            "observations": self.observations,
            "actions": self.actions,
            "rewards": self.rewards,
            "next_observations": self.next_observations,
            "terminals": self.terminals,
            "timeouts": self.timeouts,
        }
        n = len(self.rewards)
        if n == 0:
            raise DatasetError(f"{src}: the dataset is empty (0 transitions).")
        lengths = {k: v.shape[0] for k, v in arrays.items()}
        if len(set(lengths.values())) != 1:
            raise DatasetError(
                f"{src}: arrays have different lengths {lengths}; every key must have one row per "
                "transition. Re-export the dataset with aligned arrays."
            )
        for key in ("observations", "actions", "next_observations"):
            if arrays[key].ndim != 2:
                raise DatasetError(
                    f"{src}: {key} has shape {arrays[key].shape}; expected [N, dim] (flat vectors)."
                )
        if self.observations.shape != self.next_observations.shape:
            raise DatasetError(
                f"{src}: observations {self.observations.shape} and next_observations "
                f"{self.next_observations.shape} differ in shape."
            )
        for key in ("observations", "actions", "rewards", "next_observations"):
            bad = ~np.isfinite(arrays[key])
            if bad.any():
                rows = np.flatnonzero(bad.reshape(n, -1).any(axis=1))
                raise DatasetError(
                    f"{src}: {key} has {rows.size} rows with NaN or inf (first at row "
                    f"{rows[0]}). Clean the data (drop those transitions) before training."
                )

    def validate_for_env(
        self, obs_dim: int, action_low: np.ndarray, action_high: np.ndarray, env_id: str = "env"
    ) -> None:
        """Raise ``DatasetError`` unless observations and actions fit the environment.

        Args:
            obs_dim: the environment's flat observation size.
            action_low: lower action bounds (environment units).
            action_high: upper action bounds.
            env_id: name used in messages.
        """
        if self.obs_dim != obs_dim:
            raise DatasetError(
                f"{self.source}: observations have {self.obs_dim} dimensions but {env_id} has "
                f"{obs_dim}. Pass the --env the data was collected on (dataset env: "
                f"{self.env_id or 'unknown'})."
            )
        low, high = np.asarray(action_low, np.float32), np.asarray(action_high, np.float32)
        if self.action_dim != low.shape[-1]:
            raise DatasetError(
                f"{self.source}: actions have {self.action_dim} dimensions but {env_id} has "
                f"{low.shape[-1]}. Pass the --env the data was collected on (dataset env: "
                f"{self.env_id or 'unknown'})."
            )
        tol = 1e-3 * (high - low)
        outside = (self.actions < low - tol) | (self.actions > high + tol)
        if outside.any():
            raise DatasetError(
                f"{self.source}: {int(outside.any(axis=1).sum())} actions lie outside {env_id}'s "
                f"bounds [{low.min()}, {high.max()}] (data range [{self.actions.min():.3g}, "
                f"{self.actions.max():.3g}]). Datasets store actions in the env's units; rescale "
                "or clip them, or check --env."
            )

    # ------------------------------------------------------------------------------- statistics

    @property
    def obs_dim(self) -> int:
        """Observation size."""
        return int(self.observations.shape[1])

    @property
    def action_dim(self) -> int:
        """Action size."""
        return int(self.actions.shape[1])

    def episode_ends(self) -> np.ndarray:
        """Indices of the last row of every episode (the final, unfinished one included)."""
        ends = np.flatnonzero(self.terminals | self.timeouts)
        if ends.size == 0 or ends[-1] != len(self) - 1:
            ends = np.append(ends, len(self) - 1)
        return ends

    def episode_returns(self) -> np.ndarray:
        """Undiscounted return of every episode (the last, possibly partial one included)."""
        ends = self.episode_ends()
        csum = np.concatenate([[0.0], np.cumsum(self.rewards, dtype=np.float64)])
        starts = np.concatenate([[0], ends[:-1] + 1])
        return csum[ends + 1] - csum[starts]

    def reward_scale_return_range(self) -> float:
        """``1000 / (max - min episode return)``: IQL's reward scaling for locomotion."""
        returns = self.episode_returns()
        spread = float(returns.max() - returns.min())
        return 1000.0 / spread if spread > 1e-6 else 1.0

    def obs_stats(self, eps: float = 1e-3) -> tuple[np.ndarray, np.ndarray]:
        """Mean and standard deviation (+eps) of the observations (TD3+BC normalization)."""
        return self.observations.mean(0), self.observations.std(0) + eps

    def normalized_score(self, ret: float) -> float | None:
        """Normalized score of ``ret`` with this dataset's references (D4RL constants fallback)."""
        return normalized_score(ret, self.ref_returns or reference_returns(self.env_id))

    def info(self) -> dict[str, Any]:
        """Size, episodes, return statistics and reference scores (``jaxrl dataset info``)."""
        returns = self.episode_returns()
        refs = self.ref_returns or reference_returns(self.env_id)
        return {
            "source": self.source,
            "env_id": self.env_id,
            "transitions": len(self),
            "episodes": int(returns.size),
            "terminals": int(self.terminals.sum()),
            "timeouts": int(self.timeouts.sum()),
            "obs_dim": self.obs_dim,
            "action_dim": self.action_dim,
            "return_mean": float(returns.mean()),
            "return_std": float(returns.std()),
            "return_min": float(returns.min()),
            "return_max": float(returns.max()),
            "ref_min_return": None if refs is None else refs[0],
            "ref_max_return": None if refs is None else refs[1],
            "normalized_score_mean": normalized_score(returns.mean(), refs),
            "metadata": {k: v for k, v in self.metadata.items() if np.ndim(v) == 0},
        }

    # ----------------------------------------------------------------------------- conversions

    def next_actions(self) -> np.ndarray:
        """The dataset action of the next row inside the same episode (zeros at episode ends)."""
        nxt = np.zeros_like(self.actions)
        nxt[:-1] = self.actions[1:]
        nxt[self.terminals | self.timeouts] = 0.0
        nxt[-1] = 0.0
        return nxt

    def transitions(
        self,
        action_low: Any = -1.0,
        action_high: Any = 1.0,
        with_next_action: bool = False,
        mc_return_discount: float | None = None,
    ) -> Transition:
        """Rows as a ``Transition`` of numpy arrays with actions mapped to ``[-1, 1]``.

        ``with_next_action`` adds ``next_action`` (ReBRAC); ``mc_return_discount`` adds the
        discounted Monte-Carlo return-to-go of every row (Cal-QL, ``episodes.monte_carlo_returns``).
        """
        low = np.broadcast_to(np.asarray(action_low, np.float32), (self.action_dim,))
        high = np.broadcast_to(np.asarray(action_high, np.float32), (self.action_dim,))

        def scale(a: np.ndarray) -> np.ndarray:
            return np.clip(2.0 * (a - low) / (high - low) - 1.0, -1.0, 1.0).astype(np.float32)

        return Transition(
            obs=self.observations,
            action=scale(self.actions),
            reward=self.rewards,
            next_obs=self.next_observations,
            terminal=self.terminals.astype(np.float32),
            next_action=scale(self.next_actions()) if with_next_action else None,
            mc_return=None
            if mc_return_discount is None
            else monte_carlo_returns(
                self.rewards, self.terminals, self.timeouts, mc_return_discount
            ),
        )

    def buffer(
        self,
        action_low: Any = -1.0,
        action_high: Any = 1.0,
        with_next_action: bool = False,
        mc_return_discount: float | None = None,
    ) -> BufferState:
        """A full replay-buffer state on the device (sample it with ``buffer_sample``)."""
        return buffer_from_arrays(
            self.transitions(action_low, action_high, with_next_action, mc_return_discount)
        )

    @classmethod
    def concatenate(cls, parts: list[Dataset], **overrides: Any) -> Dataset:
        """Join datasets end to end (e.g. D4RL's medium-expert = medium + expert)."""
        last = [p.timeouts.copy() for p in parts]
        for t, p in zip(last, parts, strict=True):
            t[-1] = t[-1] or not p.terminals[-1]  # an episode never runs into the next part
        fields = {
            name: np.concatenate([getattr(p, name) for p in parts])
            for name in ("observations", "actions", "rewards", "next_observations", "terminals")
        }
        kwargs = {
            **fields,
            "timeouts": np.concatenate(last),
            "env_id": parts[0].env_id,
            "ref_returns": parts[0].ref_returns,
            "metadata": dict(parts[0].metadata),
            "source": "+".join(p.source for p in parts),
        }
        kwargs.update(overrides)
        return cls(**kwargs)


# ------------------------------------------------------------------------------------ D4RL HDF5


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
        data = {k: np.asarray(f[k]) for k in f if not hasattr(f[k], "keys")}
        infos = _read_group(f["infos"]) if "infos" in f else {}
        metadata = _read_group(f["metadata"]) if "metadata" in f else {}
    n = len(data["rewards"])
    for key in (*REQUIRED_KEYS, "timeouts", "next_observations"):
        if key in data and data[key].shape[:1] != (n,):
            raise DatasetError(
                f"{path}: {key} has {data[key].shape[0] if data[key].ndim else 0} rows but rewards "
                f"has {n}; every key must have one row per transition."
            )
    terminals = data["terminals"].reshape(-1).astype(bool)
    if "timeouts" in data:
        timeouts = data["timeouts"].reshape(-1).astype(bool)
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
        rewards=data["rewards"].reshape(-1)[rows],
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


# ---------------------------------------------------------------------------------------- Minari


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
    ds = MinariDataset(path)
    obs, acts, rews, nobs, terms, truncs = [], [], [], [], [], []
    for ep in ds.iterate_episodes():
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
