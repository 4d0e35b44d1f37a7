"""Diffusion and flow modules (jaxrl.generative): math, samplers, and multimodal coverage."""

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl import generative as gen
from jaxrl import rl
from jaxrl.networks import GaussianActor, gradient_step, make_train_state
from jaxrl.offline import common

# ------------------------------------------------------------------------- math by hand


def test_vp_schedule_matches_the_closed_form():
    s = gen.vp_schedule(5)
    t = np.arange(1, 6)
    alphas = np.exp(-0.1 / 5 - 0.5 * 9.9 * (2 * t - 1) / 25)
    np.testing.assert_allclose(s.alphas, alphas, rtol=1e-6)
    np.testing.assert_allclose(s.betas, 1 - alphas, rtol=1e-5)
    np.testing.assert_allclose(s.alpha_bars, np.cumprod(alphas), rtol=1e-5)
    assert s.num_steps == 5 and s.alpha_bars[-1] < 0.01  # x_T is almost pure noise
    with pytest.raises(ValueError, match="at least one step"):
        gen.vp_schedule(0)


def test_ddpm_noising_is_the_forward_marginal():
    s = gen.vp_schedule(5)
    actions = jnp.full((64, 2), 0.5)
    x_t, t, eps = gen.ddpm_noising(jax.random.key(0), actions, s)
    assert x_t.shape == eps.shape == (64, 2) and t.shape == (64, 1)
    abar = s.alpha_bars[np.asarray(t[:, 0], int)][:, None]
    np.testing.assert_allclose(x_t, np.sqrt(abar) * 0.5 + np.sqrt(1 - abar) * eps, rtol=1e-5)
    assert set(np.unique(t)) <= set(range(5))


def test_sinusoidal_embedding():
    e = gen.sinusoidal_embedding(jnp.asarray([[0.0], [2.0]]), 8)
    freqs = np.exp(-np.log(10_000.0) * np.arange(4) / 3)
    np.testing.assert_allclose(e[1], np.concatenate([np.sin(2 * freqs), np.cos(2 * freqs)]), 1e-6)
    np.testing.assert_allclose(e[0], [0, 0, 0, 0, 1, 1, 1, 1])
    with pytest.raises(ValueError, match="even"):
        gen.sinusoidal_embedding(jnp.zeros((1, 1)), 7)


def _exact_eps(point, schedule):
    """The true noise prediction when the data is the single action ``point``."""
    abars = jnp.asarray(schedule.alpha_bars)

    def fn(x, t):
        abar = abars[t.astype(jnp.int32)]
        return (x - jnp.sqrt(abar) * point) / jnp.sqrt(1.0 - abar)

    return fn


@pytest.mark.parametrize("sampler", ["ddpm", "posterior"])
def test_samplers_recover_a_point_mass_with_the_exact_noise_predictor(sampler):
    s = gen.vp_schedule(5)
    point = jnp.asarray([0.3, -0.7])
    fn = _exact_eps(point, s)
    key = jax.random.key(0)
    if sampler == "ddpm":
        x = gen.ddpm_sample(fn, key, (16, 2), s)
    else:
        x = gen.ddpm_posterior_sample(fn, key, (16, 2), s)
    np.testing.assert_allclose(x, np.broadcast_to(point, (16, 2)), atol=1e-5)


def test_euler_sampler_integrates_known_fields():
    noise = jax.random.normal(jax.random.key(0), (8, 2)) * 0.1
    const = gen.euler_sample(lambda x, t: jnp.full_like(x, 0.5), noise, 4, clip=False)
    np.testing.assert_allclose(const, noise + 0.5, rtol=1e-6)
    # dx/dt = t: x(1) = x(0) + sum_i (i/n) / n = x(0) + (n - 1) / (2n) for Euler with n steps
    lin = gen.euler_sample(lambda x, t: jnp.broadcast_to(t, x.shape), noise, 10, clip=False)
    np.testing.assert_allclose(lin, noise + 0.45, rtol=1e-5)
    assert float(jnp.abs(gen.euler_sample(lambda x, t: 10 * jnp.ones_like(x), noise, 2)).max()) == 1


def test_flow_matching_targets_are_the_straight_path():
    a = jnp.full((32, 2), 0.4)
    x_t, t, v = gen.flow_matching_targets(jax.random.key(1), a)
    x0 = a - v
    np.testing.assert_allclose(x_t, (1 - t) * x0 + t * a, rtol=1e-5, atol=1e-6)
    assert float(t.min()) >= 0 and float(t.max()) <= 1


def test_select_by_value():
    actions = jnp.arange(12.0).reshape(2, 3, 2)
    values = jnp.asarray([[0.0, 5.0, 1.0], [9.0, 0.0, 0.0]])
    np.testing.assert_array_equal(common.select_by_value(actions, values), [[2, 3], [6, 7]])
    # A very low temperature samples the argmax; a huge one spreads over all candidates.
    cold = common.select_by_value(actions, values, jax.random.key(0), temperature=1e-3)
    np.testing.assert_array_equal(cold, [[2, 3], [6, 7]])
    picks = jax.vmap(lambda k: common.select_by_value(actions[0], values[0], k, 1e6))(
        jax.random.split(jax.random.key(1), 300)
    )
    assert len(np.unique(np.asarray(picks[:, 0]))) == 3
    with pytest.raises(ValueError, match="needs a key"):
        common.select_by_value(actions, values, temperature=1.0)


def test_observation_key_is_a_function_of_the_observation():
    key = jax.random.key(0)
    obs = jnp.asarray([[0.1, 0.2], [0.1, 0.2], [0.1, 0.3]])
    draws = jax.vmap(lambda o: jax.random.normal(common.observation_key(key, o)))(obs)
    assert draws[0] == draws[1] and draws[0] != draws[2]
    out = common.map_rows(lambda o, k: o + jax.random.normal(k, o.shape), key, obs[None])
    assert out.shape == (1, 3, 2)
    np.testing.assert_array_equal(out[0, 0], out[0, 1])
    single = common.map_rows(lambda o, k: o + jax.random.normal(k, o.shape), key, obs[2])
    np.testing.assert_array_equal(single, out[0, 2])  # independent of the batch it arrives in


# --------------------------------------------------------------------------- sampler contract

NET = gen.DenoiserNet(2, (32, 32))
OBS = jnp.linspace(-1, 1, 12).reshape(4, 3)
PARAMS = NET.init(jax.random.key(0), OBS, jnp.zeros((4, 2)), jnp.zeros((4, 1)))


@pytest.mark.parametrize("sampler", ["ddpm", "posterior", "euler"])
def test_samplers_are_deterministic_per_key_and_work_under_jit_and_vmap(sampler):
    s = gen.vp_schedule(5)

    def sample(key, obs):
        fn = partial(NET.apply, PARAMS, obs)
        if sampler == "ddpm":
            return gen.ddpm_sample(fn, key, (*obs.shape[:-1], 2), s)
        if sampler == "posterior":
            return gen.ddpm_posterior_sample(fn, key, (*obs.shape[:-1], 2), s)
        return gen.euler_sample(fn, jax.random.normal(key, (*obs.shape[:-1], 2)), 10)

    a = jax.jit(sample)(jax.random.key(3), OBS)
    np.testing.assert_array_equal(a, jax.jit(sample)(jax.random.key(3), OBS))
    assert not np.allclose(a, sample(jax.random.key(4), OBS))
    assert a.shape == (4, 2) and float(jnp.abs(a).max()) <= 1.0
    keys = jax.random.split(jax.random.key(5), 3)
    batched = jax.jit(jax.vmap(sample, in_axes=(0, None)))(keys, OBS)
    np.testing.assert_allclose(batched[1], sample(keys[1], OBS), rtol=1e-5, atol=1e-6)


def test_ln_resnet_denoiser_uses_dropout_only_in_training():
    net = gen.DenoiserNet(2, (16, 16), "ln_resnet", dropout_rate=0.5)
    x, t = jnp.zeros((4, 2)), jnp.ones((4, 1))
    params = net.init(jax.random.key(0), OBS, x, t)
    eval1, eval2 = net.apply(params, OBS, x, t), net.apply(params, OBS, x, t)
    np.testing.assert_array_equal(eval1, eval2)
    train = net.apply(params, OBS, x, t, True, rngs={"dropout": jax.random.key(1)})
    assert not np.allclose(train, eval1)


# -------------------------------------------------------------- multimodal actions (measured)

MODES = jnp.asarray([[-0.6, -0.6], [0.6, 0.6]])


def _bimodal(key, n):
    """Actions from an equal mixture of two well separated Gaussians (std 0.08), same state."""
    k_mode, k_noise = jax.random.split(key)
    mode = MODES[jax.random.bernoulli(k_mode, 0.5, (n,)).astype(jnp.int32)]
    return jnp.clip(mode + 0.08 * jax.random.normal(k_noise, (n, 2)), -1.0, 1.0)


def _coverage(actions):
    """Fraction of samples within 0.25 of each mode (a perfect model: ~0.5 each)."""
    dist = jnp.linalg.norm(actions[:, None] - MODES[None], axis=-1)
    return [float(jnp.mean(dist[:, i] < 0.25)) for i in range(2)]


def _fit(module, loss, steps=2000):
    obs = jnp.zeros((256, 1))
    example = (obs,) if isinstance(module, GaussianActor) else (obs, obs.repeat(2, -1), obs)
    state = make_train_state(module, jax.random.key(0), 1e-3, *example)

    def step(state, key):
        actions = _bimodal(jax.random.fold_in(key, 1), 256)
        return gradient_step(state, lambda p: (loss(p, obs, actions, key), {}))[0], None

    return jax.jit(lambda s: jax.lax.scan(step, s, jax.random.split(jax.random.key(1), steps)))(
        state
    )[0]


@pytest.mark.parametrize("model", ["diffusion-mlp", "diffusion-ln_resnet", "flow", "gaussian"])
def test_generative_actors_cover_both_modes_a_gaussian_does_not(model):
    obs, key = jnp.zeros((2000, 1)), jax.random.key(2)
    if model == "gaussian":  # maximum likelihood, as IQL's and BC's actors
        actor = GaussianActor(2, (64, 64))
        state = _fit(actor, lambda p, o, a, k: -rl.gaussian_log_prob(a, *actor.apply(p, o)).mean())
        mean, std = actor.apply(state.params, obs)
        actions = mean + std * jax.random.normal(key, mean.shape)
    elif model == "flow":
        net = gen.DenoiserNet(2, (64, 64), time_embedding="raw")
        state = _fit(
            net, lambda p, o, a, k: gen.flow_matching_loss(partial(net.apply, p, o), k, a).mean()
        )
        noise = jax.random.normal(key, (2000, 2))
        actions = gen.euler_sample(partial(net.apply, state.params, obs), noise, 10)
    else:
        net = gen.DenoiserNet(2, (64, 64), model.split("-")[1])
        s = gen.vp_schedule(5)
        state = _fit(
            net, lambda p, o, a, k: gen.ddpm_loss(partial(net.apply, p, o), k, a, s).mean()
        )
        actions = gen.ddpm_sample(partial(net.apply, state.params, obs), key, (2000, 2), s)
    cover = _coverage(actions)
    print(f"{model}: fraction near each mode {cover}")
    if model == "gaussian":
        # One wide bump between the modes.
        assert max(cover) < 0.15
    else:
        # T = 5 diffusion and 10 Euler steps leave some spread around each mode.
        assert min(cover) > 0.25
