"""Measure d3rlpy's offline-RL update speed (BC, TD3+BC, CQL, IQL, ReBRAC, PRDC) on D4RL HDF5.

Run inside the peer virtualenv created by ``setup_peers.sh`` (``make peers``)::

    .venv-peers/bin/python benchmarks/peers/d3rlpy_offline.py \
        --data halfcheetah.hdf5 --agents bc,iql --seconds 5

``benchmarks/offline.py`` runs this script once per agent and passes the jaxrl agent's config
(``--configs``, JSON ``{agent: {jaxrl field: value}}``); without it the paper defaults below are
used. The jaxrl fields are translated to d3rlpy's config as closely as d3rlpy allows, and every
setting that d3rlpy cannot match is listed in the output (``differences``).

The dataset becomes an ``MDPDataset`` (episodes split at ``terminals | timeouts``). Setup is not
timed: building the algorithm, fitting the scalers, sampling a pool of minibatches and
``--warmup`` updates. Two rates are then measured, each over at least ``--seconds`` of wall time:

* ``update``: ``algo.update(batch)`` on minibatches sampled in advance (the learner alone);
* ``fit``: ``dataset.sample_transition_batch`` + ``algo.update`` per step, which is what
  ``algo.fit`` does each step (d3rlpy samples minibatches in Python).

torch runs on the CPU with ``--threads`` intra-op threads (default: the cores this process may
use). d3rlpy's ``compile_graph`` only takes effect on CUDA devices, so there is nothing to enable
here. One JSON line per agent is printed to stdout.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from typing import Any

import d3rlpy
import h5py
import numpy as np
import structlog
import torch
from d3rlpy.algos.utility import build_scalers_with_transition_picker
from d3rlpy.models import VectorEncoderFactory
from d3rlpy.optimizers import AdamFactory
from d3rlpy.optimizers.lr_schedulers import CosineAnnealingLRFactory
from d3rlpy.preprocessing import ReturnBasedRewardScaler, StandardObservationScaler

AGENTS = ("bc", "td3-bc", "cql", "iql", "rebrac", "prdc")
STAND_INS = ("sac",)  # online agents on the same data, to validate the harness

# Paper defaults in jaxrl's field names, used when no --configs are given (standalone runs).
_COMMON = {"discount": 0.99, "tau": 0.005, "num_qs": 2, "batch_size": 256}
PAPER_DEFAULTS: dict[str, dict[str, Any]] = {
    "bc": {"actor_lr": 3e-4, "hidden_dims": [256, 256], "batch_size": 256},
    "td3-bc": {
        **_COMMON,
        "actor_lr": 3e-4,
        "critic_lr": 3e-4,
        "hidden_dims": [256, 256],
        "policy_noise": 0.2,
        "noise_clip": 0.5,
        "policy_delay": 2,
        "alpha": 2.5,
        "normalize_observations": True,
    },
    "cql": {
        **_COMMON,
        "actor_lr": 1e-4,
        "critic_lr": 3e-4,
        "temp_lr": 1e-4,
        "hidden_dims": [256, 256, 256],
        "cql_alpha": 5.0,
        "cql_n_actions": 10,
        "lagrange": False,
    },
    "iql": {
        **_COMMON,
        "actor_lr": 3e-4,
        "critic_lr": 3e-4,
        "value_lr": 3e-4,
        "hidden_dims": [256, 256],
        "expectile": 0.7,
        "temperature": 3.0,
        "max_weight": 100.0,
        "actor_lr_schedule": "cosine",
        "max_steps": 1_000_000,
        "reward_normalization": "return_range",
    },
    "rebrac": {
        **_COMMON,
        "actor_lr": 1e-3,
        "critic_lr": 1e-3,
        "hidden_dims": [256, 256, 256],
        "critic_layer_norm": True,
        "policy_noise": 0.2,
        "noise_clip": 0.5,
        "policy_delay": 2,
        "actor_bc_coef": 0.01,
        "critic_bc_coef": 0.001,
        "batch_size": 1024,
    },
    "prdc": {
        **_COMMON,
        "actor_lr": 3e-4,
        "critic_lr": 3e-4,
        "hidden_dims": [256, 256],
        "policy_noise": 0.2,
        "noise_clip": 0.5,
        "policy_delay": 2,
        "alpha": 2.5,
        "beta": 2.0,
        "normalize_observations": True,
    },
    "sac": {
        **_COMMON,
        "actor_lr": 3e-4,
        "critic_lr": 3e-4,
        "temp_lr": 3e-4,
        "hidden_dims": [256, 256],
    },
}

# jaxrl fields that play no part in an offline gradient step (online fine-tuning, evaluation).
_NOT_IN_UPDATE = {
    "utd_ratio",
    "buffer_size",
    "learning_starts",
    "exploration_noise",
}


class _Fields:
    """Read jaxrl config fields (several spellings allowed) and remember which were used."""

    def __init__(self, cfg: dict[str, Any]) -> None:
        self.cfg = cfg
        self.used: set[str] = set()
        self.differences: list[str] = []

    def get(self, *names: str, default: Any = None) -> Any:
        for n in names:
            if n in self.cfg:
                self.used.add(n)
                return self.cfg[n]
        return default

    def expect(self, name: str, supported: Any, what: str) -> None:
        """Record a difference when field ``name`` is set and differs from d3rlpy's fixed value."""
        if name in self.cfg:
            self.used.add(name)
            value = self.cfg[name]
            if value != supported:
                self.differences.append(f"{name}={value!r} (d3rlpy: {what})")

    def unmapped(self) -> list[str]:
        rest = sorted(set(self.cfg) - self.used - _NOT_IN_UPDATE)
        return [f"{k}={self.cfg[k]!r} (no d3rlpy counterpart)" for k in rest]


def _encoder(hidden: Any, layer_norm: bool = False) -> Any:
    return VectorEncoderFactory(hidden_units=[int(h) for h in hidden], use_layer_norm=layer_norm)


def _common(f: _Fields) -> dict[str, Any]:
    """Settings shared by the actor-critic agents: sizes, discount, tau, scalers."""
    hidden = f.get("hidden_dims", default=[256, 256])
    actor_hidden = f.get("actor_hidden_dims", default=hidden)
    critic_hidden = f.get("critic_hidden_dims", default=hidden)
    kw: dict[str, Any] = {
        "batch_size": int(f.get("batch_size", default=256)),
        "gamma": float(f.get("discount", "gamma", default=0.99)),
        "tau": float(f.get("tau", default=0.005)),
        "actor_encoder_factory": _encoder(
            actor_hidden, bool(f.get("actor_layer_norm", default=False))
        ),
        "critic_encoder_factory": _encoder(
            critic_hidden, bool(f.get("critic_layer_norm", default=False))
        ),
    }
    num_qs = f.get("num_qs", default=2)
    kw["n_critics"] = int(num_qs)
    f.expect("network_init", "torch", "PyTorch's nn.Linear default initialization")
    if f.get("normalize_observations", default=False):
        kw["observation_scaler"] = StandardObservationScaler()
    reward_norm = f.get("reward_normalization", default="none")
    if reward_norm == "return_range":
        kw["reward_scaler"] = ReturnBasedRewardScaler(multiplier=1000.0)
    elif reward_norm not in ("none", None):
        f.differences.append(f"reward_normalization={reward_norm!r} (d3rlpy: not matched)")
    return kw


def make_config(name: str, cfg: dict[str, Any]) -> tuple[Any, list[str]]:
    """A d3rlpy config matching the jaxrl config ``cfg`` of agent ``name``, and the differences."""
    f = _Fields(cfg)
    if name == "bc":
        # jaxrl's BC is the deterministic (MSE) variant.
        config = d3rlpy.algos.BCConfig(
            learning_rate=float(f.get("actor_lr", "lr", default=3e-4)),
            batch_size=int(f.get("batch_size", default=256)),
            policy_type="deterministic",
            encoder_factory=_encoder(
                f.get("hidden_dims", default=[256, 256]), f.get("actor_layer_norm", default=False)
            ),
            observation_scaler=(
                StandardObservationScaler()
                if f.get("normalize_observations", default=False)
                else None
            ),
        )
        f.used |= {"reward_normalization", "discount", "tau"}  # BC has no rewards or critic
    elif name in ("td3-bc", "rebrac"):
        kw = _common(f)
        kw.update(
            actor_learning_rate=float(f.get("actor_lr", default=3e-4)),
            critic_learning_rate=float(f.get("critic_lr", default=3e-4)),
            target_smoothing_sigma=float(f.get("policy_noise", default=0.2)),
            target_smoothing_clip=float(f.get("noise_clip", default=0.5)),
            update_actor_interval=int(f.get("policy_delay", default=2)),
        )
        f.expect("normalize_q", True, "lambda = alpha / mean|Q|")
        if name == "td3-bc":
            kw["alpha"] = float(f.get("alpha", default=2.5))
            f.expect("actor_q", "first", "first critic in the actor loss")
            f.expect("actor_bc_coef", 1.0, "BC weight 1")
            f.expect("bc_reduction", "mean", "mean squared error")
            f.expect("critic_bc_coef", 0.0, "no critic penalty")
            config = d3rlpy.algos.TD3PlusBCConfig(**kw)
        else:
            kw["actor_beta"] = float(f.get("actor_bc_coef", default=0.01))
            kw["critic_beta"] = float(f.get("critic_bc_coef", default=0.001))
            f.expect("alpha", 1.0, "lambda = 1 / mean|Q|")
            f.expect("actor_q", "min", "min over critics in the actor loss")
            f.expect("bc_reduction", "sum", "sum over action dims")
            config = d3rlpy.algos.ReBRACConfig(**kw)
    elif name == "prdc":
        kw = _common(f)
        kw.update(
            actor_learning_rate=float(f.get("actor_lr", default=3e-4)),
            critic_learning_rate=float(f.get("critic_lr", default=3e-4)),
            target_smoothing_sigma=float(f.get("policy_noise", default=0.2)),
            target_smoothing_clip=float(f.get("noise_clip", default=0.5)),
            update_actor_interval=int(f.get("policy_delay", default=2)),
            alpha=float(f.get("alpha", default=2.5)),
            beta=float(f.get("beta", default=2.0)),
        )
        # How jaxrl's exact search walks the rows; d3rlpy's scikit-learn search is exact too.
        f.used.add("chunk_size")
        config = d3rlpy.algos.PRDCConfig(**kw)
    elif name == "cql":
        kw = _common(f)
        lagrange = bool(f.get("lagrange", default=False))
        kw.update(
            actor_learning_rate=float(f.get("actor_lr", default=1e-4)),
            critic_learning_rate=float(f.get("critic_lr", default=3e-4)),
            temp_learning_rate=float(f.get("temp_lr", default=1e-4)),
            initial_temperature=float(f.get("init_temperature", default=1.0)),
            conservative_weight=float(f.get("cql_alpha", default=5.0)),
            n_action_samples=int(f.get("cql_n_actions", default=10)),
            # d3rlpy scales the conservative loss by exp(log_alpha); a zero learning rate keeps
            # alpha = initial_alpha = 1, i.e. the fixed weight `conservative_weight` (no Lagrange).
            alpha_learning_rate=float(f.get("alpha_prime_lr", default=3e-4)) if lagrange else 0.0,
            initial_alpha=float(f.get("init_alpha_prime", default=1.0)) if lagrange else 1.0,
            alpha_threshold=float(f.get("target_action_gap", default=10.0)),
            soft_q_backup=bool(f.get("backup_entropy", default=False)),
        )
        if not lagrange:
            f.used.update({"target_action_gap", "init_alpha_prime", "alpha_prime_lr"})
        if not kw["soft_q_backup"]:
            f.differences.append(
                "TD target: d3rlpy evaluates the policy's mean action at s' "
                "(jaxrl samples one, as the CQL authors' code)"
            )
        f.expect("target_entropy", None, "-action_dim")
        f.expect("cql_temperature", 1.0, "logsumexp temperature 1")
        f.expect("bc_steps", 0, "no BC warm-start")
        f.expect("max_q_backup", False, "max_q_backup off")
        config = d3rlpy.algos.CQLConfig(**kw)
    elif name == "iql":
        kw = _common(f)
        actor_lr = float(f.get("actor_lr", default=3e-4))
        critic_lr = float(f.get("critic_lr", default=3e-4))
        value_lr = f.get("value_lr", default=critic_lr)
        if value_lr != critic_lr:
            f.differences.append(f"value_lr={value_lr!r} (d3rlpy: critic_lr for Q and V)")
        # IQL decays the actor's learning rate with a cosine over the whole run.
        schedule = f.get("actor_lr_schedule", default="constant")
        decay = int(f.get("max_steps") or 1_000_000)  # None: the run's budget; 1M offline
        if schedule == "cosine":
            kw["actor_optim_factory"] = AdamFactory(
                lr_scheduler_factory=CosineAnnealingLRFactory(T_max=decay)
            )
        elif schedule != "constant":
            f.differences.append(f"actor_lr_schedule={schedule!r} (d3rlpy: cosine or constant)")
        kw.update(
            actor_learning_rate=actor_lr,
            critic_learning_rate=critic_lr,
            value_encoder_factory=_encoder(f.get("hidden_dims", default=[256, 256])),
            expectile=float(f.get("expectile", default=0.7)),
            weight_temp=float(f.get("temperature", "beta", "weight_temp", default=3.0)),
            max_weight=float(f.get("max_weight", "exp_adv_max", default=100.0)),
        )
        config = d3rlpy.algos.IQLConfig(**kw)
    elif name == "sac":
        kw = _common(f)
        kw.update(
            actor_learning_rate=float(f.get("actor_lr", default=3e-4)),
            critic_learning_rate=float(f.get("critic_lr", default=3e-4)),
            temp_learning_rate=float(f.get("temp_lr", default=3e-4)),
            initial_temperature=float(f.get("init_temperature", default=1.0)),
        )
        f.expect("target_entropy", None, "-action_dim")
        f.expect("backup_entropy", True, "entropy term in the TD target")
        f.expect("num_min_qs", None, "min over all critics")
        f.expect("policy_q", "min", "min over critics in the actor loss")
        config = d3rlpy.algos.SACConfig(**kw)
    else:
        raise ValueError(f"unknown agent {name!r}; choose from {', '.join(AGENTS + STAND_INS)}")
    return config, f.differences + f.unmapped()


def load_dataset(path: str) -> d3rlpy.dataset.MDPDataset:
    """A D4RL-layout HDF5 file as an MDPDataset (episodes end at terminals | timeouts)."""
    with h5py.File(path, "r") as h:
        obs = np.asarray(h["observations"], np.float32)
        act = np.clip(np.asarray(h["actions"], np.float32), -1.0, 1.0)
        rew = np.asarray(h["rewards"], np.float32).reshape(-1)
        term = np.asarray(h["terminals"]).reshape(-1).astype(np.float32)
        timeout = np.asarray(h["timeouts"]).reshape(-1).astype(np.float32)
    timeout[-1] = 1.0 - term[-1]  # the file's last episode ends with the file
    return d3rlpy.dataset.MDPDataset(
        observations=obs,
        actions=act,
        rewards=rew,
        terminals=term,
        timeouts=timeout,
        action_space=d3rlpy.ActionSpace.CONTINUOUS,
    )


class TorchNeighbours:
    """An exact nearest-row search in torch, in place of PRDC's scikit-learn index.

    The two methods d3rlpy's ``PRDCImpl`` calls: ``kneighbors(keys, n_neighbors=1,
    return_distance=False)`` and the ``_fit_X`` it reads the actions from. scikit-learn's
    ``algorithm="auto"`` searches by brute force in float64 when the key has more than 15
    features (halfcheetah: 23): inside d3rlpy's update on a 100k-row halfcheetah file, 0.54 s
    per 256-row query on one core, mostly in ``argpartition`` (cProfile). This is the same exact
    search as one float32 matmul per chunk of rows, about 50 ms there. The neighbours are the
    same up to float rounding of near ties.
    """

    def __init__(self, chunk: int = 4096):
        self.chunk = chunk

    def fit(self, x: np.ndarray) -> TorchNeighbours:
        """Hold the rows (``_fit_X``, as scikit-learn names them) and their squared norms."""
        self._fit_X = np.asarray(x)
        rows = torch.as_tensor(self._fit_X, dtype=torch.float32)
        self._rows_t, self._sq = rows.T.contiguous(), (rows**2).sum(1)
        return self

    def kneighbors(self, keys: Any, n_neighbors: int = 1, return_distance: bool = False) -> Any:
        """Index of each key's nearest row, shape ``[n, 1]`` (``n_neighbors`` must be 1)."""
        if n_neighbors != 1 or return_distance:
            raise ValueError("TorchNeighbours answers n_neighbors=1 without distances only")
        q = torch.as_tensor(np.asarray(keys), dtype=torch.float32)
        best = torch.full((q.shape[0],), float("inf"))
        arg = torch.zeros(q.shape[0], dtype=torch.long)
        for start in range(0, self._sq.shape[0], self.chunk):
            end = start + self.chunk
            # ||row||^2 - 2 q.row: ||q||^2 is the same for every row of a query.
            d = torch.addmm(self._sq[None, start:end], q, self._rows_t[:, start:end], alpha=-2.0)
            val, idx = d.min(1)
            better = val < best
            best = torch.where(better, val, best)
            arg = torch.where(better, idx + start, arg)
        return arg[:, None].numpy()


def fit_neighbours(algo: Any, dataset: Any, index: str = "sklearn") -> None:
    """Build PRDC's nearest-neighbour index, as ``d3rlpy.algos.PRDC.fit`` does (others: no-op).

    d3rlpy's PRDC fits its scikit-learn index in ``fit`` only; ``update`` and ``fitter`` (which
    these scripts call) use it as it is. This builds it from the same rows ``fit`` uses (each
    episode's ``transition_count`` first rows, observations through the fitted observation
    scaler, times ``beta``, next to the actions), vectorized instead of row by row. Call it
    after ``build_scalers_with_transition_picker`` and ``build_with_dataset``. ``index``
    ``"torch"`` swaps in ``TorchNeighbours`` (the same exact search, faster on wide keys).
    """
    if not isinstance(algo, d3rlpy.algos.PRDC):
        return
    if index == "torch":
        algo.impl._nbsr = TorchNeighbours()
    eps = dataset.episodes
    obs = np.concatenate([e.observations[: e.transition_count] for e in eps]).reshape(
        -1, int(np.prod(eps[0].observations.shape[1:]))
    )
    act = np.concatenate([e.actions[: e.transition_count] for e in eps]).reshape(obs.shape[0], -1)
    if algo.observation_scaler is not None and algo.observation_scaler.built:
        obs = algo.observation_scaler.transform_numpy(obs)
    if algo.action_scaler is not None and algo.action_scaler.built:
        act = algo.action_scaler.transform_numpy(act)
    algo.impl._nbsr.fit(np.concatenate([obs * algo.config.beta, act], axis=1))


def _rate(step: Any, seconds: float) -> tuple[float, int, float]:
    """Call ``step(i)`` until ``seconds`` have passed; (steps/s, steps, elapsed seconds)."""
    n = 0
    t0 = time.perf_counter()
    while True:
        step(n)
        n += 1
        elapsed = time.perf_counter() - t0
        if elapsed >= seconds:
            return n / elapsed, n, elapsed


def measure(name: str, cfg: dict[str, Any], dataset: Any, args: argparse.Namespace) -> dict:
    """Updates/s of d3rlpy's ``name`` (update alone, and sample + update)."""
    config, differences = make_config(name, cfg)
    d3rlpy.seed(args.seed)
    algo = config.create(device="cpu")
    build_scalers_with_transition_picker(algo, dataset)
    algo.build_with_dataset(dataset)
    fit_neighbours(algo, dataset)
    bs = config.batch_size
    pool = [dataset.sample_transition_batch(bs) for _ in range(args.pool)]
    for i in range(args.warmup):
        algo.update(pool[i % len(pool)])

    update_rate, update_n, update_s = _rate(
        lambda i: algo.update(pool[i % len(pool)]), args.seconds
    )
    fit_rate, fit_n, fit_s = _rate(
        lambda i: algo.update(dataset.sample_transition_batch(bs)), args.seconds
    )
    settings = {
        k: v
        for k, v in dataclasses.asdict(config).items()
        if isinstance(v, int | float | str | bool) or v is None
    }
    settings["actor_hidden"] = getattr(
        getattr(config, "actor_encoder_factory", None) or getattr(config, "encoder_factory", None),
        "hidden_units",
        None,
    )
    return {
        "library": "d3rlpy",
        "agent": name,
        "algo": type(algo).__name__,
        "d3rlpy_version": d3rlpy.__version__,
        "torch_version": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "batch_size": bs,
        "updates_per_s": round(update_rate, 2),
        "updates_timed": update_n,
        "seconds_timed": round(update_s, 2),
        "fit_updates_per_s": round(fit_rate, 2),
        "fit_updates_timed": fit_n,
        "fit_seconds_timed": round(fit_s, 2),
        "settings": settings,
        "differences": differences,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", required=True, help="D4RL-layout HDF5 file")
    p.add_argument("--agents", default=",".join(AGENTS), help="comma-separated agent names")
    p.add_argument("--configs", default=None, help="JSON {agent: {jaxrl config field: value}}")
    p.add_argument("--seconds", type=float, default=5.0, help="minimum timed wall time per rate")
    p.add_argument("--warmup", type=int, default=20, help="untimed updates before timing")
    p.add_argument("--pool", type=int, default=16, help="minibatches sampled ahead of time")
    p.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()

    torch.set_num_threads(args.threads)
    # d3rlpy logs to stdout through structlog; keep stdout for the JSON lines.
    structlog.configure(logger_factory=structlog.PrintLoggerFactory(sys.stderr))
    configs = json.loads(args.configs) if args.configs else {}
    names = [n.strip() for n in args.agents.split(",") if n.strip()]
    for n in names:
        if n not in AGENTS + STAND_INS:
            p.error(f"unknown agent {n!r}; choose from {', '.join(AGENTS + STAND_INS)}")
    dataset = load_dataset(args.data)
    for name in names:
        cfg = configs.get(name, PAPER_DEFAULTS[name])
        print(json.dumps(measure(name, cfg, dataset, args)), flush=True)


if __name__ == "__main__":
    main()
