"""Export the deterministic evaluation policy of a run: ONNX, numpy or JAX (StableHLO).

``jaxrl export DIR --format onnx|numpy|jax [--out FILE]`` writes one artifact that maps raw env
observations ``[batch, obs_size]`` (float32, any batch) to actions in the env's units: the
observation normalizer (a JAX env's running statistics, or an offline agent's dataset
statistics) and the ``[-1, 1]`` -> ``[low, high]`` action rescaling are folded in, the
parameters are constants. Next to it, ``FILE.contract.json`` says what the artifact expects and
gives (observation and action sizes, normalizer statistics, action bounds and scaling, control
rate, agent, config, env, training step, jaxrl version, format, the artifact's sha256);
``load_policy`` checks it before running the artifact.

The policy is traced once with a symbolic batch size (``jax.make_jaxpr``); the ONNX graph and
the numpy program are converted from that jaxpr here (no converter package: the maintained one
pins an older orbax), the JAX format is ``jax.export``'s serialized StableHLO. Every export is
checked against the JAX policy before it is written. Planners and policies that draw random
numbers at evaluation are refused: they are not a fixed function of the observation.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl.registry import AgentSpec

FORMATS = ("onnx", "numpy", "jax")
SUFFIX = {"onnx": ".onnx", "numpy": ".npz", "jax": ".jaxexport"}
CONTRACT_VERSION = 1
CONTRACT_SUFFIX = ".contract.json"
RUNTIME_FILE = "export_runtime_numpy.py"
ONNX_OPSET = 18
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
# Primitives that only wrap a sub-jaxpr: their body is inlined.
_CALLS = {
    "jit": "jaxpr",
    "pjit": "jaxpr",
    "closed_call": "call_jaxpr",
    "core_call": "call_jaxpr",
    "remat": "jaxpr",
    "checkpoint": "jaxpr",
    "custom_jvp_call": "call_jaxpr",
    "custom_vjp_call": "call_jaxpr",
    "custom_vjp_call_jaxpr": "fun_jaxpr",
}
_CHECK_ATOL = 1e-4


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


# --------------------------------------------------------------------------- the policy


def _obs_normalizer(src: PolicySource) -> tuple[np.ndarray, np.ndarray, float | None] | None:
    """(mean, std, clip) of the observation normalizer folded into the policy, or None."""
    if src.obs_stats is not None:
        mean = np.asarray(src.obs_stats.mean, np.float32)
        std = np.sqrt(np.asarray(src.obs_stats.var, np.float32) + np.float32(1e-8))
        return mean, std, float(src.obs_clip)
    if src.spec.data_norm:  # inside the agent (dataset statistics): eval_actions applies it
        return np.asarray(src.agent.norm.obs_mean), np.asarray(src.agent.norm.obs_std), None
    return None


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
        raise ValueError(
            f"Cannot export {src.spec.name}: it is a planner (it optimizes an action sequence "
            "with its learned model at every step and carries the plan across steps), not a "
            "fixed function of the observation. Run it with jaxrl (`jaxrl eval DIR`), or train "
            "a policy agent (e.g. sac, td3, ppo) to export."
        )
    x = jax.ShapeDtypeStruct(jax.export.symbolic_shape(f"b, {src.obs_size}"), jnp.float32)
    closed = jax.make_jaxpr(policy_function(src))(x)
    rng = sorted({e.primitive.name for e in _walk(closed.jaxpr)} & RNG_PRIMITIVES)
    if rng:
        raise ValueError(
            f"Cannot export {src.spec.name}: its evaluation policy draws random numbers "
            f"({', '.join(rng)} in its graph; e.g. sampling candidate actions or noise), so it "
            "is not a fixed function of the observation. Use an agent whose evaluation policy "
            "is deterministic, or an evaluation option without sampling where the agent has "
            "one (FQL: train with --eval-noise zero)."
        )
    return closed


# --------------------------------------------------------------------------- jaxpr -> program


def _dim(d: Any, batch: Any) -> int | str:
    if isinstance(d, int | np.integer):
        return int(d)
    if d is batch or d == batch:
        return "b"
    raise ValueError(
        f"Cannot export: the policy computes a shape ({d}) from the batch size; only shapes "
        "with the batch as its own dimension are supported."
    )


def _einsum(dn: Any, lhs_rank: int, rhs_rank: int) -> str:
    (lc, rc), (lb, rb) = dn
    letters = iter("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
    lhs, rhs = [""] * lhs_rank, [""] * rhs_rank
    for i, j in zip(lb, rb, strict=True):
        lhs[i] = rhs[j] = next(letters)
    for i, j in zip(lc, rc, strict=True):
        lhs[i] = rhs[j] = next(letters)
    for spec in (lhs, rhs):
        for i, s in enumerate(spec):
            spec[i] = s or next(letters)
    out = [lhs[i] for i in lb]
    out += [lhs[i] for i in range(lhs_rank) if i not in lb and i not in lc]
    out += [rhs[j] for j in range(rhs_rank) if j not in rb and j not in rc]
    return f"{''.join(lhs)},{''.join(rhs)}->{''.join(out)}"


_PARAMS = {
    "integer_pow": ("y",),
    "reduce_sum": ("axes",),
    "reduce_max": ("axes",),
    "reduce_min": ("axes",),
    "reduce_prod": ("axes",),
    "squeeze": ("dimensions",),
    "concatenate": ("dimension",),
    "transpose": ("permutation",),
}
_PLAIN = {
    *("tanh", "exp", "log", "neg", "sqrt", "rsqrt", "logistic", "abs", "sign", "erf", "log1p"),
    *("expm1", "square", "floor", "ceil", "sin", "cos", "not", "copy", "copy_p"),
    *("add", "sub", "mul", "div", "max", "min", "pow", "gt", "lt", "ge", "le", "eq", "ne"),
    *("and", "or", "clamp", "select_n"),
}


def to_program(closed: Any) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """The jaxpr as a flat op list (calls inlined, dead code removed) and its constants.

    Returns:
        ``(program, consts)``: ``program`` is JSON-serializable (``input``, ``output``,
        ``obs_size``, ``ops``: ``{"op", "in", "out", "dtype", ...parameters}``); ``consts``
        maps names to arrays.

    Raises:
        ValueError: the policy uses an operation the converter does not support.
    """
    jaxpr = closed.jaxpr
    batch = jaxpr.invars[0].aval.shape[0]
    consts: dict[str, np.ndarray] = {}
    ops: list[dict[str, Any]] = []
    counter = iter(range(10**9))

    def const(value: Any) -> str:
        name = f"c{len(consts)}"
        consts[name] = np.asarray(value)
        return name

    def read(env: dict, atom: Any) -> str:
        if isinstance(atom, jax.extend.core.Literal):
            return const(np.asarray(atom.val, atom.aval.dtype))
        return env[atom]

    def emit(jp: Any, env: dict) -> None:
        for eqn in jp.eqns:
            name = eqn.primitive.name
            ins = [read(env, v) for v in eqn.invars]
            if name in _CALLS:
                sub = eqn.params[_CALLS[name]]
                sub_jaxpr = sub.jaxpr if isinstance(sub, jax.extend.core.ClosedJaxpr) else sub
                sub_env = {
                    v: const(c) for v, c in zip(sub_jaxpr.constvars, sub.consts, strict=True)
                }
                sub_env.update(zip(sub_jaxpr.invars, ins, strict=True))
                emit(sub_jaxpr, sub_env)
                for outer, inner in zip(eqn.outvars, sub_jaxpr.outvars, strict=True):
                    env[outer] = read(sub_env, inner)
                continue
            if name == "split":  # one slice per piece
                shape = [_dim(d, batch) for d in eqn.invars[0].aval.shape]
                start, axis = 0, int(eqn.params["axis"])
                for out, size in zip(eqn.outvars, eqn.params["sizes"], strict=True):
                    starts, limits = [0] * len(shape), list(shape)
                    starts[axis], limits[axis] = start, start + int(size)
                    start += int(size)
                    op = {"op": "slice", "in": ins, "out": f"v{next(counter)}", "strides": None}
                    op.update(start_indices=starts, limit_indices=limits)
                    op["dtype"] = np.dtype(out.aval.dtype).name
                    ops.append(op)
                    env[out] = op["out"]
                continue
            if len(eqn.outvars) != 1:
                raise ValueError(f"Cannot export: unsupported operation {name!r} in the policy.")
            out = eqn.outvars[0]
            op: dict[str, Any] = {"op": name, "in": ins, "out": f"v{next(counter)}"}
            op["dtype"] = np.dtype(out.aval.dtype).name
            p = eqn.params
            if name in _PARAMS:
                op.update({k: _jsonable(p[k]) for k in _PARAMS[name]})
            elif name == "dot_general":
                ranks = [v.aval.ndim for v in eqn.invars]
                op["equation"] = _einsum(p["dimension_numbers"], *ranks)
            elif name == "broadcast_in_dim":
                op["shape"] = [_dim(d, batch) for d in p["shape"]]
                op["broadcast_dimensions"] = list(p["broadcast_dimensions"])
                op["in_shape"] = [_dim(d, batch) for d in eqn.invars[0].aval.shape]
                op["in"] = ins[:1]
            elif name == "reshape":
                if p.get("dimensions") is not None:
                    raise ValueError("Cannot export: a reshape with a transposition.")
                op["new_sizes"] = [_dim(d, batch) for d in p["new_sizes"]]
                op["in"] = ins[:1]
            elif name == "slice":
                op["start_indices"] = [int(s) for s in p["start_indices"]]
                op["limit_indices"] = [_dim(d, batch) for d in p["limit_indices"]]
                op["strides"] = None if p["strides"] is None else [int(s) for s in p["strides"]]
            elif name == "convert_element_type":
                op["new_dtype"] = np.dtype(p["new_dtype"]).name
            elif name not in _PLAIN:
                raise ValueError(
                    f"Cannot export: the policy uses {name!r}, which the converter does not "
                    "support. Use the jax format (`--format jax`), which takes any policy."
                )
            ops.append(op)
            env[out] = op["out"]

    env = {v: const(c) for v, c in zip(jaxpr.constvars, closed.consts, strict=True)}
    env[jaxpr.invars[0]] = "obs"
    emit(jaxpr, env)
    output = read(env, jaxpr.outvars[0])
    live, kept = {output}, []
    for op in reversed(ops):  # dead code (e.g. an unused log-std head) is dropped
        if op["out"] in live:
            kept.append(op)
            live.update(op["in"])
    consts = {k: v for k, v in consts.items() if k in live}
    program = {
        "input": "obs",
        "output": output,
        "obs_size": int(jaxpr.invars[0].aval.shape[1]),
        "ops": kept[::-1],
    }
    return program, consts


def _jsonable(x: Any) -> Any:
    if isinstance(x, tuple | list):
        return [_jsonable(v) for v in x]
    return int(x) if isinstance(x, int | np.integer) else x


# --------------------------------------------------------------------------- program -> ONNX

_ONNX_UNARY = {
    "tanh": "Tanh", "exp": "Exp", "log": "Log", "neg": "Neg", "sqrt": "Sqrt",
    "logistic": "Sigmoid", "abs": "Abs", "sign": "Sign", "erf": "Erf", "floor": "Floor",
    "ceil": "Ceil", "sin": "Sin", "cos": "Cos", "not": "Not", "copy": "Identity",
    "copy_p": "Identity",
}  # fmt: skip
_ONNX_BINARY = {
    "add": "Add", "sub": "Sub", "mul": "Mul", "div": "Div", "max": "Max", "min": "Min",
    "pow": "Pow", "gt": "Greater", "lt": "Less", "ge": "GreaterOrEqual", "le": "LessOrEqual",
    "eq": "Equal", "and": "And", "or": "Or",
}  # fmt: skip
_ONNX_REDUCE = {
    "reduce_sum": "ReduceSum",
    "reduce_max": "ReduceMax",
    "reduce_min": "ReduceMin",
    "reduce_prod": "ReduceProd",
}


def to_onnx(program: dict[str, Any], consts: dict[str, np.ndarray], action_size: int) -> bytes:
    """The program as a serialized ONNX model: input ``obs [b, obs_size]``, output ``action``."""
    from onnx import TensorProto, helper, numpy_helper

    nodes: list[Any] = []
    inits = [numpy_helper.from_array(np.asarray(v), k) for k, v in consts.items()]
    fresh = iter(range(10**9))

    def node(op_type: str, inputs: list[str], out: str | None = None, **attrs: Any) -> str:
        out = out or f"t{next(fresh)}"
        nodes.append(helper.make_node(op_type, inputs, [out], **attrs))
        return out

    def int64s(values: list[int]) -> str:
        name = f"i{next(fresh)}"
        inits.append(numpy_helper.from_array(np.asarray(values, np.int64), name))
        return name

    batch = node("Slice", [node("Shape", ["obs"]), int64s([0]), int64s([1])])

    def shape(dims: list[Any]) -> str:
        if "b" not in dims:
            return int64s([int(d) for d in dims])
        parts = [batch if d == "b" else int64s([int(d)]) for d in dims]
        return node("Concat", parts, axis=0)

    for op in program["ops"]:
        name, ins, out = op["op"], op["in"], op["out"]
        if name in _ONNX_UNARY:
            node(_ONNX_UNARY[name], ins, out)
        elif name in _ONNX_BINARY:
            node(_ONNX_BINARY[name], ins, out)
        elif name == "ne":
            node("Not", [node("Equal", ins)], out)
        elif name == "rsqrt":
            node("Reciprocal", [node("Sqrt", ins)], out)
        elif name == "square":
            node("Mul", [ins[0], ins[0]], out)
        elif name == "log1p":
            one = _scalar_const(inits, fresh, 1.0, op["dtype"])
            node("Log", [node("Add", [ins[0], one])], out)
        elif name == "expm1":
            one = _scalar_const(inits, fresh, 1.0, op["dtype"])
            node("Sub", [node("Exp", ins), one], out)
        elif name == "integer_pow":
            node("Pow", [ins[0], _scalar_const(inits, fresh, float(op["y"]), op["dtype"])], out)
        elif name == "dot_general":
            node("Einsum", ins, out, equation=op["equation"])
        elif name in _ONNX_REDUCE:
            node(_ONNX_REDUCE[name], [ins[0], int64s(op["axes"])], out, keepdims=0)
        elif name == "broadcast_in_dim":
            expanded: list[Any] = [1] * len(op["shape"])
            for i, d in enumerate(op["broadcast_dimensions"]):
                expanded[d] = op["in_shape"][i]
            node("Expand", [node("Reshape", [ins[0], shape(expanded)]), shape(op["shape"])], out)
        elif name == "reshape":
            node("Reshape", [ins[0], shape(op["new_sizes"])], out)
        elif name == "squeeze":
            node("Squeeze", [ins[0], int64s(op["dimensions"])], out)
        elif name == "concatenate":
            node("Concat", ins, out, axis=op["dimension"])
        elif name == "slice":
            ends = [2**62 if d == "b" else d for d in op["limit_indices"]]
            steps = op["strides"] or [1] * len(ends)
            axes = list(range(len(ends)))
            args = [int64s(op["start_indices"]), int64s(ends), int64s(axes), int64s(steps)]
            node("Slice", [ins[0], *args], out)
        elif name == "transpose":
            node("Transpose", ins, out, perm=op["permutation"])
        elif name == "convert_element_type":
            node("Cast", ins, out, to=helper.np_dtype_to_tensor_dtype(np.dtype(op["new_dtype"])))
        elif name == "clamp":
            node("Min", [node("Max", [ins[1], ins[0]]), ins[2]], out)
        elif name == "select_n":
            pred, cases = ins[0], ins[1:]
            if len(cases) == 2:
                node("Where", [pred, cases[1], cases[0]], out)
            else:
                acc, idx = cases[0], node("Cast", [pred], to=TensorProto.INT64)
                for k, case in enumerate(cases[1:], 1):
                    hit = node("Equal", [idx, int64s([k])])
                    acc = node("Where", [hit, case, acc], out if k == len(cases) - 1 else None)
        else:  # to_program admits only the operations above
            raise ValueError(f"Cannot export {name!r} to ONNX.")
    node("Identity", [program["output"]], "action")
    graph = helper.make_graph(
        nodes,
        "jaxrl_policy",
        [helper.make_tensor_value_info("obs", TensorProto.FLOAT, ["batch", program["obs_size"]])],
        [helper.make_tensor_value_info("action", TensorProto.FLOAT, ["batch", action_size])],
        inits,
    )
    model = helper.make_model(
        graph, producer_name="jaxrl", opset_imports=[helper.make_opsetid("", ONNX_OPSET)]
    )
    model.ir_version = 9  # readable by onnxruntime >= 1.18 (the extra's floor)
    import onnx

    onnx.checker.check_model(model)
    return model.SerializeToString()


def _scalar_const(inits: list, fresh: Any, value: float, dtype: str) -> str:
    from onnx import numpy_helper

    name = f"s{next(fresh)}"
    inits.append(numpy_helper.from_array(np.asarray(value, dtype), name))
    return name


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


def _contract(src: PolicySource, fmt: str, path: str) -> dict[str, Any]:
    import jaxrl

    norm = _obs_normalizer(src)
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
        raise ValueError(f"Unknown export format {fmt!r}; choose one of {', '.join(FORMATS)}.")
    closed = trace_policy(src)
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    if fmt == "jax":
        x = jax.ShapeDtypeStruct(jax.export.symbolic_shape(f"b, {src.obs_size}"), jnp.float32)
        exported = jax.export.export(jax.jit(policy_function(src)))(x)
        data = bytes(exported.serialize())
    else:
        program, consts = to_program(closed)
    if fmt == "onnx":
        _require_onnx()
        data = to_onnx(program, consts, src.action_size)
    tmp = out + ".tmp"
    if fmt == "numpy":
        with open(tmp, "wb") as f:
            np.savez(f, program=np.asarray(json.dumps(program)), **consts)
        runtime = os.path.join(os.path.dirname(__file__), RUNTIME_FILE)
        shutil.copyfile(runtime, os.path.join(os.path.dirname(os.path.abspath(out)), RUNTIME_FILE))
    else:
        with open(tmp, "wb") as f:
            f.write(data)
    try:
        _check(src, _runner(fmt, tmp), fmt)
    except BaseException:
        os.remove(tmp)
        raise
    os.replace(tmp, out)
    with open(contract_path(out), "w") as f:
        json.dump(_contract(src, fmt, out), f, indent=2, default=str)
    return out


def _require_onnx() -> None:
    try:
        import onnx  # noqa: F401
        import onnxruntime  # noqa: F401
    except ImportError:
        raise ValueError(
            "ONNX export needs onnx and onnxruntime: pip install 'jaxrl[export]'."
        ) from None


def _check(src: PolicySource, run: Callable[[np.ndarray], np.ndarray], fmt: str) -> None:
    """The artifact reproduces the JAX policy on random observations (around the normalizer)."""
    rng = np.random.default_rng(0)
    obs = rng.normal(size=(64, src.obs_size)).astype(np.float32)
    norm = _obs_normalizer(src)
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


def _runner(fmt: str, path: str) -> Callable[[np.ndarray], np.ndarray]:
    """``obs [b, D] -> actions`` running the artifact at ``path`` (no contract check)."""
    if fmt == "onnx":
        _require_onnx()
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
        return lambda obs: session.run(["action"], {"obs": np.asarray(obs, np.float32)})[0]
    if fmt == "numpy":
        from jaxrl import export_runtime_numpy

        return export_runtime_numpy.load(path)
    with open(path, "rb") as f:
        exported = jax.export.deserialize(bytearray(f.read()))
    call = jax.jit(exported.call)
    return lambda obs: np.asarray(call(jnp.asarray(obs, jnp.float32)))


@dataclasses.dataclass
class LoadedPolicy:
    """An exported policy, checked against its contract: ``policy(obs) -> actions``.

    Attributes:
        contract: the contract (see ``jaxrl.export``).
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
        _require_onnx()
    try:
        fn = _runner(fmt, path)
    except Exception as err:  # each runtime has its own parse errors
        raise ValueError(f"{path} cannot be read as a {fmt} policy ({err}).") from None
    return LoadedPolicy(contract, fn)


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
    from jaxrl.runs import env_obs_norm, load_run

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
        raise ValueError(f"Unknown export format {fmt!r}; choose one of {', '.join(FORMATS)}.")
    out = out or os.path.join(run_dir, "export", "policy" + SUFFIX[fmt])
    return export_policy(source_from_run(run_dir, step), fmt, out)


def export_command(argv: list[str]) -> dict[str, Any]:
    """``jaxrl export DIR --format onnx|numpy|jax [--out FILE] [--step N]``; prints one line."""
    import argparse

    p = argparse.ArgumentParser(
        prog="jaxrl export",
        description="Export the deterministic evaluation policy of a run directory "
        "(observation normalizer and action rescaling folded in) with a contract JSON.",
    )
    p.add_argument("run_dir")
    p.add_argument("--format", choices=FORMATS, required=True)
    p.add_argument("--out", default=None, help="artifact path (default DIR/export/policy.EXT)")
    p.add_argument("--step", type=int, default=None, help="checkpoint step (default: newest)")
    a = p.parse_args(argv)
    path = export_run(a.run_dir, a.format, a.out, a.step)
    result = {"artifact": path, "contract": contract_path(path), "format": a.format}
    print(json.dumps(result))
    return result


__all__ = [
    "CONTRACT_VERSION",
    "FORMATS",
    "LoadedPolicy",
    "PolicySource",
    "contract_path",
    "export_command",
    "export_policy",
    "export_run",
    "load_policy",
    "policy_function",
    "source_from_run",
    "to_onnx",
    "to_program",
    "trace_policy",
]
