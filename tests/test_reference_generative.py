"""Diffusion-QL, FQL and IDQL match their reference implementations: math on hand values."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl import generative as gen
from jaxrl.networks import MLP, EnsembleQ
from jaxrl.offline import common
from jaxrl.offline import diffusion_ql as dql_lib
from jaxrl.offline import iql as iql_lib
from jaxrl.offline.diffusion_ql import DiffusionQL, DiffusionQLConfig
from jaxrl.offline.fql import FQL, FQLConfig
from jaxrl.offline.idql import IDQL, IDQLConfig
from jaxrl.types import Transition

# A 3-step schedule small enough to do by hand: betas 0.1, 0.2, 0.5.
BETAS = np.asarray([0.1, 0.2, 0.5], np.float32)
HAND = gen.DiffusionSchedule(BETAS, 1 - BETAS, np.cumprod(1 - BETAS).astype(np.float32))
# alphas 0.9, 0.8, 0.5; abar 0.9, 0.72, 0.36; abar_prev 1, 0.9, 0.72.


# --------------------------------------------------------------------------- Diffusion-QL sampler


def test_posterior_variance_of_a_three_step_schedule_by_hand():
    np.testing.assert_allclose(HAND.alpha_bars, [0.9, 0.72, 0.36], rtol=1e-6)
    np.testing.assert_allclose(HAND.alpha_bars_prev, [1.0, 0.9, 0.72], rtol=1e-6)
    # beta~_t = beta_t (1 - abar_{t-1}) / (1 - abar_t)
    #   t=0: 0.1 * 0 / 0.1 = 0;  t=1: 0.2 * 0.1 / 0.28 = 1/14;  t=2: 0.5 * 0.28 / 0.64 = 7/32
    np.testing.assert_allclose(HAND.posterior_variance, [0.0, 1 / 14, 7 / 32], rtol=1e-6, atol=1e-8)


def test_posterior_step_clips_x0_and_uses_the_posterior_mean_and_variance():
    x, eps, z = jnp.asarray([0.5]), jnp.asarray([-2.0]), jnp.asarray([1.0])
    # t = 2: x0 = 0.5 / 0.6 + sqrt(1 / 0.36 - 1) * 2 = (0.5 + 0.8 * 2) / 0.6 = 3.5 -> clipped to 1.
    # mean = 0.5 sqrt(0.72) / 0.64 * 1 + 0.28 sqrt(0.5) / 0.64 * 0.5; + sqrt(7/32) * z.
    want = 0.5 * np.sqrt(0.72) / 0.64 + 0.28 * np.sqrt(0.5) / 0.64 * 0.5 + np.sqrt(7 / 32)
    got = gen.ddpm_posterior_step(x, eps, 2, HAND, z)
    np.testing.assert_allclose(got, [want], rtol=1e-5)  # 1.2853: the iterate is not clipped
    unclipped = (
        0.5 * np.sqrt(0.72) / 0.64 * 3.5 + 0.28 * np.sqrt(0.5) / 0.64 * 0.5 + np.sqrt(7 / 32)
    )
    assert abs(float(got[0]) - unclipped) > 1.0
    # t = 0: the step returns the clipped x0 itself (c1 = 1, c2 = 0, no noise).
    # x0 = 0.5 / sqrt(0.9) + sqrt(1 / 0.9 - 1) * 2 = 1.1937 -> 1.
    np.testing.assert_allclose(gen.ddpm_posterior_step(x, eps, 0, HAND, z), [1.0], rtol=1e-6)
    x0 = (0.2 - np.sqrt(0.1) * 0.3) / np.sqrt(0.9)  # inside the box: kept as is
    np.testing.assert_allclose(
        gen.ddpm_posterior_step(jnp.asarray([0.2]), jnp.asarray([0.3]), 0, HAND, z), [x0], rtol=1e-5
    )


def test_posterior_sampler_ends_on_the_clipped_x0():
    # A noise predictor that pushes x0 far outside the box: the last step returns clip(x0) = 1
    # for every draw. (The iterates before it are not clipped: 1.2853 in the test above.)
    def fn(x, t):
        return jnp.full_like(x, -5.0)

    out = gen.ddpm_posterior_sample(fn, jax.random.key(0), (64, 1), HAND)
    np.testing.assert_allclose(out, 1.0, rtol=1e-6)
    idql = gen.ddpm_sample(fn, jax.random.key(0), (64, 1), HAND)
    assert float(jnp.abs(idql).max()) <= 1.0


def test_diffusion_ql_uses_the_posterior_sampler_by_default_and_ancestral_as_an_option():
    cfg = DiffusionQLConfig(hidden_dims=(8, 8), num_samples=2, diffusion_steps=3)
    assert cfg.sampler == "posterior"
    agent = DiffusionQL.create(cfg, jnp.zeros(3), jnp.zeros(2), 0)
    obs, key = jnp.ones((4, 3)), jax.random.key(1)
    fn = lambda x, t: agent.actor.apply_fn(agent.actor.params, obs, x, t)  # noqa: E731
    post = gen.ddpm_posterior_sample(fn, key, (4, 2), agent.schedule)
    np.testing.assert_allclose(agent.sample_chain(agent.actor.params, obs, key), post, rtol=1e-6)
    ancestral = agent.replace(config=DiffusionQLConfig(**{**cfg.__dict__, "sampler": "ancestral"}))
    anc = gen.ddpm_sample(fn, key, (4, 2), agent.schedule)
    np.testing.assert_allclose(ancestral.sample_chain(agent.actor.params, obs, key), anc, rtol=1e-6)


# ------------------------------------------------------------------------ Diffusion-QL max-Q backup


def test_max_q_backup_takes_each_critics_max_then_the_min():
    # 2 critics x 1 state x 3 sampled next actions.
    qs = jnp.asarray([[[1.0, 5.0, 0.0]], [[4.0, 2.0, 3.0]]])
    # Per critic max: 5 and 4 -> min 4 (the authors'). The other order: min per action
    # [1, 2, 0] -> max 2.
    np.testing.assert_allclose(dql_lib.max_q_backup_value(qs), [4.0])


# ------------------------------------------------------------------------------ FQL network order


def _two_layer(order):
    # Dense(2) -> [LN, relu] -> Dense(1); first layer maps x = 1 to [-1, 3], second sums.
    mlp = MLP((2, 1), nn.relu, layer_norm=True, layer_norm_order=order)
    params = mlp.init(jax.random.key(0), jnp.ones((1, 1)))
    params = jax.tree.map(lambda p: p, params)
    params["params"]["Dense_0"] = {"kernel": jnp.asarray([[-1.0, 3.0]]), "bias": jnp.zeros(2)}
    params["params"]["Dense_1"] = {"kernel": jnp.ones((2, 1)), "bias": jnp.zeros(1)}
    return mlp, params


def test_mlp_layer_norm_order_by_hand():
    # pre_act: LN([-1, 3]) = [-1, 1] -> relu [0, 1] -> sum 1.
    # post_act: relu([-1, 3]) = [0, 3] -> LN [-1, 1] -> sum 0.
    mlp, params = _two_layer("pre_act")
    np.testing.assert_allclose(mlp.apply(params, jnp.ones((1, 1))), [[1.0]], atol=1e-5)
    mlp, params = _two_layer("post_act")
    np.testing.assert_allclose(mlp.apply(params, jnp.ones((1, 1))), [[0.0]], atol=1e-5)
    with pytest.raises(ValueError, match="layer_norm_order"):
        MLP((2, 1), layer_norm_order="after").init(jax.random.key(0), jnp.ones((1, 1)))


def test_fql_networks_use_the_authors_order_and_others_keep_theirs():
    assert FQLConfig().layer_norm_order == "post_act"
    assert EnsembleQ().layer_norm_order == "pre_act" and MLP((1,)).layer_norm_order == "pre_act"
    for order in ("post_act", "pre_act"):
        cfg = FQLConfig(actor_hidden_dims=(4,), critic_hidden_dims=(4,), layer_norm_order=order)
        agent = FQL.create(cfg, jnp.zeros(3), jnp.zeros(2), 0)
        assert agent.critic.apply_fn.__self__.layer_norm_order == order
        assert agent.one_step.apply_fn.__self__.layer_norm_order == order
        assert agent.flow.apply_fn.__self__.layer_norm_order == order


# ---------------------------------------------------------------------------- FQL evaluation


def test_fql_evaluates_the_one_step_policy_with_noise_keyed_by_the_observation():
    cfg = FQLConfig(actor_hidden_dims=(8,), critic_hidden_dims=(8,))
    assert cfg.eval_noise == "sampled"
    agent = FQL.create(cfg, jnp.zeros(3), jnp.zeros(2), 0)
    obs = jnp.asarray([[0.1, 0.2, 0.3], [0.1, 0.2, 0.3], [0.4, 0.5, 0.6]])
    got = agent.eval_actions(obs)
    np.testing.assert_array_equal(got[0], got[1])  # same agent, same observation
    np.testing.assert_allclose(agent.eval_actions(obs[2]), got[2], rtol=1e-5)  # any batch
    key = common.observation_key(agent.rng, obs[2])
    np.testing.assert_allclose(got[2], agent.sample_actions(obs[2], key), rtol=1e-6)
    zero = agent.replace(config=FQLConfig(**{**cfg.__dict__, "eval_noise": "zero"}))
    z0 = agent.one_step.apply_fn(
        agent.one_step.params, jnp.concatenate([obs, jnp.zeros((3, 2))], -1)
    )
    np.testing.assert_allclose(zero.eval_actions(obs), jnp.clip(z0, -1, 1), rtol=1e-6)
    assert not np.allclose(got, zero.eval_actions(obs))


# ---------------------------------------------------------------------- IDQL shares IQL's step


def test_idql_update_is_iqls_value_and_critic_step_plus_diffusion_bc():
    cfg = IDQLConfig(hidden_dims=(8,), actor_hidden_dims=(8,), num_samples=2, diffusion_steps=2)
    agent = IDQL.create(cfg, jnp.zeros(3), jnp.zeros(2), 0)
    k = jax.random.split(jax.random.key(3), 5)
    batch = Transition(
        jax.random.normal(k[0], (8, 3)),
        jax.random.uniform(k[1], (8, 2), minval=-1, maxval=1),
        jax.random.normal(k[2], (8,)),
        jax.random.normal(k[3], (8, 3)),
        jnp.zeros(8),
    )
    new, info = jax.jit(lambda a: a.update(batch))(agent)
    ref, target_q, _ = jax.jit(lambda a: iql_lib.value_and_critic_step(a, batch))(agent)
    for a, b in ((new.value.params, ref.value.params), (new.critic.params, ref.critic.params)):
        jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-6), a, b)
    jax.tree.map(
        lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-6),
        new.target_critic_params,
        ref.target_critic_params,
    )
    assert {"value/loss", "critic/loss", "actor/loss"} <= set(info)
    qs = agent.critic.apply_fn(agent.target_critic_params, batch.obs, batch.action)
    np.testing.assert_allclose(target_q, qs.min(0), rtol=1e-6)
