import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl.buffers import buffer_from_arrays, make_replay_buffer, sample_mixed
from jaxrl.types import Transition

OBS_DIM, ACT_DIM = 3, 2


def _example() -> Transition:
    return Transition(
        obs=np.zeros(OBS_DIM, np.float32),
        action=np.zeros(ACT_DIM, np.float32),
        reward=np.float32(0),
        next_obs=np.zeros(OBS_DIM, np.float32),
        terminal=np.float32(0),
    )


def _rows(ids) -> Transition:
    """Transitions whose every field encodes the row id (reward = id, obs = id + column/10)."""
    ids = np.asarray(ids, np.float32)
    n = len(ids)
    return Transition(
        obs=ids[:, None] + np.arange(OBS_DIM, dtype=np.float32)[None] / 10,
        action=np.tile(-ids[:, None], (1, ACT_DIM)),
        reward=ids,
        next_obs=ids[:, None] + 100.0 + np.zeros((n, OBS_DIM), np.float32),
        terminal=(ids % 2).astype(np.float32),
    )


def _assert_rows(data: Transition, expected_ids) -> None:
    expected = _rows(expected_ids)
    for got, want in zip(data, expected, strict=True):
        np.testing.assert_array_equal(np.asarray(got), want)


# ------------------------------------------------------------------------------- add / wrap-around


def test_init_is_empty_and_shaped():
    buf = make_replay_buffer(5)
    state = buf.init(_example())
    assert state.capacity == 5
    assert int(state.pos) == 0 and int(state.size) == 0
    assert state.data.obs.shape == (5, OBS_DIM)
    assert state.data.reward.shape == (5,)
    assert state.data.obs.dtype == jnp.float32


def test_wrap_around_overwrites_oldest():
    buf = make_replay_buffer(5)
    state = buf.init(_example())

    state = buf.add(state, _rows([1, 2, 3]))
    assert int(state.pos) == 3 and int(state.size) == 3
    np.testing.assert_array_equal(state.data.reward, [1, 2, 3, 0, 0])

    state = buf.add(state, _rows([4, 5, 6, 7]))
    # Rows 4, 5 fill slots 3, 4; rows 6, 7 wrap to slots 0, 1 and overwrite 1, 2.
    assert int(state.pos) == 2
    assert int(state.size) == 5
    np.testing.assert_array_equal(state.data.reward, [6, 7, 3, 4, 5])
    _assert_rows(state.data, [6, 7, 3, 4, 5])

    state = buf.add(state, _rows([8, 9, 10, 11, 12]))  # exactly capacity rows at once
    assert int(state.pos) == 2 and int(state.size) == 5
    np.testing.assert_array_equal(state.data.reward, [11, 12, 8, 9, 10])


def test_add_casts_to_buffer_dtype():
    buf = make_replay_buffer(4)
    state = buf.init(_example())
    rows = _rows([1, 2])
    rows = rows._replace(reward=np.asarray([1, 2], np.float64))
    state = buf.add(state, rows)
    assert state.data.reward.dtype == jnp.float32
    np.testing.assert_array_equal(state.data.reward, [1, 2, 0, 0])


def test_add_more_than_capacity_raises():
    buf = make_replay_buffer(5)
    state = buf.init(_example())
    with pytest.raises(ValueError, match="6 rows.*capacity 5"):
        buf.add(state, _rows(range(6)))


@pytest.mark.parametrize("capacity", [0, -3, 5.0, 2.5, True, "10"])
def test_bad_capacity_raises(capacity):
    with pytest.raises(ValueError, match="capacity"):
        make_replay_buffer(capacity)


def test_numpy_integer_capacity_accepted():
    buf = make_replay_buffer(np.int64(7))
    assert buf.init(_example()).capacity == 7


# ----------------------------------------------------------------------------------------- sample


def _seven_row_state():
    buf = make_replay_buffer(100)
    state = buf.add(buf.init(_example()), _rows(np.arange(1, 8)))
    return buf, state


def test_sample_only_valid_rows():
    buf, state = _seven_row_state()
    batch = buf.sample(state, jax.random.key(0), 2000)
    rewards = np.asarray(batch.reward)
    assert rewards.shape == (2000,)
    assert set(np.unique(rewards).tolist()) == set(range(1, 8))
    # Rows stay intact: every field of a sampled row belongs to the same stored row.
    np.testing.assert_array_equal(np.asarray(batch.obs[:, 0]), rewards)
    np.testing.assert_array_equal(np.asarray(batch.action[:, 0]), -rewards)
    np.testing.assert_array_equal(np.asarray(batch.next_obs[:, 0]), rewards + 100)
    # Roughly uniform: each of the 7 rows is drawn 2000/7 ~ 286 times (std ~ 15).
    counts = np.bincount(rewards.astype(int), minlength=8)[1:]
    assert counts.min() > 200 and counts.max() < 370


def test_sample_different_keys_differ_same_key_repeats():
    buf, state = _seven_row_state()
    a = buf.sample(state, jax.random.key(1), 64).reward
    b = buf.sample(state, jax.random.key(1), 64).reward
    c = buf.sample(state, jax.random.key(2), 64).reward
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)


def test_jit_add_and_sample_with_donation():
    buf = make_replay_buffer(100)

    def step(state, items, key):
        state = buf.add(state, items)
        return state, buf.sample(state, key, 512)

    step = jax.jit(step, donate_argnums=0)
    state = buf.init(_example())
    state, _ = step(state, _rows([1, 2, 3]), jax.random.key(0))
    state, batch = step(state, _rows([4, 5, 6, 7]), jax.random.key(1))
    assert int(state.pos) == 7 and int(state.size) == 7
    np.testing.assert_array_equal(state.data.reward[:8], [1, 2, 3, 4, 5, 6, 7, 0])
    rewards = np.asarray(batch.reward)
    assert set(np.unique(rewards).tolist()) == set(range(1, 8))


def test_vmap_over_independent_buffers():
    buf = make_replay_buffer(4)
    examples = jax.tree.map(lambda x: jnp.stack([x] * 3), _example())
    states = jax.vmap(buf.init)(examples)
    assert states.data.obs.shape == (3, 4, OBS_DIM)
    assert states.pos.shape == (3,)

    # Member m gets rows 10m+1, 10m+2, 10m+3 first, then 10m+4, 10m+5, 10m+6 (wrap-around).
    first = jax.tree.map(
        lambda *xs: jnp.stack(xs), *[_rows([10 * m + i for i in (1, 2, 3)]) for m in range(3)]
    )
    second = jax.tree.map(
        lambda *xs: jnp.stack(xs), *[_rows([10 * m + i for i in (4, 5, 6)]) for m in range(3)]
    )
    add = jax.jit(jax.vmap(buf.add))
    states = add(states, first)
    states = add(states, second)
    np.testing.assert_array_equal(states.pos, [2, 2, 2])
    np.testing.assert_array_equal(states.size, [4, 4, 4])
    for m in range(3):
        member = jax.tree.map(lambda x, m=m: x[m], states.data)
        _assert_rows(member, [10 * m + i for i in (5, 6, 3, 4)])

    keys = jax.random.split(jax.random.key(0), 3)
    batch = jax.vmap(buf.sample, in_axes=(0, 0, None))(states, keys, 256)
    assert batch.reward.shape == (3, 256)
    for m in range(3):
        got = set(np.unique(np.asarray(batch.reward[m])).tolist())
        assert got == {10 * m + i for i in (3, 4, 5, 6)}


def test_scan_of_adds():
    buf = make_replay_buffer(8)
    rows = _rows(np.arange(1, 21))  # 20 rows, added 2 at a time over 10 scan steps
    chunks = jax.tree.map(lambda x: x.reshape(10, 2, *x.shape[1:]), rows)

    @jax.jit
    def fill(state, chunks):
        return jax.lax.scan(lambda s, c: (buf.add(s, c), s.size), state, chunks)

    state, sizes = fill(buf.init(_example()), chunks)
    np.testing.assert_array_equal(sizes, [0, 2, 4, 6, 8, 8, 8, 8, 8, 8])
    assert int(state.pos) == 20 % 8 and int(state.size) == 8
    # Slots hold the newest 8 rows (13..20); slot i holds the last id written there.
    _assert_rows(state.data, [17, 18, 19, 20, 13, 14, 15, 16])


# ------------------------------------------------------------------------- offline data, mixing


def test_buffer_from_arrays_round_trip():
    rows = _rows(np.arange(1, 13))
    state = buffer_from_arrays(rows)
    assert state.capacity == 12
    assert int(state.size) == 12
    _assert_rows(state.data, np.arange(1, 13))
    batch = jax.jit(lambda s, k: make_replay_buffer(12).sample(s, k, 500))(state, jax.random.key(0))
    assert set(np.unique(np.asarray(batch.reward)).tolist()) == set(range(1, 13))


def test_buffer_from_arrays_length_mismatch():
    rows = _rows(np.arange(5))._replace(reward=np.zeros(4, np.float32))
    with pytest.raises(ValueError, match="same length.*5.*4"):
        buffer_from_arrays(rows)
    with pytest.raises(ValueError, match="at least one array"):
        buffer_from_arrays({})


def _constant_reward_state(value: float, n: int):
    rows = _rows(np.arange(n))._replace(reward=np.full(n, value, np.float32))
    return buffer_from_arrays(rows)


@pytest.mark.parametrize("ratio,expected_ones", [(0.25, 64), (0.5, 128), (0.0, 0), (1.0, 256)])
def test_sample_mixed_ratio(ratio, expected_ones):
    state_a = _constant_reward_state(1.0, 10)
    state_b = _constant_reward_state(0.0, 30)
    batch = sample_mixed(state_a, state_b, jax.random.key(0), 256, ratio)
    rewards = np.asarray(batch.reward)
    assert rewards.shape == (256,)
    assert batch.obs.shape == (256, OBS_DIM)
    assert int(rewards.sum()) == expected_ones
    # Source-a rows come first.
    np.testing.assert_array_equal(rewards[:expected_ones], 1.0)


def test_sample_mixed_jit_with_static_ratio():
    state_a = _constant_reward_state(1.0, 10)
    state_b = _constant_reward_state(0.0, 30)
    fn = jax.jit(lambda a, b, k: sample_mixed(a, b, k, 100, 0.3))
    assert int(np.asarray(fn(state_a, state_b, jax.random.key(5)).reward).sum()) == 30


@pytest.mark.parametrize("ratio", [-0.1, 1.5])
def test_sample_mixed_invalid_ratio(ratio):
    state = _constant_reward_state(1.0, 4)
    with pytest.raises(ValueError, match="ratio_a"):
        sample_mixed(state, state, jax.random.key(0), 8, ratio)


# ------------------------------------------------------------------------ sequences of steps


def _episodes(num_envs: int, lengths: list[int], steps: int) -> list[Transition]:
    """``steps`` loop steps of ``num_envs`` envs, each running episodes of ``lengths[env]``.

    The observation is ``[env, episode, t]``: the true next observation is ``t + 1`` of the
    same episode, and the step after an episode's last one starts a new episode at ``t = 0``.
    Returns one ``Transition`` of ``num_envs`` rows per loop step (the order the loops add them).
    """
    out, t, ep = [], np.zeros(num_envs, int), np.zeros(num_envs, int)
    for _ in range(steps):
        obs = np.stack([np.arange(num_envs), ep, t], 1).astype(np.float32)
        nxt = np.stack([np.arange(num_envs), ep, t + 1], 1).astype(np.float32)
        last = t + 1 == np.asarray(lengths)
        out.append(
            Transition(
                obs,
                np.zeros((num_envs, 1), np.float32),
                obs[:, 2].copy(),
                nxt,
                np.zeros(num_envs, np.float32),
            )
        )
        t, ep = np.where(last, 0, t + 1), np.where(last, ep + 1, ep)
    return out


@pytest.mark.parametrize("num_envs", [1, 3])
@pytest.mark.parametrize("capacity", [64, 1000])
def test_sampled_sequences_are_consecutive_steps_of_one_episode(num_envs, capacity):
    from jaxrl.buffers import sample_sequences

    length, steps = 4, 120
    buf = make_replay_buffer(capacity)
    state = buf.init(jax.tree.map(lambda x: x[0], _episodes(num_envs, [5] * num_envs, 1)[0]))
    for tr in _episodes(num_envs, [5, 7, 9][:num_envs], steps):
        state = buf.add(state, tr)
    batch = sample_sequences(state, jax.random.key(0), 3, 64, length, stride=num_envs)
    obs, nxt = np.asarray(batch.obs), np.asarray(batch.next_obs)
    assert obs.shape == (3, 64, length, 3)
    # Each step's true next observation is the following step's observation: one env, one
    # episode, consecutive times; so no sequence crosses an episode end, nor the write pointer
    # (with capacity 64 the buffer wrapped around: rows after the pointer are older steps).
    np.testing.assert_array_equal(nxt[:, :, :-1], obs[:, :, 1:])
    np.testing.assert_array_equal(obs[..., 2], obs[:, :, :1, 2] + np.arange(length))
    assert (obs[..., 0] == obs[:, :, :1, 0]).all() and (obs[..., 1] == obs[:, :, :1, 1]).all()
    # Every env and many starts are sampled (not one repeated candidate).
    starts = {tuple(x) for x in obs[:, :, 0].reshape(-1, 3).tolist()}
    assert len({s[0] for s in starts}) == num_envs and len(starts) > 20
    # Only the newest rows are sampled once the buffer wrapped.
    if capacity == 64:
        newest = [
            tuple(r)
            for tr in _episodes(num_envs, [5, 7, 9][:num_envs], steps)[-64 // num_envs :]
            for r in np.asarray(tr.obs).tolist()
        ]
        assert starts <= set(newest)


def test_host_drawn_sequence_rows_match_the_device_layout():
    from jaxrl.buffers import pick_sequences, sequence_rows

    capacity, length = 50, 3
    buf = make_replay_buffer(capacity)
    eps = _episodes(2, [6, 4], 40)
    state = buf.init(jax.tree.map(lambda x: x[0], eps[0]))
    for tr in eps:
        state = buf.add(state, tr)
    offsets = np.arange(10)
    host = sequence_rows(state, offsets, length, 2, xp=np)
    np.testing.assert_array_equal(
        host, np.asarray(sequence_rows(state, jnp.asarray(offsets), length, 2))
    )
    # Oldest row first: the buffer wrapped (80 rows written), so offset 0 is row pos.
    assert host[0, 0] == int(state.pos) and (np.diff(host, axis=1) % capacity == 2).all()
    picked = pick_sequences(state, jnp.asarray(host)[None], 4)
    obs = np.asarray(picked.obs)
    assert obs.shape == (1, 4, length, 3)
    np.testing.assert_array_equal(np.asarray(picked.next_obs)[0, :, :-1], obs[0, :, 1:])
