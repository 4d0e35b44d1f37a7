"""Runs that end by raising leave nothing open: no env, no thread, no progress bar, no wandb run.

Optuna's in-process trials end by raising (``TrialPruned`` from the evaluation hook, or
``Diverged``), and any run can fail half-way. Each test records the Gymnasium envs the run
layer builds, the threads alive before, and a stand-in ``wandb`` module; afterwards every env
must be closed, every new thread (tensorboardX's event writer, tqdm's monitor) gone and every
wandb run finished once. Every run is a tiny SAC / BC run on Pendulum-v1 with TensorBoard, the
progress bar and wandb on.
"""

import io
import sys
import threading
import time
import types

import jax
import optuna
import pytest
from jax.experimental.compilation_cache import compilation_cache
from tqdm import tqdm

from jaxrl.cli import parse_train_args
from jaxrl.data import save_d4rl
from jaxrl.envs import gym as host_envs
from jaxrl.loops import Harness, TrainConfig
from jaxrl.run import train
from jaxrl.run.collect import rollout
from jaxrl.tune import Sweep, optuna_sweep, parse_search

ARGS = (
    "--env Pendulum-v1 --num-envs 1 --hidden-dims 16 16 --total-steps 200 --learning-starts 50 "
    "--eval-every 100 --eval-episodes 1 --batch-size 16 --buffer-size 500 --wandb-project p"
).split()


class _FakeRun:
    def __init__(self) -> None:
        self.finished = 0

    def log(self, *args, **kwargs) -> None:
        pass

    def finish(self, *args, **kwargs) -> None:
        self.finished += 1


class Leaks:
    """The envs and wandb runs made since the fixture started, and the threads before it."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        # tqdm's monitor thread is one per process, started by the first bar and kept after.
        tqdm(total=1, file=io.StringIO()).close()
        self.threads = set(threading.enumerate())
        self.envs: list[host_envs.HostEnv] = []
        self.runs: list[_FakeRun] = []
        init = host_envs.HostEnv.__init__

        def record(env, *args, **kwargs):
            init(env, *args, **kwargs)
            self.envs.append(env)

        monkeypatch.setattr(host_envs.HostEnv, "__init__", record)
        wandb = types.ModuleType("wandb")
        wandb.init = lambda **kwargs: self.runs.append(_FakeRun()) or self.runs[-1]
        monkeypatch.setitem(sys.modules, "wandb", wandb)

    def check(self) -> None:
        """Every env closed, every wandb run finished once, no new thread alive."""
        assert self.envs and self.runs, "no env or no wandb run was made"
        problems = []
        if open_envs := [e.env_id for e in self.envs if not e.vec.closed]:
            problems.append(f"envs left open: {open_envs}")
        if any(r.finished != 1 for r in self.runs):
            problems.append(f"wandb runs finished {[r.finished for r in self.runs]} times")
        deadline = time.monotonic() + 2.0
        while (new := set(threading.enumerate()) - self.threads) and time.monotonic() < deadline:
            for t in new:
                t.join(timeout=0.1)
        if new:
            problems.append(f"threads left alive: {sorted(t.name for t in new)}")
        assert not problems, "; ".join(problems)


@pytest.fixture(scope="module", autouse=True)
def compile_cache(tmp_path_factory):
    """A persistent compilation cache: each trial compiles the same programs (test_tuning.py)."""
    options = {
        "jax_compilation_cache_dir": str(tmp_path_factory.mktemp("jax-cache")),
        "jax_persistent_cache_min_compile_time_secs": 0,
        "jax_persistent_cache_min_entry_size_bytes": 0,
    }
    old = {name: getattr(jax.config, name) for name in options}
    for name, value in options.items():
        jax.config.update(name, value)
    compilation_cache.reset_cache()
    yield
    for name, value in old.items():
        jax.config.update(name, value)
    compilation_cache.reset_cache()


@pytest.fixture
def leaks(monkeypatch):
    return Leaks(monkeypatch)


def test_pruned_optuna_trials_leak_nothing(tmp_path, leaks, monkeypatch):
    # Every trial is pruned at its first evaluation (step 100 of 200).
    monkeypatch.setattr(optuna.trial.Trial, "should_prune", lambda self: True)
    train_cfg, agent_cfg = parse_train_args("sac", ARGS)
    search = parse_search(["actor_lr=loguniform:1e-4:1e-3"], type(agent_cfg))
    job = Sweep.of("sac", train_cfg, agent_cfg, search, trials=3, out_root=str(tmp_path))
    summary = optuna_sweep(job, n_startup_trials=0)
    assert summary["trials"] == {"PRUNED": 3}
    assert len(leaks.envs) == 6 and len(leaks.runs) == 3  # train and eval envs per trial
    leaks.check()


class Boom(RuntimeError):
    pass


def _fail_at_step(monkeypatch, n: int) -> None:
    """Make the ``n``-th ``HostEnv.step`` of the run raise (a simulator failing mid-run)."""
    step, calls = host_envs.HostEnv.step, [0]

    def failing(env, *args, **kwargs):
        calls[0] += 1
        if calls[0] == n:
            raise Boom(f"env step {n}")
        return step(env, *args, **kwargs)

    monkeypatch.setattr(host_envs.HostEnv, "step", failing)


def test_host_run_failing_mid_run_leaks_nothing(tmp_path, leaks, monkeypatch):
    _fail_at_step(monkeypatch, 80)  # after the first updates, before the first evaluation
    train_cfg, agent_cfg = parse_train_args("sac", [*ARGS, "--out", str(tmp_path / "run")])
    with pytest.raises(Boom):
        train("sac", train_cfg, agent_cfg)
    assert len(leaks.envs) == 2
    leaks.check()


def test_offline_run_failing_in_its_evaluation_leaks_nothing(tmp_path, leaks, monkeypatch):
    data = str(tmp_path / "pendulum.hdf5")
    save_d4rl(rollout("Pendulum-v1", None, 300, seed=0), data)
    leaks.envs.clear()  # the collection's env (closed) is not part of the run
    for seeds in ("1", "2"):  # a single run, then two seeds as one vmapped program
        _fail_at_step(monkeypatch, 50)  # inside the first evaluation (200 steps per episode)
        args = ["--dataset", data, "--out", str(tmp_path / f"run{seeds}"), "--num-seeds", seeds]
        train_cfg, agent_cfg = parse_train_args("bc", [*ARGS, *args])
        with pytest.raises(Boom):
            train("bc", train_cfg, agent_cfg)
    assert len(leaks.envs) == 2
    leaks.check()


def test_harness_closes_once_on_finish_then_exit(tmp_path, leaks):
    cfg = TrainConfig(env="Pendulum-v1", total_steps=10, wandb_project="p")
    h = Harness("sac", cfg, [str(tmp_path / "run")])
    h.resume(None)
    with h:
        h.advance(10)
        h.log({"train/x": 1.0})
        h.finish()
    leaks.envs.append(types.SimpleNamespace(env_id="none", vec=types.SimpleNamespace(closed=True)))
    leaks.check()


def test_harness_closes_when_the_loop_raises(tmp_path, leaks):
    cfg = TrainConfig(env="Pendulum-v1", total_steps=10, wandb_project="p")
    h = Harness("sac", cfg, [str(tmp_path / "run")])
    h.resume(None)
    with pytest.raises(Boom), h:
        h.advance(5)
        h.log({"train/x": 1.0})
        raise Boom("in the loop")
    leaks.envs.append(types.SimpleNamespace(env_id="none", vec=types.SimpleNamespace(closed=True)))
    leaks.check()
