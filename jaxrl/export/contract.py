"""The contract of an exported policy: what it records, writing it, and loading a policy against it.

Next to every artifact ``jaxrl export`` writes, ``FILE.contract.json`` says what the artifact
expects and gives (observation and action sizes, normalizer statistics, action bounds and
scaling, control rate, agent, config, env, training step, jaxrl version, format, the artifact's
sha256). ``PolicySource`` is what an export is made from and what the contract records about
it; ``load_policy`` checks the contract before it runs the artifact.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl.export.onnx_graph import require_onnx
from jaxrl.registry import AgentSpec

FORMATS = ("onnx", "numpy", "jax")
CONTRACT_VERSION = 1
CONTRACT_SUFFIX = ".contract.json"
RUNTIME_FILE = "export_runtime_numpy.py"


@dataclasses.dataclass
class PolicySource:
    """What an export needs: the agent, its env's interface, and what to record about it.

    Attributes:
        spec: the agent's registry entry.
        agent: the trained agent (``eval_actions`` gives actions in ``[-1, 1]``).
        obs_size: length of the env's observation vector.
        action_low: ``[action_size]`` lower bounds of the env's actions.
        action_high: ``[action_size]`` upper bounds.
        obs_stats: a JAX env's running observation statistics (``RunningStats``) the policy was
            trained on, or None when the env gives the agent raw observations.
        obs_clip: the clip applied after normalizing with ``obs_stats``.
        env: the env id, recorded in the contract.
        control_dt: seconds per agent step (the control period: the simulator's step times
            ``decimation``), or None when unknown.
        step: the training step of the checkpoint.
        agent_config: the agent's config as a dict (recorded).
        privileged_size: observation features the env appends for the critic only
            (``privileged=true``); the exported policy takes the first ``obs_size`` features,
            which is all the actor ever reads, and never these.
        decimation: simulator steps per agent step (the env id's ``decimation``).
        sim2real: the env id's sim-to-real options (noise, delays, filter, history, ...), so a
            deployment knows what the policy was trained to expect.
    """

    spec: AgentSpec
    agent: Any
    obs_size: int
    action_low: np.ndarray
    action_high: np.ndarray
    obs_stats: Any = None
    obs_clip: float = 10.0
    env: str = ""
    control_dt: float | None = None
    step: int = 0
    agent_config: dict[str, Any] | None = None
    privileged_size: int = 0
    decimation: int = 1
    sim2real: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def action_size(self) -> int:
        """Length of the action vector."""
        return int(np.size(self.action_high))


def obs_normalizer(src: PolicySource) -> tuple[np.ndarray, np.ndarray, float | None] | None:
    """(mean, std, clip) of the observation normalizer folded into the policy, or None."""
    if src.obs_stats is not None:
        mean = np.asarray(src.obs_stats.mean, np.float32)
        std = np.sqrt(np.asarray(src.obs_stats.var, np.float32) + np.float32(1e-8))
        return mean, std, float(src.obs_clip)
    if src.spec.data_norm:  # inside the agent (dataset statistics): eval_actions applies it
        return np.asarray(src.agent.norm.obs_mean), np.asarray(src.agent.norm.obs_std), None
    return None


# --------------------------------------------------------------------------- writing and loading


def _sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def contract_path(path: str) -> str:
    """Where the contract of the artifact at ``path`` is: ``path + '.contract.json'``."""
    return path + CONTRACT_SUFFIX


def contract_of(src: PolicySource, fmt: str, path: str) -> dict[str, Any]:
    """The contract of the artifact at ``path``.

    Its source run, observation and action layout, bounds and scaling, normalizer, control
    rate and the artifact's hash.
    """
    import jaxrl

    norm = obs_normalizer(src)
    low = np.asarray(src.action_low, np.float32)
    high = np.asarray(src.action_high, np.float32)
    normalizer = None
    if norm is not None:
        mean, std, clip = norm
        where = "the env's running statistics" if src.obs_stats is not None else "the dataset's"
        formula = "(obs - mean) / std" + ("" if clip is None else f", clipped to +-{clip:g}")
        normalizer = {
            "folded": True,
            "source": where,
            "formula": formula,
            "mean": mean.tolist(),
            "std": std.tolist(),
            "clip": clip,
        }
    runtime = None
    if fmt == "numpy":  # the module that runs the .npz, next to it
        runtime = os.path.join(os.path.dirname(os.path.abspath(path)), RUNTIME_FILE)
        runtime = {"file": RUNTIME_FILE, "sha256": _sha256(runtime)}
    return {
        "contract_version": CONTRACT_VERSION,
        "format": fmt,
        "artifact": os.path.basename(path),
        "sha256": _sha256(path),
        "runtime": runtime,
        "jaxrl_version": jaxrl.__version__,
        "agent": src.spec.name,
        "agent_config": src.agent_config,
        "env": src.env,
        "step": int(src.step),
        "control_dt": src.control_dt,
        "decimation": int(src.decimation),
        "sim2real": src.sim2real,
        "observation": {
            "size": int(src.obs_size),
            "dtype": "float32",
            "layout": f"[batch, {src.obs_size}]: the env's raw observation vector, batch any size"
            + (
                f"; the env's {src.privileged_size} privileged critic features (privileged=true) "
                "are not inputs"
                if src.privileged_size
                else ""
            ),
            "input_name": "obs",
        },
        "normalizer": normalizer,
        "action": {
            "size": src.action_size,
            "dtype": "float32",
            "low": low.tolist(),
            "high": high.tolist(),
            "scaling": "action = low + (clip(a, -1, 1) + 1) / 2 * (high - low), a the agent's "
            "output in [-1, 1]; applied inside the artifact (its output is in env units)",
            "output_name": "action",
        },
    }


def artifact_runner(fmt: str, path: str) -> Callable[[np.ndarray], np.ndarray]:
    """``obs [b, D] -> actions`` running the artifact at ``path`` (no contract check)."""
    if fmt == "onnx":
        require_onnx()
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
        return lambda obs: session.run(["action"], {"obs": np.asarray(obs, np.float32)})[0]
    if fmt == "numpy":
        from jaxrl.export import runtime_numpy as export_runtime_numpy

        return export_runtime_numpy.load(path)
    with open(path, "rb") as f:
        exported = jax.export.deserialize(bytearray(f.read()))
    call = jax.jit(exported.call)
    return lambda obs: np.asarray(call(jnp.asarray(obs, jnp.float32)))


@dataclasses.dataclass
class LoadedPolicy:
    """An exported policy, checked against its contract: ``policy(obs) -> actions``.

    Attributes:
        contract: the contract (see ``jaxrl.export.contract``).
        fn: ``obs [batch, obs_size] -> actions [batch, action_size]`` (numpy, env units).
    """

    contract: dict[str, Any]
    fn: Callable[[np.ndarray], np.ndarray]

    @property
    def obs_size(self) -> int:
        """Length of the observation vector the policy takes."""
        return int(self.contract["observation"]["size"])

    def __call__(self, obs: Any) -> np.ndarray:
        """Actions in env units for ``[batch, obs_size]`` or one ``[obs_size]`` observation."""
        obs = np.asarray(obs, np.float32)
        single = obs.ndim == 1
        obs = obs[None] if single else obs
        if obs.ndim != 2 or obs.shape[1] != self.obs_size:
            raise ValueError(
                f"This policy takes observations [batch, {self.obs_size}], got {obs.shape}."
            )
        action = np.asarray(self.fn(obs), np.float32)
        return action[0] if single else action


def load_policy(path: str, obs_size: int | None = None) -> LoadedPolicy:
    """Load an exported policy (``.onnx``, ``.npz`` or ``.jaxexport``) after checking its contract.

    Args:
        path: the artifact (or its ``.contract.json``).
        obs_size: the observation size the caller will feed; checked against the contract.

    Raises:
        ValueError: a missing, unreadable or newer contract; an artifact whose sha256 differs
            from the contract's (corrupt or truncated, or replaced); an artifact that cannot be
            parsed; an observation size other than ``obs_size``.
    """
    if path.endswith(CONTRACT_SUFFIX):
        path = path[: -len(CONTRACT_SUFFIX)]
    cpath = contract_path(path)
    if not os.path.exists(path):
        raise ValueError(f"No exported policy at {path}; export one with `jaxrl export DIR`.")
    try:
        with open(cpath) as f:
            contract = json.load(f)
        version, fmt = contract["contract_version"], contract["format"]
        size = int(contract["observation"]["size"])
    except FileNotFoundError:
        raise ValueError(
            f"{path} has no contract ({cpath}); export the policy again with `jaxrl export`."
        ) from None
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as err:
        raise ValueError(f"{cpath} is not a valid policy contract ({err}); export again.") from None
    if not isinstance(version, int) or not 1 <= version <= CONTRACT_VERSION:
        raise ValueError(
            f"{cpath} has contract version {version!r}; this jaxrl reads versions 1.."
            f"{CONTRACT_VERSION}. Load it with the jaxrl that exported it (or a newer one), or "
            "export again."
        )
    if fmt not in FORMATS:
        raise ValueError(f"{cpath} names an unknown format {fmt!r} ({', '.join(FORMATS)}).")
    if _sha256(path) != contract["sha256"]:
        raise ValueError(
            f"{path} does not match its contract's sha256: the file is corrupt, truncated or was "
            "replaced. Copy it again or export again."
        )
    if obs_size is not None and int(obs_size) != size:
        raise ValueError(
            f"{path} takes observations of size {size}, but {obs_size} were stated: it was "
            f"exported for env {contract.get('env')!r}. Export the policy of a run on your env."
        )
    if fmt == "onnx":
        require_onnx()
    try:
        fn = artifact_runner(fmt, path)
    except Exception as err:  # each runtime has its own parse errors
        raise ValueError(f"{path} cannot be read as a {fmt} policy ({err}).") from None
    return LoadedPolicy(contract, fn)


__all__ = [
    "CONTRACT_SUFFIX",
    "CONTRACT_VERSION",
    "FORMATS",
    "LoadedPolicy",
    "PolicySource",
    "RUNTIME_FILE",
    "artifact_runner",
    "contract_of",
    "contract_path",
    "load_policy",
    "obs_normalizer",
]
