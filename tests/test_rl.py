import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl import rl


def test_td_target_hand_computed():
    reward = jnp.asarray([1.0, -2.0, 0.5, 3.0])
    terminal = jnp.asarray([0.0, 1.0, 0.0, 1.0])
    next_value = jnp.asarray([10.0, 100.0, -4.0, 7.0])
    got = rl.td_target(reward, terminal, next_value, 0.9)
    # 1 + 0.9*10 = 10; terminal -> -2; 0.5 + 0.9*(-4) = -3.1; terminal -> 3
    np.testing.assert_allclose(got, [10.0, -2.0, -3.1, 3.0], rtol=1e-6)


def test_td_target_traced_discount_and_jit():
    fn = jax.jit(rl.td_target)
    got = fn(
        jnp.asarray([0.0, 1.0]), jnp.asarray([0.0, 0.0]), jnp.asarray([2.0, 4.0]), jnp.float32(0.5)
    )
    np.testing.assert_allclose(got, [1.0, 3.0])


def test_td_target_discount_one_no_terminal():
    got = rl.td_target(jnp.asarray([1.0]), jnp.asarray([0.0]), jnp.asarray([5.0]), 1.0)
    np.testing.assert_allclose(got, [6.0])


def test_td_target_wrong_rank_raises():
    with pytest.raises(AssertionError):
        rl.td_target(jnp.ones((4, 1)), jnp.zeros((4, 1)), jnp.ones((4, 1)), 0.99)
    with pytest.raises(AssertionError):
        rl.td_target(jnp.ones(4), jnp.zeros(4), jnp.ones((2, 4)), 0.99)


def test_td_target_shape_mismatch_raises():
    with pytest.raises(AssertionError):
        rl.td_target(jnp.ones(4), jnp.zeros(3), jnp.ones(4), 0.99)


def test_polyak_update_hand_computed():
    params = {"w": jnp.asarray([[1.0, 2.0], [3.0, 4.0]]), "b": jnp.asarray([10.0])}
    target = {"w": jnp.asarray([[0.0, 0.0], [1.0, -1.0]]), "b": jnp.asarray([0.0])}
    got = rl.polyak_update(params, target, 0.1)
    # 0.1 * p + 0.9 * t
    np.testing.assert_allclose(got["w"], [[0.1, 0.2], [1.2, -0.5]], rtol=1e-6)
    np.testing.assert_allclose(got["b"], [1.0], rtol=1e-6)
    # tau = 1 copies, tau = 0 keeps the target.
    np.testing.assert_allclose(rl.polyak_update(params, target, 1.0)["w"], params["w"])
    np.testing.assert_allclose(rl.polyak_update(params, target, 0.0)["b"], target["b"])


def test_polyak_update_structure_mismatch_raises():
    with pytest.raises(ValueError):
        rl.polyak_update({"a": jnp.ones(2)}, {"b": jnp.ones(2)}, 0.5)


def test_min_over_ensemble():
    qs = jnp.asarray([[1.0, 5.0, -2.0], [3.0, 0.0, -1.0], [2.0, 4.0, -3.0]])
    np.testing.assert_allclose(rl.min_over_ensemble(qs), [1.0, 0.0, -3.0])
    with pytest.raises(AssertionError):
        rl.min_over_ensemble(jnp.ones(3))


QS = jnp.asarray(
    [
        [5.0, 1.0, 9.0, 4.0],
        [3.0, 8.0, 2.0, 7.0],
        [6.0, 4.0, 1.0, 9.0],
        [1.0, 6.0, 7.0, 3.0],
        [9.0, 2.0, 5.0, 0.0],
    ]
)


def test_ensemble_subset_none_or_full_is_everything():
    key, params = jax.random.key(0), {"q": QS, "w": jnp.arange(5.0)}
    for num in (None, 5, 7):
        assert rl.ensemble_subset(key, params, num) is params


def test_ensemble_subset_two_of_five():
    # Members are QS's rows; "w" holds each member's index, so both leaves must take the same
    # members: the subset is of whole members, not of each leaf separately.
    params = {"q": QS, "w": jnp.arange(5.0)}
    fn = jax.jit(rl.ensemble_subset, static_argnums=2)
    seen = set()
    for seed in range(40):
        got = fn(jax.random.key(seed), params, 2)
        members = tuple(int(i) for i in np.asarray(got["w"]))
        assert got["q"].shape == (2, 4) and len(set(members)) == 2
        np.testing.assert_array_equal(got["q"], np.asarray(QS)[list(members)])
        seen.add(frozenset(members))
    # Subsets really are random: with 40 draws of 10 pairs, several distinct pairs appear.
    assert len(seen) >= 5


# ------------------------------------------------------------------------------- GAE and PPO clip


def _gae_case():
    # Two envs, three steps, time-major [T=3, N=2]. Env 0 terminates at t=1 (no bootstrap, trace
    # cut); env 1 is truncated at t=1 (bootstraps from its true final obs, V = 5, trace cut).
    rewards = jnp.asarray([[1.0, 0.0], [2.0, -1.0], [3.0, 2.0]])
    values = jnp.asarray([[0.5, 1.0], [1.0, 2.0], [1.5, 3.0]])
    next_values = jnp.asarray([[1.0, 2.0], [2.0, 5.0], [4.0, 0.5]])
    terminated = jnp.asarray([[0.0, 0.0], [1.0, 0.0], [0.0, 0.0]])
    done = jnp.asarray([[0.0, 0.0], [1.0, 1.0], [0.0, 0.0]])
    return rewards, values, next_values, terminated, done


def test_gae_advantages_hand_computed_with_termination_and_truncation():
    got = rl.gae_advantages(*_gae_case(), 0.9, 0.5)
    # gamma * lambda = 0.45.
    # env 0: deltas 1 + 0.9*1 - 0.5 = 1.4 | 2 - 1 = 1.0 (terminated) | 3 + 0.9*4 - 1.5 = 5.1
    #        A2 = 5.1, A1 = 1.0 (cut), A0 = 1.4 + 0.45 * 1.0 = 1.85
    # env 1: deltas 0 + 0.9*2 - 1 = 0.8 | -1 + 0.9*5 - 2 = 1.5 (truncated) | 2 + 0.45 - 3 = -0.55
    #        A2 = -0.55, A1 = 1.5 (cut), A0 = 0.8 + 0.45 * 1.5 = 1.475
    np.testing.assert_allclose(got, [[1.85, 1.475], [1.0, 1.5], [5.1, -0.55]], rtol=1e-6)


def test_gae_lambda_limits():
    rewards, values, next_values, terminated, done = _gae_case()
    zeros = jnp.zeros_like(done)
    # lambda = 0: one-step TD errors.
    got = rl.gae_advantages(rewards, values, next_values, terminated, done, 0.9, 0.0)
    np.testing.assert_allclose(got, rewards + 0.9 * (1 - terminated) * next_values - values)
    # lambda = 1, no episode ends (so next_values[t] = values[t + 1]): the discounted return
    # bootstrapped from the last next value.
    next_values = jnp.concatenate([values[1:], next_values[-1:]])
    got = jax.jit(rl.gae_advantages)(rewards, values, next_values, zeros, zeros, 0.9, 1.0)
    r, nv = np.asarray(rewards), np.asarray(next_values)
    for t in range(3):
        ret = sum(0.9**k * r[t + k] for k in range(3 - t)) + 0.9 ** (3 - t) * nv[2]
        np.testing.assert_allclose(got[t] + values[t], ret, rtol=1e-5)


def test_gae_shape_checks():
    x = jnp.ones((3, 2))
    with pytest.raises(AssertionError):
        rl.gae_advantages(jnp.ones(3), jnp.ones(3), jnp.ones(3), jnp.ones(3), jnp.ones(3), 0.9, 0.9)
    with pytest.raises(AssertionError):
        rl.gae_advantages(x, x, jnp.ones((2, 3)), x, x, 0.9, 0.9)


def test_ppo_clipped_objective_hand_computed():
    ratio = jnp.asarray([0.5, 1.0, 1.5, 1.5, 0.5])
    adv = jnp.asarray([1.0, 2.0, 1.0, -1.0, -2.0])
    got = rl.ppo_clipped_objective(ratio, adv, 0.2)
    # min(0.5, 0.8) | 2 | min(1.5, 1.2) | min(-1.5, -1.2) | min(-1.0, -1.6)
    np.testing.assert_allclose(got, [0.5, 2.0, 1.2, -1.5, -1.6], rtol=1e-6)
    with pytest.raises(AssertionError):
        rl.ppo_clipped_objective(jnp.ones((2, 2)), jnp.ones((2, 2)), 0.2)


def test_expectile_loss_hand_computed():
    diff = jnp.asarray([2.0, -1.0, 0.0, -3.0])
    # tau * u^2 for u >= 0, (1 - tau) * u^2 for u < 0.
    np.testing.assert_allclose(rl.expectile_loss(diff, 0.7), [2.8, 0.3, 0.0, 2.7], rtol=1e-6)
    np.testing.assert_allclose(rl.expectile_loss(diff, 0.5), 0.5 * diff**2, rtol=1e-6)
    with pytest.raises(AssertionError):
        rl.expectile_loss(jnp.ones((2, 2)), 0.7)


def test_expectile_loss_minimizer_is_the_expectile():
    # Over samples {0, 1}, the tau-expectile m solves tau (1 - m) = (1 - tau) m, i.e. m = tau.
    samples = jnp.asarray([0.0, 1.0])
    grid = jnp.linspace(0.0, 1.0, 1001)
    for tau in (0.5, 0.7, 0.9):
        losses = jax.vmap(lambda m, t=tau: rl.expectile_loss(samples - m, t).mean())(grid)
        assert abs(float(grid[jnp.argmin(losses)]) - tau) < 1e-3


def test_awr_weights_hand_computed_and_clipped():
    adv = jnp.asarray([-1.0, 0.0, 0.5, 10.0])
    got = rl.awr_weights(adv, 3.0)
    np.testing.assert_allclose(got, [np.exp(-3.0), 1.0, np.exp(1.5), 100.0], rtol=1e-6)
    np.testing.assert_allclose(rl.awr_weights(adv, 3.0, max_weight=2.0)[2:], [2.0, 2.0])
    np.testing.assert_allclose(rl.awr_weights(adv, 0.0), jnp.ones(4))  # beta = 0: plain BC
    # The weights are constants for the actor's gradient.
    np.testing.assert_allclose(jax.grad(lambda a: rl.awr_weights(a, 3.0).sum())(adv), 0.0)


def test_bc_mse_hand_computed():
    pred = jnp.asarray([[0.5, -1.0], [0.0, 1.0]])
    act = jnp.asarray([[0.0, -1.0], [1.0, 0.5]])
    # (0.25 + 0 + 1 + 0.25) / 4
    np.testing.assert_allclose(rl.bc_mse(pred, act), 0.375, rtol=1e-6)
    with pytest.raises(AssertionError):
        rl.bc_mse(pred, act[:, :1])


def test_gaussian_log_prob_matches_scipy_formula():
    x = jnp.asarray([[0.3, -0.2], [1.0, 0.0]])
    mean = jnp.asarray([[0.0, 0.0], [0.5, -0.5]])
    std = jnp.asarray([0.5, 2.0])
    want = jax.scipy.stats.norm.logpdf(x, mean, std).sum(-1)
    np.testing.assert_allclose(rl.gaussian_log_prob(x, mean, std), want, rtol=1e-6)


def test_torch_network_init_draws_kernels_and_biases_within_one_over_sqrt_fan_in():
    from jaxrl.networks import MLP, NETWORK_INITS, DeterministicActor

    mlp = MLP((64, 32, 3), **NETWORK_INITS["torch"]._asdict())
    params = mlp.init(jax.random.key(0), jnp.zeros((1, 10)))["params"]
    for layer, fan_in in (("Dense_0", 10), ("Dense_1", 64), ("Dense_2", 32)):
        bound = fan_in**-0.5
        for name in ("kernel", "bias"):
            x = np.asarray(params[layer][name])
            assert np.abs(x).max() <= bound, (layer, name)
            # Uniform on [-b, b]: std b / sqrt(3); the draw fills the range, biases included.
            assert np.abs(x).max() > 0.8 * bound, (layer, name)
        kernel = np.asarray(params[layer]["kernel"])
        np.testing.assert_allclose(kernel.std(), bound / np.sqrt(3), rtol=0.15)
    xavier = MLP((64, 32, 3), **NETWORK_INITS["xavier"]._asdict())
    zeros = xavier.init(jax.random.key(0), jnp.zeros((1, 10)))["params"]
    assert all(not np.asarray(zeros[k]["bias"]).any() for k in zeros)
    # The actor heads pass the initializers on to every layer.
    actor = DeterministicActor(3, (64, 32), inits=NETWORK_INITS["torch"])
    a_params = actor.init(jax.random.key(1), jnp.zeros((1, 10)))["params"]
    assert np.asarray(a_params["MLP_0"]["Dense_2"]["bias"]).any()
