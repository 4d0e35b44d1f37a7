"""The jaxpr -> ONNX converter of ``jaxrl export``: a traced policy as a flat op list, then ONNX.

``to_program`` turns the policy's ``ClosedJaxpr`` (``jaxrl.export.policy.trace_policy``) into a
JSON-serializable op list with its constants (calls inlined, dead code dropped): the numpy
format stores it as is (run by ``jaxrl.export.runtime_numpy``), and ``to_onnx`` builds the ONNX
graph from it. No converter package: the maintained one pins an older orbax.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from jaxrl.errors import ConfigError, require

ONNX_OPSET = 18
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
                raise ConfigError(
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


def require_onnx() -> None:
    """Import onnx and onnxruntime, or raise ``MissingExtraError`` naming the export extra."""
    require("onnx", "export")
    require("onnxruntime", "export")


__all__ = [
    "ONNX_OPSET",
    "require_onnx",
    "to_onnx",
    "to_program",
]
