"""The fused loop writes its replay buffer in place: the compiled chunk never copies the buffer.

A copy of the buffer costs O(capacity) per iteration (SAC on jax:pendulum with one env was 6x
slower per step at 1M rows than at 10k). These tests compile a tiny chunk with abstract inputs
(nothing is allocated or run) and read the optimized HLO.
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import pytest

from jaxrl import registry
from jaxrl.cli import parse_train_args
from jaxrl.loops import fused
from jaxrl.loops.device import strongly_typed
from jaxrl.run.runs import make_jax_envs

CAPACITY = 100_003
"""A buffer size no other array dimension has, so a shape holding it is (part of) the buffer."""

_INSTRUCTION = re.compile(r"^\s*(?:ROOT )?%(\S+) = (.+?) ([a-z][a-z-]*)\((.*)$")
_ALLOWED = {
    *("parameter", "get-tuple-element", "tuple", "bitcast", "while", "conditional", "call"),
    *("dynamic-update-slice", "scatter"),  # a few rows written in place
    "fusion",  # its fused computation's instructions are checked too
}
"""What may produce a capacity-sized array: ops that pass buffers along or write rows in place.
Anything else (``copy``, ``copy-start``, ``select``, ``broadcast``, ...) touches every row."""


def _holds_capacity(shape: str) -> bool:
    return any(str(CAPACITY) in dims.split(",") for dims in re.findall(r"\[([\d,]*)\]", shape))


def _computations(hlo: str) -> dict[str, list[tuple[str, str, str, str]]]:
    """``computation name -> [(name, result shape, opcode, rest of line)]`` of an HLO module."""
    comps: dict[str, list[tuple[str, str, str, str]]] = {}
    current: list[tuple[str, str, str, str]] = []
    for line in hlo.splitlines():
        if header := re.match(r"^(?:ENTRY )?%(\S+) .*\{$", line):
            current = comps.setdefault(header.group(1), [])
        elif m := _INSTRUCTION.match(line):
            current.append(m.groups())
    return comps


def buffer_work(hlo: str) -> list[str]:
    """The instructions of ``hlo`` (fused ones too) that copy or touch all ``CAPACITY`` rows."""
    return [
        f"{comp_name}: %{name} = {shape} {opcode}"
        for comp_name, comp in _computations(hlo).items()
        for name, shape, opcode, _ in comp
        if _holds_capacity(shape) and opcode not in _ALLOWED
    ]


def undonated_buffers(hlo: str) -> list[str]:
    """The capacity-sized entry parameters that the module's outputs do not alias (not donated)."""
    header = hlo.split("\n", 1)[0]
    aliased = re.findall(r"\((\d+), \{[\d,]*\}, (?:may|must)-alias\)", header)
    comps = _computations(hlo)
    entry = next(name for name in comps if f"ENTRY %{name} " in hlo)
    return [
        name
        for name, shape, opcode, rest in comps[entry]
        if opcode == "parameter" and _holds_capacity(shape) and rest.split(")")[0] not in aliased
    ]


def chunk_hlo(members: int, num_envs: int, updates_per_step: int = 1, agent: str = "sac") -> str:
    """Optimized HLO of a two-iteration chunk on jax:pendulum, as ``train_fused`` jits it."""
    argv = ["--env", "jax:pendulum", "--num-envs", str(num_envs), "--buffer-size", str(CAPACITY)]
    argv += ["--hidden-dims", "8", "8", "--batch-size", "4", "--learning-starts", "1"]
    argv += ["--updates-per-step", str(updates_per_step), "--no-progress", "--no-tensorboard"]
    train_cfg, agent_cfg = parse_train_args(agent, argv)
    spec = registry.get(agent)
    env, _ = make_jax_envs(train_cfg.env, num_envs, 1, agent_cfg, spec)
    iteration, unit, _ = fused._iteration(spec, agent_cfg, env, train_cfg)

    def init(seeds: jax.Array) -> fused.FusedState:
        states = jax.vmap(lambda s: fused.init_fused_state(spec, agent_cfg, env, s))(seeds)
        return strongly_typed(states)

    states = jax.eval_shape(init, jax.ShapeDtypeStruct((members,), jnp.int32))
    step = jax.ShapeDtypeStruct((), jnp.int32)
    return fused.jit_chunk(iteration, 2, unit).lower(states, step).compile().as_text()


@pytest.mark.parametrize(
    ("members", "num_envs", "updates"),
    [(1, 1, 1), (2, 1, 1), (1, 3, 2)],
    ids=["one-member", "two-members-vmapped", "one-member-3-envs"],
)
def test_fused_chunk_does_not_copy_the_buffer(members, num_envs, updates):
    hlo = chunk_hlo(members, num_envs, updates)
    assert _holds_capacity(hlo.split("ENTRY", 1)[1].split("\n", 1)[0])  # the buffer is an input
    assert buffer_work(hlo) == []
    assert undonated_buffers(hlo) == []
