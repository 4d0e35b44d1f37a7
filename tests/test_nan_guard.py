"""The NaN guard: a diverging update stops the run (exit 3) with the last good checkpoint kept,
the non-finite losses named and visible in metrics.csv; 'skip' discards such updates instead.
Also --max-to-keep and the exit status after SIGTERM."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from jaxrl.cli import EXIT_DIVERGED, EXIT_STOPPED, main
from jaxrl.data import Dataset, save_d4rl
from jaxrl.envs import HostEnv
from jaxrl.loops.checkpoint import Checkpointer
from jaxrl.loops.logging import read_metrics

TINY = ["--hidden-dims", "16", "16", "--no-progress", "--no-tensorboard", "--eval-episodes", "1"]


def _train(argv, capsys):
    """``jaxrl train ...``: (exit status, stderr)."""
    try:
        main(["train", *argv])
        code = 0
    except SystemExit as exit:
        code = exit.code
    return code, capsys.readouterr().err


def _checkpoint_steps(out):
    return Checkpointer(os.path.join(out, "checkpoints")).all_steps()


def _summary(out):
    with open(os.path.join(out, "summary.json")) as f:
        return json.load(f)


def _nan_rewards_from(step, monkeypatch):
    """Host envs return NaN rewards from their ``step``-th step on (training env only)."""
    original, calls = HostEnv.step, {"n": 0}

    def step_fn(self, action):
        next_obs, new_obs, reward, terminated, truncated = original(self, action)
        if self.num_envs == 2:  # the training envs; the eval env has 1 copy
            calls["n"] += 1
            if calls["n"] >= step:
                reward = np.full_like(reward, np.nan)
        return next_obs, new_obs, reward, terminated, truncated

    monkeypatch.setattr(HostEnv, "step", step_fn)


HOST = ["sac", "--env", "Pendulum-v1", "--num-envs", "2", "--total-steps", "400"]
HOST += ["--learning-starts", "100", "--eval-every", "100", "--log-every", "100"]


def test_nan_reward_stops_the_run_and_keeps_the_last_good_checkpoint(tmp_path, monkeypatch, capsys):
    out = str(tmp_path / "run")
    _nan_rewards_from(120, monkeypatch)  # env step 240 (2 envs): after the checkpoint at 200
    code, err = _train([*HOST, *TINY, "--out", out], capsys)
    assert code == EXIT_DIVERGED
    assert "training diverged" in err and "between step 200 and step 300" in err
    assert "critic/loss" in err  # the loss that went non-finite is named
    assert _checkpoint_steps(out) == [100, 200]  # nothing after the divergence
    rows = read_metrics(os.path.join(out, "metrics.csv"))
    assert [r["step"] for r in rows] == [100, 200, 300]
    assert np.isnan(rows[-1]["critic/loss"]) and rows[-1]["train/nonfinite_updates"] > 0
    summary = _summary(out)
    assert summary["status"] == "diverged" and summary["diverged_at"] == 300
    assert summary["final_eval_return_mean"] is None
    # The last good state restores and is finite.
    import jax
    import jax.numpy as jnp

    from jaxrl.run.runs import load_run

    leaves = jax.tree.leaves(load_run(out).agent)
    floats = [x for x in leaves if jnp.issubdtype(jnp.asarray(x).dtype, jnp.floating)]
    assert floats and all(bool(jnp.all(jnp.isfinite(x))) for x in floats)


def test_skip_mode_discards_the_bad_updates_and_counts_them(tmp_path, monkeypatch, capsys):
    out = str(tmp_path / "run")
    _nan_rewards_from(120, monkeypatch)
    code, _ = _train([*HOST, *TINY, "--out", out, "--on-nonfinite", "skip"], capsys)
    assert code == 0
    rows = read_metrics(os.path.join(out, "metrics.csv"))
    assert rows[-1]["train/nonfinite_updates"] > 0  # the skipped updates, counted
    assert _checkpoint_steps(out)[-1] == 400
    summary = _summary(out)
    assert summary["status"] == "completed" and np.isfinite(summary["final_eval_return_mean"])


def test_huge_learning_rate_in_the_fused_loop(tmp_path, capsys):
    out = str(tmp_path / "run")
    argv = ["sac", "--env", "jax:pendulum", "--num-envs", "4", "--total-steps", "800"]
    argv += ["--learning-starts", "100", "--eval-every", "400", "--log-every", "200"]
    argv += ["--actor-lr", "1e30", "--critic-lr", "1e30"]
    code, err = _train([*argv, *TINY, "--out", out], capsys)
    assert code == EXIT_DIVERGED and "training diverged" in err and "actor/loss" in err
    assert _summary(out)["status"] == "diverged"


def test_rewards_near_float32_max_offline(tmp_path, capsys):
    rng = np.random.default_rng(0)
    n = 400
    obs = rng.normal(size=(n, 3)).astype(np.float32)
    data = Dataset(
        observations=obs,
        actions=rng.uniform(-2, 2, (n, 1)).astype(np.float32),
        rewards=np.full(n, 3e38, np.float32),  # finite, but any sum of two overflows
        next_observations=obs + 0.01,
        terminals=np.zeros(n, bool),
        timeouts=(np.arange(n) % 100 == 99),
        env_id="Pendulum-v1",
    )
    path = save_d4rl(data, str(tmp_path / "huge.hdf5"))
    out = str(tmp_path / "run")
    argv = ["td3-bc", "--dataset", path, "--total-steps", "200", "--eval-every", "100"]
    argv += ["--log-every", "50", "--batch-size", "32"]
    code, err = _train([*argv, *TINY, "--out", out], capsys)
    assert code == EXIT_DIVERGED and "critic/loss" in err
    assert _summary(out)["status"] == "diverged"


def test_max_to_keep(tmp_path, capsys):
    out = str(tmp_path / "run")
    argv = ["sac", "--env", "jax:pendulum", "--num-envs", "2", "--total-steps", "200"]
    argv += ["--learning-starts", "50", "--eval-every", "200", "--checkpoint-every", "40"]
    code, _ = _train([*argv, *TINY, "--out", out, "--max-to-keep", "3"], capsys)
    assert code == 0 and _checkpoint_steps(out) == [120, 160, 200]


@pytest.mark.slow
def test_sigterm_saves_and_exits_with_the_requeue_status(tmp_path):
    """SLURM/Kubernetes send SIGTERM before a kill: save, then exit 75 (resume by rerunning)."""
    out = str(tmp_path / "run")
    argv = ["sac", "--env", "jax:pendulum", "--num-envs", "1", "--total-steps", "100000"]
    argv += ["--learning-starts", "50", "--log-every", "50", "--eval-every", "100000"]
    cmd = [sys.executable, "-m", "jaxrl.cli", "train", *argv, *TINY, "--out", out]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    metrics = os.path.join(out, "metrics.csv")
    deadline = time.time() + 240
    while not (os.path.exists(metrics) and len(read_metrics(metrics)) >= 2):
        assert proc.poll() is None and time.time() < deadline, proc.communicate()[0]
        time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)
    output = proc.communicate(timeout=240)[0]
    assert proc.returncode == EXIT_STOPPED, output
    assert "checkpoint saved" in output
    step = _checkpoint_steps(out)[-1]
    assert step >= 100 and _summary(out)["status"] == "stopped"
