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

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import struct

from jaxrl.cli import EXIT_DIVERGED, EXIT_STOPPED, main
from jaxrl.data import Dataset, save_d4rl
from jaxrl.envs import HostEnv
from jaxrl.loops import guarded_updates
from jaxrl.loops.checkpoint import Checkpointer
from jaxrl.loops.logging import read_metrics

TINY = ["--hidden-dims", "16", "16", "--no-progress", "--no-tensorboard", "--eval-episodes", "1"]


def _train(argv, capsys, stream="err"):
    """``jaxrl train ...``: (exit status, what it wrote to ``stream``, stderr or stdout)."""
    try:
        main(["train", *argv])
        code = 0
    except SystemExit as exit:
        code = exit.code
    return code, getattr(capsys.readouterr(), stream)


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


def _huge_reward_dataset(tmp_path):
    """A small Pendulum dataset whose rewards overflow any TD target (a D4RL HDF5 file)."""
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
    return save_d4rl(data, str(tmp_path / "huge.hdf5"))


def test_rewards_near_float32_max_offline(tmp_path, capsys):
    path = _huge_reward_dataset(tmp_path)
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


# -- warn / skip / stop in every loop ----------------------------------------------------------
# All rewards are NaN (or overflow) from the start, so every update leaves NaN in the agent:
# 'warn' keeps them (and says so), 'skip' discards every one (the agent never changes), 'stop'
# ends the run with status 3.


def _float_leaves(tree):
    leaves = [jnp.asarray(x) for x in jax.tree.leaves(tree)]
    return [np.asarray(x) for x in leaves if jnp.issubdtype(x.dtype, jnp.floating)]


def _check_mode(mode, code, out, capsys_out, pristine):
    """The run in ``out`` (``capsys_out``: its stdout) followed ``--on-nonfinite mode``.

    ``pristine``: its first checkpoint holds the agent before any update (else after some);
    its last one holds the agent after every (non-finite) update.
    """
    from jaxrl.run.runs import load_run

    if mode == "stop":
        assert code == EXIT_DIVERGED
        assert _summary(out)["status"] == "diverged"
        return
    assert code == 0
    rows = read_metrics(os.path.join(out, "metrics.csv"))
    assert rows[-1]["train/nonfinite_updates"] > 0
    steps = _checkpoint_steps(out)
    assert len(steps) > 1
    before = _float_leaves(load_run(out, steps[0]).agent)
    after = _float_leaves(load_run(out, steps[-1]).agent)
    if pristine or mode == "skip":
        assert before and not any(np.isnan(x).any() for x in before)
    if mode == "warn":  # the NaN updates were applied, and the run says so
        assert "left NaN in the agent" in capsys_out
        assert any(np.isnan(x).any() for x in after)
    else:  # every update was discarded: the agent is the one from before them
        assert "were skipped" in capsys_out
        assert len(after) == len(before)
        for a, b in zip(after, before, strict=True):
            np.testing.assert_array_equal(a, b)


def _nan_rewards_jax(monkeypatch):
    """JAX envs of 2 copies (the training envs; eval has 1) return NaN rewards."""
    from jaxrl.envs.jax_envs import VecEnv

    original = VecEnv.step

    def step_fn(self, state, action):
        state = original(self, state, action)
        if self.num_envs == 2:
            state = state.replace(reward=state.reward * np.float32(np.nan))
        return state

    monkeypatch.setattr(VecEnv, "step", step_fn)


TINY_AGENTS = {
    "sac": {"hidden_dims": (8, 8), "batch_size": 8, "learning_starts": 4, "buffer_size": 64},
    "ppo": {
        "policy_hidden_dims": (8,),
        "value_hidden_dims": (8,),
        "batch_size": 2,
        "num_minibatches": 2,
        "unroll_length": 2,
        "num_updates_per_batch": 1,
    },
}


@pytest.mark.parametrize(("agent", "mode"), [("sac", "warn"), ("sac", "skip"), ("ppo", "skip")])
def test_fused_loop_honours_on_nonfinite(agent, mode, monkeypatch):
    """Two iterations of the fused loop's program, every update non-finite (NaN rewards).

    The off-policy iteration once discarded such updates whatever the mode. ('stop' runs the
    'warn' program and ends the run in the harness: test_huge_learning_rate_in_the_fused_loop.
    PPO's 'warn' is left out for time: its iteration passes the mode as the off-policy one does,
    to the same guarded_update.)
    """
    from jaxrl import registry
    from jaxrl.loops import NONFINITE, TrainConfig, init_fused_state, strongly_typed
    from jaxrl.loops.fused import _iteration, jit_chunk
    from jaxrl.run.runs import make_jax_envs

    _nan_rewards_jax(monkeypatch)
    spec = registry.get(agent)
    agent_cfg = spec.config(**TINY_AGENTS[agent])
    env, _ = make_jax_envs("jax:pendulum", 2, 1, agent_cfg, spec)
    cfg = TrainConfig(env="jax:pendulum", num_envs=2, on_nonfinite=mode)
    iteration, unit, updates = _iteration(spec, agent_cfg, env, cfg)
    states = jax.tree.map(lambda x: jnp.asarray(x)[None], init_fused_state(spec, agent_cfg, env, 0))
    states = strongly_typed(states)  # as train_fused makes them
    before = [np.array(x) for x in _float_leaves(states.agent)]
    start = 0 if spec.kind == "on-policy" else agent_cfg.learning_starts  # learning from here
    states, metrics = jit_chunk(iteration, 2, unit)(states, jnp.int32(start))
    assert int(metrics[NONFINITE][0]) == 2 * updates  # every update counted
    after = _float_leaves(states.agent)
    if mode == "warn":  # the NaN updates were applied
        assert any(np.isnan(x).any() for x in after)
    else:  # every update was discarded: the agent is the one from before them
        for a, b in zip(after, before, strict=True):
            np.testing.assert_array_equal(a, b)


def test_fused_loop_warn_mode_keeps_the_nan_updates_and_says_so(tmp_path, capsys):
    # Through the command line, so the run's own warning is checked too; that the fused program
    # keeps a NaN update in 'warn' mode is test_fused_loop_honours_on_nonfinite[sac-warn].
    out = str(tmp_path / "run")
    argv = ["sac", "--env", "jax:pendulum", "--num-envs", "4", "--total-steps", "800"]
    argv += ["--learning-starts", "100", "--eval-every", "400", "--log-every", "200"]
    argv += ["--checkpoint-every", "400", "--actor-lr", "1e30", "--critic-lr", "1e30"]
    code, text = _train([*argv, *TINY, "--out", out, "--on-nonfinite", "warn"], capsys, "out")
    _check_mode("warn", code, out, text, pristine=False)


def test_host_loop_warn_mode_keeps_the_nan_updates(tmp_path, monkeypatch, capsys):
    out = str(tmp_path / "run")
    _nan_rewards_from(1, monkeypatch)
    argv = [*HOST[:5], "--total-steps", "200", "--learning-starts", "100"]
    argv += ["--checkpoint-every", "100", "--eval-every", "200", "--log-every", "100"]
    code, text = _train([*argv, *TINY, "--out", out, "--on-nonfinite", "warn"], capsys, "out")
    _check_mode("warn", code, out, text, pristine=True)


@pytest.mark.parametrize("mode", ["warn", "skip"])
def test_offline_loop_honours_on_nonfinite(mode, tmp_path, capsys):
    path = _huge_reward_dataset(tmp_path)
    out = str(tmp_path / "run")
    argv = ["td3-bc", "--dataset", path, "--total-steps", "100", "--eval-every", "100"]
    argv += ["--log-every", "50", "--checkpoint-every", "50", "--batch-size", "16"]
    code, text = _train([*argv, *TINY, "--out", out, "--on-nonfinite", mode], capsys, "out")
    _check_mode(mode, code, out, text, pristine=False)


class _Toy(struct.PyTreeNode):
    """An agent whose update adds the batch to its parameter (a NaN batch: a NaN update)."""

    w: jax.Array

    def update(self, batch):
        return self.replace(w=self.w + batch), {"loss": jnp.sum(batch)}


def test_guarded_updates_apply_the_mode_and_select_only_when_skipping():
    batches = jnp.array([[1.0, 1.0], [jnp.nan, 0.0], [2.0, 2.0]])
    for mode, want in [("warn", np.nan), ("stop", np.nan), ("skip", 3.0)]:
        agent, info, bad = guarded_updates(_Toy(jnp.zeros(2)), batches, mode)
        assert int(bad) == (1 if mode == "skip" else 2)  # after a kept NaN, every one is bad
        np.testing.assert_array_equal(agent.w[1], 3.0)
        assert np.isnan(agent.w[0]) if np.isnan(want) else agent.w[0] == want
        jaxpr = str(jax.make_jaxpr(lambda a, m=mode: guarded_updates(a, batches, m))(agent))
        assert ("select_n" in jaxpr) == (mode == "skip")  # no jnp.where over the agent else
    with pytest.raises(ValueError, match="on_nonfinite"):  # e.g. a function passed as the mode
        guarded_updates(_Toy(jnp.zeros(2)), batches, lambda: None)
