"""CrossQ: batch renormalization's math, the joint forward pass, the policy delay, pure updates
under scan and vmap, and a fused run whose running statistics resume bit-identically."""

from __future__ import annotations

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl import networks as nets
from jaxrl.agents import CrossQ, CrossQConfig
from jaxrl.config import ConfigError
from jaxrl.types import Transition

OBS, ACT, B = 4, 2, 64
SMALL = {"actor_hidden_dims": (16, 16), "critic_hidden_dims": (32, 32)}
# Created by a compiled program (one compilation), not op by op: seconds faster per call.
_create = jax.jit(lambda s: CrossQ.create(CrossQConfig(**SMALL), jnp.zeros(OBS), jnp.zeros(ACT), s))


def _batch(seed: int, n: int = B) -> Transition:
    rng = np.random.default_rng(seed)
    f = lambda *s: jnp.asarray(rng.normal(size=s), jnp.float32)  # noqa: E731
    return Transition(
        obs=f(n, OBS) * 2.0 + 1.0,
        action=jnp.tanh(f(n, ACT)),
        reward=f(n),
        next_obs=f(n, OBS) - 3.0,
        terminal=jnp.asarray(rng.random(n) < 0.1, jnp.float32),
    )


def _leaves(tree) -> list[np.ndarray]:
    key_data = jax.random.key_data
    return [
        np.asarray(key_data(x) if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key) else x)
        for x in jax.tree.leaves(tree)
    ]


def _renorm(x, stats, **kw):
    layer = nets.BatchRenorm(False, momentum=0.9, warmup_steps=2, **kw)
    params = {"params": {"scale": jnp.ones(x.shape[-1]), "bias": jnp.zeros(x.shape[-1])}}
    return layer.apply({**params, "batch_stats": stats}, x, mutable=["batch_stats"])


def test_batch_renorm_is_batch_norm_in_warmup_then_corrects_toward_running_statistics():
    x = jnp.asarray(np.random.default_rng(0).normal(3.0, 2.0, size=(128, 3)), jnp.float32)
    mu, var = np.asarray(x).mean(0), np.asarray(x).var(0)
    stats = {"mean": jnp.full(3, -0.5), "var": jnp.full(3, 0.25), "steps": jnp.int32(0)}
    y, new = _renorm(x, stats)
    np.testing.assert_allclose(y, (x - mu) / np.sqrt(var + 1e-3), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(new["batch_stats"]["mean"], 0.9 * -0.5 + 0.1 * mu, rtol=1e-5)
    np.testing.assert_allclose(new["batch_stats"]["var"], 0.9 * 0.25 + 0.1 * var, rtol=1e-4)
    assert int(new["batch_stats"]["steps"]) == 1

    # After warm-up: x_hat * r + d, with r and d clipped (running std 0.5 vs batch std ~2).
    warm = {**stats, "steps": jnp.int32(2)}
    y, _ = _renorm(x, warm)
    sd_b, sd_r = np.sqrt(var + 1e-3), np.sqrt(0.25 + 1e-3)
    r = np.clip(sd_b / sd_r, 1 / 3, 3)
    d = np.clip((mu + 0.5) / sd_r, -5, 5)
    want = (x - mu) / np.sqrt(var) * r + d  # SBX's affine mean/var, up to epsilon
    np.testing.assert_allclose(y, want, rtol=2e-3, atol=2e-3)
    assert np.all(r == 3.0) and np.all(d == 5.0)  # both bounds were active

    # Evaluation: the running statistics only, nothing updated.
    layer = nets.BatchRenorm(True)
    params = {"params": {"scale": jnp.ones(3), "bias": jnp.zeros(3)}}
    y = layer.apply({**params, "batch_stats": stats}, x)
    np.testing.assert_allclose(y, (x + 0.5) / np.sqrt(0.25 + 1e-3), rtol=1e-5)


def test_critic_statistics_come_from_the_joint_batch_and_the_actor_steps_every_third_call():
    agent = _create(0)
    batch = _batch(1)
    update = jax.jit(lambda a, b: a.update(b))
    first = jax.tree.leaves(agent.actor.params)[0]
    changed, infos = [], []
    for _ in range(3):
        before = jax.tree.leaves(agent.critic.params)[0]
        agent, info = update(agent, batch)
        assert not np.allclose(before, jax.tree.leaves(agent.critic.params)[0])
        changed.append(not np.allclose(first, jax.tree.leaves(agent.actor.params)[0]))
        infos.append(float(info["actor/loss"]))
    assert changed == [False, False, True] and infos[:2] == [0.0, 0.0] and infos[2] != 0.0

    # The critic's input layer saw [s; s'] (its first OBS features): after three calls the
    # running mean is the momentum average of the joint batch's mean, for every member.
    joint = np.concatenate([batch.obs, batch.next_obs]).mean(0)
    got = agent.critic_stats["VmapRenormMLP_0"]["BatchRenorm_0"]["mean"][:, :OBS]
    np.testing.assert_allclose(got, np.broadcast_to((1 - 0.99**3) * joint, got.shape), rtol=1e-4)
    actor_in = agent.actor_stats["RenormMLP_0"]["BatchRenorm_0"]
    np.testing.assert_allclose(actor_in["mean"], 0.01 * np.asarray(batch.obs).mean(0), rtol=1e-4)
    assert int(actor_in["steps"]) == 1  # the actor's statistics move only on its step
    assert "target_critic_params" not in {f for f in agent.__dataclass_fields__}


def test_update_is_pure_under_scan_and_vmap_over_seeds():
    batches = jax.tree.map(lambda *x: jnp.stack(x), *[_batch(i) for i in range(4)])

    def run(agent):
        return jax.lax.scan(lambda a, b: a.update(b), agent, batches)

    vagents, vinfo = jax.jit(jax.vmap(lambda s: run(_create(s))))(jnp.arange(3))
    for i in range(3):
        single, info = jax.jit(run)(_create(i))
        for v, s in zip(_leaves(vagents), _leaves(single), strict=True):
            np.testing.assert_allclose(v[i], s, rtol=1e-4, atol=1e-5)
    assert not np.allclose(vinfo["critic/loss"][0], vinfo["critic/loss"][1])
    again, _ = jax.jit(run)(_create(0))
    single, _ = jax.jit(run)(_create(0))
    for a, b in zip(_leaves(again), _leaves(single), strict=True):
        np.testing.assert_array_equal(a, b)  # same seed, same numbers


@pytest.mark.parametrize(
    "field,value", [("adam_b1", 1.5), ("bn_momentum", -0.1), ("policy_delay", 0), ("num_qs", 0)]
)
def test_bad_config_values_are_refused(field, value):
    with pytest.raises(ConfigError, match=field.replace("_", "[-_]")):
        CrossQConfig(**{field: value})


def _train(out, steps, *extra):
    from jaxrl.cli import main

    main(["train", "crossq", "--env", "jax:pendulum", "--num-envs", "2", "--out", out,
          "--total-steps", str(steps), "--learning-starts", "100", "--eval-episodes", "2",
          "--actor-hidden-dims", "16", "16", "--critic-hidden-dims", "32", "32", "--no-progress",
          "--renorm-warmup-steps", "150", *extra])  # fmt: skip


def _metrics(out):
    from jaxrl.loops.logging import read_metrics

    rows = read_metrics(os.path.join(out, "metrics.csv"))
    return [{k: v for k, v in r.items() if not k.startswith("time/")} for r in rows]


def test_fused_run_resumes_bit_identically_with_its_running_statistics(tmp_path, capsys):
    from jaxrl.cli import main
    from jaxrl.run.runs import load_run

    full, split = str(tmp_path / "full"), str(tmp_path / "split")
    # 400 env steps, one update per env step after the 100 warm-up steps: 100 updates before the
    # stop, 300 in all; renorm warm-up ends at 150 calls, so the resumed half crosses it and its
    # r/d corrections read the restored running statistics.
    _train(full, 400, "--eval-every", "200")
    _train(split, 200, "--eval-every", "200", "--checkpoint-every", "200")
    _train(split, 400, "--eval-every", "200", "--checkpoint-every", "200")
    assert "Resuming" in capsys.readouterr().out
    assert _metrics(split) == _metrics(full) and len(_metrics(full)) >= 2
    a, b = load_run(full).agent, load_run(split).agent
    steps = a.critic_stats["VmapRenormMLP_0"]["BatchRenorm_0"]["steps"]
    assert int(steps[0]) == 300, steps
    for x, y in zip(_leaves(a), _leaves(b), strict=True):
        np.testing.assert_array_equal(x, y)
    main(["eval", full, "--episodes", "1"])
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["step"] == 400 and np.isfinite(result["return_mean"])
    main(["export", full, "--format", "numpy"])  # checks the artifact against eval_actions
