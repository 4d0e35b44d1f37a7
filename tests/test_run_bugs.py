"""Run directories of offline agents: online fine-tuning trains every network, and offline agents
evaluated on JAX envs see raw observations and can be reopened."""

from __future__ import annotations

import dataclasses
import json
import os

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax.training.train_state import TrainState

from jaxrl.data import Dataset, save_d4rl


def _dataset(path: str, env_id: str, n: int = 400, speed: float = 8.0, seed: int = 0) -> str:
    """Pendulum-shaped rows (cos, sin, angular velocity in [-speed, speed]), episodes of 50."""
    rng = np.random.default_rng(seed)
    theta = rng.uniform(-np.pi, np.pi, n)
    obs = np.stack([np.cos(theta), np.sin(theta), rng.uniform(-speed, speed, n)], -1)
    obs = obs.astype(np.float32)
    action = np.clip(obs[:, 2:] / speed + 0.1 * rng.normal(size=(n, 1)), -1, 1)
    ds = Dataset(
        observations=obs,
        actions=action.astype(np.float32),
        rewards=-np.abs(theta).astype(np.float32),
        next_observations=np.roll(obs, -1, axis=0),
        terminals=np.zeros(n, bool),
        timeouts=np.arange(n) % 50 == 49,
        env_id=env_id,
        ref_returns=(-500.0, 0.0),
    )
    return save_d4rl(ds, path)


def _networks(agent) -> list[TrainState]:
    """Every network of an agent (its ``TrainState`` leaves, in a fixed order)."""
    return [x for x in jax.tree.leaves(agent, is_leaf=lambda x: isinstance(x, TrainState))
            if isinstance(x, TrainState)]  # fmt: skip


def _changed(a, b) -> bool:
    pairs = zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True)
    return any(not np.array_equal(x, y) for x, y in pairs)


def test_finetune_of_a_finished_offline_run_trains_every_network_online(tmp_path):
    """`jaxrl finetune DIR` of IQL trained offline with its cosine schedule: the schedule ended
    with the offline phase (its horizon = the offline steps, saved in config.json), yet every
    network, the actor included, moves online (the IQL authors fine-tune at a constant rate)."""
    from jaxrl.cli import main
    from jaxrl.run.runs import load_run

    path = _dataset(str(tmp_path / "data.hdf5"), "Pendulum-v1")
    out = str(tmp_path / "iql")
    main([
        "train", "iql", "--dataset", path, "--total-steps", "40", "--eval-every", "40",
        "--hidden-dims", "16", "16", "--batch-size", "32", "--eval-episodes", "1",
        "--no-progress", "--no-tensorboard", "--out", out,
    ])  # fmt: skip
    offline = load_run(out)
    assert offline.meta["step"] == 40
    assert offline.agent_config.max_steps == 40  # the schedule ends here
    main(["finetune", out, "--online-steps", "30"])
    online = load_run(out)
    assert online.meta["step"] == 30 and online.meta["phase"] == "online"  # env steps
    before, after = _networks(offline.agent), _networks(online.agent)
    assert len(before) == len(after) == 3  # actor, value, critic
    pairs = enumerate(zip(before, after, strict=True))
    frozen = [i for i, (a, b) in pairs if not _changed(a.params, b.params)]
    assert not frozen, f"networks {frozen} did not train online"


def _past_horizon(agent):
    """``agent`` with every learning-rate schedule run to its end (as after the offline phase)."""

    def finish(x):
        if isinstance(x, optax.ScaleByScheduleState):
            return x._replace(count=jnp.full_like(x.count, 10**6))
        return x

    is_schedule = lambda x: isinstance(x, optax.ScaleByScheduleState)  # noqa: E731
    return jax.tree.map(finish, agent, is_leaf=is_schedule)


def _moves(state: TrainState) -> bool:
    """Whether an optimizer step of ``state`` with a gradient of ones changes its parameters."""
    grads = jax.tree.map(jnp.ones_like, state.params)
    updates, _ = state.tx.update(grads, state.opt_state, state.params)
    return any(bool(jnp.any(u != 0)) for u in jax.tree.leaves(updates))


@pytest.mark.parametrize(
    ("agent", "config"),
    [
        ("iql", {"hidden_dims": (8,)}),
        ("idql", {"hidden_dims": (8,), "actor_hidden_dims": (8, 8), "time_dim": 4}),
        ("diffusion-ql", {"hidden_dims": (8,), "time_dim": 4}),
    ],
)
def test_online_agent_trains_every_network_of_an_agent_with_a_schedule(agent, config):
    """The online phase's agent (``online_agent``): by default every network steps at its base
    rate; ``online_lr_schedule='cosine'`` starts a new decay over the online updates. Every
    pretrained leaf (parameters, Adam's moments and count, data statistics) carries over."""
    from jaxrl import registry
    from jaxrl.loops import TrainConfig
    from jaxrl.run.runs import online_agent, online_config

    spec = registry.get(agent)
    cfg = spec.config(**config, max_steps=10, utd_ratio=2)
    obs, act = jnp.zeros(3), jnp.zeros(1)
    pretrained = _past_horizon(spec.agent.create(cfg, obs, act, 0))
    networks = _networks(pretrained)
    frozen = [i for i, s in enumerate(networks) if not _moves(s)]
    assert frozen  # the schedules' end: what fine-tuning used to continue with
    train = TrainConfig(online_steps=50)
    cosine = dataclasses.replace(train, online_lr_schedule="cosine")
    assert online_config(spec, cfg, train).max_steps == 0  # default: no decay
    assert online_config(spec, cfg, cosine).max_steps == 100  # 50 env steps x utd 2
    for t in (train, cosine):
        online = online_agent(spec, pretrained, cfg, t, obs, act)
        assert all(_moves(s) for s in _networks(online))
        for a, b in zip(networks, _networks(online), strict=True):
            chex.assert_trees_all_equal(a.params, b.params)
            chex.assert_trees_all_equal(a.opt_state.inner_state[0], b.opt_state.inner_state[0])
        chex.assert_trees_all_equal(online.norm, pretrained.norm)


def test_offline_agent_on_a_jax_env_is_evaluated_on_raw_observations(tmp_path, capsys):
    """BC (``normalize_observations``: dataset statistics inside the agent) trained with
    ``--env jax:...`` is evaluated on the env's own observations, which here leave [-10, 10]
    (gravity x10 spins the pendulum well past 10 rad/s), and its run directory reopens:
    ``jaxrl eval`` and ``dataset collect --policy`` load it."""
    from jaxrl.cli import main
    from jaxrl.envs.jax_envs import make_jax_env
    from jaxrl.loops.evaluation import evaluate_jax
    from jaxrl.run.runs import load_run

    env_id = "jax:pendulum?g=100&max_speed=100&max_torque=20"
    path = _dataset(str(tmp_path / "fast.hdf5"), env_id, speed=30.0)
    out = str(tmp_path / "bc")
    main([
        "train", "bc", "--dataset", path, "--env", env_id, "--total-steps", "30",
        "--eval-every", "30", "--eval-episodes", "2", "--hidden-dims", "16", "16",
        "--batch-size", "32", "--out", out, "--no-progress", "--no-tensorboard",
    ])  # fmt: skip
    with open(os.path.join(out, "summary.json")) as f:
        logged = json.load(f)["final_eval_return_mean"]
    capsys.readouterr()
    main(["eval", out, "--episodes", "2"])
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["step"] == 30
    run = load_run(out)
    raw_env = make_jax_env(env_id, 2)
    clipping_env = make_jax_env(env_id, 2, normalize_obs=True)
    clipping_env.update = False  # what the evaluation used before: fresh statistics, clip at 10

    def evaluator(env):
        fn = jax.jit(lambda a, seed: evaluate_jax(a, env, jax.random.key(seed)))
        return lambda seed: float(jnp.mean(fn(run.agent, seed)))

    raw, clipped = evaluator(raw_env), evaluator(clipping_env)
    seed = run.train_config.seed
    # Clipping changes the returns: the observations leave [-10, 10] (without that, the frozen
    # fresh statistics, mean 0 and variance 1, give the same float32 observations).
    assert abs(clipped(seed + 10_000) - raw(seed + 10_000)) > 1e-3
    # The offline loop's evaluation and `jaxrl eval` both ran on raw observations.
    np.testing.assert_allclose(logged, raw(seed + 10_000), rtol=1e-4)
    np.testing.assert_allclose(result["return_mean"], raw(seed + 20_000), rtol=1e-4)

    from jaxrl.run.collect import collect

    ds = collect("Pendulum-v1", "medium", 20, policy=out, ref_min_return=-1.0, ref_max_return=0.0)
    assert len(ds) == 20 and ds.metadata["algorithm"] == "bc"
