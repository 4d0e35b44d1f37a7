"""Export the deterministic evaluation policy of a run: ONNX, numpy or JAX (StableHLO).

``jaxrl export DIR --format onnx|numpy|jax [--out FILE]`` writes one artifact that maps raw env
observations ``[batch, obs_size]`` (float32, any batch) to actions in the env's units: the
observation normalizer (a JAX env's running statistics, or an offline agent's dataset
statistics) and the ``[-1, 1]`` -> ``[low, high]`` action rescaling are folded in, the
parameters are constants. Next to it, ``FILE.contract.json`` says what the artifact expects and
gives (observation and action sizes, normalizer statistics, action bounds and scaling, control
rate, agent, config, env, training step, jaxrl version, format, the artifact's sha256;
``jaxrl.export.contract``); ``load_policy`` checks it before running the artifact.

The policy is traced once with a symbolic batch size (``jax.make_jaxpr``); the ONNX graph and
the numpy program are converted from that jaxpr (``jaxrl.export.onnx_graph``; no converter package:
the maintained one pins an older orbax), the JAX format is ``jax.export``'s serialized
StableHLO. Every export is checked against the JAX policy before it is written. Planners and
policies that draw random numbers at evaluation are refused: they are not a fixed function of
the observation.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl.errors import ConfigError
from jaxrl.export.contract import (
    CONTRACT_VERSION,
    FORMATS,
    RUNTIME_FILE,
    LoadedPolicy,
    PolicySource,
    artifact_runner,
    contract_of,
    contract_path,
    load_policy,
    obs_normalizer,
)
from jaxrl.export.onnx_graph import require_onnx, to_onnx, to_program

SUFFIX = {"onnx": ".onnx", "numpy": ".npz", "jax": ".jaxexport"}
RNG_PRIMITIVES = frozenset(
    {
        "random_seed",
        "random_bits",
        "random_split",
        "random_fold_in",
        "random_wrap",
        "random_unwrap",
        "threefry2x32",
        "rng_bit_generator",
        "rng_uniform",
    }
)
_CHECK_ATOL = 1e-4


# --------------------------------------------------------------------------- the policy


def policy_function(src: PolicySource) -> Callable[[jax.Array], jax.Array]:
    """``obs [batch, obs_size] -> actions [batch, action_size]`` in the env's units.

    A JAX env's observation normalizer (as ``NormalizeObservation`` applies it at evaluation)
    comes first; the agent's actions are clipped to ``[-1, 1]`` and rescaled to the bounds as
    the envs do (``RescaleAction``, ``HostEnv.step``).
    """
    from jaxrl.envs.wrappers import normalize

    low = jnp.asarray(src.action_low, jnp.float32)
    high = jnp.asarray(src.action_high, jnp.float32)

    def fn(obs: jax.Array) -> jax.Array:
        if src.obs_stats is not None:
            obs = normalize(src.obs_stats, obs, src.obs_clip)
        action = jnp.clip(src.agent.eval_actions(obs), -1.0, 1.0)
        return low + (action + 1.0) * 0.5 * (high - low)

    return fn


def _walk(jaxpr: Any):
    """Every equation of ``jaxpr`` and of the jaxprs nested in its equations' parameters."""
    for eqn in jaxpr.eqns:
        yield eqn
        for value in eqn.params.values():
            for sub in value if isinstance(value, tuple | list) else (value,):
                if isinstance(sub, jax.extend.core.ClosedJaxpr):
                    yield from _walk(sub.jaxpr)
                elif isinstance(sub, jax.extend.core.Jaxpr):
                    yield from _walk(sub)


def trace_policy(src: PolicySource) -> Any:
    """The policy's ``ClosedJaxpr`` for a symbolic batch size ``b``.

    Raises:
        ValueError: the agent is a planner, or its evaluation policy draws random numbers.
    """
    if src.spec.kind == "planner":
        raise ConfigError(
            f"Cannot export {src.spec.name}: it is a planner (it optimizes an action sequence "
            "with its learned model at every step and carries the plan across steps), not a "
            "fixed function of the observation. Run it with jaxrl (`jaxrl eval DIR`), or train "
            "a policy agent (e.g. sac, td3, ppo) to export."
        )
    x = jax.ShapeDtypeStruct(jax.export.symbolic_shape(f"b, {src.obs_size}"), jnp.float32)
    closed = jax.make_jaxpr(policy_function(src))(x)
    rng = sorted({e.primitive.name for e in _walk(closed.jaxpr)} & RNG_PRIMITIVES)
    if rng:
        raise ConfigError(
            f"Cannot export {src.spec.name}: its evaluation policy draws random numbers "
            f"({', '.join(rng)} in its graph; e.g. sampling candidate actions or noise), so it "
            "is not a fixed function of the observation. Use an agent whose evaluation policy "
            "is deterministic, or an evaluation option without sampling where the agent has "
            "one (FQL: train with --eval-noise zero)."
        )
    return closed


# --------------------------------------------------------------------------- writing


def export_policy(src: PolicySource, fmt: str, out: str) -> str:
    """Write ``src``'s policy in ``fmt`` to ``out`` and its contract to ``out.contract.json``.

    The artifact is run on random observations and compared with the JAX policy before the
    contract is written. For ``numpy``, the runtime module is copied next to ``out``.

    Returns:
        ``out``.

    Raises:
        ValueError: an unknown format, a policy that cannot be exported (``trace_policy``,
            ``to_program``), a missing ``onnx``/``onnxruntime``, or an artifact that does not
            reproduce the JAX policy.
    """
    if fmt not in FORMATS:
        raise ConfigError(f"Unknown export format {fmt!r}; choose one of {', '.join(FORMATS)}.")
    closed = trace_policy(src)
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    if fmt == "jax":
        x = jax.ShapeDtypeStruct(jax.export.symbolic_shape(f"b, {src.obs_size}"), jnp.float32)
        exported = jax.export.export(jax.jit(policy_function(src)))(x)
        data = bytes(exported.serialize())
    else:
        program, consts = to_program(closed)
    if fmt == "onnx":
        require_onnx()
        data = to_onnx(program, consts, src.action_size)
    tmp = out + ".tmp"
    if fmt == "numpy":
        with open(tmp, "wb") as f:
            np.savez(f, program=np.asarray(json.dumps(program)), **consts)
        # The numpy runtime is copied beside the artifact as RUNTIME_FILE.
        runtime = os.path.join(os.path.dirname(__file__), "runtime_numpy.py")
        shutil.copyfile(runtime, os.path.join(os.path.dirname(os.path.abspath(out)), RUNTIME_FILE))
    else:
        with open(tmp, "wb") as f:
            f.write(data)
    try:
        _check(src, artifact_runner(fmt, tmp), fmt)
    except BaseException:
        os.remove(tmp)
        raise
    os.replace(tmp, out)
    with open(contract_path(out), "w") as f:
        json.dump(contract_of(src, fmt, out), f, indent=2, default=str)
    return out


def _check(src: PolicySource, run: Callable[[np.ndarray], np.ndarray], fmt: str) -> None:
    """The artifact reproduces the JAX policy on random observations (around the normalizer)."""
    rng = np.random.default_rng(0)
    obs = rng.normal(size=(64, src.obs_size)).astype(np.float32)
    norm = obs_normalizer(src)
    if norm is not None:
        obs = (norm[0] + obs * norm[1]).astype(np.float32)
    want = np.asarray(jax.jit(policy_function(src))(obs))
    got = np.asarray(run(obs))
    err = float(np.max(np.abs(got - want))) if got.shape == want.shape else float("inf")
    scale = float(np.max(np.abs(want))) if want.size else 0.0
    if not err <= _CHECK_ATOL * max(1.0, scale):
        raise ValueError(
            f"The {fmt} export of {src.spec.name} does not reproduce the JAX policy (max "
            f"difference {err:.3g}); please report this with the run directory."
        )


# --------------------------------------------------------------------------- run directories


def _control_dt(obj: Any) -> float | None:
    """The env's seconds per step where it states one (MuJoCo, Brax and jaxrl's JAX envs)."""
    dt = getattr(obj, "dt", None)
    try:
        return None if dt is None else float(dt)
    except (TypeError, ValueError):
        return None


def source_from_run(run_dir: str, step: int | None = None) -> PolicySource:
    """The ``PolicySource`` of the checkpoint at ``step`` (default: the newest) of ``run_dir``.

    Raises:
        ValueError: ``run_dir`` is not a run directory with a checkpoint (``load_run``).
    """
    from jaxrl import registry
    from jaxrl.envs.jax_envs import is_jax_env, make_core
    from jaxrl.run.runs import env_obs_norm, load_run

    run = load_run(run_dir, step)
    spec = registry.get(run.config["agent"])
    env_id = run.config["env"]
    clip, obs_stats, privileged = 10.0, run.obs_stats, 0
    if is_jax_env(env_id):
        from jaxrl.envs.jax_envs import make_jax_env

        env = make_jax_env(env_id, 1, normalize_obs=env_obs_norm(spec, run.agent_config))
        core, _ = make_core(env_id)
        obs_size, action_size = env.observation_size, env.action_size
        if env.actor_observation_size is not None:  # privileged=true: the policy's part only
            obs_size, privileged = env.actor_observation_size, obs_size - env.actor_observation_size
            obs_stats = _first_features(obs_stats, obs_size)
        low, high = core.action_low, core.action_high
        dt = _control_dt(core) or _control_dt(getattr(core, "env", None))
        if obs_stats is not None:
            clip = float(env.clip)
    else:
        from jaxrl.envs import make_env

        env = make_env(env_id, 1)
        obs_size, action_size = env.obs_dim, env.action_dim
        low, high = env.action_low, env.action_high
        dt = _control_dt(env.vec.envs[0].unwrapped)
        env.close()
    options = _sim2real_options(env_id)
    decimation = int(options.get("decimation", 1))
    if dt is not None:
        dt *= decimation  # the simulator's step, times the steps each action is held
    shape = (int(action_size),)
    return PolicySource(
        spec=spec,
        agent=run.agent,
        obs_size=int(obs_size),
        action_low=np.broadcast_to(np.asarray(low, np.float32), shape).copy(),
        action_high=np.broadcast_to(np.asarray(high, np.float32), shape).copy(),
        obs_stats=obs_stats,
        obs_clip=clip,
        env=env_id,
        control_dt=dt,
        step=int(run.meta["step"]),
        agent_config=dataclasses.asdict(run.agent_config),
        privileged_size=int(privileged),
        decimation=decimation,
        sim2real=options,
    )


def _sim2real_options(env_id: str) -> dict[str, Any]:
    """The sim-to-real options of a JAX or Gymnasium env id (``...?obs_noise=0.05&...``)."""
    from jaxrl.envs.jax_envs import parse_env_id
    from jaxrl.envs.sim2real import split_options

    query = env_id.partition("?")[2]
    return split_options(parse_env_id(f"jax:env?{query}")[2])[0] if query else {}


def _first_features(stats: Any, size: int) -> Any:
    """Running observation statistics of the first ``size`` features (None stays None)."""
    if stats is None:
        return None
    return stats.replace(mean=stats.mean[..., :size], var=stats.var[..., :size])


def export_run(run_dir: str, fmt: str, out: str | None = None, step: int | None = None) -> str:
    """Export the evaluation policy of ``run_dir`` (default ``DIR/export/policy.<ext>``).

    Returns:
        The artifact's path; its contract is at ``contract_path(path)``.
    """
    if fmt not in FORMATS:
        raise ConfigError(f"Unknown export format {fmt!r}; choose one of {', '.join(FORMATS)}.")
    out = out or os.path.join(run_dir, "export", "policy" + SUFFIX[fmt])
    return export_policy(source_from_run(run_dir, step), fmt, out)


__all__ = [
    "CONTRACT_VERSION",
    "FORMATS",
    "LoadedPolicy",
    "PolicySource",
    "contract_path",
    "export_policy",
    "export_run",
    "load_policy",
    "policy_function",
    "source_from_run",
    "to_onnx",
    "to_program",
    "trace_policy",
]
