"""Training over several devices (``--devices``): members and data parallelism on a mesh.

Each test runs jaxrl in a subprocess whose CPU is split into 4 devices
(``XLA_FLAGS=--xla_force_host_platform_device_count=4``, fixed when JAX starts); one process
trains both the 1-device and the 4-device runs it compares. Data-parallel runs compute the
1-device program with its arrays split over devices, so they match it up to the order of
float sums, whose differences grow over the updates: 1e-3 relative after 500 SAC updates (the
critic loss, a squared TD error, shows them most), where two seeds differ by 1e-1 or more.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from jaxrl.cli import main
from jaxrl.config import ConfigError
from jaxrl.loops.logging import read_metrics
from jaxrl.registry import get

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY_SAC = ["--hidden-dims", "32", "32", "--batch-size", "64", "--learning-starts", "256"]
QUIET = ["--no-progress", "--no-tensorboard"]
SMALL_SAC = ["--num-envs", "16", *TINY_SAC, "--learning-starts", "128", "--buffer-size", "1600"]
SMALL_SAC += QUIET
# Each CPU device is a thread, and a collective waits for all of them: on a loaded 2-core
# machine one may wait minutes for a thread that XLA's default gives 40 s before aborting.
FOUR_DEVICES = " ".join(
    [
        os.environ.get("XLA_FLAGS", ""),  # the test processes' flags (tests/xla_flags.py)
        "--xla_force_host_platform_device_count=4",
        "--xla_cpu_collective_call_terminate_timeout_seconds=900",
        "--xla_cpu_collective_call_warn_stuck_timeout_seconds=600",
        "--xla_cpu_collective_timeout_seconds=900",
    ]
)


def _on_four_devices(*commands: list[str], code: str = "") -> str:
    """Run ``jaxrl`` commands (then ``code``) in one Python process with 4 CPU devices."""
    lines = ["from jaxrl.cli import main"] + [f"main({c!r})" for c in commands] + [code]
    env = {**os.environ, "XLA_FLAGS": FOUR_DEVICES}
    env["PYTHONPATH"] = os.pathsep.join([ROOT, env.get("PYTHONPATH", "")])
    proc = subprocess.run(
        [sys.executable, "-c", "\n".join(lines)], env=env, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def _rows(out) -> list[dict]:
    return read_metrics(os.path.join(str(out), "metrics.csv"))


def _assert_same_metrics(a, b, keys, rtol=1e-4):
    rows_a, rows_b = _rows(a), _rows(b)
    assert [r["step"] for r in rows_a] == [r["step"] for r in rows_b]
    compared = 0
    for ra, rb in zip(rows_a, rows_b, strict=True):
        assert ra.keys() == rb.keys()
        for k in set(keys) & ra.keys():  # losses appear once learning started
            np.testing.assert_allclose(ra[k], rb[k], rtol=rtol, atol=1e-6, err_msg=k)
            compared += 1
    assert compared >= len(keys)


def test_a_member_sharded_sweep_matches_one_device(tmp_path):
    # 4 members (2 settings x 2 seeds) on 4 devices: one member per device, nothing shared.
    sweep = ["sweep", "sac", "--env", "jax:pendulum", "--num-envs", "4", "--total-steps", "256"]
    sweep += ["--grid", "actor_lr=0.001,0.0003", "--seeds", "2", "--log-every", "64"]
    sweep += ["--eval-every", "256", "--eval-episodes", "2", *TINY_SAC, *QUIET]
    sweep += ["--learning-starts", "64"]
    _on_four_devices(
        [*sweep, "--out", str(tmp_path / "one"), "--devices", "1"],
        [*sweep, "--out", str(tmp_path / "four"), "--devices", "4"],
    )
    keys = ["critic/loss", "actor/loss", "temp/alpha", "critic/q_mean"]
    for setting in ("actor_lr=0.001", "actor_lr=0.0003"):
        for seed in ("s0", "s1"):
            one, four = (tmp_path / d / setting / seed for d in ("one", "four"))
            _assert_same_metrics(one, four, keys, rtol=1e-5)


def test_sac_data_parallel_matches_one_device_and_reshards_on_resume(tmp_path):
    # One seed, 16 envs split 4 per device; the buffer's rows and every minibatch split too.
    # Checkpointed at 320 steps on 4 devices and resumed on 1 (and the reverse), a run goes
    # on as if it had not stopped: a checkpoint holds the same arrays at every device count.
    sac = ["train", "sac", "--env", "jax:pendulum", *SMALL_SAC, "--log-every", "160"]
    sac += ["--eval-every", "320", "--eval-episodes", "2"]
    full, short = [*sac, "--total-steps", "640"], [*sac, "--total-steps", "320"]
    _on_four_devices(
        [*full, "--out", str(tmp_path / "one"), "--devices", "1"],
        [*short, "--out", str(tmp_path / "4to1"), "--devices", "4"],
        [*full, "--out", str(tmp_path / "4to1"), "--devices", "1"],
        [*short, "--out", str(tmp_path / "1to4"), "--devices", "1"],
        [*full, "--out", str(tmp_path / "1to4"), "--devices", "4"],
    )
    keys = ["critic/loss", "actor/loss", "temp/alpha", "critic/q_mean", "critic/target"]
    # 512 updates (16 per iteration after 128 warm-up steps of 16 envs) by step 640.
    # 4to1 trains its first half on 4 devices, 1to4 its second half.
    for run in ("4to1", "1to4"):
        _assert_same_metrics(tmp_path / "one", tmp_path / run, keys, rtol=1e-3)
    returns = [_rows(tmp_path / r)[-1]["eval_return"] for r in ("one", "4to1", "1to4")]
    np.testing.assert_allclose(returns, returns[0], rtol=1e-3)
    assert json.load(open(tmp_path / "4to1" / "config.json"))["train"]["devices"] == "1"


def test_ppo_data_parallel_matches_one_device(tmp_path):
    # 64 envs on 4 devices, with the observation normalizer's statistics over all of them;
    # 2 updates of 4 epochs x 16 minibatches (128 optimizer steps) by 10240 steps.
    ppo = ["train", "ppo", "--env", "jax:pendulum", "--num-envs", "64", *QUIET]
    ppo += ["--total-steps", "10240", "--log-every", "5120", "--eval-every", "10240"]
    ppo += ["--eval-episodes", "2"]
    _on_four_devices(
        [*ppo, "--out", str(tmp_path / "one"), "--devices", "1"],
        [*ppo, "--out", str(tmp_path / "four"), "--devices", "4"],
    )
    keys = ["policy/loss", "value/loss", "ppo/grad_norm", "policy/entropy", "value/mean"]
    _assert_same_metrics(tmp_path / "one", tmp_path / "four", keys, rtol=1e-3)


def test_iql_data_parallel_matches_one_device(tmp_path):
    # 100 updates of batch 256 split 64 per device; the dataset is whole on every device.
    data = str(tmp_path / "random.hdf5")
    collect = ["dataset", "collect", "--kind", "random", "--env", "Pendulum-v1"]
    collect += ["--steps", "2000", "--ref-max-return", "-150", "--out", data]
    iql = ["train", "iql", "--dataset", data, "--total-steps", "100", "--log-every", "50"]
    iql += ["--eval-every", "100", "--eval-episodes", "2", *QUIET]
    _on_four_devices(
        collect,
        [*iql, "--out", str(tmp_path / "one"), "--devices", "1"],
        [*iql, "--out", str(tmp_path / "four"), "--devices", "4"],
    )
    keys = ["critic/loss", "value/loss", "actor/loss", "critic/q_mean", "value/v_mean"]
    _assert_same_metrics(tmp_path / "one", tmp_path / "four", keys)


def test_collectives_of_the_compiled_programs(tmp_path):
    """One all-reduce per optimizer step carries the gradients; a member sweep has none."""
    out = tmp_path / "scale.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")])}
    env["XLA_FLAGS"] = FOUR_DEVICES  # the script adds the device count again: the same value
    script = os.path.join(ROOT, "benchmarks", "scale.py")
    proc = subprocess.run(
        [sys.executable, script, "--quick", "--json", str(out)],
        env=env,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["devices"] == 4
    updates = {u["agent"]: u for u in result["updates"]}
    # SAC trains three networks (critic, then actor and temperature, which XLA combines into
    # one all-reduce); IQL three (value, then critic and actor). Each all-reduce carries one
    # step's gradients plus a few scalars (losses), and every byte of gradient goes once.
    for name, steps in (("sac", 3), ("iql", 3)):
        u = updates[name]
        assert 1 <= len(u["all_reduce_bytes"]) <= steps, u
        extra = sum(u["all_reduce_bytes"]) - u["trained_bytes"]
        assert 0 <= extra <= 256, u
        assert not u["other"], u
    ppo, members, sac = result["iterations"]
    # One seed on 4 devices: its env copies and replay-buffer rows are split over them.
    assert sac["mesh"] == {"members": 1, "data": 4}
    assert sac["buffer_spec"] == sac["env_spec"] == "P('members', 'data')", sac
    assert ppo["agent"] == "ppo" and ppo["normalizer"] and ppo["mesh"]["data"] == 4
    big = [b for b in ppo["collectives"]["all-reduce"] if b > 1024]
    small = [b for b in ppo["collectives"]["all-reduce"] if b <= 1024]
    # One gradient all-reduce per minibatch step: the policy's and the value's together.
    assert len(big) == 1 and 0 <= big[0] - ppo["trained_bytes"] <= 256, ppo
    # The normalizer's statistics (count, mean, variance of the observations over all envs)
    # and the losses' scalars are the small ones.
    assert any(b == 3 * 4 for b in small), ppo
    assert members["members"] == 4 and members["mesh"] == {"members": 4, "data": 1}
    assert members["collectives"] == {}, members


def test_data_parallel_refusals(tmp_path, capsys):
    # PETS refits on the whole buffer: the registry keeps one run on one device.
    assert get("pets").data_parallel is False and get("sac").data_parallel is True
    with pytest.raises(ConfigError, match=r"pets cannot split one run over 2 devices.*--num-seeds"):
        get("pets").check_data_parallel(2)
    get("pets").check_data_parallel(1)
    # This process sees one device: asking for more names XLA_FLAGS.
    with pytest.raises(SystemExit) as err:
        main(["train", "sac", "--env", "jax:pendulum", "--devices", "2", "--total-steps", "64"]
             + ["--out", str(tmp_path / "x"), *QUIET])  # fmt: skip
    assert err.value.code == 2
    assert "xla_force_host_platform_device_count" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["train", "sac", "--env", "jax:pendulum", "--devices", "two"])
    assert "--devices 'two'" in capsys.readouterr().err


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def _launch_two(args: list[str]) -> list[subprocess.Popen]:
    """Start processes 0 and 1 of one run, 2 CPU devices each, joined by jax.distributed."""
    env = {**os.environ, "XLA_FLAGS": FOUR_DEVICES.replace("count=4", "count=2")}
    env["PYTHONPATH"] = os.pathsep.join([ROOT, env.get("PYTHONPATH", "")])
    port = _free_port()
    join = ["--devices", "all", "--coordinator", f"localhost:{port}", "--num-processes", "2"]
    return [
        subprocess.Popen(
            [sys.executable, "-m", "jaxrl.cli", *args, *join, "--process-id", str(i)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in (0, 1)
    ]


def _finish(procs: list[subprocess.Popen]) -> list[str]:
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=900)
        assert p.returncode == 0, err[-3000:]
        outs.append(out)
    return outs


@pytest.mark.slow
def test_two_processes_train_one_run_and_resume_after_both_are_killed(tmp_path):
    # Two processes of 2 devices each form one 4-device mesh: one seed's 16 envs, buffer rows
    # and minibatches split over both. Killed (SIGKILL, both) after a checkpoint, rerun, the
    # run goes on from it and ends where one process on one device ends. Short: the collectives
    # between CPU processes go over TCP, so a step here costs about 20x one process's step.
    import signal
    import time

    out = tmp_path / "two"
    sac = ["train", "sac", "--env", "jax:pendulum", *SMALL_SAC, "--log-every", "160"]
    sac += ["--eval-every", "320", "--eval-episodes", "2", "--checkpoint-every", "160"]
    sac += ["--total-steps", "320"]
    procs = _launch_two([*sac, "--out", str(out)])
    deadline = time.time() + 600
    while not (out / "checkpoints" / "160").is_dir() and time.time() < deadline:
        if any(p.poll() is not None for p in procs):
            break
        time.sleep(0.5)
    for p in procs:
        p.send_signal(signal.SIGKILL)
        p.communicate()
    assert (out / "checkpoints" / "160").is_dir(), "no checkpoint before the kill"
    assert not (out / "summary.json").exists()
    stdout = _finish(_launch_two([*sac, "--out", str(out)]))
    assert all("Resuming" in s for s in stdout), stdout
    # Every device of both processes holds the same agent at the end.
    checks = [
        line.split()[-1] for s in stdout for line in s.splitlines() if "holds the agent" in line
    ]
    assert len(checks) == 2 and checks[0] == checks[1], stdout
    # The run in this process, on its one device (the 4-device program matches the 1-device one
    # up to float sums: test_sac_data_parallel_matches_one_device_and_reshards_on_resume).
    main([*sac, "--out", str(tmp_path / "one"), "--devices", "1"])
    keys = ["critic/loss", "actor/loss", "temp/alpha", "critic/q_mean"]
    _assert_same_metrics(tmp_path / "one", out, keys, rtol=1e-3)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["completed"] and summary["total_steps"] == 320


def test_only_process_0_writes_the_run_directory(tmp_path, monkeypatch):
    # As process 1 of a run: the loop trains and checkpoints, but writes no metrics,
    # summary, plot or config (process 0 does).
    import jaxrl.loops.config as loop_config
    import jaxrl.loops.harness as harness

    monkeypatch.setattr(harness, "primary", lambda: False)
    monkeypatch.setattr(loop_config, "primary", lambda: False)
    out = tmp_path / "p1"
    main(["train", "sac", "--env", "jax:pendulum", "--num-envs", "4", "--total-steps", "256",
          "--eval-every", "256", "--eval-episodes", "2", "--log-every", "128", *TINY_SAC,
          "--learning-starts", "128", "--no-progress", "--out", str(out)])  # fmt: skip
    assert sorted(os.listdir(out)) == ["checkpoints"]
    monkeypatch.undo()
    main(["train", "sac", "--env", "jax:pendulum", "--num-envs", "4", "--total-steps", "256",
          "--eval-every", "256", "--eval-episodes", "2", "--log-every", "128", *TINY_SAC,
          "--learning-starts", "128", "--no-progress", "--out", str(tmp_path / "p0")])  # fmt: skip
    written = set(os.listdir(tmp_path / "p0"))
    assert {"metrics.csv", "summary.json", "config.json", "learning_curve.png"} <= written
