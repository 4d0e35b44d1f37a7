"""EXPO: the on-the-fly policy, bounded edits, the TD target, purity under scan/vmap, the config,
and a learning test against SAC with the same data mixing on Pendulum-v1."""

from __future__ import annotations

import csv
import dataclasses
import functools
import os
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl import generative as gen
from jaxrl.agents import EXPO, EXPOConfig
from jaxrl.config import ConfigError
from jaxrl.types import Transition

OBS_DIM, ACT_DIM, B = 3, 2, 16
SMALL = EXPOConfig(
    hidden_dims=(16, 16),
    num_qs=3,
    num_min_qs=2,
    batch_size=B,
    utd_ratio=2,
    base_width=16,
    base_blocks=1,
    time_dim=8,
    diffusion_steps=2,
    num_samples=4,
    num_edit_samples=3,
    edit_scale=0.2,
)


def _batch(key, n=B):
    k = jax.random.split(key, 5)
    return Transition(
        jax.random.normal(k[0], (n, OBS_DIM)),
        jax.random.uniform(k[1], (n, ACT_DIM), minval=-1.0, maxval=1.0),
        jax.random.normal(k[2], (n,)),
        jax.random.normal(k[3], (n, OBS_DIM)),
        (jax.random.uniform(k[4], (n,)) < 0.2).astype(jnp.float32),
    )


BATCHES = jax.vmap(_batch)(jax.random.split(jax.random.key(5), 4))  # scanned: [4, B, ...]


def _one(seed):
    agent = EXPO.create(SMALL, jnp.zeros(OBS_DIM), jnp.zeros(ACT_DIM), seed)
    trained, infos = jax.lax.scan(lambda a, b: a.update(b), agent, BATCHES)
    return agent, trained, infos


# Two seeds created and trained under vmap in one program, compiled once for the whole file.
_run = jax.jit(jax.vmap(_one))
SEEDS = jnp.array([3, 4])


@functools.cache
def _runs():
    return _run(SEEDS)


def _member(tree, i=0):
    return jax.tree.map(lambda x: x[i], tree)


def _leaves(agent):
    """The agent's leaves as arrays (its PRNG key as the key's data)."""
    return [
        np.asarray(x) for x in jax.tree.leaves(agent.replace(rng=jax.random.key_data(agent.rng)))
    ]


def _trained():
    return _member(_runs()[1])  # nonzero edits, critics apart from their initial values


# ----------------------------------------------------------------------------------------- math


def test_otf_takes_the_candidate_with_the_highest_target_q():
    agent = _trained()
    obs = _batch(jax.random.key(9)).obs[:6]

    @jax.jit
    def both(agent, key):
        got = agent.otf(agent.base_ema_params, obs, key)
        # The same draws by hand: N base samples, the first M edited, a subset of critics on each.
        k_base, k_edit, k_sub = jax.random.split(key, 3)
        reps = jnp.broadcast_to(obs[:, None], (6, 4, OBS_DIM))
        fn = partial(agent.base.apply_fn, agent.base_ema_params, reps)
        base = gen.ddpm_sample(fn, k_base, (6, 4, ACT_DIM), agent.schedule)
        edited, _, _ = agent.edit(agent.actor.params, reps[:, :3], base[:, :3], k_edit)
        cands = jnp.concatenate([base, edited], axis=1)  # [6, 7, A]
        qs = agent.critic.apply_fn(agent.target_critic_params, reps[:, [0] * 7], cands)
        subset = jax.random.choice(k_sub, 3, (2,), replace=False)
        return got, cands, qs[subset].min(axis=0), agent.target_q(k_sub, reps[:, [0] * 7], cands)

    picked_edit = picked_base = False
    for i in range(8):
        got, cands, q, q_agent = both(agent, jax.random.key(i))
        np.testing.assert_allclose(q_agent, q, rtol=1e-5, atol=1e-6)  # only the subset is run
        best = np.argmax(np.asarray(q), axis=1)
        np.testing.assert_allclose(got, np.asarray(cands)[np.arange(6), best], rtol=1e-6)
        picked_edit |= bool((best >= 4).any())
        picked_base |= bool((best < 4).any())
    assert picked_edit and picked_base  # both kinds of candidate compete


def test_edits_are_bounded_by_the_edit_scale_and_scale_the_density():
    agent = _trained()
    key = jax.random.key(3)
    obs = jax.random.normal(key, (512, OBS_DIM))
    inside = jax.random.uniform(key, (448, ACT_DIM), minval=-1.0, maxval=1.0)
    base = jnp.concatenate([jnp.full((64, ACT_DIM), 1.0), inside])  # some at the bound
    edited, log_probs, edits = agent.edit(agent.actor.params, obs, base, jax.random.key(4))
    scale = float(agent.hparams["edit_scale"])
    assert scale == pytest.approx(0.2)
    assert np.abs(np.asarray(edits)).max() <= scale + 1e-6
    assert np.abs(np.asarray(edits)).max() > 0.5 * scale  # the bound is not vacuous
    assert np.abs(np.asarray(edited - base)).max() <= scale + 1e-6
    assert np.all(np.abs(np.asarray(edited)) <= 1.0)  # clipped to the action space
    # The density of e = scale * tanh(u) is tanh(u)'s divided by scale per dimension.
    raw_dist = agent.actor.apply_fn(agent.actor.params, obs, base)
    raw_lp = np.asarray(raw_dist.log_prob(jnp.clip(edits / scale, -0.999, 0.999)))
    inside = np.all(np.abs(np.asarray(edits)) < 0.99 * scale, axis=1)  # atanh is exact there
    assert inside.sum() > 100
    want = raw_lp - ACT_DIM * np.log(scale)
    np.testing.assert_allclose(np.asarray(log_probs)[inside], want[inside], rtol=1e-3, atol=1e-3)
    # A wider scale, the same network: the bound follows the (sweepable) leaf.
    wide = agent.replace(hparams={**agent.hparams, "edit_scale": jnp.float32(0.5)})
    _, _, wide_edits = wide.edit(wide.actor.params, obs, base, jax.random.key(4))
    np.testing.assert_allclose(wide_edits, np.asarray(edits) * 2.5, rtol=1e-5, atol=1e-6)


def test_td_target_bootstraps_from_the_otf_action():
    agent, infos = _member(_runs()[0]), _member(_runs()[2])
    batch = jax.tree.map(lambda x: x[0], BATCHES)

    @jax.jit
    def by_hand(agent):  # with update_step's and critic_loss's key splits
        _, k_critic, _ = jax.random.split(agent.rng, 3)
        k_otf, k_sub = jax.random.split(k_critic)
        next_actions = agent.otf(agent.base.params, batch.next_obs, k_otf)
        next_qs = agent.critic.apply_fn(agent.target_critic_params, batch.next_obs, next_actions)
        next_q = next_qs[jax.random.choice(k_sub, 3, (2,), replace=False)].min(axis=0)
        return batch.reward + 0.99 * (1.0 - batch.terminal) * next_q

    np.testing.assert_allclose(infos["critic/target"][0], by_hand(agent).mean(), rtol=1e-5)


# --------------------------------------------------------------------------- the agent contract


def test_update_is_pure_under_scan_and_vmap_over_seeds():
    _, trained, infos = _runs()
    _, again, _ = _run(SEEDS)  # the same program again: bit for bit the same agents
    jax.tree.map(np.testing.assert_array_equal, _leaves(trained), _leaves(again))
    kernels = [jax.tree.leaves(_member(trained, i).base.params)[-1] for i in (0, 1)]
    assert not np.allclose(*kernels)  # the seeds differ
    for v in infos.values():
        assert v.shape == (2, 4) and np.isfinite(v).all()
    # RLPD's schedule: the policies step on every second call (utd_ratio 2), zeros between.
    base_loss, actor_loss = infos["base/loss"][0], infos["actor/loss"][0]
    assert np.all(base_loss[::2] == 0) and np.all(base_loss[1::2] > 0)
    assert np.all(actor_loss[::2] == 0) and np.all(infos["critic/loss"] > 0)
    a1 = _member(trained)
    # Acting: actions in [-1, 1]; evaluation is a function of the observation alone.
    obs = BATCHES.obs[0]
    acts = jax.jit(EXPO.sample_actions)(a1, obs, jax.random.key(0))
    assert acts.shape == (B, ACT_DIM) and np.all(np.abs(np.asarray(acts)) <= 1.0)
    ev = jax.jit(EXPO.eval_actions)
    np.testing.assert_allclose(ev(a1, obs)[3:5], ev(a1, obs[3:5]), rtol=1e-5, atol=1e-6)


def test_config_defaults_are_the_authors_and_bad_values_are_refused():
    c = EXPOConfig()
    assert (c.num_samples, c.num_edit_samples, c.edit_scale, c.diffusion_steps) == (8, 8, 0.05, 10)
    assert (c.utd_ratio, c.num_qs, c.num_min_qs, c.critic_layer_norm) == (20, 10, 2, True)
    assert (c.hidden_dims, c.base_width, c.base_blocks) == ((256,) * 3, 256, 3)
    assert (c.backup_entropy, c.base_ema_tau, c.learning_starts) == (False, 0.001, 5000)
    assert c.delayed_actor_update and c.policy_q == "mean" and c.target_entropy_scale == 0.5
    want = -ACT_DIM / 2 + ACT_DIM * np.log(0.2)  # the scaled edit's target entropy
    assert float(_member(_runs()[0]).hparams["target_entropy"]) == pytest.approx(want, rel=1e-6)
    plain = dataclasses.replace(SMALL, edit_target_entropy=False)
    zeros = jnp.zeros(OBS_DIM), jnp.zeros(ACT_DIM)
    entropy = jax.jit(lambda: EXPO.create(plain, *zeros, 0).hparams["target_entropy"])()
    assert float(entropy) == pytest.approx(-ACT_DIM / 2)
    with pytest.raises(ConfigError, match="num_edit_samples"):
        EXPOConfig(num_samples=4, num_edit_samples=5)
    with pytest.raises(ConfigError, match="backup-entropy"):
        EXPOConfig(backup_entropy=True)
    with pytest.raises(ConfigError, match="time_dim"):
        EXPOConfig(time_dim=7)
    with pytest.raises(ConfigError, match="edit_scale"):
        EXPOConfig(edit_scale=0.0)


# ------------------------------------------------------------------------------- learning (slow)


def _first_crossing(out: str, threshold: float) -> float:
    with open(os.path.join(out, "metrics.csv")) as f:
        rows = [r for r in csv.DictReader(f) if r.get("eval_return")]
    for r in rows:
        if float(r["eval_return"]) >= threshold:
            return float(r["step"])
    return float("inf")


@pytest.mark.slow
def test_expo_with_expert_data_reaches_the_threshold_before_sac(tmp_path, record_property):
    """EXPO against SAC with the same data mixing: half of every minibatch from the generated
    expert data (`--offline-ratio 0.5`), the same 64x64 networks, UTD 2 (every network steps on
    every update), batch 256, no random warm-up, the same seed and evaluations (10 episodes every
    250 env steps). EXPO at a CPU budget: a 5-step diffusion of one residual block of 64, 4 base
    and 4 edited candidates, 4 LayerNorm critics, base learning rate 1e-3 and moving average 0.05
    (the paper's 0.001 averages over ~1,000 updates, most of this run).

    Threshold -800 on Pendulum-v1 (random: about -1,200; the expert data: about -145). EXPO gets
    1,250 env steps and must get there; SAC must get there at least one evaluation (250 env
    steps) later, or not within EXPO's steps + 250. Measured with `benchmarks/learning_tests.py`
    (JAXRL_TEST_SEED 0-4: data, agent and evaluation seeds): EXPO first reached -800 at 750, 750,
    1,000, 1,250 and 750 env steps (seed 3: -825 at 1,000, -510 at 1,250), and SAC not within the
    250 steps after. With the samplers' loops unrolled (the same operations, other float
    rounding) seed 3 had reached it at 1,000 and seed 2 at 750: 1,000 steps left no margin. Run
    to 1,750 steps, SAC first reached it at 1,250, 1,250, not, not and 1,250 (its best
    evaluation, -469 to -1,097 at 1,000-1,250 steps, falls back below -1,000: without LayerNorm
    its critic overestimates the data's actions). EXPO keeps improving, but on seeds 2-4 it had
    not reached -400 within 1,250 steps (-491, -539, -225 at 2,000). This test shows no lead over
    RLPD, which shares EXPO's critic (RLPD at UTD 4 first reached -400 at 1,000-1,250 env steps
    on data seed 0).
    """
    from jaxrl.agents import SACConfig
    from jaxrl.loops import TrainConfig
    from jaxrl.run import train
    from tests.offline_utils import learning_seed, pendulum_dataset

    path = pendulum_dataset("expert").source
    shared = {"hidden_dims": (64, 64), "utd_ratio": 2, "batch_size": 256, "learning_starts": 0}
    common = {"env": "Pendulum-v1", "eval_every": 250, "eval_episodes": 10, "progress": False}
    common.update(seed=learning_seed(), dataset=path, tensorboard=False)
    expo = EXPOConfig(
        **shared, num_qs=4, delayed_actor_update=False, base_width=64, base_blocks=1,
        time_dim=16, diffusion_steps=5, num_samples=4, num_edit_samples=4, base_lr=1e-3,
        base_ema_tau=0.05,
    )  # fmt: skip
    expo_out, sac_out = str(tmp_path / "expo"), str(tmp_path / "sac")
    train("expo", TrainConfig(**common, total_steps=1250, out=expo_out), expo)
    expo_steps = _first_crossing(expo_out, -800.0)
    record_property("expo_steps", expo_steps)
    assert expo_steps <= 1250
    cfg = TrainConfig(**common, total_steps=int(expo_steps) + 250, out=sac_out)
    train("sac", cfg, SACConfig(**shared))
    sac_steps = _first_crossing(sac_out, -800.0)
    print(f"env steps to -800: EXPO {expo_steps}, SAC {sac_steps} (inf: not within the run)")
    record_property("sac_steps", sac_steps)
    assert expo_steps + 250 <= sac_steps
