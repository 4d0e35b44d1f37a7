"""MPPI / CEM planners (jaxrl.planners): math against hand-computed values, warm start,
validation, vmap over envs, and a quadratic toy whose optimum planning must find."""

from __future__ import annotations

import math
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl.config import ConfigError
from jaxrl.planners import (
    PlannerConfig,
    PlanState,
    capped_variance,
    elite_weights,
    init_plan,
    plan,
    refit,
    sample_population,
    warm_start,
)

# Three policy-prior sequences (H = 1, A = 1) and their values; the value_fn below gives every
# Gaussian sample a value far below them, so after one iteration the elites are exactly these
# three and the refit is a closed-form function of them.
PRIOR = np.array([0.2, 0.6, -0.4], np.float32)
PRIOR_VALUES = np.array([3.0, 1.0, 0.0], np.float32)


def _prior_value_fn(actions, key):
    n = actions.shape[0]
    return jnp.concatenate([jnp.asarray(PRIOR_VALUES), jnp.full(n - 3, -1e9)])


def _one_iteration(method, **kw):
    cfg = PlannerConfig(
        method=method,
        horizon=1,
        num_samples=8,
        num_elites=3,
        iterations=1,
        num_policy_samples=3,
        max_std=2.0,
        **kw,
    )
    result, state = plan(
        cfg,
        _prior_value_fn,
        init_plan(cfg, 1),
        True,
        jax.random.key(0),
        policy_actions=jnp.asarray(PRIOR).reshape(3, 1, 1),
    )
    return cfg, result, state


def test_mppi_weights_hand_computed():
    cfg = PlannerConfig(temperature=0.5)
    w = elite_weights(cfg, jnp.array([3.0, 1.0, 0.0]))
    # exp(0.5 * (V - 3)) = [1, e^-1, e^-1.5], normalized
    raw = [1.0, math.exp(-1.0), math.exp(-1.5)]
    np.testing.assert_allclose(w, [r / sum(raw) for r in raw], rtol=1e-6)
    np.testing.assert_allclose(w, [0.628532, 0.231224, 0.140244], atol=1e-6)
    cem = elite_weights(PlannerConfig(method="cem"), jnp.array([3.0, 1.0, 0.0]))
    np.testing.assert_allclose(cem, [1 / 3] * 3, rtol=1e-6)
    # Invalid elites (NaN ranked as -inf) weigh nothing; all invalid -> uniform, not NaN.
    np.testing.assert_allclose(elite_weights(cfg, jnp.array([0.0, -jnp.inf])), [1.0, 0.0])
    np.testing.assert_allclose(elite_weights(cfg, jnp.full(2, -jnp.inf)), [0.5, 0.5])


def test_mppi_update_hand_computed():
    _, result, state = _one_iteration("mppi", temperature=0.5)
    w = np.array([1.0, math.exp(-1.0), math.exp(-1.5)])
    w /= w.sum()
    mean = float(np.sum(w * PRIOR))  # 0.208344
    std = math.sqrt(float(np.sum(w * (PRIOR - mean) ** 2)))
    assert mean == pytest.approx(0.208344, abs=1e-5)
    np.testing.assert_allclose(result.mean, [[mean]], rtol=1e-5)
    np.testing.assert_allclose(result.std, [[std]], rtol=1e-5)
    np.testing.assert_allclose(state.mean, result.mean)
    assert float(result.value) == 3.0
    assert float(result.actions[0, 0]) in PRIOR.tolist()


def test_cem_update_hand_computed_with_momentum():
    """CEM (mbrl-lib): elite mean and unbiased variance, the variance (not the std) smoothed."""
    _, result, _ = _one_iteration("cem")
    mean = (0.2 + 0.6 - 0.4) / 3  # 0.13333
    var = ((0.2 - mean) ** 2 + (0.6 - mean) ** 2 + (-0.4 - mean) ** 2) / (3 - 1)  # 0.25333
    np.testing.assert_allclose(result.mean, [[mean]], rtol=1e-5)
    np.testing.assert_allclose(result.std, [[math.sqrt(var)]], rtol=1e-5)  # 0.50332, no cap
    # momentum 0.5 from the initial (mean 0, std max_std = 2, so var 4)
    _, smoothed, _ = _one_iteration("cem", momentum=0.5)
    np.testing.assert_allclose(smoothed.mean, [[0.5 * mean]], rtol=1e-5)
    np.testing.assert_allclose(smoothed.std, [[math.sqrt(0.5 * 4.0 + 0.5 * var)]], rtol=1e-5)
    # the std blend the previous version used would give 0.5 * 2 + 0.5 * sqrt(var) = 1.2517
    assert float(smoothed.std[0, 0]) == pytest.approx(1.4583, abs=1e-4)


def test_cem_refit_no_std_cap_and_min_std_floor():
    elites = jnp.array([-1.0, 1.0, -1.0, 1.0]).reshape(4, 1, 1)
    cfg = PlannerConfig(method="cem", num_elites=4, min_std=0.0, max_std=0.5)
    mean, std = refit(cfg, elites, jnp.full(4, 0.25), jnp.zeros((1, 1)), jnp.full((1, 1), 0.5))
    np.testing.assert_allclose(mean, 0.0, atol=1e-7)
    np.testing.assert_allclose(std, math.sqrt(4 / 3), rtol=1e-6)  # above max_std: not clipped
    same = jnp.full((4, 1, 1), 0.3)
    cfg = PlannerConfig(method="cem", num_elites=4, min_std=0.1)
    _, std = refit(cfg, same, jnp.full(4, 0.25), jnp.zeros((1, 1)), jnp.ones((1, 1)))
    np.testing.assert_allclose(std, 0.1)


def test_cem_samples_stay_inside_and_off_the_bounds():
    """Truncated, bound-capped CEM samples vs the clipped Gaussian MPPI keeps (TD-MPC2)."""
    mean = jnp.array([[0.0, 0.9, -0.95, 0.5]])  # [H=1, A=4]
    std = jnp.full_like(mean, 2.0)  # wide, as at the first iteration
    key = jax.random.key(0)
    cem = np.asarray(sample_population(PlannerConfig(method="cem"), mean, std, key, 20000))
    mppi = np.asarray(sample_population(PlannerConfig(method="mppi"), mean, std, key, 20000))
    assert cem.shape == mppi.shape == (20000, 1, 4)
    assert cem.min() >= -1.0 and cem.max() <= 1.0
    assert (np.abs(cem) == 1.0).mean() == 0.0
    # the clip puts most of these samples exactly on a bound: 62% at mean 0, 69% near a bound
    assert (np.abs(mppi) == 1.0).mean() > 0.5
    # spread: std of N(0, 1) truncated at +-2 is 0.8796, times sqrt(capped var) = half the
    # distance to the nearer bound: 0.5, 0.05, 0.025, 0.25
    np.testing.assert_allclose(
        cem.std(axis=0)[0], 0.8796 * np.array([0.5, 0.05, 0.025, 0.25]), rtol=0.03
    )
    np.testing.assert_allclose(cem.mean(axis=0)[0], mean[0], atol=0.01)
    # a small variance is left as it is
    small = sample_population(
        PlannerConfig(method="cem"), mean, jnp.full_like(mean, 0.01), key, 20000
    )
    np.testing.assert_allclose(np.std(small, axis=0)[0, [0, 3]], 0.8796 * 0.01, rtol=0.03)


def test_capped_variance_near_a_bound():
    mean = jnp.array([0.0, 0.9, -0.96, 1.0, 0.5])
    var = capped_variance(jnp.full(5, 4.0), mean, -1.0, 1.0)
    # ((distance to the nearer bound) / 2)^2: 0.25, 0.0025, 0.0004, 0, 0.0625
    np.testing.assert_allclose(var, [0.25, 0.0025, 0.0004, 0.0, 0.0625], rtol=1e-5, atol=1e-9)
    small = np.asarray(capped_variance(jnp.full(5, 1e-3), mean, -1.0, 1.0))
    np.testing.assert_allclose(small[[0, 4]], 1e-3)
    # per-dimension bounds [A]
    var = capped_variance(
        jnp.full((1, 2), 9.0), jnp.array([[1.0, 1.0]]), jnp.array([0.0, -2.0]), 4.0
    )
    np.testing.assert_allclose(var, [[0.25, 2.25]])


def test_std_clipped_to_min_std():
    cfg = PlannerConfig(
        horizon=2, num_samples=8, num_elites=2, iterations=1, min_std=0.3, num_policy_samples=2
    )
    prior = jnp.full((2, 2, 1), 0.5)  # two identical elites: std 0 before the clip

    def value_fn(actions, key):
        return jnp.concatenate([jnp.zeros(2), jnp.full(6, -1e9)])

    result, _ = plan(cfg, value_fn, init_plan(cfg, 1), True, jax.random.key(0), prior)
    np.testing.assert_allclose(result.std, 0.3)
    np.testing.assert_allclose(result.mean, 0.5, rtol=1e-6)


def test_action_drawn_from_final_weights():
    """The returned sequence is an elite drawn with probability equal to its MPPI weight."""
    cfg, _, _ = _one_iteration("mppi", temperature=0.5)
    fn = jax.jit(
        jax.vmap(
            lambda k: plan(
                cfg, _prior_value_fn, init_plan(cfg, 1), True, k, jnp.asarray(PRIOR)[:, None, None]
            )[0].actions[0, 0]
        )
    )
    picks = np.asarray(fn(jax.random.split(jax.random.key(1), 4000)))
    freq = [(np.abs(picks - p) < 1e-6).mean() for p in PRIOR]
    np.testing.assert_allclose(freq, [0.628532, 0.231224, 0.140244], atol=0.03)


def test_nan_values_rank_last():
    cfg = PlannerConfig(horizon=1, num_samples=8, num_elites=2, iterations=1, num_policy_samples=2)

    def value_fn(actions, key):
        return jnp.concatenate([jnp.array([jnp.nan, 1.0]), jnp.full(6, jnp.nan)])

    prior = jnp.array([0.9, -0.7]).reshape(2, 1, 1)
    result, _ = plan(cfg, value_fn, init_plan(cfg, 1), True, jax.random.key(0), prior)
    assert float(result.value) == 1.0
    np.testing.assert_allclose(result.actions, [[-0.7]])
    np.testing.assert_allclose(result.mean, [[-0.7]])
    assert np.isfinite(np.asarray(result.std)).all()


def test_warm_start_shifts_one_step_and_zeros_where_first():
    mean = jnp.array([[1.0, -1.0], [2.0, -2.0], [3.0, -3.0]])
    np.testing.assert_array_equal(
        warm_start(PlanState(mean), False), [[2.0, -2.0], [3.0, -3.0], [0.0, 0.0]]
    )
    np.testing.assert_array_equal(warm_start(PlanState(mean), True), jnp.zeros((3, 2)))
    batched = PlanState(jnp.stack([mean, 10 * mean]))
    out = warm_start(batched, jnp.array([True, False]))
    np.testing.assert_array_equal(out[0], jnp.zeros((3, 2)))
    np.testing.assert_array_equal(out[1], [[20.0, -20.0], [30.0, -30.0], [0.0, 0.0]])


def test_plan_starts_from_the_warm_start():
    # max_std tiny: every sample sits on the initial mean, so the result shows where it started.
    cfg = PlannerConfig(
        horizon=3, num_samples=16, num_elites=4, iterations=1, min_std=1e-6, max_std=1e-6
    )
    prev = PlanState(jnp.array([[0.5], [0.7], [-0.3]]))
    flat = lambda actions, key: jnp.zeros(actions.shape[0])  # noqa: E731
    fn = jax.jit(partial(plan, cfg, flat))
    result, state = fn(prev, False, jax.random.key(0))
    np.testing.assert_allclose(result.mean, [[0.7], [-0.3], [0.0]], atol=1e-4)
    np.testing.assert_allclose(state.mean, result.mean)
    result, _ = fn(prev, True, jax.random.key(0))
    np.testing.assert_allclose(result.mean, jnp.zeros((3, 1)), atol=1e-4)


def test_init_plan_shapes():
    cfg = PlannerConfig(horizon=5)
    assert init_plan(cfg, 2).mean.shape == (5, 2)
    assert init_plan(cfg, 2, (4,)).mean.shape == (4, 5, 2)
    assert init_plan(cfg, 2, 4).mean.shape == (4, 5, 2)
    assert float(jnp.abs(init_plan(cfg, 3, (2, 3)).mean).sum()) == 0.0


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"horizon": 0}, "horizon must be positive"),
        ({"num_samples": 8, "num_elites": 16}, "num_elites .16. must be <= num_samples .8."),
        ({"min_std": 1.0, "max_std": 0.5}, r"min_std \(1.0\) must be <= max_std \(0.5\)"),
        ({"num_samples": 8, "num_elites": 4, "num_policy_samples": 8}, "num_policy_samples"),
        ({"iterations": 0}, "iterations must be positive"),
        ({"method": "ilqr"}, "method must be one of"),
        ({"temperature": 0.0}, "temperature must be positive"),
        ({"momentum": 1.0}, r"momentum must be in \[0, 1\)"),
        ({"min_std": -0.1}, "min_std must be in"),
        ({"horizon": 2.5}, "horizon must be an integer"),
        ({"method": "cem", "num_elites": 1}, r"num_elites \(1\) must be >= 2 for CEM"),
    ],
)
def test_config_validation(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        PlannerConfig(**kwargs)


def test_bad_call_arguments_are_clear():
    cfg = PlannerConfig(horizon=2, num_samples=8, num_elites=2, num_policy_samples=2)
    value_fn = lambda a, k: jnp.zeros(a.shape[0])  # noqa: E731
    with pytest.raises(ValueError, match="policy_actions of shape"):
        plan(cfg, value_fn, init_plan(cfg, 1), True, jax.random.key(0))
    cfg0 = PlannerConfig(horizon=2, num_samples=8, num_elites=2)
    with pytest.raises(ValueError, match="num_policy_samples is 0"):
        plan(cfg0, value_fn, init_plan(cfg0, 1), True, jax.random.key(0), jnp.zeros((2, 2, 1)))
    with pytest.raises(ValueError, match="jax.vmap plan"):
        plan(cfg0, value_fn, init_plan(cfg0, 1, (3,)), True, jax.random.key(0))
    with pytest.raises(ValueError, match="one value per sequence"):
        plan(cfg0, lambda a, k: jnp.zeros(3), init_plan(cfg0, 1), True, jax.random.key(0))


def _quadratic(target):
    # value of a sequence: -sum_t |a_t - target|^2; optimum a_t = target for every t
    return lambda actions, key: -jnp.sum((actions - target) ** 2, axis=(1, 2))


@pytest.mark.parametrize("method", ["mppi", "cem"])
def test_quadratic_toy_finds_optimum(method):
    # 30 seeds x 3 calls (checked by hand): worst |mean - 0.37| 0.011, |action - 0.37| 0.041,
    # value -0.0004. A population of 64 / 8 elites sometimes collapses to min_std early.
    cfg = PlannerConfig(method=method, horizon=3, num_samples=256, num_elites=32, iterations=6)
    fn = jax.jit(partial(plan, cfg, _quadratic(0.37)))
    state = init_plan(cfg, 1)
    for t in range(3):  # warm-started calls keep (and refine) the optimum
        result, state = fn(state, t == 0, jax.random.key(t))
        np.testing.assert_allclose(result.mean, 0.37, atol=0.05)
        np.testing.assert_allclose(result.actions[0], 0.37, atol=0.15)
        assert float(result.value) > -0.02


def test_vmap_over_envs():
    """A batch of envs, each with its own optimum and policy prior, planned in one vmapped call."""
    cfg = PlannerConfig(
        horizon=2, num_samples=128, num_elites=16, iterations=6, num_policy_samples=4
    )
    targets = jnp.array([[-0.6, 0.2], [0.0, 0.5], [0.4, -0.9], [0.8, 0.8]])
    # env 3's prior holds its optimum; the others' priors are zeros (not optimal)
    prior = jnp.zeros((4, 4, 2, 2)).at[3].set(targets[3])

    def plan_one(state, first, key, target, prior):
        return plan(cfg, _quadratic(target), state, first, key, policy_actions=prior)

    fn = jax.jit(jax.vmap(plan_one))
    state = init_plan(cfg, 2, (4,))
    first = jnp.array([True, True, False, True])
    keys = jax.random.split(jax.random.key(0), 4)
    result, state = fn(state, first, keys, targets, prior)  # worst error over 30 seeds: 0.019
    assert result.actions.shape == (4, 2, 2) and state.mean.shape == (4, 2, 2)
    assert result.value.shape == (4,)
    np.testing.assert_allclose(result.mean, jnp.broadcast_to(targets[:, None], (4, 2, 2)), atol=0.1)
    assert float(result.value[3]) == 0.0  # the prior's sequence scored and kept
    one, _ = jax.jit(plan_one)(init_plan(cfg, 2), first[2], keys[2], targets[2], prior[2])
    np.testing.assert_allclose(result.mean[2], one.mean, atol=1e-5)  # as if planned alone


def test_plan_state_checkpoints(tmp_path):
    """The plan carry saves and restores with jaxrl's Checkpointer (it is a plain pytree)."""
    from jaxrl.loops.checkpoint import Checkpointer

    cfg = PlannerConfig(horizon=2, num_samples=8, num_elites=2, iterations=1)
    state = PlanState(jnp.arange(30, dtype=jnp.float32).reshape(5, 2, 3))
    ckpt = Checkpointer(tmp_path / "ckpt")
    ckpt.save(1, {"plan": state}, {"step": 1})
    restored, _ = ckpt.restore({"plan": init_plan(cfg, 3, (5,))})
    assert isinstance(restored["plan"], PlanState)
    np.testing.assert_array_equal(restored["plan"].mean, state.mean)


# ------------------------------------------------------------------ true-simulator planning

# MPPI, horizon 20, 64 samples, 8 elites, 4 iterations, from the pendulum hanging straight down
# (the hardest start; a random start's return is -1..-340). Planner seeds 0-4 (checked by hand):
# returns -349.4, -348.4, -365.5, -351.8, -348.3; upright (|th| < 0.1) by step 61-65; worst reward
# over the last 50 steps -0.023. Not swinging up scores about -2,000 (hanging still: -9.87/step).
SWING_UP = PlannerConfig(horizon=20, num_samples=64, num_elites=8, iterations=4)
SWING_UP_MIN_RETURN = -450.0
HOLD_MIN_REWARD = -0.1  # every one of the last 50 steps: |th| < ~0.3 rad, slow


def test_true_sim_mppi_swings_up_and_holds_pendulum():
    from jaxrl.envs.jax_envs import make_jax_env
    from jaxrl.loops.plan import make_plan_step

    env = make_jax_env("jax:pendulum", 1)
    plan_step = make_plan_step(env, SWING_UP)

    @jax.jit
    def episode(key):
        state = env.reset(jax.random.key(0))
        down = jnp.array([[-jnp.pi, 0.0]], jnp.float32)  # [th, thdot]
        state = state.replace(sim=down, obs=jnp.array([[-1.0, 0.0, 0.0]], jnp.float32))

        def body(carry, k):
            state, plan_state, first = carry
            action, plan_state, _ = plan_step(state, plan_state, first, k)
            state = env.step(state, action)
            return (state, plan_state, jnp.zeros(1, bool)), (state.reward[0], state.truncation[0])

        carry = (state, init_plan(SWING_UP, 1, (1,)), jnp.ones(1, bool))
        _, out = jax.lax.scan(body, carry, jax.random.split(key, 200))
        return out

    rewards, truncation = (np.asarray(x) for x in episode(jax.random.key(0)))
    assert truncation[-1] == 1.0 and truncation[:-1].sum() == 0  # exactly one 200-step episode
    assert rewards[:20].max() < -5.0  # it did start hanging down
    assert rewards.sum() > SWING_UP_MIN_RETURN, rewards.sum()
    assert rewards[-50:].min() > HOLD_MIN_REWARD, rewards[-50:].min()


def test_true_sim_value_fn_is_the_rollout_return():
    """The model's value of a sequence is the sum of the rewards the env gives for it."""
    from jaxrl.envs.jax_envs import make_jax_env
    from jaxrl.loops.plan import true_sim_value_fn

    env = make_jax_env("jax:pendulum?episode_length=5", 1)
    step = jax.jit(env.step)
    state = env.reset(jax.random.key(3))
    actions = jnp.array([[[0.5], [-1.0], [1.0]], [[0.0], [0.2], [-0.3]]])
    value = jax.jit(lambda s: true_sim_value_fn(env, s)(actions, jax.random.key(0)))
    values = value(state)
    for i in range(2):
        s, total = state, 0.0
        for t in range(3):
            s = step(s, actions[i, t][None])
            total += float(s.reward[0])
        assert float(values[i]) == pytest.approx(total, rel=1e-5)
    # Two steps before the time limit only two of the three steps count.
    late = value(state.replace(time=state.time + 3))
    s, total = state.replace(time=state.time + 3), 0.0
    for t in range(2):
        s = step(s, actions[0, t][None])
        total += float(s.reward[0])
    assert float(s.truncation[0]) == 1.0
    assert float(late[0]) == pytest.approx(total, rel=1e-5)


def test_cli_plan_writes_run_directory(tmp_path, capsys):
    import json

    from jaxrl.cli import main
    from jaxrl.loops.logging import read_metrics

    out = tmp_path / "plan"
    argv = ["plan", "--env", "jax:pendulum?episode_length=20", "--episodes", "2", "--out"]
    argv += [str(out), "--seed", "3", "--horizon", "4", "--num-samples", "16", "--num-elites"]
    argv += ["4", "--iterations", "2", "--method", "cem", "--no-progress", "--no-tensorboard"]
    out.mkdir()
    (out / "metrics.csv").write_text("step,eval_return\n999,1.0\n")  # an earlier run's
    main(argv)
    assert "planning latency per action" in capsys.readouterr().out
    for name in ("config.json", "metrics.csv", "summary.json", "learning_curve.png"):
        assert (out / name).exists(), name
    config = json.loads((out / "config.json").read_text())
    assert config["agent_config"]["method"] == "cem" and config["agent_config"]["horizon"] == 4
    assert config["env"] == "jax:pendulum?episode_length=20" and config["seed"] == 3
    rows = read_metrics(str(out / "metrics.csv"))
    assert [r["step"] for r in rows] == [20.0, 40.0]  # a rerun starts over
    summary = json.loads((out / "summary.json").read_text())
    assert [r["eval_return"] for r in rows] == pytest.approx(summary["episode_returns"])
    assert summary["final_eval_return_mean"] == pytest.approx(np.mean(summary["episode_returns"]))
    assert summary["total_steps"] == 40 and summary["completed"]
    assert 0 < summary["plan_latency_ms_median"] <= summary["plan_latency_ms_p90"]
    with pytest.raises(SystemExit) as err:
        main(["plan", "--env", "Pendulum-v1", "--out", str(tmp_path / "x")])
    assert err.value.code == 2
    assert "needs a JAX env" in capsys.readouterr().err
    # `jaxrl eval` of a plan run says there is no trained agent (not "unknown agent 'cem'").
    with pytest.raises(SystemExit) as err:
        main(["eval", str(out)])
    assert err.value.code == 2 and "`jaxrl plan` run" in capsys.readouterr().err
