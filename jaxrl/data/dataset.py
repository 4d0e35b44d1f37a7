"""The offline dataset model: transitions in file order, validated, and turned into a buffer.

A ``Dataset`` keeps rows in file order. ``next_observations`` is either read from the file or
reconstructed the way D4RL's ``qlearning_dataset`` does (the next row's observation, dropping the
last step of every time-limited episode, so nothing bootstraps across an episode boundary).
Episodes end where ``terminals | timeouts``. Actions are stored in the environment's units; they
are mapped to ``[-1, 1]`` (the agents' convention) only when the buffer is built.

```python
ds = load_dataset("data/hopper-medium.hdf5")        # D4RL layout (d4rl_io, h5py)
ds = load_dataset("minari:mujoco/hopper/medium-v0")  # Minari, local only (minari_io)
ds.validate_for_env(obs_dim, action_low, action_high)
buffer_state = ds.buffer(action_low, action_high)    # the shared replay buffer, ready to sample
```
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from jaxrl.buffers import BufferState, buffer_from_arrays
from jaxrl.data.episodes import monte_carlo_returns, next_actions
from jaxrl.data.scores import normalized_score, reference_returns
from jaxrl.errors import DatasetError
from jaxrl.types import Transition

_FLOAT32_MAX = float(np.finfo(np.float32).max)


def as_float32(value: Any, key: str, src: str) -> np.ndarray:
    """``value`` as float32, refusing what the cast would silently mangle.

    Raises:
        DatasetError: a non-numeric or complex dtype (strings, objects, records), or finite
            values beyond float32's range (the cast would turn them into inf).
    """
    array = np.asarray(value)
    if array.dtype.kind not in "biuf":
        raise DatasetError(
            f"{src}: {key} has dtype {array.dtype}, not a real number type; store it as float32 "
            "(e.g. np.asarray(x, np.float32)) when writing the dataset."
        )
    if array.dtype.kind == "f" and array.dtype.itemsize > 4 and array.size:
        with np.errstate(invalid="ignore"):
            big = np.isfinite(array) & (np.abs(array) > _FLOAT32_MAX)
        if big.any():
            rows = big.reshape(len(array), -1) if array.ndim else big.reshape(1, 1)
            row = int(np.flatnonzero(rows.any(axis=1))[0])
            raise DatasetError(
                f"{src}: {key} has values beyond the float32 range (max {_FLOAT32_MAX:.3g}), "
                f"first at row {row}; jaxrl trains in float32. Rescale or drop those transitions."
            )
    return array.astype(np.float32)


def as_column(value: Any, key: str, src: str) -> np.ndarray:
    """A per-transition array (``[N]`` or ``[N, 1]``) as ``[N]``.

    Raises:
        DatasetError: any other shape (a scalar, several values per transition).
    """
    array = np.asarray(value)
    if array.ndim == 1 or (array.ndim == 2 and array.shape[1] == 1):
        return array.reshape(-1)
    raise DatasetError(
        f"{src}: {key} has shape {array.shape}; expected [N] (one value per transition)."
    )


def as_flags(value: Any, key: str, src: str) -> np.ndarray:
    """``terminals`` / ``timeouts`` (bool, or numbers 0 and 1) as ``[N]`` bool.

    Raises:
        DatasetError: another shape or dtype, or values other than 0 and 1 (NaN included).
    """
    array = as_column(value, key, src)
    if array.dtype.kind not in "biuf":
        raise DatasetError(
            f"{src}: {key} has dtype {array.dtype}; store it as bool (or 0/1 numbers)."
        )
    if array.dtype.kind != "b":
        with np.errstate(invalid="ignore"):
            bad = (array != 0) & (array != 1)
        if bad.any():
            rows = np.flatnonzero(bad)
            raise DatasetError(
                f"{src}: {key} must be 0/1 (or bool) flags, but {rows.size} rows hold other "
                f"values (first at row {rows[0]}: {array[rows[0]]!r}). Fix the file's {key}."
            )
    return array.astype(bool)


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
        src = self.source
        self.observations = as_float32(self.observations, "observations", src)
        self.actions = as_float32(self.actions, "actions", src)
        self.rewards = as_float32(as_column(self.rewards, "rewards", src), "rewards", src)
        self.next_observations = as_float32(self.next_observations, "next_observations", src)
        self.terminals = as_flags(self.terminals, "terminals", src)
        self.timeouts = as_flags(self.timeouts, "timeouts", src)
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
        """``T / (max - min episode return)``: IQL's reward scaling, ``T`` the episode length.

        The IQL authors scale D4RL locomotion rewards by ``1000 / (max - min return)``; 1000 is
        those tasks' episode length, so the scaled returns span about one unit per step. ``T`` is
        the longest episode in the data: 1000 on D4RL locomotion (the authors' scale), 200 on
        Pendulum-v1, where the constant 1000 would scale rewards 5x more and sharpen the advantage
        weights ``exp(beta A)`` of IQL and IDQL by the same factor.
        """
        returns = self.episode_returns()
        spread = float(returns.max() - returns.min())
        longest = int(np.diff(self.episode_ends(), prepend=-1).max())
        return longest / spread if spread > 1e-6 else 1.0

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
        return next_actions(self.actions, self.terminals, self.timeouts)[0]

    def transitions(
        self,
        action_low: Any = -1.0,
        action_high: Any = 1.0,
        with_next_action: bool = False,
        mc_return_discount: float | None = None,
        with_source: bool = False,
    ) -> Transition:
        """Rows as a ``Transition`` of numpy arrays with actions mapped to ``[-1, 1]``.

        ``with_next_action`` adds ``next_action`` (ReBRAC); ``mc_return_discount`` adds the
        discounted Monte-Carlo return-to-go of every row (Cal-QL, ``episodes.monte_carlo_returns``);
        ``with_source`` adds ``from_dataset`` = 1 (H2O tells them from online rows).
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
            next_action_mask=next_actions(self.actions, self.terminals, self.timeouts)[1]
            if with_next_action
            else None,
            mc_return=None
            if mc_return_discount is None
            else monte_carlo_returns(
                self.rewards, self.terminals, self.timeouts, mc_return_discount
            ),
            from_dataset=np.ones(len(self.rewards), np.float32) if with_source else None,
        )

    def buffer(self, *args: Any, **kwargs: Any) -> BufferState:
        """``transitions(*args, **kwargs)`` as a full replay-buffer state on the device."""
        return buffer_from_arrays(self.transitions(*args, **kwargs))

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
