"""The loop harness: one cadence for every loop, the device-side non-finite count, registry
dispatch without capability probing, and the offline script's agents."""

from __future__ import annotations

import os
import re
import runpy

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import struct

from jaxrl import registry
from jaxrl.loops import NONFINITE, Cadence, TrainConfig, nonfinite
from jaxrl.loops.cadence import Points

ROOT = os.path.join(os.path.dirname(__file__), "..")


def test_cadence_points_are_crossed_multiples_and_the_end():
    c = Cadence(log_every=10, eval_every=30, checkpoint_every=20, total_steps=60)
    assert c.at(0, 10) == Points(log=True, eval=False, save=False)
    assert c.at(10, 20) == Points(log=True, eval=False, save=True)
    assert c.at(20, 30) == Points(log=True, eval=True, save=False)  # every eval is logged
    assert c.at(30, 35) == Points(log=False, eval=False, save=False)
    assert c.at(8, 12) == Points(log=True, eval=False, save=False)  # 4 envs: 10 crossed
    assert c.at(56, 60) == Points(log=True, eval=True, save=True)  # the end
    assert c.at(58, 62) == Points(log=True, eval=True, save=True)  # past the end


def test_cadence_chunks_end_at_the_next_point():
    c = Cadence(log_every=20, eval_every=30, checkpoint_every=30, total_steps=60)
    step, chunks = 0, []
    while step < 60:
        chunks.append(c.chunk(step))
        step += chunks[-1]
    assert chunks == [20, 10, 10, 20]  # points at 20, 30, 40, 60
    # Iterations of several steps: whole iterations within the shortest period (one chunk
    # length when they do not divide it), cut at a point an iteration boundary falls on.
    step, ends = 0, []
    while step < 60:
        step += 8 * c.chunk(step, unit=8)
        ends.append(step)
    assert ends == [16, 32, 40, 56, 64]  # 40: the log point falls on an iteration boundary
    assert [c.chunk(s, unit=10) for s in (0, 20, 30, 40)] == [2, 1, 1, 2]
    assert c.chunk(0, unit=100) == 1
    assert Cadence.of(TrainConfig(eval_every=50, log_every=5)).checkpoint_every == 50


def test_nonfinite_checks_the_small_float_arrays_of_an_agent():
    ok = {"w": jnp.ones((128, 128)), "b": jnp.zeros(128), "step": jnp.int32(3)}
    assert not bool(nonfinite(ok))
    assert bool(nonfinite({**ok, "b": ok["b"].at[5].set(jnp.nan)}))
    assert bool(jax.jit(nonfinite)({**ok, "t": jnp.float32(jnp.nan)}))
    # Inf is the "off" value of sweepable thresholds: a default PPO agent is not flagged.
    assert not bool(nonfinite({**ok, "max_grad_norm": jnp.float32(jnp.inf)}))
    ppo = registry.get("ppo")
    agent = ppo.agent.create(ppo.config(), jnp.zeros(3), jnp.zeros(1), 0)
    assert not bool(nonfinite(agent))
    # Arrays above SMALL_ARRAY elements are not read (their biases show a divergence).
    assert not bool(nonfinite({**ok, "w": ok["w"].at[0, 0].set(jnp.nan)}))
    assert not bool(nonfinite({"key": jax.random.key(0)}))


@struct.dataclass
class _DivergeConfig:
    batch_size: int = 4


class _Diverging(struct.PyTreeNode):
    """Its parameter and loss turn NaN at its 6th update; acts with zeros."""

    updates: jax.Array
    param: jax.Array
    config: _DivergeConfig = struct.field(pytree_node=False)

    def update(self, batch):
        loss = jnp.where(self.updates >= 5, jnp.nan, jnp.mean(batch.reward))
        info = {"critic/loss": loss, "actor/loss": jnp.float32(jnp.nan)}  # a skipped sub-step
        return self.replace(updates=self.updates + 1, param=self.param * loss), info

    def eval_actions(self, obs):
        return jnp.zeros((obs.shape[0], 1))


def test_offline_loop_records_the_nonfinite_count_at_log_points(tmp_path, capsys):
    from jaxrl.buffers import buffer_from_arrays
    from jaxrl.envs import make_env
    from jaxrl.loops import prepare_run_dir, train_offline
    from jaxrl.loops.logging import read_metrics
    from jaxrl.types import Transition

    n = 32
    data = buffer_from_arrays(
        Transition(
            np.zeros((n, 3), np.float32),
            np.zeros((n, 1), np.float32),
            np.ones(n, np.float32),
            np.zeros((n, 3), np.float32),
            np.zeros(n, np.float32),
        )
    )
    spec = registry.AgentSpec("diverging", _Diverging, _DivergeConfig, "offline")
    out = str(tmp_path / "run")
    cfg = TrainConfig(
        env="Pendulum-v1", total_steps=10, log_every=5, eval_every=10, eval_episodes=1,
        progress=False, tensorboard=False, on_nonfinite="warn",
    )  # fmt: skip
    prepare_run_dir(out, {"agent": "diverging"})
    eval_env = make_env("Pendulum-v1", 1)
    agent = _Diverging(jnp.int32(0), jnp.ones(3), _DivergeConfig())
    summary = train_offline(spec, agent, data, eval_env, cfg, out)
    eval_env.close()
    rows = read_metrics(os.path.join(out, "metrics.csv"))
    assert [r["step"] for r in rows] == [5, 10]
    assert [r[NONFINITE] for r in rows] == [0, 5]
    assert rows[0]["critic/loss"] == 1.0 and np.isnan(rows[1]["critic/loss"])  # NaN is written
    assert summary["completed"]  # 'warn' goes on ('stop', the default: tests/test_nan_guard.py)
    warning = "5 updates left NaN in the agent by step 10 (non-finite metrics: actor/loss, "
    assert warning in capsys.readouterr().out


def test_loops_and_cli_do_not_probe_agents():
    # The command line and what it dispatches to (run/train.py: `jaxrl train`'s run setup).
    cli = os.path.join(ROOT, "jaxrl", "cli")
    paths = [os.path.join(cli, f) for f in sorted(os.listdir(cli)) if f.endswith(".py")]
    paths += [os.path.join(ROOT, "jaxrl", "run", f) for f in ("train.py", "commands.py")]
    loops = os.path.join(ROOT, "jaxrl", "loops")
    # checkpoint.py reads orbax's metadata objects (and never sees an agent's methods)
    paths += [
        os.path.join(loops, f)
        for f in sorted(os.listdir(loops))
        if f.endswith(".py") and f != "checkpoint.py"
    ]
    for path in paths:
        with open(path) as f:
            source = f.read()
        assert not re.search(r"\b(getattr|hasattr)\(", source), path
        assert "AGENTS" not in source, path
        for name in registry.names():
            assert f'== "{name}"' not in source and f"== '{name}'" not in source, (path, name)


# Agents added as one file plus one registry line and nothing else: no loop, command, run-setup,
# tuner, exporter or script file may name them (any case, as a word).
ONE_FILE_AGENTS = ("prdc", "a2pr", "famo2o", "reinflow", "expo")


def test_one_file_agents_are_named_only_by_their_file_and_the_registry():
    places = [os.path.join(ROOT, "jaxrl", d) for d in ("loops", "run", "cli", "tune", "export")]
    places.append(os.path.join(ROOT, "scripts"))
    pattern = re.compile(r"\b(" + "|".join(ONE_FILE_AGENTS) + r")\b", re.IGNORECASE)
    checked = 0
    for place in places:
        for folder, _, files in os.walk(place):
            for f in files:
                if f.endswith(".py"):
                    with open(os.path.join(folder, f)) as fh:
                        found = pattern.findall(fh.read())
                    assert not found, (os.path.join(folder, f), found)
                    checked += 1
    assert checked > 30  # the walk saw the package
    for name in ONE_FILE_AGENTS:
        assert name in registry.names()  # they are registered, so the check matters


@pytest.mark.parametrize("name", registry.names("offline"))
def test_train_offline_script_takes_every_offline_agent(name, capsys):
    script = runpy.run_path(os.path.join(ROOT, "scripts", "train_offline.py"))
    with pytest.raises(SystemExit) as err:
        script["main"](["--agent", name, "--help"])
    assert err.value.code == 0
    assert "--dataset" in capsys.readouterr().out


TRACES: list[int] = []


class _Constant(struct.PyTreeNode):
    """Acts with its parameter; counts how often its policy is traced."""

    param: jax.Array

    def eval_actions(self, obs):
        TRACES.append(1)
        return jnp.broadcast_to(self.param, (obs.shape[0], 1))


def test_host_evaluation_compiles_the_policy_once():
    from jaxrl.envs import make_env
    from jaxrl.loops.evaluation import evaluate

    env = make_env("Pendulum-v1", 2)
    TRACES.clear()
    first = evaluate(_Constant(jnp.float32(0.5)), env, seed=0)
    again = evaluate(_Constant(jnp.float32(0.5)), env, seed=0)
    other = evaluate(_Constant(jnp.float32(-0.5)), env, seed=0)
    env.close()
    # 200 steps per episode, three evaluations, new parameter values: one trace.
    assert len(TRACES) == 1
    np.testing.assert_array_equal(first, again)
    assert not np.allclose(first, other)


COMPILED: list[str] = []


def _record_compile(event: str, secs: float, **kw) -> None:
    if event == "/jax/core/compile/backend_compile_duration":
        COMPILED.append(kw.get("fun_name", "?"))


jax.monitoring.register_event_duration_secs_listener(_record_compile)


def test_offline_to_online_and_evaluation_do_not_compile_per_step(tmp_path, capsys):
    # After a first run has filled the module-level caches, a second run of the same length and
    # a third with twice the online steps and evaluations must compile the same programs: a
    # recompile per env step or per evaluation would make the third compile more.
    from jaxrl.cli import main

    data = str(tmp_path / "random.hdf5")
    main(["dataset", "collect", "--env", "Pendulum-v1", "--kind", "random", "--steps", "600",
          "--seed", "0", "--ref-max-return", "-150", "--out", data])  # fmt: skip
    counts = []
    for i, online in enumerate((150, 150, 300)):
        COMPILED.clear()
        main(["train", "iql", "--dataset", data, "--offline-steps", "50", "--online-steps",
              str(online), "--eval-every", "75", "--log-every", "75", "--eval-episodes", "2",
              "--hidden-dims", "16", "16", "--learning-starts", "20",
              "--out", str(tmp_path / f"run{i}"),
              "--no-progress", "--no-tensorboard"])  # fmt: skip
        counts.append(list(COMPILED))
    capsys.readouterr()
    assert counts[1], "the listener saw no compilation: the comparison would prove nothing"
    assert sorted(counts[2]) == sorted(counts[1])
    # One program per role: the offline chunk, the online update, the policy; the evaluation
    # once per phase (the online agent's config differs: its schedule restarts).
    want = {"_offline_chunk": 1, "_act": 1, "_learn": 1}
    want["eval_act"] = 2
    for name in counts[2]:
        assert name[4:-1] in want, counts[2]
    assert all(counts[2].count(f"jit({name})") <= n for name, n in want.items()), counts[2]


def test_resumed_settings_replace_config_json_only_after_the_restore(tmp_path):
    """A longer budget is written beside config.json and committed by a resume that works."""
    import json

    from jaxrl.loops import prepare_run_dir
    from jaxrl.loops.checkpoint import Checkpointer
    from jaxrl.loops.harness import Harness

    def recorded(out: str) -> int:
        with open(os.path.join(out, "config.json")) as f:
            return json.load(f)["train"]["total_steps"]

    state = {"x": jnp.zeros(2)}
    ok, bad = str(tmp_path / "ok"), str(tmp_path / "bad")
    for out in (ok, bad):
        prepare_run_dir(out, {"agent": "sac", "train": {"total_steps": 100}})
        prepare_run_dir(out, {"agent": "sac", "train": {"total_steps": 200}})
        assert recorded(out) == 100 and os.path.exists(os.path.join(out, "config.pending.json"))
    # A checkpoint of another phase: this online run refuses to resume over it.
    Checkpointer(os.path.join(bad, "checkpoints")).save(10, state, {"step": 10, "phase": "offline"})
    cfg = TrainConfig(total_steps=200, progress=False, tensorboard=False)
    Harness("sac", cfg, [ok]).resume(state)
    assert recorded(ok) == 200 and not os.path.exists(os.path.join(ok, "config.pending.json"))
    with pytest.raises(ValueError, match="offline phase"):
        Harness("sac", cfg, [bad]).resume(state)
    assert recorded(bad) == 100 and not os.path.exists(os.path.join(bad, "config.pending.json"))


def test_summary_wall_clock_counts_every_segment_of_a_resumed_run(tmp_path):
    """``wall_clock_s`` adds the segments before a resume (carried in the checkpoint meta)."""
    import json

    from flax import struct

    from jaxrl.loops import prepare_run_dir
    from jaxrl.loops.harness import Harness

    @struct.dataclass
    class State:
        x: jax.Array
        nonfinite: jax.Array

    out, state = str(tmp_path / "run"), State(jnp.zeros(2), jnp.zeros((), jnp.int32))
    prepare_run_dir(out, {"agent": "sac", "train": {"total_steps": 20}})
    cfg = TrainConfig(total_steps=20, progress=False, tensorboard=False)
    first = Harness("sac", cfg, [out])
    first.resume(state)
    with first:
        first.advance(10)
        first.wall_before = 1000.0  # as if the first segment had taken 1000 s
        first.save(state)
    second = Harness("sac", cfg, [out])
    second.resume(state)
    assert second.step == 10 and 1000.0 <= second.wall_before < 1100.0
    with second:
        second.advance(10)
    (summary,) = second.finish()
    with open(os.path.join(out, "summary.json")) as f:
        assert json.load(f)["wall_clock_s"] == summary["wall_clock_s"]
    assert 1000.0 <= summary["wall_clock_s"] < 1100.0 and summary["completed"]
    # A checkpoint written before the wall clock was carried: the total is unknown, not wrong.
    second.ckpts[0].save(20, state, {"step": 20, "phase": "online"})
    third = Harness("sac", cfg, [out])
    third.resume(state)
    assert third.wall_before is None and third.wall_clock() is None


def _other_process_claims(out: str, hold: bool):
    """A second Python process claiming ``out``: held until killed, or just tried (exit 0/1)."""
    import subprocess
    import sys

    code = (
        "import sys, time\nfrom jaxrl.loops.config import claim_run_dir\n"
        "try:\n    claim_run_dir(sys.argv[1])\nexcept Exception as e:\n    print(e); sys.exit(1)\n"
        "print('claimed', flush=True)\n" + ("time.sleep(600)\n" if hold else "")
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code, out], stdout=subprocess.PIPE, text=True, cwd=ROOT
    )
    if hold:
        assert proc.stdout.readline().strip() == "claimed"
    return proc


def test_a_run_directory_trains_in_one_process_at_a_time(tmp_path, capsys):
    """A second trainer on a run directory is refused, changing nothing; the lock goes with
    the process that held it (killed, it leaves nothing to clean up) and with a run's end."""
    from jaxrl.cli import main
    from jaxrl.loops.config import run_dir_in_use

    out = str(tmp_path / "run")
    argv = ["train", "sac", "--env", "jax:pendulum", "--num-envs", "2", "--total-steps", "64"]
    argv += ["--learning-starts", "32", "--batch-size", "8", "--hidden-dims", "8", "8"]
    argv += ["--eval-every", "64", "--eval-episodes", "1", "--no-progress", "--out", out]
    os.makedirs(out)
    assert not run_dir_in_use(out)  # never trained: no lock file
    holder = _other_process_claims(out, hold=True)
    try:
        assert run_dir_in_use(out)
        with pytest.raises(SystemExit) as err:
            main(argv)
        assert err.value.code == 2
        assert "being trained by another process" in capsys.readouterr().err
        assert sorted(os.listdir(out)) == [".lock"]  # no config.json, no checkpoint
    finally:
        holder.kill()
        holder.wait()
    assert not run_dir_in_use(out)
    main(argv)  # the holder died: its lock went with it
    assert os.path.exists(os.path.join(out, "summary.json"))
    # The finished run let go of the directory, though this process is still alive.
    assert _other_process_claims(out, hold=False).wait() == 0


def test_online_runs_on_a_d4rl_task_write_its_normalized_score(tmp_path, capsys):
    """The host loop scores Hopper-v5 with D4RL's hopper references; Brax's hopper gets none."""
    import csv
    import json

    from jaxrl.cli import main
    from jaxrl.loops.harness import Harness

    run = str(tmp_path / "run")
    main(["train", "sac", "--env", "Hopper-v5", "--total-steps", "60", "--learning-starts", "30",
          "--hidden-dims", "16", "16", "--batch-size", "16", "--eval-every", "30",
          "--eval-episodes", "1", "--no-progress", "--no-tensorboard", "--out", run])  # fmt: skip
    capsys.readouterr()
    summary = json.load(open(os.path.join(run, "summary.json")))
    rows = [r for r in csv.DictReader(open(os.path.join(run, "metrics.csv"))) if r["eval_return"]]
    lo, hi = -20.272305, 3234.3
    ret = summary["final_eval_return_mean"]
    assert summary["normalized_score"] == pytest.approx(100 * (ret - lo) / (hi - lo))
    assert len(rows) == 2 and all(r["eval_normalized_score"] for r in rows)
    assert float(rows[-1]["eval_normalized_score"]) == pytest.approx(summary["normalized_score"])
    brax = Harness("ppo", TrainConfig(env="brax:hopper", progress=False), [str(tmp_path / "b")])
    assert brax.score_fn(1000.0) is None
