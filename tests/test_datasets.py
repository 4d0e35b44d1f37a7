"""Offline datasets: D4RL HDF5 read/write, Minari, validation errors, scores, collection."""

from __future__ import annotations

import json
import os

import h5py
import numpy as np
import pytest

from jaxrl.data import (
    Dataset,
    DatasetError,
    load_d4rl,
    load_dataset,
    normalized_score,
    reference_returns,
    save_d4rl,
)

SHARED = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data")
SHARED_FILE = os.path.join(SHARED, "halfcheetah-sbx100k-v5.hdf5")


def _episodes(lengths, terminal_last, obs_dim=3, act_dim=2, seed=0):
    """Rows of consecutive episodes; obs[t] = (episode, t, noise) so transitions are checkable."""
    rng = np.random.default_rng(seed)
    obs, nxt, act, rew, term, tout = [], [], [], [], [], []
    for e, (n, is_term) in enumerate(zip(lengths, terminal_last, strict=True)):
        traj = np.stack(
            [np.full(n + 1, e), np.arange(n + 1), *rng.normal(size=(obs_dim - 2, n + 1))], 1
        )
        obs.append(traj[:-1])
        nxt.append(traj[1:])
        act.append(rng.uniform(-1, 1, (n, act_dim)))
        rew.append(rng.normal(size=n))
        t = np.zeros(n, bool)
        o = np.zeros(n, bool)
        if is_term:
            t[-1] = True
        else:
            o[-1] = True
        term.append(t)
        tout.append(o)
    return {
        "observations": np.concatenate(obs).astype(np.float32),
        "next_observations": np.concatenate(nxt).astype(np.float32),
        "actions": np.concatenate(act).astype(np.float32),
        "rewards": np.concatenate(rew).astype(np.float32),
        "terminals": np.concatenate(term),
        "timeouts": np.concatenate(tout),
    }


def _write_plain(path, arrays, infos=None, metadata=None):
    """A file written with plain h5py, exactly as D4RL lays it out."""
    with h5py.File(path, "w") as f:
        for k, v in arrays.items():
            f.create_dataset(k, data=v)
        if infos is not None:
            g = f.create_group("infos")
            for k, v in infos.items():
                g.create_dataset(k, data=v)
        if metadata is not None:
            g = f.create_group("metadata")
            for k, v in metadata.items():
                g.create_dataset(k, data=v)


def test_round_trip_keeps_arrays_metadata_and_references(tmp_path):
    a = _episodes([5, 7, 4], [True, False, False])
    ds = Dataset(
        a["observations"],
        a["actions"],
        a["rewards"],
        a["next_observations"],
        a["terminals"],
        a["timeouts"],
        env_id="Pendulum-v1",
        ref_returns=(-1200.0, -150.0),
        metadata={"kind": "medium", "seed": 3},
        infos={"qpos": np.arange(16.0)},
    )
    path = save_d4rl(ds, tmp_path / "d.hdf5")
    back = load_d4rl(path)
    for k in ("observations", "actions", "rewards", "next_observations", "terminals", "timeouts"):
        np.testing.assert_array_equal(getattr(back, k), getattr(ds, k))
    assert back.env_id == "Pendulum-v1"
    assert back.ref_returns == (-1200.0, -150.0)
    assert back.metadata["kind"] == "medium" and back.metadata["seed"] == 3
    assert type(back.metadata["seed"]) is int  # Python scalars: JSON numbers in `info`
    np.testing.assert_array_equal(back.infos["qpos"], np.arange(16.0))
    assert back.episode_returns().shape == (3,)
    np.testing.assert_allclose(back.episode_returns().sum(), a["rewards"].sum(), rtol=1e-5)
    assert not any(f.endswith(".tmp") for f in os.listdir(tmp_path))  # atomic write cleaned up


def test_plain_d4rl_file_without_next_observations_is_rebuilt_like_qlearning_dataset(tmp_path):
    # Episode 0 terminates after 5 steps, episode 1 times out after 6, episode 2 runs to the end.
    a = _episodes([5, 6, 4], [True, False, False])
    raw = {k: v for k, v in a.items() if k != "next_observations"}
    infos = {"goal": np.arange(15.0)}
    _write_plain(
        tmp_path / "d.hdf5",
        raw,
        infos=infos,
        metadata={"algorithm": b"SAC", "env_id": b"Pendulum-v1"},
    )
    ds = load_d4rl(tmp_path / "d.hdf5")
    # D4RL's qlearning_dataset drops the last step of the time-limited episode and the last row.
    kept = [i for i in range(15) if not a["timeouts"][i] and i != 14]
    assert len(ds) == len(kept) == 13
    np.testing.assert_array_equal(ds.observations, a["observations"][kept])
    np.testing.assert_array_equal(ds.actions, a["actions"][kept])
    # Every kept non-terminal row's next observation is the true successor (same episode, t+1).
    live = ~ds.terminals
    assert np.all(ds.next_observations[live, 0] == ds.observations[live, 0])
    assert np.all(ds.next_observations[live, 1] == ds.observations[live, 1] + 1)
    assert ds.terminals.sum() == 1 and ds.terminals[4]
    assert ds.env_id == "Pendulum-v1" and ds.metadata["algorithm"] == "SAC"
    np.testing.assert_array_equal(ds.infos["goal"], infos["goal"][kept])
    assert len(ds.episode_returns()) == 3


def test_plain_d4rl_file_with_next_observations_keeps_every_row(tmp_path):
    a = _episodes([5, 6], [True, False])
    _write_plain(tmp_path / "d.hdf5", a, metadata={"algorithm": b"SAC"})
    ds = load_d4rl(tmp_path / "d.hdf5", env_id="Pendulum-v1")
    assert len(ds) == 11
    np.testing.assert_array_equal(ds.next_observations, a["next_observations"])
    np.testing.assert_array_equal(ds.timeouts, a["timeouts"])
    t = ds.transitions()
    assert t.terminal.dtype == np.float32 and t.terminal.sum() == 1


def test_actions_are_rescaled_to_unit_box_and_next_actions_stop_at_episode_ends():
    a = _episodes([3, 2], [True, False], act_dim=1)
    actions = np.array([[-2.0], [0.0], [2.0], [1.0], [-1.0]], np.float32)
    ds = Dataset(
        a["observations"],
        actions,
        a["rewards"],
        a["next_observations"],
        a["terminals"],
        a["timeouts"],
    )
    t = ds.transitions(-2.0, 2.0, with_next_action=True)
    np.testing.assert_allclose(t.action[:, 0], [-1.0, 0.0, 1.0, 0.5, -0.5])
    np.testing.assert_allclose(t.next_action[:, 0], [0.0, 1.0, 0.0, -0.5, 0.0])


def test_minari_dataset_made_with_datacollector_loads_by_id_and_by_path(tmp_path, monkeypatch):
    import gymnasium as gym
    import minari
    from minari import DataCollector

    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path))
    env = DataCollector(gym.make("Pendulum-v1", max_episode_steps=40))
    lengths = 0
    for ep in range(3):
        env.reset(seed=ep)
        done = False
        while not done:
            _, _, term, trunc, _ = env.step(env.action_space.sample())
            done = term or trunc
            lengths += 1
    env.create_dataset(
        "pendulum/jaxrl-test-v0",
        algorithm_name="random",
        ref_min_score=-1500.0,
        ref_max_score=-150.0,
    )
    env.close()
    ds = load_dataset("minari:pendulum/jaxrl-test-v0")
    assert len(ds) == lengths == 120
    assert ds.env_id == "Pendulum-v1"
    assert ds.ref_returns == (-1500.0, -150.0)
    assert ds.timeouts.sum() == 3 and ds.terminals.sum() == 0
    # Within an episode, next_obs[t] is obs[t + 1]; episode i starts at row 40 * i.
    ends = ds.episode_ends()
    np.testing.assert_array_equal(ends, [39, 79, 119])
    inner = np.setdiff1d(np.arange(119), ends)
    np.testing.assert_array_equal(ds.next_observations[inner], ds.observations[inner + 1])
    ref = minari.load_dataset("pendulum/jaxrl-test-v0")
    first = next(ref.iterate_episodes())
    np.testing.assert_allclose(ds.observations[:40], first.observations[:-1])
    np.testing.assert_allclose(ds.actions[:40], first.actions)
    by_path = load_dataset(str(tmp_path / "pendulum" / "jaxrl-test-v0"))
    np.testing.assert_array_equal(by_path.observations, ds.observations)
    with pytest.raises(DatasetError, match="not on local disk.*never downloads"):
        load_dataset("minari:pendulum/missing-v0")


# ------------------------------------------------------------------------------------ errors


def test_missing_keys_are_named(tmp_path):
    a = _episodes([4], [True])
    _write_plain(tmp_path / "d.hdf5", {k: a[k] for k in ("observations", "actions", "rewards")})
    with pytest.raises(DatasetError, match=r"lacks the D4RL key\(s\) \['terminals'\]"):
        load_d4rl(tmp_path / "d.hdf5")


def test_length_mismatch_is_reported(tmp_path):
    a = _episodes([4, 4], [True, True])
    a["actions"] = a["actions"][:-1]
    _write_plain(tmp_path / "d.hdf5", a)
    with pytest.raises(DatasetError, match="actions has 7 rows but rewards has 8"):
        load_d4rl(tmp_path / "d.hdf5")


@pytest.mark.parametrize("key", ["observations", "rewards", "actions"])
def test_nan_and_inf_are_rejected_with_the_row(tmp_path, key):
    a = _episodes([4, 4], [True, True])
    a[key] = a[key].copy()
    a[key][5] = np.nan if key != "actions" else np.inf
    _write_plain(tmp_path / "d.hdf5", a)
    with pytest.raises(DatasetError, match=f"{key} has 1 rows with NaN or inf.*row 5"):
        load_d4rl(tmp_path / "d.hdf5")


def test_corrupt_or_missing_file(tmp_path):
    bad = tmp_path / "bad.hdf5"
    bad.write_bytes(b"not an hdf5 file at all")
    with pytest.raises(DatasetError, match="not a readable HDF5 file"):
        load_dataset(str(bad))
    with pytest.raises(DatasetError, match="not found"):
        load_dataset(str(tmp_path / "nope.hdf5"))


def test_dimensions_and_bounds_must_match_the_env():
    a = _episodes([4], [True], obs_dim=3, act_dim=1)
    ds = Dataset(**{k: a[k] for k in a}, source="d.hdf5")
    ds.validate_for_env(3, [-2.0], [2.0], "Pendulum-v1")
    with pytest.raises(DatasetError, match="observations have 3 dimensions but Hopper-v5 has 11"):
        ds.validate_for_env(11, [-1.0] * 3, [1.0] * 3, "Hopper-v5")
    with pytest.raises(DatasetError, match="actions have 1 dimensions but X has 2"):
        ds.validate_for_env(3, [-1.0] * 2, [1.0] * 2, "X")
    ds.actions[0] = 5.0
    with pytest.raises(DatasetError, match="outside Pendulum-v1's bounds"):
        ds.validate_for_env(3, [-2.0], [2.0], "Pendulum-v1")


# ---------------------------------------------------------------------------- normalized scores


def test_d4rl_reference_constants_and_families():
    assert reference_returns("HalfCheetah-v5") == (-280.178953, 12135.0)
    assert reference_returns("hopper-medium-v2") == (-20.272305, 3234.3)
    assert reference_returns("Walker2d-v4") == (1.629008, 4592.3)
    assert reference_returns("Ant-v5") == (-325.6, 3879.7)
    assert reference_returns("Pendulum-v1") is None
    assert reference_returns("brax:hopper") is None and reference_returns("jax:pendulum") is None
    assert normalized_score(12135.0, reference_returns("HalfCheetah-v5")) == pytest.approx(100.0)
    assert normalized_score(-280.178953, reference_returns("halfcheetah")) == pytest.approx(0.0)
    assert normalized_score(1.0, None) is None


@pytest.mark.skipif(not os.path.exists(SHARED_FILE), reason="reference dataset not present")
def test_reference_halfcheetah_file_from_another_library():
    ds = load_dataset(SHARED_FILE, env_id="HalfCheetah-v5")
    info = ds.info()
    assert info["transitions"] == 100_000 and info["episodes"] == 100
    assert (info["obs_dim"], info["action_dim"]) == (17, 6)
    assert info["return_mean"] == pytest.approx(4398, abs=1)
    assert info["return_std"] == pytest.approx(423, abs=1)
    assert info["normalized_score_mean"] == pytest.approx(37.7, abs=0.1)
    ds.validate_for_env(17, [-1.0] * 6, [1.0] * 6, "HalfCheetah-v5")
    inner = np.setdiff1d(np.arange(len(ds) - 1), ds.episode_ends())
    np.testing.assert_array_equal(ds.next_observations[inner], ds.observations[inner + 1])


# ----------------------------------------------------------------------------------- collection


def test_random_collection_is_reproducible_and_has_real_transitions(tmp_path):
    from jaxrl.run.collect import collect

    kwargs = dict(ref_max_return=-150.0, ref_episodes=2)
    a = collect("Pendulum-v1", "random", 450, seed=4, **kwargs)
    b = collect("Pendulum-v1", "random", 450, seed=4, **kwargs)
    c = collect("Pendulum-v1", "random", 450, seed=5, **kwargs)
    np.testing.assert_array_equal(a.observations, b.observations)
    np.testing.assert_array_equal(a.actions, b.actions)
    assert not np.array_equal(a.actions, c.actions)
    assert a.timeouts.sum() == 3 and a.timeouts[199] and a.timeouts[399] and a.timeouts[-1]
    assert np.abs(a.actions).max() <= 2.0 and np.abs(a.actions).max() > 1.5  # env units
    inner = np.setdiff1d(np.arange(449), a.episode_ends())
    np.testing.assert_array_equal(a.next_observations[inner], a.observations[inner + 1])
    assert a.ref_returns[1] == -150.0 and a.ref_returns[0] < -800  # measured random return
    assert a.metadata["kind"] == "random" and a.metadata["seed"] == 4
    assert a.metadata["steps"] == 450 and a.metadata["transitions"] == 450
    back = load_dataset(save_d4rl(a, tmp_path / "r.hdf5"))
    assert back.ref_returns == a.ref_returns and back.metadata["kind"] == "random"


def test_collect_rejects_bad_requests():
    from jaxrl.run.collect import collect

    with pytest.raises(DatasetError, match="Unknown dataset kind"):
        collect("Pendulum-v1", "mediocre", 10)
    with pytest.raises(DatasetError, match="needs --policy"):
        collect("Pendulum-v1", "medium", 10)
    with pytest.raises(DatasetError, match="no D4RL reference returns"):
        collect("Pendulum-v1", "random", 10)


@pytest.mark.slow
def test_generated_pendulum_datasets_follow_the_d4rl_recipe(record_property):
    from offline_utils import eval_curve, pendulum_dataset, pendulum_policies

    med, exp = pendulum_dataset("medium"), pendulum_dataset("expert")
    rnd, replay = pendulum_dataset("random"), pendulum_dataset("medium-replay")
    scores = {
        k: d.normalized_score(d.episode_returns().mean())
        for k, d in {"random": rnd, "medium": med, "expert": exp}.items()
    }
    for k, v in scores.items():
        record_property(f"{k}_score", v)
    # Random near 0, expert near 100, medium in between (D4RL: 40-60 on locomotion).
    assert abs(scores["random"]) < 15 and scores["expert"] > 85
    assert 15 < scores["medium"] < 75
    # The medium policy was retrained to the chosen step of the expert run with the same seed:
    # the same run up to there, so the same evaluations.
    pol = pendulum_policies()
    medium_curve, expert_curve = eval_curve(pol["medium"]), eval_curve(pol["expert"])
    step = max(medium_curve)
    record_property("medium_step", step)
    assert medium_curve == {s: v for s, v in expert_curve.items() if s <= step}
    # medium-replay is the medium policy's training buffer (whole env steps over 8 envs),
    # regrouped per env so that its transitions are real ones.
    assert len(replay) == step and step % 8 == 0
    inner = np.setdiff1d(np.arange(len(replay) - 1), replay.episode_ends())
    np.testing.assert_array_equal(replay.next_observations[inner], replay.observations[inner + 1])
    assert med.metadata["kind"] == "medium" and json.loads(json.dumps(med.info(), default=str))
