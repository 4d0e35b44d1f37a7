"""The fused loop on JAX envs: acting, simulating, storing and learning as one XLA program.

Each chunk is ``lax.scan`` over loop iterations, vmapped over members (seeds): off-policy agents
act, step, add to their buffer and take ``updates_per_step`` gradient steps per iteration;
on-policy agents collect a rollout and update on it. Between chunks the host logs, evaluates,
checkpoints and advances the progress bar (the ``Harness``).
"""

from __future__ import annotations

from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from jaxrl.buffers import MEMBERS, BufferState, buffer_add, make_replay_buffer
from jaxrl.loops import mesh
from jaxrl.loops.acting import acting
from jaxrl.loops.config import TrainConfig
from jaxrl.loops.device import (
    NONFINITE,
    compile_cache,
    guarded_update,
    strongly_typed,
    update_step,
)
from jaxrl.loops.evaluation import evaluate_jax
from jaxrl.loops.fused_metrics import chunk_metrics, episode_stats, member_rows
from jaxrl.loops.harness import Harness
from jaxrl.loops.mesh import host_array, member
from jaxrl.loops.video import Videos
from jaxrl.registry import AgentSpec, refit_due
from jaxrl.types import Rollout, Transition


class FusedState(struct.PyTreeNode):
    """Everything the fused loop carries for one member (what its checkpoint stores).

    Attributes:
        agent: the agent.
        buffer: replay buffer (None for on-policy agents).
        env: the training envs' state (simulators, wrappers such as the observation normalizer,
            and any per-episode randomization).
        rng: loop RNG (exploration, uniform warm-up actions, minibatch sampling).
        nonfinite: updates after which the agent held a NaN.
        plan: a planner's carry between env steps (an empty tuple for policies).
    """

    agent: Any
    buffer: BufferState | None
    env: Any
    rng: jax.Array
    nonfinite: jax.Array = np.int32(0)
    plan: Any = ()


def init_fused_state(spec: AgentSpec, agent_config: Any, env: Any, seed: Any) -> FusedState:
    """Fresh state for one member; ``seed`` may be traced, so members can be created under vmap."""
    obs = jnp.zeros(env.observation_size, jnp.float32)
    act = jnp.zeros(env.action_size, jnp.float32)
    agent = spec.agent.create(agent_config, obs, act, seed)
    key = jax.random.fold_in(jax.random.key(seed), 7)
    k_env, k_loop = jax.random.split(key)
    buffer = None
    if spec.kind != "on-policy":
        source = jnp.float32(0) if spec.needs_source else None
        example = Transition(obs, act, jnp.float32(0), obs, jnp.float32(0), from_dataset=source)
        buffer = make_replay_buffer(agent_config.buffer_size).init(example)
    plan = acting(spec).init(agent, env.num_envs)
    return FusedState(agent, buffer, env.reset(k_env), k_loop, jnp.zeros((), jnp.int32), plan)


def _off_policy_iteration(
    state: FusedState,
    step: jax.Array,
    *,
    env: Any,
    num_updates: int,
    explore: Any,
    sequence: tuple[int, int] | None,
    burst: bool,
    on_nonfinite: str = "stop",
    refit_every: int | None = None,
    prior: BufferState | None = None,
    prior_ratio: float = 0.0,
) -> tuple[FusedState, tuple[Any, ...]]:
    """Act in every env, step, add the transitions, then ``num_updates`` gradient steps.

    ``explore`` acts (``jaxrl.loops.acting``); ``sequence`` makes minibatches of consecutive steps;
    with ``burst``, the iteration where learning starts first runs ``learning_starts`` updates.
    ``on_nonfinite``: the NaN guard's mode (``guarded_update``). With ``refit_every`` the
    update is instead one call on the whole buffer when ``refit_due`` (``AgentSpec.refit_field``).
    With ``prior`` (a dataset's device buffer, shared by every member) each minibatch holds
    ``round(prior_ratio * batch_size)`` of its rows first, then the replay buffer's, as in the
    host loop.
    """
    acfg = state.agent.config
    rng, k_act, k_rand = jax.random.split(state.rng, 3)
    obs = state.env.obs
    warmup = jax.random.uniform(k_rand, (env.num_envs, env.action_size), minval=-1.0, maxval=1.0)

    def act(_: Any) -> tuple[jax.Array, Any]:
        return explore(state.agent, state.plan, obs, state.env.time == 0, k_act)

    # A conditional (the step is the same for every member), so warm-up steps do not plan.
    action, plan = jax.lax.cond(
        step < acfg.learning_starts, lambda _: (warmup, state.plan), act, None
    )
    env_state = env.step(state.env, action)
    # Online rows are marked as such when the buffer has the field (registry ``needs_source``).
    online = None if state.buffer.data.from_dataset is None else 0.0 * env_state.reward
    transition = Transition(
        obs, action, env_state.reward, env_state.info["final_obs"], env_state.terminated,
        from_dataset=online,
    )  # fmt: skip
    buffer = buffer_add(state.buffer, transition)

    def learn(
        agent: Any, rng: jax.Array, num: int = num_updates
    ) -> tuple[Any, jax.Array, dict[str, jax.Array]]:
        if refit_every is not None:
            agent, info, bad = guarded_update(agent, buffer, on_nonfinite)
            return agent, rng, {**info, NONFINITE: bad.astype(jnp.int32)}
        sizes = {"num_updates": num, "batch_size": acfg.batch_size, "sequence": sequence}
        mix = {"prior_ratio": prior_ratio}
        return update_step(agent, rng, buffer, prior, **sizes, **mix, on_nonfinite=on_nonfinite)

    def wait(agent: Any, rng: jax.Array) -> tuple[Any, jax.Array, dict[str, jax.Array]]:
        """Before ``learning_starts``: no update, and ``learn``'s metrics as zeros."""
        shapes = jax.eval_shape(learn, agent, rng)[2]
        return agent, rng, jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)

    agent, bad = state.agent, state.nonfinite
    if burst and acfg.learning_starts > 0:

        def pretrain(agent: Any, rng: jax.Array) -> tuple[Any, jax.Array, jax.Array]:
            agent, rng, info = learn(agent, rng, acfg.learning_starts)
            return agent, rng, info[NONFINITE]

        def no_pretrain(agent: Any, rng: jax.Array) -> tuple[Any, jax.Array, jax.Array]:
            return agent, rng, jnp.zeros((), jnp.int32)

        first_learn = (step >= acfg.learning_starts) & (step < acfg.learning_starts + env.num_envs)
        agent, rng, pre_bad = jax.lax.cond(first_learn, pretrain, no_pretrain, agent, rng)
        bad = bad + pre_bad
    if refit_every is None:
        updated = step >= acfg.learning_starts
    else:  # a conditional on the loop's step alone stays one under vmap over members
        updated = refit_due(step + env.num_envs, env.num_envs, acfg.learning_starts, refit_every)
    agent, rng, info = jax.lax.cond(updated, learn, wait, agent, rng)
    new = FusedState(agent, buffer, env_state, rng, bad + info.pop(NONFINITE), plan)
    return new, (info, updated, *episode_stats(env_state))


def _on_policy_iteration(
    state: FusedState,
    step: jax.Array,
    *,
    env: Any,
    rollout_length: int,
    on_nonfinite: str = "stop",
    prior: None = None,
) -> tuple[FusedState, tuple[Any, ...]]:
    """Collect ``rollout_length`` steps in every env, then one (guarded) update on that rollout."""
    del step, prior  # on-policy updates learn from their own rollout only

    def env_step(carry: tuple[Any, jax.Array], _: Any) -> tuple[Any, Any]:
        env_state, rng = carry
        rng, key = jax.random.split(rng)
        obs = env_state.obs
        action, extras = state.agent.policy_step(obs, key)
        env_state = env.step(env_state, action)
        rollout = Rollout(
            obs=obs,
            action=action,
            extras=extras,
            reward=env_state.reward,
            terminated=env_state.terminated,
            truncated=env_state.truncation,
            next_obs=env_state.info["final_obs"],
        )
        return (env_state, rng), (rollout, episode_stats(env_state))

    (env_state, rng), (rollout, (sums, count)) = jax.lax.scan(
        env_step, (state.env, state.rng), None, length=rollout_length
    )
    agent, info, bad = guarded_update(state.agent, rollout, on_nonfinite)
    bad = state.nonfinite + bad.astype(jnp.int32)
    new = state.replace(agent=agent, env=env_state, rng=rng, nonfinite=bad)
    return new, (info, jnp.bool_(True), jax.tree.map(jnp.sum, sums), count.sum())


def _chunk(
    states: FusedState,
    step: jax.Array,
    prior: BufferState | None = None,
    *,
    iteration: Any,
    num_iters: int,
    steps_per_iter: int,
) -> tuple[FusedState, dict[str, jax.Array]]:
    """``num_iters`` loop iterations of every member (leading axis of ``states``) in one program.

    ``prior``, a dataset's buffer, is an argument (not a constant folded into the program) that
    every member reads unbatched. The replay buffer is written in place (``jit_chunk`` donates
    ``states``): the scan carries it in one shape throughout, so no iteration copies it
    (tests/test_fused_copies.py checks the compiled program).
    """
    single = jax.tree.leaves(states)[0].shape[0] == 1
    if prior is not None:
        iteration = partial(iteration, prior=prior)
    # One member runs unbatched (vmap over a size-1 axis makes XLA emit batched matmuls and
    # scatters that are measurably slower on CPU). The size-1 axis is dropped outside the scan:
    # squeezing and re-adding it inside the loop body let XLA fuse the buffer's one-row write
    # (a dynamic-update-slice) twice, once per shape, and copy the whole buffer for each.
    run = iteration if single else jax.vmap(iteration, in_axes=(0, None), spmd_axis_name=MEMBERS)
    carry = jax.tree.map(lambda x: x[0], states) if single else states

    def body(carry: tuple[Any, jax.Array], _: Any) -> tuple[Any, Any]:
        states, step = carry
        new_states, out = run(states, step)
        # Keep the carry's types exactly (simulators may return weakly typed leaves, e.g. Brax's
        # reward), so the next chunk call does not recompile.
        states = jax.tree.map(
            lambda n, o: jax.lax.convert_element_type(n, o.dtype), new_states, states
        )
        return (states, step + steps_per_iter), out

    (states, _), outs = jax.lax.scan(body, (carry, step), None, length=num_iters)
    if single:  # the member axis back, after the scan's iteration axis
        states = jax.tree.map(lambda x: x[None], states)
        outs = jax.tree.map(lambda x: x[:, None], outs)
    return states, chunk_metrics(outs, states.nonfinite)


def _iteration(
    spec: AgentSpec, agent_config: Any, env: Any, cfg: TrainConfig, prior_ratio: float = 0.0
) -> tuple:
    """``(iteration, env steps per iteration, gradient steps per iteration)`` of ``spec``.

    ``prior_ratio``: the share of each minibatch drawn from a dataset passed to the chunk.
    """
    n, mode = env.num_envs, cfg.on_nonfinite
    if spec.kind == "on-policy":
        rollout_length = agent_config.rollout_length(n)
        iteration = partial(
            _on_policy_iteration, env=env, rollout_length=rollout_length, on_nonfinite=mode
        )
        return iteration, rollout_length * n, 1
    refit_every = spec.refit_every(agent_config)
    num_updates = cfg.updates_per_step or agent_config.utd_ratio * n
    length = spec.sequence_length(agent_config)
    sequence = None if length is None else (length, n)  # one env's steps are n rows apart
    iteration = partial(
        _off_policy_iteration,
        env=env,
        num_updates=num_updates,
        explore=acting(spec).explore,
        sequence=sequence,
        burst=spec.burst_at_start,
        on_nonfinite=mode,
        refit_every=refit_every,
        prior_ratio=prior_ratio,
    )
    return iteration, n, 0 if refit_every else num_updates


def jit_chunk(iteration: Any, num_iters: int, steps_per_iter: int, shardings: Any = None) -> Any:
    """``(states, step, prior=None) -> (states, metrics)``: ``num_iters`` iterations, one program.

    ``states`` is donated: without that, XLA must keep the input buffers intact and the first
    write to the replay buffer copies all of it. ``shardings``: where states live (kept).
    """
    chunk = partial(_chunk, iteration=iteration, num_iters=num_iters, steps_per_iter=steps_per_iter)
    placed = {} if shardings is None else {"out_shardings": (shardings, None)}
    return jax.jit(chunk, donate_argnums=0, **placed)


def state_shardings(layout: mesh.Layout, states: FusedState, num_envs: int) -> FusedState:
    """Where each array of stacked fused states lives (``Layout.stacked``).

    Members over the members axis; env copies and buffer rows over the data axis.
    """
    rows = None if states.buffer is None else jax.tree.leaves(states.buffer.data)[0].shape[1]
    split = FusedState(agent=0, buffer=rows, env=num_envs, rng=0, nonfinite=0, plan=num_envs)
    return layout.stacked(states, split)


def train_fused(
    spec: AgentSpec,
    agent_config: Any,
    env: Any,
    eval_env: Any,
    cfg: TrainConfig,
    outs: list[str],
    *,
    seeds: list[int] | None = None,
    agents: Any = None,
    prior: BufferState | None = None,
    prior_ratio: float = 0.5,
    step_offset: int = 0,
    score_fn: Any = None,
) -> list[dict[str, Any]]:
    """Train ``len(outs)`` members on a JAX env, one program per chunk.

    Each member writes its own run directory (``outs[i]``), which is also a valid single-seed
    run: it resumes and evaluates on its own. As in the host loop, ``prior`` (a dataset) joins
    every minibatch, and ``agents`` with ``step_offset`` continue an offline phase online.

    Args:
        spec: the agent's registry entry.
        agent_config: the config every member shares (static structure).
        env: the training envs (``cfg.num_envs`` copies per member).
        eval_env: the evaluation envs.
        cfg: loop options.
        outs: one run directory per member (``config.json`` already written).
        seeds: each member's seed (default ``cfg.seed + i``).
        agents: the members' agents stacked on a leading axis, when they differ in more than
            their seed (a sweep: ``jaxrl.tune.grid.member_agents``) or were pretrained offline;
            default: created from ``agent_config`` and the seeds.
        prior: offline data (a full buffer state with the replay buffer's fields), or None.
        prior_ratio: fraction of each minibatch drawn from ``prior``.
        step_offset: offline gradient steps that came before (numbering of rows and checkpoints).
        score_fn: ``return -> normalized score or None`` (e.g. ``Dataset.normalized_score``).

    Returns:
        The per-member summaries (also written to ``outs[i]/summary.json``).
    """
    layout = mesh.make_layout(cfg.devices, len(outs))
    batch = {} if spec.kind == "on-policy" else {"batch_size": agent_config.batch_size}
    what = f"--devices {cfg.devices} on {cfg.env}"
    mesh.check_data_parallel(spec, layout, what, num_envs=env.num_envs, **batch)
    ratio = prior_ratio if prior is not None else 0.0
    iteration, unit, updates_per_iter = _iteration(spec, agent_config, env, cfg, ratio)
    seeds = list(seeds) if seeds is not None else [cfg.seed + i for i in range(len(outs))]
    h = Harness(
        spec.name, cfg, outs, stacked=True, seeds=seeds, step_offset=step_offset, score_fn=score_fn
    )
    seed_array = jnp.asarray(seeds, dtype=jnp.int32)
    states = jax.jit(jax.vmap(lambda s: init_fused_state(spec, agent_config, env, s)))(seed_array)
    if agents is not None:
        states = states.replace(agent=agents)
    states, _ = h.resume(strongly_typed(states))
    if (done := h.completed()) is not None:
        return done
    shardings = state_shardings(layout, states, env.num_envs)
    states = layout.place(states, shardings)
    if prior is not None:  # every device holds the whole dataset
        prior = layout.place(prior, layout.sharding())
    run_chunk = compile_cache(lambda k: layout.traced(jit_chunk(iteration, k, unit, shardings)))
    policy = acting(spec)
    eval_fn = jax.jit(jax.vmap(lambda a, k, s: evaluate_jax(a, eval_env, k, s, policy)))
    videos = Videos(cfg, h.loggers, eval_env, policy, step_offset)
    # Each member evaluates with its own seed's key, as its single run would.
    eval_key = jax.vmap(lambda s: jax.random.key(s + 10_000))(seed_array)
    eval_key = layout.place(eval_key, layout.stacked(eval_key))
    with h:
        while h.running():
            iters = h.cadence.chunk(h.step, unit)
            states, metrics = run_chunk(iters)(states, jnp.int32(h.step), prior)
            updates = iters * updates_per_iter
            if (every := spec.refit_every(agent_config)) is not None:
                ends = range(h.step + unit, h.step + (iters + 1) * unit, unit)
                learning_starts = agent_config.learning_starts
                updates = sum(bool(refit_due(s, unit, learning_starts, every)) for s in ends)
            if (
                spec.burst_at_start
                and h.step <= agent_config.learning_starts < h.step + iters * unit
            ):
                updates += agent_config.learning_starts  # the pretraining burst ran in this chunk
            at = h.advance(iters * unit, updates)
            metrics = jax.tree.map(host_array, metrics)
            learned = spec.kind == "on-policy" or h.step - unit >= agent_config.learning_starts
            rows = member_rows(metrics, learned, h.rate())
            if at.eval:
                obs_stats = states.env.extras.get("obs_stats")
                h.record_eval(mesh.host_array(eval_fn(states.agent, eval_key, obs_stats)), *rows)
                for i, s in enumerate(seeds):
                    stats = None if obs_stats is None else member(obs_stats, i)
                    videos(h.step, member(states.agent, i), i, s + 10_000, stats)
            if at.log:
                h.log(*rows)
            if at.save:
                h.save(states)
        h.save_if_stopped(states)
    if jax.process_count() > 1 and layout.members == 1:
        print(f"process {jax.process_index()}: {mesh.replica_checksum(states.agent)}")
    extra = None
    if prior is not None or step_offset:
        extra = {"dataset": cfg.dataset, "offline_steps": step_offset, "online_steps": h.step}
    return h.finish(extra)


__all__ = ["FusedState", "init_fused_state", "train_fused"]
