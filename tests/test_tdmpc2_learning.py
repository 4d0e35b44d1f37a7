"""TD-MPC2 in the training loops: it learns the pendulum swing-up (slow), and a run interrupted
by Ctrl-C mid-episode after learning started and resumed is the uninterrupted run, bit for bit
(host loop on MuJoCo)."""

from __future__ import annotations

import json
import os
import signal

import numpy as np
import pytest

from jaxrl import registry
from jaxrl.cli import parse_train_args
from jaxrl.envs import HostEnv
from jaxrl.loops import TrainConfig
from jaxrl.loops.logging import read_metrics
from jaxrl.run import train

# Small enough that a run is mostly compilation; every part of the agent still runs (policy
# prior trajectories in the plan, 2 MPPI iterations, the termination head).
TINY = dict(
    latent_dim=16, mlp_dim=32, enc_dim=32, num_samples=16, num_elites=4, num_pi_trajs=2,
    iterations=2, batch_size=16, num_q=2, num_bins=21, buffer_size=1000, episodic=True,
)  # fmt: skip


def _metrics_without_timing(out):
    rows = read_metrics(os.path.join(out, "metrics.csv"))
    return [{k: v for k, v in r.items() if not k.startswith("time/")} for r in rows]


def _run_host(out, steps, **train_kw):
    cfg = registry.get("tdmpc2").config(learning_starts=100, **TINY)
    run = TrainConfig(
        env="InvertedPendulum-v5", total_steps=steps, seed=0, out=str(out), progress=False,
        tensorboard=False, eval_every=200, eval_episodes=2, log_every=50, checkpoint_every=100,
        **train_kw,
    )  # fmt: skip
    return train("tdmpc2", run, cfg)


def test_tdmpc2_resume_is_bit_identical_on_mujoco(tmp_path, monkeypatch):
    # Learning starts at step 100 (a burst of 100 updates on the random-action data, then one
    # update on sequences per step and MPPI actions whose warm start is carried between steps).
    # Ctrl-C between checkpoints (at 150) and a resume from the checkpoint at 100
    # must log exactly the rows of the uninterrupted run. (Three runs: each compiles anew.)
    full, part = tmp_path / "full", tmp_path / "part"
    _run_host(full, 200)
    original, calls = HostEnv.step, {"n": 0}

    def step_and_interrupt(self, action):
        if self.num_envs == 1:  # the training env (evaluation runs 2)
            calls["n"] += 1
            if calls["n"] == 150:
                os.kill(os.getpid(), signal.SIGINT)
        return original(self, action)

    monkeypatch.setattr(HostEnv, "step", step_and_interrupt)
    summary = _run_host(part, 200)
    assert not summary["completed"] and summary["total_steps"] == 150
    monkeypatch.setattr(HostEnv, "step", original)
    assert _run_host(part, 200)["completed"]

    # The discount was left unset: the run set the authors' heuristic for 1000-step episodes.
    with open(full / "config.json") as f:
        assert json.load(f)["agent_config"]["discount"] == pytest.approx(0.995)
    want = _metrics_without_timing(full)
    assert [r["step"] for r in want] == list(range(50, 201, 50))
    assert sum("eval_return" in r for r in want) == 1 and "model/value_loss" in want[-1]
    assert all(np.isfinite(v) for r in want for v in r.values())
    assert _metrics_without_timing(part) == want


# The "cpu" model size: widths 64, 2 Qs, MPPI with 64 samples, 8 elites, 8 policy
# trajectories and 3 iterations.
LEARN = ["--model-size", "cpu", "--lr", "1e-3", "--batch-size", "64", "--buffer-size", "10000"]


@pytest.mark.slow
def test_tdmpc2_learns_jax_pendulum_in_the_fused_loop(tmp_path, record_property):
    # 4000 env steps (1000 random, discount 0.975 and learning_starts 1000 from the 200-step
    # episodes), ~55 s on 2 quiet cores (~20 s of it compilation). Final return over the
    # test's 20 episodes, seeds 0-4: -201, -468, -113, -163, -223 (over 10: -251, -259, -100,
    # -153, -86). Random actions: about -1200.
    # At this budget TD-MPC2 swings the pendulum up and holds it (about -120 per episode)
    # from most starts, but from 5-20% of the starts near the bottom it still pushes at full
    # torque and stays stuck off the bottom (about -1500): the mean of 50 episodes of the
    # seeds' final agents is -190 to -430 (it reaches SAC's -150 at about 7000 steps). The
    # threshold allows for that: it fails an agent that did not learn the swing-up.
    from offline_utils import learning_seed

    argv = ["--env", "jax:pendulum", "--num-envs", "2", "--updates-per-step", "1"]
    argv += ["--total-steps", "4000", "--eval-every", "4000", "--eval-episodes", "20"]
    argv += ["--seed", str(learning_seed()), "--out", str(tmp_path / "tdmpc2"), *LEARN]
    train_cfg, agent_cfg = parse_train_args("tdmpc2", argv + ["--no-progress", "--no-tensorboard"])
    summary = train("tdmpc2", train_cfg, agent_cfg)
    record_property("value", summary["final_eval_return_mean"])
    record_property("threshold", THRESHOLD)
    assert summary["total_steps"] == 4000
    assert summary["final_eval_return_mean"] >= THRESHOLD, summary


THRESHOLD = -700
