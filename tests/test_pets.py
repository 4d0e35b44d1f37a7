"""PETS: the probabilistic ensemble's math, updates, known rewards, planning and a model fit."""

import dataclasses
import json
import math
import os

import gymnasium as gym
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import struct
from flax.training.train_state import TrainState

from jaxrl.agents.pets import PETS, REWARD_FNS, TERMINATION_FNS, PETSConfig
from jaxrl.agents.pets_model import (
    alive_returns,
    bound_logvar,
    buffer_stats,
    fit_with_early_stopping,
    gaussian_nll,
    model_loss,
    normalize_inputs,
)
from jaxrl.buffers import buffer_add, buffer_from_arrays, make_replay_buffer
from jaxrl.config import ConfigError, OffPolicyFields
from jaxrl.envs import make_env
from jaxrl.envs.jax_envs import make_jax_env
from jaxrl.loops import TrainConfig, prepare_run_dir, run_config, train_fused, train_host
from jaxrl.loops.logging import read_metrics
from jaxrl.registry import AgentSpec, refit_due
from jaxrl.types import Transition

TINY = dict(
    ensemble_size=3,
    num_elites=2,
    hidden_dims=(32, 32),
    horizon=5,
    population=32,
    cem_elites=4,
    cem_iterations=2,
    num_particles=4,
    batch_size=32,
    model_epochs=3,
    validation_ratio=0.2,
)
OBS_DIM, ACT_DIM = 3, 1
UPDATE = jax.jit(PETS.update)
PLAN = jax.jit(PETS.plan_actions, static_argnums=5)


def tiny(**kw):
    return PETSConfig(**{**TINY, **kw})


def random_batch(key, n=32, obs_dim=OBS_DIM, act_dim=ACT_DIM):
    k = jax.random.split(key, 4)
    obs = jax.random.normal(k[0], (n, obs_dim)) * 2.0 + 1.0
    act = jax.random.uniform(k[1], (n, act_dim), minval=-1.0, maxval=1.0)
    nxt = obs + 0.1 * jax.random.normal(k[2], (n, obs_dim))
    return Transition(obs, act, jax.random.normal(k[3], (n,)), nxt, jnp.zeros(n))


def stored(rows, capacity):
    """A replay buffer of ``capacity`` rows holding ``rows`` (the rest: huge garbage)."""
    state = make_replay_buffer(capacity).init(jax.tree.map(lambda x: x[0], rows))
    state = state.replace(data=jax.tree.map(lambda d: d + 1e6, state.data))
    return buffer_add(state, rows)


@pytest.fixture(scope="module")
def agent():
    return PETS.create(tiny(), jnp.zeros(OBS_DIM), jnp.zeros(ACT_DIM), 0)


def test_bound_logvar_stays_within_bounds():
    lo, hi = jnp.float32(-10.0), jnp.float32(0.5)
    raw = jnp.linspace(-1e3, 1e3, 20001)
    lv = bound_logvar(raw, lo, hi)
    # mbrl-lib's order (upper softplus, then lower) lets the top exceed max by softplus(lo - hi).
    top = 0.5 + math.log1p(math.exp(-10.5))
    assert bool(jnp.all(lv >= lo)) and bool(jnp.all(lv <= top + 1e-6))
    assert bool(jnp.all(jnp.diff(lv) >= 0))  # monotone
    # Far from the bounds it is (nearly) the identity; at the extremes it saturates.
    np.testing.assert_allclose(bound_logvar(jnp.float32(-4.0), lo, hi), -4.0, atol=0.02)
    np.testing.assert_allclose(lv[0], lo, atol=1e-4)
    np.testing.assert_allclose(lv[-1], top, atol=1e-6)
    # mbrl-lib's two softplus steps, by hand at raw = hi: hi - log 2, then lo + softplus(.).
    mid = 0.5 - math.log(2.0)
    np.testing.assert_allclose(
        bound_logvar(jnp.float32(0.5), lo, hi), -10.0 + math.log1p(math.exp(mid + 10.0)), rtol=1e-5
    )


def test_gaussian_nll_hand_values_and_loss_regularizer(agent):
    # (mu - y)^2 exp(-lv) + lv: (1 - 0)^2 / 4 + log 4, and 0 + 0 at mu = y, lv = 0.
    np.testing.assert_allclose(gaussian_nll(1.0, math.log(4.0), 0.0), 0.25 + math.log(4.0))
    np.testing.assert_allclose(gaussian_nll(2.0, 0.0, 2.0), 0.0)
    x = jax.random.normal(jax.random.key(0), (3, 8, OBS_DIM + ACT_DIM))
    y = jax.random.normal(jax.random.key(1), (3, 8, OBS_DIM + 1))
    loss, info = model_loss(agent.model.params, agent, x, y)
    mean, lv = agent.predict(agent.model.params, x)
    nll = sum(float(gaussian_nll(mean[m], lv[m], y[m]).mean()) for m in range(3))
    np.testing.assert_allclose(info["model/nll"], nll, rtol=1e-5)
    # Bounds regularizer 0.01 * (sum max_lv - sum min_lv) = 0.01 * 4 * (0.5 + 10).
    np.testing.assert_allclose(loss - info["model/nll"], 0.01 * 4 * 10.5, rtol=1e-5)


def test_refit_fits_the_normalizer_to_the_stored_rows_and_trains_every_member(agent):
    batch = random_batch(jax.random.key(2), n=40)
    new, info = UPDATE(agent, stored(batch, 64))  # 40 stored rows of 64; the rest is garbage
    assert set(info) >= {"model/nll", "model/mse", "model/elite_mse", "model/epochs"}
    assert all(bool(jnp.isfinite(v)) for v in info.values())
    # A fresh random fifth held out (floor(40 * 0.2)), the rest trains; 3 epochs (no early stop
    # from a random initialization), ceil(32 / 32) = 1 batch each.
    assert (int(info["model/val_rows"]), int(info["model/train_rows"])) == (8, 32)
    assert int(info["model/epochs"]) == 3 and int(new.model.step) == 3
    changed = jax.tree.map(
        lambda a, b: bool(jnp.any(a != b)),
        agent.model.params["members"],
        new.model.params["members"],
    )
    assert all(jax.tree.leaves(changed))
    # Fixed log-variance bounds stay put (no gradient, no weight decay).
    np.testing.assert_array_equal(new.model.params["min_logvar"], -10.0)
    np.testing.assert_array_equal(new.model.params["max_logvar"], 0.5)
    # The input normalizer is the stored rows' mean and std, not a running estimate.
    x = np.concatenate([batch.obs, batch.action], axis=-1)
    np.testing.assert_allclose(new.in_stats.mean, x.mean(0), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(new.in_stats.var, x.var(0), rtol=1e-4, atol=1e-5)
    # A second refit on more rows replaces the statistics (a running normalizer would keep
    # weighting the first 40 rows).
    more = random_batch(jax.random.key(3), n=24)
    more = more._replace(obs=more.obs * 5.0 - 3.0, next_obs=more.next_obs * 5.0 - 3.0)
    both = jax.tree.map(lambda a, b: jnp.concatenate([a, b]), batch, more)
    again, _ = UPDATE(new, stored(both, 64))
    x = np.concatenate([both.obs, both.action], axis=-1)
    np.testing.assert_allclose(again.in_stats.mean, x.mean(0), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(again.in_stats.var, x.var(0), rtol=1e-4, atol=1e-4)
    # The targets stay raw: the loss reads next_obs - obs as stored.
    xs, ys = again.model_data(both)
    np.testing.assert_allclose(ys[:, :OBS_DIM], both.next_obs - both.obs)
    np.testing.assert_allclose(xs, normalize_inputs(again.in_stats, x), atol=1e-6)
    # Only learned bounds get a gradient.
    x, y = jnp.zeros((3, 4, OBS_DIM + ACT_DIM)), jnp.ones((3, 4, OBS_DIM + 1))
    for learn in (False, True):
        a = agent.replace(config=tiny(learn_logvar_bounds=learn))
        grads = jax.grad(model_loss, has_aux=True)(a.model.params, a, x, y)[0]
        assert bool(jnp.any(grads["max_logvar"] != 0)) == learn
        assert bool(jnp.any(grads["min_logvar"] != 0)) == learn


def test_masked_loss_ignores_the_padding_of_a_short_last_batch(agent):
    x = jax.random.normal(jax.random.key(0), (3, 8, OBS_DIM + ACT_DIM))
    y = jax.random.normal(jax.random.key(1), (3, 8, OBS_DIM + 1))
    mask = jnp.arange(8) < 5
    full, _ = model_loss(agent.model.params, agent, x[:, :5], y[:, :5])
    padded, _ = model_loss(agent.model.params, agent, x, y.at[:, 5:].set(1e6), mask)
    np.testing.assert_allclose(padded, full, rtol=1e-5)


def test_elites_are_chosen_by_held_out_mse_and_exclude_a_corrupted_member():
    # Member 1's output bias is shifted by 10 (a mean error of 10 per target); a tiny learning
    # rate keeps it broken through the refit. It must rank last, on held-out rows, every time.
    data = linear_transitions(jax.random.key(0), 64)
    data = data._replace(obs=jnp.pad(data.obs, ((0, 0), (0, 1))))
    data = data._replace(next_obs=jnp.pad(data.next_obs, ((0, 0), (0, 1))))
    for seed in range(3):
        cfg = tiny()
        agent = PETS.create(cfg, jnp.zeros(OBS_DIM), jnp.zeros(ACT_DIM), seed)
        opt = agent.model.opt_state  # a learning rate too small to repair member 1
        opt = opt._replace(hyperparams={**opt.hyperparams, "learning_rate": jnp.float32(1e-6)})
        params = jax.tree.map(jnp.copy, agent.model.params)
        head = params["members"]["params"]["MLP_0"]["Dense_2"]
        head["bias"] = head["bias"].at[1, : OBS_DIM + 1].add(10.0)
        agent = agent.replace(model=agent.model.replace(params=params, opt_state=opt))
        new, info = UPDATE(agent, stored(data, 64))
        elites = np.asarray(jax.lax.top_k(-new.elite_score, cfg.num_elites)[1])
        assert 1 not in elites, new.elite_score
        assert int(np.argmax(new.elite_score)) == 1 and float(new.elite_score[1]) > 50.0
        assert int(info["model/val_rows"]) == 12
        np.testing.assert_allclose(
            info["model/elite_mse"], np.sort(new.elite_score)[: cfg.num_elites].mean(), rtol=1e-6
        )


def test_early_stopping_keeps_the_best_epoch():
    # params = epochs trained; the held-out score by epoch: 10 before training, then
    # 5, 4.99 (< 1% better: no improvement), 3 (best), 3.5, 4, 4 -> patience 3 stops at 6.
    table = jnp.array([10.0, 5.0, 4.99, 3.0, 3.5, 4.0, 4.0, 1.0, 1.0, 1.0])
    model = TrainState.create(apply_fn=None, params=jnp.int32(0), tx=optax.sgd(0.0))

    def train_epoch(model, key):
        return model.replace(params=model.params + 1), jnp.float32(0)

    def score(params):
        return jnp.stack([table[params], table[params] + 1.0])

    def fit(start, patience, max_epochs=9):
        return fit_with_early_stopping(
            start, train_epoch, score, score(start.params), jax.random.key(0),
            max_epochs=max_epochs, patience=patience, threshold=0.01,
        )  # fmt: skip

    model_out, best, epochs, _ = fit(model, 3)
    assert int(epochs) == 6 and int(model_out.params) == 3
    np.testing.assert_allclose(best, [3.0, 4.0])
    # No patience: every epoch runs and the best (epoch 7) is kept.
    model_out, best, epochs, _ = fit(model, 0)
    assert int(epochs) == 9 and int(model_out.params) == 7
    # Nothing improves: the last epoch's parameters stay (as mbrl-lib's trainer).
    model_out, best, epochs, _ = fit(model.replace(params=jnp.int32(7)), 5, max_epochs=2)
    assert int(epochs) == 2 and int(model_out.params) == 9
    np.testing.assert_allclose(best, [1.0, 2.0])


def test_vmapped_create_and_refit():
    cfg = tiny()
    buffers = jax.vmap(lambda k: buffer_from_arrays(random_batch(k, 48)))(
        jax.random.split(jax.random.key(3), 2)
    )

    def train(seed, buffer):
        agent = PETS.create(cfg, jnp.zeros(OBS_DIM), jnp.zeros(ACT_DIM), seed)
        return agent.update(buffer)

    agents, infos = jax.jit(jax.vmap(train))(jnp.arange(2), buffers)
    assert infos["model/nll"].shape == (2,)
    assert bool(jnp.all(jnp.isfinite(infos["model/nll"])))
    w = agents.model.params["members"]["params"]["MLP_0"]["Dense_0"]["kernel"]
    assert w.shape[:2] == (2, 3) and not bool(jnp.allclose(w[0], w[1]))
    assert agents.model.step.tolist() == [6, 6]  # 3 epochs of ceil((48 - 9) / 32) batches


def test_refit_due_counts_env_steps_from_learning_starts():
    due = [s for s in range(1, 60) if refit_due(s, 1, 10, 7)]
    assert due == [10, 17, 24, 31, 38, 45, 52, 59]
    # Four envs: the vectorized step that reaches (or passes) each refit point.
    due = [s for s in range(4, 60, 4) if refit_due(s, 4, 10, 7)]
    assert due == [12, 20, 24, 32, 40, 48, 52]
    assert not any(refit_due(s, 1, 0, 5) for s in (1, 2, 3, 4)) and refit_due(5, 1, 0, 5)


@dataclasses.dataclass(frozen=True, kw_only=True)
class RefitProbeConfig(OffPolicyFields):
    """A planner that records when the loops refit it on the whole buffer."""

    every: int = 7
    """Env steps between refits."""


class RefitProbe(struct.PyTreeNode):
    """Records the buffer's size at each refit (``update`` gets the whole buffer)."""

    sizes: jax.Array
    calls: jax.Array
    config: RefitProbeConfig = struct.field(pytree_node=False)

    @classmethod
    def create(cls, config, obs_example, action_example, seed):
        return cls(jnp.full(16, -1, jnp.int32), jnp.int32(0), config)

    def update(self, buffer):
        sizes = self.sizes.at[self.calls].set(buffer.size)
        info = {"probe/size": buffer.size, "probe/calls": self.calls + 1}
        return self.replace(sizes=sizes, calls=self.calls + 1), info

    def init_plan(self, num_envs):
        return ()

    def plan_actions(self, plan, obs, first, key, explore):
        return jnp.zeros((obs.shape[0], 1)), plan

    def sample_actions(self, obs, rng):
        return jnp.zeros((*obs.shape[:-1], 1))

    def eval_actions(self, obs):
        return jnp.zeros((*obs.shape[:-1], 1))


REFIT_SPEC = AgentSpec("refit-probe", RefitProbe, RefitProbeConfig, "planner", refit_field="every")


@pytest.mark.parametrize("env_id", ["jax:pendulum", "Pendulum-v1"])
def test_loops_refit_exactly_every_model_train_freq_steps(tmp_path, env_id):
    cfg = RefitProbeConfig(learning_starts=10, every=7, buffer_size=100, utd_ratio=3)
    out = str(tmp_path / "run")
    train = TrainConfig(
        env=env_id, total_steps=40, out=out, progress=False, tensorboard=False,
        eval_every=40, eval_episodes=1, log_every=20, checkpoint_every=40,
    )  # fmt: skip
    prepare_run_dir(out, run_config(REFIT_SPEC.name, cfg, train))
    if env_id.startswith("jax:"):
        env = make_jax_env(env_id, 1)
        summary = train_fused(REFIT_SPEC, cfg, env, make_jax_env(env_id, 1), train, [out])[0]
    else:
        env, eval_env = make_env(env_id), make_env(env_id)
        agent = RefitProbe.create(cfg, env.obs_example, env.action_example, 0)
        summary = train_host(REFIT_SPEC, agent, env, eval_env, train, out)
    assert summary["completed"]
    rows = read_metrics(os.path.join(out, "metrics.csv"))
    # Each row logs the last refit's metrics: at step 20 the refits at 10 and 17 (the first
    # sees the random steps), at step 40 those at 24, 31 and 38; never one per step.
    logged = [(r["step"], r["probe/calls"], r["probe/size"]) for r in rows if "probe/calls" in r]
    assert logged[-2:] == [(20, 2.0, 17.0), (40, 5.0, 38.0)], logged


def test_known_pendulum_reward_matches_both_envs():
    env = make_jax_env("jax:pendulum", num_envs=16)
    state, env_step = env.reset(jax.random.key(4)), jax.jit(env.step)
    fn = REWARD_FNS["pendulum"]
    for i in range(3):
        action = jax.random.uniform(jax.random.key(10 + i), (16, 1), minval=-1.5, maxval=1.5)
        obs = state.obs
        state = env_step(state, action)
        pred = fn(obs, action, state.info["final_obs"])
        np.testing.assert_allclose(pred, state.reward, rtol=1e-5, atol=1e-5)
    # Gymnasium's Pendulum-v1 (torque = 2 * action, the host loop's rescale).
    genv = gym.make("Pendulum-v1")
    obs, _ = genv.reset(seed=0)
    rng = np.random.default_rng(0)
    for _ in range(20):
        a = rng.uniform(-1.0, 1.0, size=1).astype(np.float32)
        nxt, r, *_ = genv.step(2.0 * a)
        np.testing.assert_allclose(
            fn(jnp.asarray(obs), jnp.asarray(a), nxt), r, rtol=1e-5, atol=1e-5
        )
        obs = nxt
    genv.close()


def test_plan_actions_shapes_range_and_first_reset(agent):
    plan_fn = PLAN
    obs = jax.random.normal(jax.random.key(6), (2, OBS_DIM))
    plan = agent.init_plan(2)
    assert plan.mean.shape == (2, 5, ACT_DIM)
    key = jax.random.key(7)
    acts, plan1 = plan_fn(agent, plan, obs, jnp.array([True, True]), key, True)
    assert acts.shape == (2, ACT_DIM) and plan1.mean.shape == (2, 5, ACT_DIM)
    assert bool(jnp.all(jnp.abs(acts) <= 1.0)) and bool(jnp.all(jnp.isfinite(acts)))
    np.testing.assert_allclose(acts, plan1.mean[:, 0])  # acts with the final CEM mean
    # At an episode's first step the carried plan is ignored; otherwise it warm-starts CEM.
    junk = plan.replace(mean=jnp.full_like(plan.mean, 0.9))
    fresh = plan_fn(agent, junk, obs, jnp.array([True, True]), key, True)[0]
    np.testing.assert_allclose(fresh, acts, atol=1e-6)
    warm = plan_fn(agent, junk, obs, jnp.array([True, False]), key, True)[0]
    np.testing.assert_allclose(warm[0], acts[0], atol=1e-6)
    assert not np.allclose(warm[1], acts[1])
    # Stateless acting plans from scratch; evaluation takes single observations too and is
    # deterministic.
    np.testing.assert_allclose(jax.jit(PETS.sample_actions)(agent, obs, key), acts, atol=1e-6)
    evaluate = jax.jit(PETS.eval_actions)
    e1, e2 = evaluate(agent, obs[0]), evaluate(agent, obs[0])
    assert e1.shape == (ACT_DIM,)
    np.testing.assert_array_equal(e1, e2)


@pytest.mark.parametrize("propagation", ["fixed_model", "random_model"])
def test_trajectory_returns_use_elites_evenly(agent, propagation):
    # Member m predicts reward m exactly (zero output kernel, bias m, minimal variance);
    # the elites are members 1 and 2, so every sequence is worth H * (1 + 2) / 2.
    agent = agent.replace(config=tiny(propagation=propagation))
    params = jax.tree.map(jnp.copy, agent.model.params)
    head = params["members"]["params"]["MLP_0"]["Dense_2"]
    head["kernel"] = jnp.zeros_like(head["kernel"])
    bias = jnp.zeros_like(head["bias"]).at[:, OBS_DIM].set(jnp.arange(3.0))
    head["bias"] = bias.at[:, OBS_DIM + 1 :].set(-1e3)  # raw log-variance -> min_logvar
    agent = agent.replace(
        model=agent.model.replace(params=params), elite_score=jnp.array([5.0, 1.0, 2.0])
    )
    actions = jax.random.uniform(jax.random.key(8), (64, 5, ACT_DIM), minval=-1, maxval=1)
    values = jax.jit(PETS.trajectory_returns)(agent, jnp.ones(OBS_DIM), actions, jax.random.key(9))
    if propagation == "fixed_model":
        # Each sequence's 4 particles: 2 on member 1, 2 on member 2, for the whole horizon.
        # Sampling noise (std exp(-5) per step) is ~0.01; a wrong elite or split is >= 1 off.
        np.testing.assert_allclose(values, 5 * 1.5, atol=0.05)
    else:
        # TS1: members drawn per step, balanced over the population, not within a sequence.
        assert float(values.std()) > 0.1
        assert bool(jnp.all((values > 5 - 0.1) & (values < 10 + 0.1)))
        np.testing.assert_allclose(values.mean(), 5 * 1.5, atol=0.05)


def test_alive_returns_count_rewards_up_to_and_including_the_first_termination():
    # Columns: terminates at step 2 (later rewards NaN: a diverged rollout), at step 0, never,
    # at step 4 (the last), and at 1 then again at 3 (done is sticky, the second changes nothing).
    nan = jnp.nan
    rewards = jnp.array(
        [
            [1.0, 5.0, 1.0, 1.0, 2.0],
            [2.0, 5.0, 2.0, 1.0, 3.0],
            [3.0, 5.0, 3.0, 1.0, 4.0],
            [nan, 5.0, 4.0, 1.0, 5.0],
            [nan, 5.0, 5.0, 1.0, 6.0],
        ]
    )
    dones = jnp.zeros((5, 5), bool)
    dones = dones.at[2, 0].set(True).at[0, 1].set(True).at[4, 3].set(True)
    dones = dones.at[1, 4].set(True).at[3, 4].set(True)
    np.testing.assert_allclose(alive_returns(rewards, dones), [6.0, 5.0, 15.0, 5.0, 5.0])
    # Once done, it stays done even if a later step's done is False (mbrl-lib's sticky flag).
    assert float(alive_returns(jnp.ones(4), jnp.array([False, True, False, False]))) == 2.0


def test_inverted_pendulum_termination_hand_values_and_gymnasium():
    fn = TERMINATION_FNS["inverted_pendulum"]
    nxt = jnp.array(
        [
            [0.5, 0.0, 3.0, -2.0],  # upright
            [0.0, 0.2, 0.0, 0.0],  # at the bound: still alive (|angle| <= 0.2)
            [0.0, -0.2, 0.0, 0.0],
            [0.0, 0.2001, 0.0, 0.0],  # past it
            [0.0, -0.25, 0.0, 0.0],
            [jnp.nan, 0.0, 0.0, 0.0],  # non-finite anywhere
            [0.0, 0.0, 0.0, jnp.inf],
        ]
    )
    done = fn(jnp.zeros_like(nxt), jnp.zeros((7, 1)), nxt)
    assert done.dtype == jnp.bool_
    np.testing.assert_array_equal(done, [False, False, False, True, True, True, True])
    # Gymnasium's own check agrees on real transitions.
    env = gym.make("InvertedPendulum-v5")
    obs, _ = env.reset(seed=0)
    rng, ends = np.random.default_rng(0), 0
    for _ in range(200):
        a = rng.uniform(-1.0, 1.0, size=1).astype(np.float32)
        nxt, _, terminated, truncated, _ = env.step(3.0 * a)
        assert bool(fn(jnp.asarray(obs), jnp.asarray(a), jnp.asarray(nxt))) == terminated
        ends += terminated
        obs = env.reset()[0] if terminated or truncated else nxt
    env.close()
    assert ends > 3  # random actions topple the pole within a few dozen steps


def test_trajectory_returns_stop_at_the_predicted_termination(agent):
    # Every member predicts reward 1 and a pole-angle (obs[1]) step of +0.15 (noise std
    # exp(-5), reward too): from angle 0 the rollout is alive after step 0 (0.15) and
    # terminates at step 1 (0.30), so a 5-step return is 2 instead of 5.
    params = jax.tree.map(jnp.copy, agent.model.params)
    head = params["members"]["params"]["MLP_0"]["Dense_2"]
    head["kernel"] = jnp.zeros_like(head["kernel"])
    bias = jnp.zeros_like(head["bias"]).at[:, 1].set(0.15).at[:, OBS_DIM].set(1.0)
    head["bias"] = bias.at[:, OBS_DIM + 1 :].set(-1e3)
    actions = jax.random.uniform(jax.random.key(8), (8, 5, ACT_DIM), minval=-1, maxval=1)
    returns = jax.jit(PETS.trajectory_returns)
    for fn, expected in (("none", 5.0), ("inverted_pendulum", 2.0)):
        model = agent.model.replace(params=params)
        planner = agent.replace(model=model, config=tiny(termination_fn=fn))
        values = returns(planner, jnp.zeros(OBS_DIM), actions, jax.random.key(9))
        np.testing.assert_allclose(values, expected, atol=0.05)  # reward noise ~0.01


A_MAT = jnp.array([[1.0, 0.1], [-0.1, 0.95]])
B_MAT = jnp.array([[0.0], [0.1]])


def linear_transitions(key, n):
    k1, k2 = jax.random.split(key)
    obs = jax.random.uniform(k1, (n, 2), minval=-1.0, maxval=1.0)
    act = jax.random.uniform(k2, (n, 1), minval=-1.0, maxval=1.0)
    nxt = obs @ A_MAT.T + act @ B_MAT.T
    return Transition(obs, act, -(obs[:, 0] ** 2), nxt, jnp.zeros(n))


@jax.jit
def fit_linear_system(seed):
    """One refit (16 epochs) on 2,000 rows of x' = A x + B u, r = -x0^2; relative test errors."""
    data = linear_transitions(jax.random.key(seed), 2000)
    cfg = tiny(hidden_dims=(64, 64), model_lr=3e-3, batch_size=64, model_epochs=16, patience=0)
    agent = PETS.create(cfg, jnp.zeros(2), jnp.zeros(1), seed)
    x = jnp.concatenate([data.obs, data.action], -1)
    before = agent.replace(in_stats=buffer_stats(x, 2000))
    agent, info = agent.update(buffer_from_arrays(data))
    test = linear_transitions(jax.random.key(seed + 2000), 500)
    delta = test.next_obs - test.obs

    def errors(agent):
        x = normalize_inputs(agent.in_stats, jnp.concatenate([test.obs, test.action], -1))
        pred, _ = agent.predict(agent.model.params, jnp.broadcast_to(x, (3, *x.shape)))
        elites = jnp.argsort(agent.elite_score)[:2]
        obs_rel = ((pred[elites, :, :2] - delta) ** 2).mean((1, 2)) / delta.var(0).mean()
        reward_rel = ((pred[elites, :, 2] - test.reward) ** 2).mean(1) / test.reward.var()
        return obs_rel.max(), reward_rel.max()

    return errors(agent), errors(before), info


def test_model_fits_a_linear_system():
    # Seeds 0-4 (scripted): elite squared errors 0.0004-0.0072 (next obs) and 0.005-0.008
    # (reward) of the targets' variance (1 = predicting the mean).
    (obs_rel, reward_rel), (obs_before, _), info = fit_linear_system(0)
    assert float(obs_rel) < 0.02, obs_rel
    assert float(reward_rel) < 0.05, reward_rel
    assert float(obs_before) > 0.5, obs_before  # the untrained ensemble does not fit it
    assert int(info["model/epochs"]) == 16 and int(info["model/train_rows"]) == 1600


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(num_elites=4), "num_elites .*cannot exceed ensemble_size"),
        (dict(num_particles=5), "num_particles .*multiple of num_elites"),
        (dict(reward_fn="cheetah"), "reward_fn must be one of .*'learned', 'pendulum'"),
        (dict(cem_elites=64), "cem_elites .*cannot exceed population"),
        (dict(propagation="expectation"), "propagation must be one of"),
        (dict(termination_fn="hopper"), "termination_fn must be one of .*'none', 'inverted_p"),
        (dict(horizon=0), "horizon must be positive"),
        (dict(cem_momentum=1.0), "planner fields: .*momentum"),
        (dict(validation_ratio=0.6), "validation_ratio must be in"),
        (dict(model_train_freq=0), "model_train_freq must be positive"),
    ],
)
def test_config_validation_errors(kw, match):
    with pytest.raises(ConfigError, match=match):
        tiny(**kw)


def test_defaults_are_mbrl_lib_pets():
    cfg = PETSConfig()
    assert (cfg.ensemble_size, cfg.num_elites, cfg.hidden_dims) == (7, 5, (200,) * 4)
    pc = cfg.planner_config()
    assert (pc.method, pc.horizon, pc.num_samples, pc.num_elites, pc.iterations) == (
        "cem",
        15,
        500,
        50,
        5,
    )
    assert (pc.momentum, pc.max_std, cfg.num_particles, cfg.propagation) == (
        0.1,
        0.5,
        20,
        "fixed_model",
    )
    # Training: pets_hopper.yaml's fields (validation_ratio: pets_reacher.yaml's).
    train = (cfg.model_train_freq, cfg.model_epochs, cfg.patience, cfg.batch_size)
    assert train == (250, 25, 25, 32) and cfg.learning_starts == 1000
    assert (cfg.model_lr, cfg.model_weight_decay, cfg.validation_ratio) == (2e-4, 3e-5, 0.05)
    assert cfg.improvement_threshold == 0.01


# The CPU-sized configuration of the learning test and of benchmarks/planners.py: a known
# reward, a 4-member 64x64 ensemble (2 elites, 4 particles), CEM 64 x 3 iterations over 15 steps.
PETS_CPU = [
    "--reward-fn", "pendulum",
    "--ensemble-size", "4", "--num-elites", "2", "--hidden-dims", "64", "64",
    "--num-particles", "4", "--horizon", "15", "--population", "64", "--cem-elites", "8",
    "--cem-iterations", "3", "--learning-starts", "200", "--buffer-size", "600",
    "--model-train-freq", "25", "--model-epochs", "25", "--patience", "25", "--batch-size", "64",
    "--model-lr", "7.5e-4", "--validation-ratio", "0.1",
]  # fmt: skip


@pytest.mark.slow
def test_pets_learns_jax_pendulum_in_the_fused_loop(tmp_path, capsys, record_property):
    # One episode of random actions, then two of planning with the known reward (the ensemble
    # learns the dynamics only, refit on the whole buffer every 25 steps from step 200);
    # evaluation: 10 episodes from Pendulum's random initial states.
    from offline_utils import learning_seed

    from jaxrl.cli import main, parse_train_args
    from jaxrl.run import train

    out = str(tmp_path / "pets")
    argv = [
        "--env", "jax:pendulum", "--num-envs", "1", "--total-steps", "600",
        "--seed", str(learning_seed()), "--eval-every", "600", "--eval-episodes", "10",
        "--out", out, "--no-progress", "--no-tensorboard", *PETS_CPU,
    ]  # fmt: skip
    summary = train("pets", *parse_train_args("pets", argv))
    # Seeds 0-4: -126, -151, -100, -138, -88 (Gymnasium's Pendulum-v1, host loop, same flags:
    # -126, -137, -138, -150, -138); random actions score about -1200. The margin allows one
    # evaluation episode of 10 to fail outright (a full spin, about -1500) on another machine.
    # With a refit every 50 steps (mbrl-lib's pets_cartpole) the means were as good, but seed
    # 3's single `jaxrl eval` episode below failed to swing up (-1508; -385 at 25 steps).
    record_property("value", summary["final_eval_return_mean"])
    record_property("threshold", -300)
    assert summary["final_eval_return_mean"] >= -300, summary
    # `jaxrl eval` restores the planner's run directory and plans through its own episodes
    # (in parallel, so 10 cost about what 1 does). One episode alone is no test: on another
    # machine seed 3's single episode failed to swing up (-1500) with a 10-episode mean of -155,
    # at this commit and before it.
    capsys.readouterr()
    main(["eval", out, "--episodes", "10"])
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["agent"] == "pets" and result["step"] == 600 and result["episodes"] == 10
    assert np.isfinite(result["return_mean"]) and result["return_mean"] > -600, result
