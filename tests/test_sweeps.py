"""``jaxrl sweep``: members of a vmapped grid x seeds equal their single runs, one compilation
per chunk shape, the leaf/static classification, and clear errors for bad grids."""

from __future__ import annotations

import csv
import dataclasses
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import struct

from jaxrl import registry
from jaxrl.cli import main, parse_train_args
from jaxrl.config import ConfigError
from jaxrl.data import Dataset, save_d4rl
from jaxrl.loops import fused
from jaxrl.tune.grid import classify, parse_grid, plan

TINY_JAX = [
    "--env", "jax:pendulum", "--num-envs", "2", "--hidden-dims", "32", "32",
    "--total-steps", "200", "--learning-starts", "100", "--eval-every", "100",
    "--log-every", "100", "--eval-episodes", "2", "--batch-size", "32", "--buffer-size", "1000",
    "--no-progress", "--no-tensorboard",
]  # fmt: skip


def _rows(run_dir: str) -> list[dict[str, float]]:
    with open(os.path.join(run_dir, "metrics.csv")) as f:
        return [{k: float(v) for k, v in r.items() if v != ""} for r in csv.DictReader(f)]


def _assert_same_run(member: str, single: str) -> None:
    a, b = _rows(member), _rows(single)
    assert [r["step"] for r in a] == [r["step"] for r in b]
    for ra, rb in zip(a, b, strict=True):
        for key in ("eval_return", "critic/loss", "actor/loss"):
            if key in rb:
                assert ra[key] == pytest.approx(rb[key], rel=1e-3, abs=1e-3), (key, ra["step"])


def _count_chunk_traces(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Each trace of the fused loop's chunk is one compilation (``jax.jit`` traces to compile)."""
    count = [0]
    chunk = fused._chunk

    def counting(*args, **kwargs):
        count[0] += 1
        return chunk(*args, **kwargs)

    monkeypatch.setattr(fused, "_chunk", counting)
    return count


def test_jax_env_sweep_members_equal_single_runs_and_compile_once(tmp_path, monkeypatch, capsys):
    count = _count_chunk_traces(monkeypatch)
    root = str(tmp_path / "sweep")
    grid = ["--grid", "actor_lr=1e-3,3e-4", "--grid", "tau=0.005,0.02"]
    main(["sweep", "sac", *grid, "--seeds", "2", "--out", root, *TINY_JAX])
    assert "leaves vary inside a program: actor_lr, tau; one program" in capsys.readouterr().out
    sweep_traces = count[0]
    count[0] = 0
    single = str(tmp_path / "single")
    main(["train", "sac", "--actor-lr", "3e-4", "--tau", "0.02", "--seed", "1", "--out", single,
          *TINY_JAX])  # fmt: skip
    # 8 members, yet the chunk compiled as often as for the one-member run (once per length).
    assert 1 <= sweep_traces == count[0]
    _assert_same_run(os.path.join(root, "actor_lr=0.0003,tau=0.02", "s1"), single)
    with open(os.path.join(root, "sweep.json")) as f:
        table = json.load(f)["settings"]
    assert len(table) == 4 and all(len(r["returns"]) == 2 for r in table)
    assert all(np.isfinite(r["mean"]) for r in table)
    # Each member is a complete run: its config.json holds its own setting and seed.
    with open(os.path.join(root, "actor_lr=0.0003,tau=0.02", "s1", "config.json")) as f:
        config = json.load(f)
    assert config["seed"] == 1 and config["agent_config"]["actor_lr"] == 3e-4
    assert config["agent_config"]["tau"] == 0.02


def _tiny_dataset(path) -> str:
    rng = np.random.default_rng(0)
    n = 400
    obs = rng.normal(size=(n, 3)).astype(np.float32)
    ends = np.zeros(n)
    ends[199::200] = 1
    ds = Dataset(obs, rng.uniform(-2, 2, (n, 1)), rng.normal(size=n), obs + 0.1, np.zeros(n), ends,
                 env_id="Pendulum-v1")  # fmt: skip
    return save_d4rl(ds, path)


def test_offline_sweep_members_equal_single_runs(tmp_path, capsys):
    data = _tiny_dataset(tmp_path / "p.hdf5")
    tiny = ["--dataset", data, "--total-steps", "40", "--eval-every", "20", "--log-every", "20",
            "--eval-episodes", "1", "--hidden-dims", "16", "16", "--batch-size", "32",
            "--no-progress", "--no-tensorboard"]  # fmt: skip
    root = str(tmp_path / "sweep")
    main(["sweep", "td3-bc", "--grid", "alpha=2.5,1.0", "--seeds", "2", "--out", root, *tiny])
    assert "leaves vary inside a program: alpha; one program" in capsys.readouterr().out
    single = str(tmp_path / "single")
    main(["train", "td3-bc", "--alpha", "1.0", "--seed", "1", "--out", single, *tiny])
    _assert_same_run(os.path.join(root, "alpha=1.0", "s1"), single)
    a, b = (_rows(os.path.join(root, f"alpha={x}", "s0"))[-1] for x in ("2.5", "1.0"))
    assert a["actor/loss"] != b["actor/loss"]  # the swept weight reached its member
    # `jaxrl train --num-seeds` on a dataset: the same member axis, seeds only.
    seeds = str(tmp_path / "seeds")
    main(["train", "td3-bc", "--alpha", "1.0", "--num-seeds", "2", "--out", seeds, *tiny])
    _assert_same_run(os.path.join(seeds, "s1"), single)
    with open(os.path.join(seeds, "summary.json")) as f:
        assert json.load(f)["seeds"] == [0, 1]


def test_prdc_sweeps_beta_inside_one_program():
    # `jaxrl sweep` runs the values of leaf fields as members of one program (the offline sweep
    # test above runs such a program end to end for TD3+BC); sizes and flags split programs.
    # PRDC's beta is read inside the nearest-row search; A2PR's and FamO2O's coefficients are
    # hparams leaves like TD3+BC's alpha.
    spec = registry.get("prdc")
    base = spec.config(hidden_dims=(16, 16))
    obs, act = np.zeros(3, np.float32), np.zeros(1, np.float32)
    grid = parse_grid(["beta=1,2", "chunk_size=64,128"], spec.config)
    kinds = classify(spec, base, grid, obs, act)
    assert kinds == {"beta": "leaf", "chunk_size": "static"}
    assert len(plan(spec, base, grid, kinds, [0, 1], "/tmp/x")) == 2  # one per chunk size


def test_classification_of_fields():
    spec = registry.get("sac")
    base = spec.config(hidden_dims=(16, 16))
    obs, act = np.zeros(3, np.float32), np.zeros(1, np.float32)
    grid = parse_grid(
        ["actor_lr=1e-4,1e-3", "tau=0.005,0.01", "discount=0.98,0.99", "init_temperature=0.1,1",
         "hidden_dims=16:16,32:32", "batch_size=64,128", "num_min_qs=1,2", "utd_ratio=1,2",
         "policy_q=min,mean"],
        spec.config,
    )  # fmt: skip
    kinds = classify(spec, base, grid, obs, act)
    leaves = {"actor_lr", "tau", "discount", "init_temperature"}
    assert {k for k, v in kinds.items() if v == "leaf"} == leaves
    assert grid["hidden_dims"] == ((16, 16), (32, 32)) and grid["init_temperature"] == (0.1, 1.0)
    programs = plan(spec, base, grid, kinds, [0, 1], "/tmp/x")
    assert len(programs) == 2 * 2 * 2 * 2 * 2  # one per combination of the static fields
    assert all(len(p.members) == 2**4 * 2 for p in programs)  # leaves x seeds inside each
    # Cal-QL's discount also sets the dataset's Monte-Carlo returns: static there.
    calql = registry.get("cal-ql")
    kinds = classify(calql, calql.config(hidden_dims=(16, 16)), {"discount": (0.98,)}, obs, act)
    assert kinds == {"discount": "static"}


@dataclasses.dataclass(frozen=True)
class _ToyConfig:
    scale: float = 1.0
    offset: float = 0.0
    batch_size: int = 4


class _Toy(struct.PyTreeNode):
    """Keeps ``scale`` and ``offset`` as leaves; ``update`` reads scale from the leaf or config."""

    w: jax.Array
    scale: jax.Array
    offset: jax.Array
    from_config: bool = struct.field(pytree_node=False)
    config: _ToyConfig = struct.field(pytree_node=False)

    @classmethod
    def create(cls, config, obs, act, seed, from_config=False):
        leaves = jnp.float32(config.scale), jnp.float32(config.offset)
        return cls(jnp.zeros(()), *leaves, from_config, config)

    def update(self, batch):
        scale = self.config.scale if self.from_config else self.scale
        return self.replace(w=self.w + scale * batch.reward.mean() + self.offset), {}


class _ToyReadsConfig(_Toy):
    @classmethod
    def create(cls, config, obs, act, seed, from_config=True):
        return _Toy.create.__func__(cls, config, obs, act, seed, from_config=True)


@pytest.mark.parametrize("agent, kind", [(_Toy, "leaf"), (_ToyReadsConfig, "static")])
def test_a_field_the_update_reads_from_the_config_is_static(agent, kind):
    # Its leaf changes with the value, but an update of a grafted member (the program's shared
    # config as static field) would use the shared value: one update of each must agree.
    spec = registry.AgentSpec("toy", agent, _ToyConfig, "off-policy")
    obs, act = np.zeros(3, np.float32), np.zeros(1, np.float32)
    assert classify(spec, _ToyConfig(), {"scale": (1.0, 2.0)}, obs, act) == {"scale": kind}
    # Several fields are checked together first, then one by one when the joint check differs.
    grid = {"scale": (1.0, 2.0), "offset": (0.0, 0.5)}
    assert classify(spec, _ToyConfig(), grid, obs, act) == {"scale": kind, "offset": "leaf"}


def test_bad_grids_get_clear_errors(tmp_path):
    spec = registry.get("sac")
    with pytest.raises(ConfigError, match="has no field 'actr_lr'.*actor_lr"):
        parse_grid(["actr_lr=1e-3"], spec.config)
    with pytest.raises(ConfigError, match="actor_lr= has no values"):
        parse_grid(["actor_lr="], spec.config)
    with pytest.raises(ConfigError, match="write FIELD=V1,V2"):
        parse_grid(["actor_lr"], spec.config)
    with pytest.raises(ConfigError, match="cannot read 'fast' as float"):
        parse_grid(["actor_lr=fast"], spec.config)
    with pytest.raises(ConfigError, match="given twice"):
        parse_grid(["tau=0.1", "tau=0.2"], spec.config)
    base = spec.config(hidden_dims=(16, 16))
    obs, act = np.zeros(3, np.float32), np.zeros(1, np.float32)
    grid = parse_grid(["hidden_dims=16:16,32:32", "tau=0.01,0.02"], spec.config)
    kinds = classify(spec, base, grid, obs, act)
    with pytest.raises(ConfigError, match="hidden_dims: static field.*drop --no-split"):
        plan(spec, base, grid, kinds, [0], str(tmp_path), split=False)
    with pytest.raises(ConfigError, match="tau=-1.0"):
        classify(spec, base, {"tau": (-1.0,)}, obs, act)
    with pytest.raises(SystemExit):  # through the command: a clear message, no traceback
        main(["sweep", "sac", "--env", "jax:pendulum", "--grid", "nope=1", "--out",
              str(tmp_path / "s")])  # fmt: skip


def test_train_takes_a_config_file_back(tmp_path):
    path = tmp_path / "best_config.json"
    path.write_text(json.dumps({"agent": "sac", "agent_config": {"actor_lr": 1e-4, "tau": 0.02}}))
    _, cfg = parse_train_args("sac", ["--config", str(path), "--tau", "0.03"])
    assert cfg.actor_lr == 1e-4 and cfg.tau == 0.03  # options after the file override it
    with pytest.raises(ValueError, match="settings of 'sac', not 'td3'"):
        parse_train_args("td3", ["--config", str(path)])
    path.write_text(json.dumps({"actr_lr": 1e-4}))
    with pytest.raises(ValueError, match="no field"):
        parse_train_args("sac", ["--config", str(path)])
