import itertools

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


def test_subsample_ensemble_none_or_full_is_min():
    key = jax.random.key(0)
    want = np.asarray([1.0, 1.0, 1.0, 0.0])
    np.testing.assert_allclose(rl.subsample_ensemble(key, QS, None), want)
    np.testing.assert_allclose(rl.subsample_ensemble(key, QS, 5), want)
    np.testing.assert_allclose(rl.subsample_ensemble(key, QS, 7), want)


def test_subsample_ensemble_two_of_five():
    qs = np.asarray(QS)
    pair_mins = {
        pair: np.min(qs[list(pair)], axis=0) for pair in itertools.combinations(range(5), 2)
    }
    fn = jax.jit(rl.subsample_ensemble, static_argnums=2)
    seen = set()
    for seed in range(40):
        got = np.asarray(fn(jax.random.key(seed), QS, 2))
        assert got.shape == (4,)
        assert np.all(got >= qs.min(axis=0))
        # The same random subset is used for the whole batch.
        matches = [p for p, m in pair_mins.items() if np.array_equal(got, m)]
        assert matches, got
        seen.update(matches)
    # Subsets really are random: with 40 draws of 10 pairs, several distinct pairs appear.
    assert len(seen) >= 5
