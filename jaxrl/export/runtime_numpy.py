"""Run a policy exported by ``jaxrl export --format numpy``; needs only numpy.

``jaxrl export`` copies this file next to the ``.npz`` it writes, so that a robot's computer can
run the policy without jax or jaxrl:

```python
import export_runtime_numpy as rt
policy = rt.load("policy.npz")
action = policy(obs)          # obs [batch, obs_size] or [obs_size], float32
```

The ``.npz`` holds the policy's constants (``c0``, ``c1``, ...) and ``program``: a JSON list of
operations named after JAX's primitives, in execution order. A shape entry ``"b"`` is the batch
size of the observations given.
"""

import json

import numpy as np


def _logistic(x):
    with np.errstate(over="ignore"):
        return 1.0 / (1.0 + np.exp(-x))


def _erf(x):
    # Abramowitz & Stegun 7.1.26 (|error| < 1.5e-7): numpy has no erf and scipy is not needed.
    t = 1.0 / (1.0 + 0.3275911 * np.abs(x))
    poly = 1.061405429
    for coef in (-1.453152027, 1.421413741, -0.284496736, 0.254829592):
        poly = coef + t * poly
    poly = t * poly
    return (np.sign(x) * (1.0 - poly * np.exp(-x * x))).astype(x.dtype)


UNARY = {
    "tanh": np.tanh, "exp": np.exp, "log": np.log, "neg": np.negative, "sqrt": np.sqrt,
    "rsqrt": lambda x: 1.0 / np.sqrt(x), "logistic": _logistic, "abs": np.abs, "sign": np.sign,
    "erf": _erf, "log1p": np.log1p, "expm1": np.expm1, "square": np.square, "floor": np.floor,
    "ceil": np.ceil, "sin": np.sin, "cos": np.cos, "not": np.logical_not, "copy": lambda x: x,
    "copy_p": lambda x: x, "stop_gradient": lambda x: x,
}  # fmt: skip
BINARY = {
    "add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide, "max": np.maximum,
    "min": np.minimum, "pow": np.power, "gt": np.greater, "lt": np.less, "ge": np.greater_equal,
    "le": np.less_equal, "eq": np.equal, "ne": np.not_equal, "and": np.logical_and,
    "or": np.logical_or,
}  # fmt: skip


def _shape(dims, batch):
    return tuple(batch if d == "b" else d for d in dims)


def _broadcast_in_dim(x, op, batch):
    shape = _shape(op["shape"], batch)
    expanded = [1] * len(shape)
    for i, d in enumerate(op["broadcast_dimensions"]):
        expanded[d] = x.shape[i]
    return np.broadcast_to(x.reshape(expanded), shape)


def _slice(x, op, batch):
    strides = op["strides"] or [1] * x.ndim
    limits = _shape(op["limit_indices"], batch)
    return x[
        tuple(slice(s, e, k) for s, e, k in zip(op["start_indices"], limits, strides, strict=True))
    ]


def _select_n(pred, *cases):
    if pred.dtype == np.bool_:
        return np.where(pred, cases[1], cases[0])
    return np.choose(pred, cases)


def _apply(op, args, batch):
    name = op["op"]
    if name in UNARY:
        return UNARY[name](args[0])
    if name in BINARY:
        return BINARY[name](args[0], args[1])
    x = args[0]
    if name == "integer_pow":
        return x ** op["y"]
    if name == "dot_general":
        return np.einsum(op["equation"], x, args[1])
    if name in ("reduce_sum", "reduce_max", "reduce_min", "reduce_prod"):
        fn = {"reduce_sum": np.sum, "reduce_max": np.max, "reduce_min": np.min}.get(name, np.prod)
        return fn(x, axis=tuple(op["axes"]))
    if name == "broadcast_in_dim":
        return _broadcast_in_dim(x, op, batch)
    if name == "reshape":
        return x.reshape(_shape(op["new_sizes"], batch))
    if name == "squeeze":
        return np.squeeze(x, axis=tuple(op["dimensions"]))
    if name == "concatenate":
        return np.concatenate(args, axis=op["dimension"])
    if name == "slice":
        return _slice(x, op, batch)
    if name == "transpose":
        return np.transpose(x, op["permutation"])
    if name == "convert_element_type":
        return x.astype(op["new_dtype"])
    if name == "clamp":
        return np.minimum(np.maximum(args[1], x), args[2])
    if name == "select_n":
        return _select_n(*args)
    raise ValueError(f"Unknown operation {name!r}: the file needs a newer runtime.")


class Policy:
    """A loaded policy: ``policy(obs) -> actions`` (float32 numpy arrays)."""

    def __init__(self, program, consts):
        self.program = program
        self.consts = consts
        self.obs_size = int(program["obs_size"])

    def __call__(self, obs):
        """Actions for ``[batch, obs_size]`` (or one ``[obs_size]``) observations."""
        obs = np.asarray(obs, np.float32)
        single = obs.ndim == 1
        obs = obs[None] if single else obs
        if obs.ndim != 2 or obs.shape[1] != self.obs_size:
            raise ValueError(f"Observations must be [batch, {self.obs_size}], got {obs.shape}.")
        env = dict(self.consts)
        env[self.program["input"]] = obs
        with np.errstate(divide="ignore", invalid="ignore"):
            for op in self.program["ops"]:
                out = _apply(op, [env[name] for name in op["in"]], obs.shape[0])
                env[op["out"]] = np.asarray(out, dtype=op["dtype"])
        action = env[self.program["output"]].astype(np.float32)
        return action[0] if single else action


def load(path):
    """The policy stored at ``path`` (a ``.npz`` written by ``jaxrl export --format numpy``)."""
    with np.load(path, allow_pickle=False) as data:
        program = json.loads(str(data["program"]))
        consts = {k: data[k] for k in data.files if k != "program"}
    return Policy(program, consts)
