"""Which agent-config fields a sweep can vary inside one vmapped program (leaves) and which not.

A field is a **leaf** when changing it changes only leaf values of a created agent, with the
same shapes, and no loop reads it; every other field is **static** (see ``jaxrl.tune.grid``).
The classification is made by creating agents, so it holds for any registered agent.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl.buffers import buffer_from_arrays
from jaxrl.config import ConfigError
from jaxrl.registry import AgentSpec
from jaxrl.types import Rollout, Transition

LOOP_FIELDS = (
    "buffer_size",
    "batch_size",
    "utd_ratio",
    "learning_starts",
    "normalize_observations",
)
"""Agent-config fields the training loops read: always static."""


def format_value(v: Any) -> str:
    """A grid value as it appears in setting labels and messages (tuples as ``256:256``)."""
    if isinstance(v, tuple):
        return ":".join(map(str, v))
    return repr(v) if isinstance(v, float) else str(v)


# ------------------------------------------------------------------------- leaf or static


def loop_fields(spec: AgentSpec) -> set[str]:
    """The agent-config fields the loops read for ``spec`` (static whatever create does)."""
    fields = set(LOOP_FIELDS) | {spec.horizon_field, spec.sequence_field, spec.refit_field}
    fields -= {None}
    if spec.needs_mc_return:
        fields.add("discount")  # the dataset's Monte-Carlo returns are computed with it
    return fields


def graft(agent: Any, config: Any) -> Any:
    """``agent`` carrying ``config`` as its static field (its leaves unchanged)."""
    return agent.replace(config=config)


def _raw(x: Any) -> np.ndarray:
    """A leaf as numpy (PRNG keys as their key data)."""
    x = jnp.asarray(x)
    if jnp.issubdtype(x.dtype, jax.dtypes.prng_key):
        x = jax.random.key_data(x)
    return np.asarray(x)


def _layout(tree: Any) -> list[tuple]:
    """Every leaf's path, shape and dtype (static fields such as optimizers are left out)."""
    flat, _ = jax.tree_util.tree_flatten_with_path(tree)
    return [(path, jnp.shape(x), jnp.result_type(x)) for path, x in flat]


def layout_matches(a: Any, b: Any) -> bool:
    """True when two agents have the same leaf paths, shapes and dtypes."""
    return _layout(a) == _layout(b)


def _leaves_differ(a: Any, b: Any) -> bool:
    return any(
        not np.array_equal(_raw(x), _raw(y))
        for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True)
    )


def classify(
    spec: AgentSpec, base: Any, grid: dict[str, tuple], obs: Any, act: Any
) -> dict[str, str]:
    """``{field: "leaf" | "static"}`` for the grid's fields, by creating agents with each value.

    A field is a leaf when every value gives an agent of the base config's structure and
    shapes, some value changes a leaf, no loop reads the field (``loop_fields``) and one update
    of an agent carrying the base config as its static field equals one update of the agent
    created with the value (``_update_reads_static``): update code that reads the field from
    the static config would otherwise see the program's shared value.
    """
    reference = spec.agent.create(base, obs, act, 0)
    kinds, candidates = {}, {}
    for name, values in grid.items():
        kind = "static" if name in loop_fields(spec) else None
        changed = None  # the first config whose agent's leaves differ from the reference
        for value in values if kind is None else ():
            try:
                config = dataclasses.replace(base, **{name: value})
            except (TypeError, ValueError) as e:
                raise ConfigError(f"--grid {name}={format_value(value)}: {e}") from None
            agent = graft(spec.agent.create(config, obs, act, 0), base)
            if not layout_matches(agent, reference):
                kind = "static"
                break
            if changed is None and _leaves_differ(agent, reference):
                changed = config
        if kind is None and changed is not None:
            candidates[name] = changed
        kinds[name] = kind or ("leaf" if changed is not None else "static")
    for name in _read_from_static(spec, base, candidates, obs, act):
        kinds[name] = "static"  # the update code reads it from the config: not a leaf
    return kinds


def _read_from_static(
    spec: AgentSpec, base: Any, candidates: dict[str, Any], obs: Any, act: Any
) -> list[str]:
    """The leaf candidates (``{field: config with a changed value}``) that ``update`` reads.

    Checks all fields at once first (one compile) and one by one only when that differs.
    """
    if not candidates:
        return []
    if len(candidates) > 1:
        try:
            joint = dataclasses.replace(base, **{n: getattr(c, n) for n, c in candidates.items()})
        except (TypeError, ValueError):
            joint = None  # the values do not combine into one valid config
        if joint is not None and not _update_reads_static(spec, base, joint, obs, act):
            return []
    return [n for n, c in candidates.items() if _update_reads_static(spec, base, c, obs, act)]


def _example_batch(spec: AgentSpec, agent: Any, obs: Any, act: Any, key: jax.Array) -> Any:
    """A random batch of the shape one ``agent.update`` takes (a rollout for on-policy agents).

    Agents that refit on the whole buffer (``refit_field``) take a buffer of such rows.
    """
    k_obs, k_act, k_rew, k_next, k_policy = jax.random.split(key, 5)
    if spec.kind == "on-policy":
        num_envs = 64
        steps = agent.rollout_length(num_envs)
        o = jax.random.normal(k_obs, (steps, num_envs, *jnp.shape(obs)))
        action, extras = jax.vmap(agent.policy_step)(o, jax.random.split(k_policy, steps))
        zeros = jnp.zeros((steps, num_envs))
        reward = jax.random.normal(k_rew, (steps, num_envs))
        next_obs = jax.random.normal(k_next, o.shape)
        return Rollout(o, action, extras, reward, zeros, zeros, next_obs)
    size = (int(agent.config.batch_size),)
    if spec.sequence_field is not None:
        size += (int(spec.sequence_length(agent.config)),)
    o = jax.random.normal(k_obs, (*size, *jnp.shape(obs)))
    a = jax.random.uniform(k_act, (*size, *jnp.shape(act)), minval=-1.0, maxval=1.0)
    extra = {}
    if spec.needs_next_action:
        extra = {"next_action": jnp.roll(a, 1, axis=0), "next_action_mask": jnp.ones(size)}
    if spec.needs_mc_return:
        extra["mc_return"] = jax.random.normal(k_policy, size)
    reward = jax.random.normal(k_rew, size)
    rows = Transition(o, a, reward, jax.random.normal(k_next, o.shape), jnp.zeros(size), **extra)
    return rows if spec.refit_field is None else buffer_from_arrays(rows)


@functools.cache
def _jitted_update(agent_cls: type) -> Any:
    """One jitted ``update`` per agent class, so the base config's program compiles once."""
    return jax.jit(agent_cls.update)


def _update_reads_static(spec: AgentSpec, base: Any, config: Any, obs: Any, act: Any) -> bool:
    """True when ``update`` reads a field of ``config`` from the static config, not the leaves.

    A member of a vmapped program is created from its own ``config`` and then carries the
    program's shared ``base`` as its static field (``graft``). That is only right when one
    update of the grafted agent equals one update of the agent created with ``config``.
    """
    own = spec.agent.create(config, obs, act, 0)
    batch = _example_batch(spec, own, obs, act, jax.random.key(1))
    update = _jitted_update(type(own))
    mine, _ = update(own, batch)
    grafted, _ = update(graft(own, base), batch)
    return _leaves_differ(mine, grafted)


def _probe_value(value: Any) -> Any:
    """A nearby valid-looking value to classify a field with (None: cannot probe)."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1
    if isinstance(value, float):
        return value * 0.9 if value else 0.1
    if isinstance(value, tuple) and value and all(isinstance(v, int) for v in value):
        return tuple(v + 1 for v in value)
    return None


def field_kinds(spec: AgentSpec, base: Any, obs: Any, act: Any) -> dict[str, str]:
    """Every config field of ``spec`` classified (``--list-fields``): leaf, static or untested.

    Each field is probed with a nearby value (``_probe_value``); fields whose probe is invalid
    or that have no numeric value (strings, ``None``) are classified when swept.
    """
    kinds = {}
    for f in dataclasses.fields(base):
        probe = _probe_value(getattr(base, f.name))
        if f.name in loop_fields(spec):
            kinds[f.name] = "static"
        elif probe is None:
            kinds[f.name] = "classified when swept"
        else:
            try:
                kinds |= classify(spec, base, {f.name: (probe,)}, obs, act)
            except (ValueError, TypeError):  # the probe is not a valid value of the field
                kinds[f.name] = "classified when swept"
    return kinds


__all__ = [
    "LOOP_FIELDS",
    "classify",
    "field_kinds",
    "format_value",
    "graft",
    "layout_matches",
    "loop_fields",
]
