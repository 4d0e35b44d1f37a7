"""Vmapped programs: the members (seeds x settings) of one program trained as one XLA program.

On JAX envs (the fused loop) and for offline agents (the dataset already on the device) the
members of a program are created from their own configs, given the program's shared static
config (``jaxrl.run.fields.graft``) and stacked on a leading axis; the loop then vmaps over
them, so a program compiles once for all its members. ``jaxrl train --num-seeds`` and grid
sweeps (``jaxrl.tune.grid``) both train through here.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl.errors import ConfigError
from jaxrl.registry import AgentSpec
from jaxrl.run.fields import graft, layout_matches
from jaxrl.run.members import Member, Program


def member_agents(spec: AgentSpec, program: Program, make: Any) -> Any:
    """The program's members' agents, each made by ``make(config, seed)``, stacked."""
    agents = [graft(make(m.config, m.seed), program.config) for m in program.members]
    for m, agent in zip(program.members, agents, strict=True):
        if not layout_matches(agent, agents[0]):
            raise ConfigError(
                f"Member {m.label} has another structure than {program.members[0].label}; a "
                "static field varies inside one program (report this: the classification "
                "missed it)."
            )
    # The members' static parts (configs, optimizer transforms, module definitions) are equal
    # but distinct objects: the first member's stand for all.
    stacked = [jnp.stack(xs) for xs in zip(*map(jax.tree.leaves, agents), strict=True)]
    return jax.tree.unflatten(jax.tree.structure(agents[0]), stacked)


def member_train_config(train_cfg: Any, member: Member) -> Any:
    """``train_cfg`` for one member: its seed and run directory, one seed per run."""
    return dataclasses.replace(train_cfg, seed=member.seed, out=member.out, num_seeds=1)


def _prepare(spec: AgentSpec, train_cfg: Any, member: Member, extra: dict | None = None) -> None:
    from jaxrl.loops import prepare_run_dir, run_config

    config = run_config(spec.name, member.config, member_train_config(train_cfg, member))
    prepare_run_dir(member.out, config | (extra or {}))


def run_fused(spec: AgentSpec, train_cfg: Any, program: Program) -> list[dict[str, Any]]:
    """Train a program's members on a JAX env as one vmapped fused loop."""
    from jaxrl.loops import train_fused
    from jaxrl.run.runs import jax_num_envs, make_jax_envs

    num_envs = jax_num_envs(spec, train_cfg.num_envs)
    cfg = dataclasses.replace(train_cfg, num_envs=num_envs, num_seeds=1)
    env, eval_env = make_jax_envs(cfg.env, num_envs, cfg.eval_episodes, program.config, spec)
    members = [
        dataclasses.replace(m, config=spec.with_actor_observation(m.config, env))
        for m in program.members
    ]
    config = spec.with_actor_observation(program.config, env)
    program = dataclasses.replace(program, config=config, members=members)
    for m in program.members:
        _prepare(spec, cfg, m)
    obs = jnp.zeros(env.observation_size, jnp.float32)
    act = jnp.zeros(env.action_size, jnp.float32)
    agents = member_agents(spec, program, lambda c, s: spec.agent.create(c, obs, act, s))
    outs = [m.out for m in program.members]
    seeds = [m.seed for m in program.members]
    return train_fused(spec, program.config, env, eval_env, cfg, outs, seeds=seeds, agents=agents)


def run_offline(spec: AgentSpec, train_cfg: Any, program: Program) -> list[dict[str, Any]]:
    """Train a program's offline members on the shared device-resident dataset, vmapped."""
    from jaxrl.loops.evaluation import close_envs
    from jaxrl.run.offline import setup_offline

    s = setup_offline(spec, program.config, train_cfg, program.members[0].out)
    try:
        return _run_offline(spec, program, s)
    finally:
        close_envs(s.eval_env)


def _run_offline(spec: AgentSpec, program: Program, s: Any) -> list[dict[str, Any]]:
    """``run_offline`` once its setup ``s`` (dataset, eval env) is made."""
    from jaxrl.loops import train_offline
    from jaxrl.run.offline import with_data_norm

    horizon = {}
    if spec.horizon_field is not None:  # the schedule's horizon the setup resolved
        horizon = {spec.horizon_field: getattr(s.agent_config, spec.horizon_field)}
    config = dataclasses.replace(s.agent_config, **horizon)
    program = Program(
        config,
        program.static,
        [
            dataclasses.replace(m, config=dataclasses.replace(m.config, **horizon))
            for m in program.members
        ],
    )
    cfg = s.train_config
    for m in program.members:
        _prepare(spec, cfg, m, {"dataset_info": s.run_config_extras()})
    obs = np.zeros(s.dataset.obs_dim, np.float32)
    act = np.zeros(s.dataset.action_dim, np.float32)

    def make(c: Any, seed: int) -> Any:
        agent = spec.agent.create(c, obs, act, seed)
        return with_data_norm(spec, agent, s.dataset, s.action_low, s.action_high)

    agents = member_agents(spec, program, make)
    outs = [m.out for m in program.members]
    seeds = [m.seed for m in program.members]
    score = s.dataset.normalized_score
    return train_offline(spec, agents, s.data, s.eval_env, cfg, outs, seeds=seeds, score_fn=score)
