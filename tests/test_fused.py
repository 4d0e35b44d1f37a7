"""The fused loop on JAX envs: seeds in one program, resume, learning, the CLI on Brax."""

from __future__ import annotations

import json
import os

import jax
import numpy as np
import pytest

from jaxrl.cli import main, parse_train_args
from jaxrl.loops import init_fused_state
from jaxrl.loops.checkpoint import Checkpointer
from jaxrl.loops.logging import read_metrics
from jaxrl.run import train

TINY_SAC = [
    "--hidden-dims", "32", "32",
    "--batch-size", "32",
    "--learning-starts", "64",
    "--buffer-size", "2000",
]  # fmt: skip


def _train(argv, agent="sac"):
    train_cfg, agent_cfg = parse_train_args(agent, argv + ["--no-progress", "--no-tensorboard"])
    return train(agent, train_cfg, agent_cfg), train_cfg, agent_cfg


def _restore(out, agent_cfg, train_cfg, agent="sac"):
    from jaxrl import registry
    from jaxrl.run.runs import make_jax_envs

    spec = registry.get(agent)
    env, _ = make_jax_envs(train_cfg.env, train_cfg.num_envs, 1, agent_cfg, spec)
    with open(os.path.join(out, "config.json")) as f:
        seed = json.load(f)["seed"]
    template = init_fused_state(spec, agent_cfg, env, seed)
    return Checkpointer(os.path.join(out, "checkpoints")).restore(template)[0]


def _leaves(tree):
    """Numeric leaves (PRNG keys as their key data)."""

    def numeric(x):
        if hasattr(x, "dtype") and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
            x = jax.random.key_data(x)
        return np.asarray(x)

    return [numeric(x) for x in jax.tree.leaves(tree)]


def test_vmapped_seeds_equal_single_seed_runs(tmp_path):
    common = ["--env", "jax:pendulum", "--num-envs", "2", "--total-steps", "200"]
    common += ["--log-every", "100", "--eval-every", "200", "--eval-episodes", "2", *TINY_SAC]
    summary, train_cfg, agent_cfg = _train(
        [*common, "--num-seeds", "4", "--out", str(tmp_path / "v")]
    )
    assert summary["seeds"] == [0, 1, 2, 3] and summary["completed"]
    assert os.path.exists(tmp_path / "v" / "learning_curve.png")
    for seed in (0, 3):  # the first and last slices (each single run compiles its own loop)
        out = tmp_path / f"single{seed}"
        _, cfg1, _ = _train([*common, "--seed", str(seed), "--out", str(out)])
        vmapped = _restore(str(tmp_path / "v" / f"s{seed}"), agent_cfg, cfg1)
        alone = _restore(str(out), agent_cfg, cfg1)
        for a, b in zip(_leaves(vmapped.agent), _leaves(alone.agent), strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
        # Training metrics agree too. (Evaluation returns are not compared: a 200-step
        # pendulum rollout of an untrained policy amplifies 1e-7 differences chaotically.)
        rows_v = read_metrics(str(tmp_path / "v" / f"s{seed}" / "metrics.csv"))
        rows_s = read_metrics(str(out / "metrics.csv"))
        for rv, rs in zip(rows_v, rows_s, strict=True):
            assert rv.keys() == rs.keys()
            for k in ("critic/loss", "actor/loss", "temp/alpha", "train/episode_return"):
                np.testing.assert_allclose(rv.get(k, 0), rs.get(k, 0), rtol=1e-4, err_msg=k)
    # The seeds really differ from each other.
    losses = [
        read_metrics(str(tmp_path / "v" / f"s{s}" / "metrics.csv"))[-1]["critic/loss"]
        for s in range(4)
    ]
    assert len({round(f, 3) for f in losses}) == 4


def test_fused_resume_continues_like_an_uninterrupted_run(tmp_path):
    common = ["--env", "jax:pendulum", "--num-envs", "2", "--log-every", "50"]
    common += ["--eval-every", "100", "--eval-episodes", "2", *TINY_SAC]
    _train([*common, "--total-steps", "200", "--out", str(tmp_path / "full")])
    _train([*common, "--total-steps", "100", "--out", str(tmp_path / "part")])
    summary, cfg, agent_cfg = _train(
        [*common, "--total-steps", "200", "--out", str(tmp_path / "part")]
    )
    assert summary["total_steps"] == 200
    full = _restore(str(tmp_path / "full"), agent_cfg, cfg)
    part = _restore(str(tmp_path / "part"), agent_cfg, cfg)
    for a, b in zip(_leaves(full), _leaves(part), strict=True):
        np.testing.assert_array_equal(a, b)
    rows = read_metrics(str(tmp_path / "part" / "metrics.csv"))
    assert [r["step"] for r in rows] == [50, 100, 150, 200]


def test_num_seeds_needs_a_jax_env(tmp_path, capsys):
    with pytest.raises(SystemExit) as err:
        main(["train", "sac", "--env", "Pendulum-v1", "--num-seeds", "2", "--out", str(tmp_path)])
    assert err.value.code == 2
    assert "JAX env" in capsys.readouterr().err


@pytest.mark.slow
def test_cli_trains_on_brax_and_writes_the_run_directory(tmp_path, capsys):
    out = tmp_path / "brax"
    argv = ["train", "sac", "--env", "brax:inverted_pendulum?backend=spring", "--num-envs", "8"]
    argv += ["--total-steps", "400", "--eval-every", "200", "--eval-episodes", "2", *TINY_SAC]
    main([*argv, "--out", str(out), "--no-progress", "--learning-starts", "200"])
    for name in ("config.json", "metrics.csv", "summary.json", "learning_curve.png"):
        assert os.path.exists(out / name), name
    assert os.listdir(out / "checkpoints")
    summary = json.loads((out / "summary.json").read_text())
    assert summary["completed"] and summary["total_steps"] == 400
    assert np.isfinite(summary["final_eval_return_mean"])
    rows = read_metrics(str(out / "metrics.csv"))
    assert [r["step"] for r in rows if "eval_return" in r] == [200, 400]
    capsys.readouterr()
    main(["eval", str(out), "--episodes", "3"])
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["episodes"] == 3 and result["step"] == 400
    assert np.isfinite(result["return_mean"])


@pytest.mark.slow
def test_sac_learns_jax_pendulum_in_the_fused_loop(tmp_path, record_property):
    from offline_utils import learning_seed

    summary, _, _ = _train(
        [
            "--env", "jax:pendulum", "--num-envs", "4", "--total-steps", "6000",
            "--seed", str(learning_seed()),
            "--learning-starts", "1000", "--hidden-dims", "128", "128",
            "--eval-every", "3000", "--out", str(tmp_path / "sac"),
        ]
    )  # fmt: skip
    record_property("value", summary["final_eval_return_mean"])
    record_property("threshold", -250)
    assert summary["final_eval_return_mean"] >= -250, summary


@pytest.mark.slow
def test_ppo_learns_jax_pendulum(tmp_path, record_property):
    # Brax-style defaults, but GAE (per segment, as Brax) over unroll_length 20 with 16-segment
    # minibatches (same 5120 transitions per update): 5-step segments are too short a horizon
    # for pendulum at this budget (-424 at 164k).
    # With a constant learning rate (Brax's default) the old budget of 164k steps (32 updates)
    # failed seed 2 by divergence, not slow learning: it reached -98 at 102k-143k, then one
    # update's policy step blew up (mean approx. KL 25, vs 0.005-0.07 elsewhere), the tanh
    # policy saturated (entropy estimate 0 -> -3) and it stayed at -566..-593 up to 328k.
    # The learning rate is therefore annealed linearly to 0 over the run (CleanRL's default),
    # so the last updates are small; annealed over 164k, seed 6 was still learning (-255), hence
    # 205k steps (40 updates). Measured at 205k, seeds 0-6: -135, -149, -140, -137, -89, -151,
    # -125 (constant rate, 164k: -134, -163, -588, -137, -86).
    from offline_utils import learning_seed

    steps = 204800
    summary, _, _ = _train(
        [
            "--env", "jax:pendulum", "--num-envs", "64", "--total-steps", str(steps),
            "--unroll-length", "20", "--batch-size", "16", "--anneal-lr-steps", str(steps),
            "--seed", str(learning_seed()),
            "--eval-every", "102400", "--log-every", "20480", "--out", str(tmp_path / "ppo"),
        ],
        agent="ppo",
    )  # fmt: skip
    record_property("value", summary["final_eval_return_mean"])
    record_property("threshold", -250)
    assert summary["total_steps"] == steps
    assert summary["final_eval_return_mean"] >= -250, summary


def test_train_jax_script_runs_ppo_with_two_seeds(tmp_path):
    import runpy

    from jaxrl.agents import PPOConfig
    from jaxrl.loops import TrainConfig

    script = runpy.run_path(
        os.path.join(os.path.dirname(__file__), "..", "scripts", "train_jax.py")
    )
    cfg = TrainConfig(
        env="jax:point_mass", total_steps=160, num_envs=4, num_seeds=2, out=str(tmp_path / "p"),
        eval_every=80, log_every=40, eval_episodes=2, progress=False, tensorboard=False,
    )  # fmt: skip
    ppo = PPOConfig(
        batch_size=4, num_minibatches=2, unroll_length=5, policy_hidden_dims=(8,),
        value_hidden_dims=(8,),
    )  # fmt: skip
    summaries = script["main"](script["Args"](agent="ppo", train=cfg, ppo=ppo))
    assert [s["seed"] for s in summaries] == [0, 1]
    assert all(s["completed"] and s["total_steps"] == 160 for s in summaries)
    rows = read_metrics(str(tmp_path / "p" / "s1" / "metrics.csv"))
    assert [r["step"] for r in rows if "eval_return" in r] == [80, 160]
    assert all(np.isfinite(r["policy/loss"]) for r in rows)
