"""TD-MPC2: its math (two-hot, SimNorm, soft cross-entropy), update, planning and config checks."""

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl import registry, rl
from jaxrl.agents import tdmpc2_model
from jaxrl.agents.tdmpc2 import (
    MODEL_SIZES,
    TDMPC2,
    TDMPC2Config,
    heuristic_discount,
    seed_steps,
)
from jaxrl.cli import main, parse_train_args
from jaxrl.config import ConfigError
from jaxrl.planners import PlanState
from jaxrl.types import Transition

OBS_DIM, ACT_DIM, B, H, N_ENVS = 5, 2, 8, 3, 3
TINY = dict(
    latent_dim=32,
    mlp_dim=64,
    enc_dim=32,
    num_q=2,
    num_samples=32,
    num_elites=4,
    iterations=2,
    horizon=H,
    num_pi_trajs=4,
    batch_size=B,
)


def _sequences(num, seed=0):
    """``num`` random sequence batches, leaves ``[num, B, H, ...]`` (obs[t+1] == next_obs[t])."""
    rng = np.random.default_rng(seed)
    states = rng.normal(size=(num, B, H + 1, OBS_DIM)).astype(np.float32)
    return Transition(
        obs=jnp.asarray(states[:, :, :-1]),
        action=jnp.asarray(np.tanh(rng.normal(size=(num, B, H, ACT_DIM))), jnp.float32),
        reward=jnp.asarray(rng.normal(size=(num, B, H)), jnp.float32),
        next_obs=jnp.asarray(states[:, :, 1:]),
        terminal=jnp.zeros((num, B, H), jnp.float32).at[:, :2, -1].set(1.0),
    )


@pytest.fixture(scope="module")
def trained():
    """Agents created vmapped over 2 seeds, then 3 scanned updates each: one compiled program."""
    config = TDMPC2Config(**TINY)
    batches = _sequences(3)

    def run(seed):
        agent0 = TDMPC2.create(config, jnp.zeros(OBS_DIM), jnp.zeros(ACT_DIM), seed)
        agent1, infos = jax.lax.scan(lambda a, b: a.update(b), agent0, batches)
        return agent0, agent1, infos

    return jax.jit(jax.vmap(run))(jnp.arange(2))


def _member(tree, i):
    return jax.tree.map(lambda x: x[i], tree)


@pytest.fixture(scope="module")
def agent(trained):
    return _member(trained[1], 0)


# ------------------------------------------------------------------------------------------ math


def test_symlog_symexp_inverse():
    x = jnp.asarray([-1e4, -3.0, -0.1, 0.0, 0.2, 7.0, 1e4])
    np.testing.assert_allclose(rl.symlog(jnp.asarray([math.e - 1.0, 0.0])), [1.0, 0.0], atol=1e-6)
    np.testing.assert_allclose(rl.symexp(rl.symlog(x)), x, rtol=1e-5)


def test_two_hot_hand_computed_and_round_trip():
    # symlog(x) = 0.1 lies halfway between the bins 0.0 (index 50) and 0.2 (index 51).
    enc = rl.two_hot(jnp.asarray([math.expm1(0.1)]), 101, -10.0, 10.0)
    assert enc.shape == (1, 101)
    np.testing.assert_allclose(enc[0, 50:52], [0.5, 0.5], atol=1e-5)
    assert float(enc.sum()) == pytest.approx(1.0, abs=1e-6)
    # Inside the range: decoding the encoding (as logits) gives the value back.
    x = jnp.asarray([-5000.0, -12.5, -1.0, 0.0, 0.3, 2.0, 40.0, 20000.0])
    enc = rl.two_hot(x, 101, -10.0, 10.0)
    assert np.all(np.asarray(enc) >= 0) and np.all((np.asarray(enc) > 0).sum(-1) <= 2)
    np.testing.assert_allclose(enc.sum(-1), 1.0, atol=1e-6)
    bins = jnp.linspace(-10.0, 10.0, 101)
    np.testing.assert_allclose(enc @ bins, rl.symlog(x), atol=1e-5)
    np.testing.assert_allclose(rl.two_hot_inv(jnp.log(enc), -10.0, 10.0), x, rtol=1e-4, atol=1e-5)
    # Outside it: clipped to the end bins (symlog 10 = e^10 - 1).
    edge = rl.two_hot(jnp.asarray([1e6, -1e6]), 101, -10.0, 10.0)
    np.testing.assert_allclose(edge[:, [-1, 0]], [[1.0, 0.0], [0.0, 1.0]], atol=1e-6)
    with pytest.raises(ValueError, match="num_bins"):
        rl.two_hot(x, 1, -10.0, 10.0)


def test_soft_ce_hand_computed():
    # 3 bins at -1, 0, 1; symlog(target) = 0.5 -> two-hot [0, 0.5, 0.5].
    logits = jnp.asarray([[0.0, 1.0, 2.0]])
    got = rl.soft_ce(logits, jnp.asarray([math.expm1(0.5)]), -1.0, 1.0)
    lse = math.log(1.0 + math.e + math.e**2)
    np.testing.assert_allclose(got, [lse - 1.5], rtol=1e-5)


def test_simnorm_groups_sum_to_one():
    x = jax.random.normal(jax.random.key(0), (4, 3, 32)) * 5
    y = tdmpc2_model.SimNorm(8).apply({}, x)
    assert y.shape == x.shape
    np.testing.assert_allclose(y.reshape(4, 3, 4, 8).sum(-1), 1.0, atol=1e-6)
    assert float(y.min()) >= 0.0
    with pytest.raises(ValueError, match="divisible"):
        tdmpc2_model.SimNorm(8).apply({}, jnp.ones((2, 12)))


def test_heuristic_discount_and_seed_steps():
    assert heuristic_discount(1000) == pytest.approx(0.995)
    assert heuristic_discount(500) == pytest.approx(0.99)
    assert heuristic_discount(100) == pytest.approx(0.95)
    assert heuristic_discount(3) == pytest.approx(0.95)
    assert seed_steps(1000) == 5000 and seed_steps(100) == 1000


# ---------------------------------------------------------------------------------------- update


def test_update_scan_and_vmap_over_seeds(trained):
    """Finite losses, the hand-computed first losses, every network moves, seeds differ."""
    agent0, agent1, infos = trained
    for name, value in infos.items():
        assert value.shape == (2, 3) and np.all(np.isfinite(value)), name
    # Zero-initialized output layers predict uniform bins: CE = log(101) at every step, weighted
    # by rho^t and divided by the horizon.
    first_loss = math.log(101) * (1 + 0.5 + 0.25) / 3
    for name in ("model/value_loss", "model/reward_loss"):
        assert float(infos[name][0, 0]) == pytest.approx(first_loss, rel=1e-4), name
    moved = lambda a, b: any(  # noqa: E731
        not np.allclose(x, y) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True)
    )
    for group in ("encoder", "dynamics", "reward", "qs"):
        assert moved(agent0.model.params[group], agent1.model.params[group]), group
    assert moved(agent0.policy.params, agent1.policy.params)
    assert moved(agent0.target_qs, agent1.target_qs)
    assert moved(_member(agent1.model.params, 0), _member(agent1.model.params, 1))
    assert np.all(np.asarray(agent1.q_scale) >= 1.0)
    assert int(agent1.model.step[0]) == 3 and int(agent1.policy.step[1]) == 3


def test_update_rejects_rows_without_horizon(agent):
    rows = jax.tree.map(lambda x: x[0, :, 0], _sequences(1))
    with pytest.raises(ValueError, match="horizon"):
        agent.update(rows)


# -------------------------------------------------------------------------------------- planning


def test_plan_actions_shapes_range_and_first_resets_warm_start(agent):
    plan_fn = jax.jit(
        lambda a, p, o, f, k: (a.plan_actions(p, o, f, k, False), a.plan_actions(p, o, f, k, True))
    )
    obs = jax.random.normal(jax.random.key(1), (N_ENVS, OBS_DIM))
    key = jax.random.key(2)
    fresh = agent.init_plan(N_ENVS)
    assert fresh.mean.shape == (N_ENVS, H, ACT_DIM)
    stale = PlanState(mean=jnp.full((N_ENVS, H, ACT_DIM), 0.9))
    first = jnp.ones(N_ENVS, bool)
    (actions, plan), (noisy, noisy_plan) = plan_fn(agent, fresh, obs, first, key)
    assert actions.shape == noisy.shape == (N_ENVS, ACT_DIM)
    assert plan.mean.shape == (N_ENVS, H, ACT_DIM)
    assert np.all(np.abs(np.asarray(actions)) <= 1.0) and np.all(np.abs(np.asarray(noisy)) <= 1.0)
    # Exploration noise is added to the same plan's first action.
    np.testing.assert_allclose(noisy_plan.mean, plan.mean)
    assert not np.allclose(noisy, actions)
    # At an episode's first step the old plan is ignored; otherwise it shapes the search.
    (again, plan_again), _ = plan_fn(agent, stale, obs, first, key)
    np.testing.assert_allclose(again, actions)
    np.testing.assert_allclose(plan_again.mean, plan.mean)
    (_, plan_warm), _ = plan_fn(agent, stale, obs, jnp.asarray([False, True, False]), key)
    assert not np.allclose(plan_warm.mean[0], plan.mean[0])
    np.testing.assert_allclose(plan_warm.mean[1], plan.mean[1])


# ---------------------------------------------------------------------------------------- config


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        (dict(horizon=0), "horizon"),
        (dict(num_elites=64, num_samples=32), "num_elites"),
        (dict(num_bins=1), "num_bins"),
        (dict(num_q=1), "num_q"),
        (dict(latent_dim=30), "simnorm_dim"),
        (dict(num_pi_trajs=32), "num_pi_trajs"),
    ],
)
def test_config_errors_are_clear(overrides, match):
    with pytest.raises(ConfigError, match=match):
        TDMPC2Config(**{**TINY, **overrides})


# ---------------------------------------------------------------------- env settings and sizes


def test_discount_heuristic_at_run_setup_and_explicit_discount_kept():
    # What every run that knows its env applies (jaxrl train, jaxrl.run.train, sweeps, scripts):
    # the authors' clip((L/5 - 1) / (L/5), 0.95, 0.995) for an unset discount.
    spec = registry.get("tdmpc2")
    assert TDMPC2Config().discount is None
    hc = spec.for_env(TDMPC2Config(**TINY), "HalfCheetah-v5")  # 1000 steps: 199/200 -> 0.995
    assert hc.discount == pytest.approx(0.995) and hc.learning_starts == 5000
    pend = spec.for_env(TDMPC2Config(**TINY), "jax:pendulum")  # 200 steps: 39/40
    assert pend.discount == pytest.approx(0.975) and pend.learning_starts == 1000
    # An explicit discount is kept, even one equal to another agent's default (0.99).
    assert spec.for_env(TDMPC2Config(**TINY, discount=0.99), "jax:pendulum").discount == 0.99
    # A sweepable leaf either way; without an env, create takes the 1000-step value.
    agent = TDMPC2.create(TDMPC2Config(**TINY), jnp.zeros(OBS_DIM), jnp.zeros(ACT_DIM), 0)
    assert float(agent.hparams["discount"]) == pytest.approx(0.995)
    agent = TDMPC2.create(pend, jnp.zeros(OBS_DIM), jnp.zeros(ACT_DIM), 0)
    assert float(agent.hparams["discount"]) == pytest.approx(0.975)


def test_non_episodic_run_on_a_terminating_env_is_refused(tmp_path, capsys):
    # The authors' trainer stops at the first termination outside episodic mode; here the run
    # is refused at setup, before its directory exists.
    spec = registry.get("tdmpc2")
    for env in ("Hopper-v5", "InvertedPendulum-v5", "brax:inverted_pendulum"):
        with pytest.raises(ConfigError, match="--episodic"):
            spec.for_env(TDMPC2Config(**TINY), env)
    for env in ("HalfCheetah-v5", "Pendulum-v1", "jax:pendulum"):
        assert not spec.for_env(TDMPC2Config(**TINY), env).episodic
    assert spec.for_env(TDMPC2Config(**TINY, episodic=True), "Hopper-v5").episodic
    out = tmp_path / "run"
    with pytest.raises(SystemExit) as exit_info:
        main(["train", "tdmpc2", "--env", "Hopper-v5", "--out", str(out), "--no-progress"])
    assert exit_info.value.code == 2 and not out.exists()
    assert "pass --episodic" in capsys.readouterr().err


def test_model_sizes_set_the_authors_widths():
    # The authors' MODEL_SIZE table (tdmpc2/common/__init__.py), written out by hand:
    # (enc_dim, mlp_dim, latent_dim, num_enc_layers, num_q); planning stays at config.yaml's.
    table = {
        1: (256, 384, 128, 2, 2),
        5: (256, 512, 512, 2, 5),
        19: (1024, 1024, 768, 3, 5),
        48: (1792, 1792, 768, 4, 5),
        317: (4096, 4096, 1376, 5, 8),
    }
    for size, dims in table.items():
        got = TDMPC2Config(model_size=size).sizes
        assert tuple(got)[:5] == dims and tuple(got)[5:] == (512, 64, 24, 6), size
    assert TDMPC2Config().sizes == TDMPC2Config(model_size=5).sizes
    cpu = TDMPC2Config(model_size="cpu").sizes
    assert tuple(cpu) == (64, 64, 64, 2, 2, 64, 8, 8, 3)
    # A width given next to the size wins; the rest come from the size, also after replace.
    mixed = TDMPC2Config(model_size=1, mlp_dim=64)
    assert mixed.sizes.mlp_dim == 64 and mixed.sizes.latent_dim == 128
    assert dataclasses.replace(mixed, model_size=19).sizes.latent_dim == 768
    with pytest.raises(ConfigError, match="model_size"):
        TDMPC2Config(model_size=2)
    # The networks are built with the size's widths.
    agent = TDMPC2.create(TDMPC2Config(model_size=1), jnp.zeros(OBS_DIM), jnp.zeros(ACT_DIM), 0)
    shapes = [x.shape for x in jax.tree.leaves(agent.model.params["dynamics"])]
    assert (128 + ACT_DIM, 384) in shapes and (384, 128) in shapes
    assert {x.shape[0] for x in jax.tree.leaves(agent.model.params["qs"])} == {2}


def test_command_line_takes_model_size():
    _, cfg = parse_train_args("tdmpc2", ["--env", "jax:pendulum", "--model-size", "cpu"])
    assert cfg.model_size == "cpu" and cfg.sizes == MODEL_SIZES["cpu"]
    _, cfg = parse_train_args("tdmpc2", ["--env", "jax:pendulum", "--model-size", "19"])
    assert cfg.model_size == 19 and cfg.sizes.latent_dim == 768
    argv = ["--env", "jax:pendulum", "--model-size", "19", "--latent-dim", "256"]
    assert parse_train_args("tdmpc2", argv)[1].sizes.latent_dim == 256
    with pytest.raises(SystemExit):
        parse_train_args("tdmpc2", ["--env", "jax:pendulum", "--model-size", "2"])
