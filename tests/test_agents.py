"""Agent-level tests: the pytree interface (scan, vmap over seeds, determinism) and learning."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl import registry
from jaxrl.agents import SAC, SACConfig, TD3Config
from jaxrl.errors import ConfigError
from jaxrl.loops import TrainConfig
from jaxrl.run import train
from jaxrl.types import Transition

OBS_DIM, ACT_DIM, B = 5, 2, 32


def _batches(num: int, seed: int = 0) -> Transition:
    rng = np.random.default_rng(seed)
    f = lambda *s: jnp.asarray(rng.normal(size=(num, *s)), jnp.float32)  # noqa: E731
    return Transition(
        obs=f(B, OBS_DIM),
        action=jnp.tanh(f(B, ACT_DIM)),
        reward=f(B),
        next_obs=f(B, OBS_DIM),
        terminal=jnp.asarray(rng.random((num, B)) < 0.1, jnp.float32),
    )


def _create(name, seed, **kw):
    agent_cls, config_cls = registry.get(name).agent, registry.get(name).config
    cfg = config_cls(hidden_dims=(32, 32), **kw)
    return agent_cls.create(cfg, jnp.zeros(OBS_DIM), jnp.zeros(ACT_DIM), seed)


def _create_jit(name, seeds):
    """Create agents for an array of seeds in one compiled, vmapped call."""
    return jax.jit(jax.vmap(lambda s: _create(name, s)))(jnp.asarray(seeds))


def _member(tree, i):
    return jax.tree.map(lambda x: x[i], tree)


def _numeric(agent):
    keys_as_data = jax.tree.map(
        lambda x: (
            jax.random.key_data(x)
            if jax.dtypes.issubdtype(getattr(x, "dtype", None), jax.dtypes.prng_key)
            else x
        ),
        agent,
    )
    return jax.tree.leaves(keys_as_data)


def _run(agent, batches):
    return jax.lax.scan(lambda a, b: a.update(b), agent, batches)


@pytest.mark.parametrize("name", ["sac", "td3"])
def test_scan_matches_python_loop_and_is_deterministic(name):
    batches = _batches(6)
    agents = _create_jit(name, [0, 0])
    scanned, infos = jax.jit(_run)(_member(agents, 0), batches)
    looped = _member(agents, 1)
    update = jax.jit(lambda a, b: a.update(b))
    for i in range(6):
        looped, _ = update(looped, jax.tree.map(lambda x, i=i: x[i], batches))
    for a, b in zip(_numeric(scanned), _numeric(looped), strict=True):
        np.testing.assert_allclose(
            np.asarray(a, np.float64), np.asarray(b, np.float64), rtol=1e-5, atol=1e-6
        )
    again, infos2 = jax.jit(_run)(_member(_create_jit(name, [0]), 0), batches)
    for a, b in zip(
        jax.tree.leaves(scanned.actor.params), jax.tree.leaves(again.actor.params), strict=True
    ):
        np.testing.assert_array_equal(a, b)  # same seed, same numbers
    assert np.isfinite(np.asarray(infos["critic/loss"])).all()


@pytest.mark.parametrize("name", ["sac", "td3"])
def test_vmap_over_seeds_equals_single_seed_runs(name):
    seeds = jnp.arange(4)
    batches = _batches(5)
    vagents = _create_jit(name, seeds)
    vagents, vinfos = jax.jit(jax.vmap(_run, in_axes=(0, None)))(vagents, batches)
    actor_leaves = [np.asarray(x) for x in jax.tree.leaves(vagents.actor.params)]
    # The 4 members differ from each other ...
    assert not np.allclose(actor_leaves[0][0], actor_leaves[0][1])
    # ... and each equals its single-seed run.
    run = jax.jit(_run)
    for i in range(4):
        # Single-seed agents are created unbatched (eagerly), independently of the vmapped path.
        single, info = run(_create(name, i), batches)
        for v, s in zip(
            jax.tree.leaves(vagents.actor.params), jax.tree.leaves(single.actor.params), strict=True
        ):
            np.testing.assert_allclose(v[i], s, rtol=1e-4, atol=1e-5)
        for v, s in zip(
            jax.tree.leaves(vagents.critic.params),
            jax.tree.leaves(single.critic.params),
            strict=True,
        ):
            np.testing.assert_allclose(v[i], s, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(vinfos["critic/loss"][i], info["critic/loss"], rtol=1e-4)


def test_td3_delays_actor_update_inside_the_agent():
    agent = _create("td3", 0, policy_delay=3)
    batches = _batches(3)
    update = jax.jit(lambda a, b: a.update(b))
    before = jax.tree.leaves(agent.actor.params)[0]
    changed = []
    for i in range(3):
        agent, info = update(agent, _member(batches, i))
        now = jax.tree.leaves(agent.actor.params)[0]
        changed.append(not np.allclose(before, now))
        before = now
    assert changed == [False, False, True]


def test_td3_network_init_torch_reaches_actor_critics_and_targets():
    """``network_init='torch'`` (the authors' nn.Linear default) draws nonzero biases everywhere."""
    xavier, authors = _create("td3", 0), _create("td3", 0, network_init="torch")
    for params in (xavier.actor.params, xavier.critic.params):
        assert not any(np.asarray(b).any() for b in _biases(params))
    for params in (authors.actor.params, authors.critic.params, authors.target_critic_params):
        assert all(np.asarray(b).any() for b in _biases(params))
    with pytest.raises(ConfigError, match="--network-init"):
        TD3Config(network_init="he")


def _biases(params):
    flat = jax.tree_util.tree_flatten_with_path(params)[0]
    return [leaf for path, leaf in flat if "bias" in jax.tree_util.keystr(path)]


def test_sac_actions_are_in_bounds_and_eval_is_deterministic():
    agent = _create("sac", 0)
    obs = jnp.ones((7, OBS_DIM)) * 50.0
    a = agent.sample_actions(obs, jax.random.key(1))
    assert a.shape == (7, ACT_DIM) and bool(jnp.all(jnp.abs(a) <= 1.0))
    np.testing.assert_array_equal(agent.eval_actions(obs), agent.eval_actions(obs))


def test_sweepable_hyperparameters_are_pytree_leaves():
    agent = _create("sac", 0)
    leaves = jax.tree.leaves(agent)
    assert any(x is agent.hparams["tau"] for x in leaves)
    lr = agent.actor.opt_state.hyperparams["learning_rate"]
    assert float(lr) == pytest.approx(SACConfig().actor_lr)
    assert isinstance(agent, SAC)


# --------------------------------------------------------------------------- learning (slow)

LEARN = {
    # agent: (config overrides, total env steps, threshold on Pendulum-v1)
    "sac": ({"hidden_dims": (128, 128), "learning_starts": 1000}, 6000, -250.0),
    # TD3 runs the authors' settings (exploration noise 0.1, policy noise 0.2, noise clip 0.5,
    # delay 2, lr 3e-4, batch 256), with 128x128 nets and 1,000 warm-up steps. It swings up at
    # 5-7k steps, but on some seeds its deterministic policy then regresses for ~3k steps (a few
    # eval episodes fail to swing up again: eval std ~550) before it settles: seed 4 -222 at
    # 6k, -433 at 9k, -121 from 10k to 15k; seed 6 -127 at 9k, -610 at 12k, -126 from 13k to
    # 16k. The old budget of 9k ended inside seed 4's dip, 12k inside seed 6's; 14k is 1k steps
    # past the latest dip seen. Measured at 14k, seeds 0-6: -110, -135, -121, -132, -121, -132,
    # -127 (at 9k: -114, -138, -125, -132, -433). Drawing the minibatch rows on the host
    # (another RNG stream) moved the dips: seed 4 -215/-480/-654 at 12k/13k/14k, seed 2
    # -500/-327 at 16k/17k. At 15k, seeds 0-4: -113, -134, -122, -133, -123. The test runs
    # batch 128 (36 -> 26 s here): -110, -136, -127, -133, -124. SAC stays at 256: at 128 its
    # seed 1 returned -205.
    "td3": (
        {"hidden_dims": (128, 128), "learning_starts": 1000, "batch_size": 128},
        15_000,
        -250.0,
    ),
    # CrossQ at SBX's settings with 128-wide nets and batch 128 (SBX: 256; half the update cost,
    # 27 -> 20 s here). At 5k, seeds 0-4: -111, -133, -133, -158, -134 (batch 256: -109, -133,
    # -134, -149, -157). With batch 256 it swings up by ~4k steps (seeds 0-4 at 4k: -110, -136,
    # -134, -589, -143; seeds 0, 1 at 3k: -543, -307); 5k leaves a margin.
    "crossq": (
        {
            "actor_hidden_dims": (128, 128),
            "critic_hidden_dims": (128, 128),
            "learning_starts": 1000,
            "batch_size": 128,
        },
        5000,
        -250.0,
    ),
    # sac-fast (LayerNorm, 3 critics with a random-pair target, 4 critic steps on 128 rows and
    # 1 actor step per env step) swings up in fewer env steps than SAC (~6k). At 4k, seeds 0-4:
    # -110, -132, -134, -143, -132; at 3k seed 3 had not swung up (-453).
    "sac-fast": (
        {"hidden_dims": (128, 128), "learning_starts": 1000},
        4000,
        -250.0,
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(LEARN))
def test_agent_learns_pendulum(name, tmp_path, record_property):
    from offline_utils import learning_seed

    overrides, steps, threshold = LEARN[name]
    config_cls = registry.get(name).config
    cfg = config_cls(**overrides)
    run = TrainConfig(
        env="Pendulum-v1",
        total_steps=steps,
        seed=learning_seed(),
        out=str(tmp_path / name),
        eval_every=steps,
        eval_episodes=10,
        progress=False,
        tensorboard=False,
    )
    summary = train(name, run, cfg)
    record_property("value", summary["final_eval_return_mean"])
    record_property("threshold", threshold)
    assert summary["completed"]
    assert summary["final_eval_return_mean"] >= threshold, summary


def test_configs_are_frozen_dataclasses_with_documented_fields():
    import inspect

    def documented(cls: type, name: str) -> bool:
        src = inspect.getsource(cls)
        if f"    {name}:" not in src:
            return False
        lines = src.split(f"    {name}:", 1)[1].splitlines()
        return len(lines) > 1 and lines[1].strip().startswith('"""')

    for config_cls in [registry.get(n).config for n in registry.names("off-policy", "on-policy")]:
        assert dataclasses.is_dataclass(config_cls)
        for f in dataclasses.fields(config_cls):
            # every field is followed by a one-line docstring, in the class or (for a field
            # redeclared with another default, e.g. RLPDConfig) in a parent, as tyro reads it
            classes = [c for c in config_cls.__mro__ if dataclasses.is_dataclass(c)]
            assert any(documented(c, f.name) for c in classes), f"{config_cls.__name__}.{f.name}"
    assert TD3Config().policy_delay == 2
