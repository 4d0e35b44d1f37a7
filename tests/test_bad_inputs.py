"""The bad-input corpus: every mistake a user can make gets one clear line.

Each case is one bad input — a file, a flag, a run directory — given to jaxrl the way a user
gives it: through the command line (``jaxrl.cli.main``), or through the public function a script
calls. A case states the exception jaxrl raises and message fragments that name the problem and
the fix. For the command line, the error is one ``error: ...`` line on stderr with exit code 2
(or tyro's boxed "Error parsing ..." for an option value), and never a traceback; for a function,
the exception is raised by jaxrl's own code, not by jax/XLA/h5py/minari internals. Cases on an
existing run directory also check that the failure changed none of its bytes.

Cases of this corpus that are covered elsewhere already are not repeated here; ``PRE_EXISTING``
lists those tests, and ``test_corpus_size`` counts both (the README quotes the total).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import traceback
from collections.abc import Callable
from typing import Any

import h5py
import jax.numpy as jnp
import numpy as np
import pytest

import jaxrl
from jaxrl import registry
from jaxrl.cli import main
from jaxrl.config import ConfigError
from jaxrl.data import Dataset, DatasetError, load_dataset, save_d4rl
from jaxrl.loops.checkpoint import Checkpointer

JAXRL_DIR = os.path.dirname(os.path.abspath(jaxrl.__file__))
QUIET = ["--no-progress", "--no-tensorboard", "--eval-episodes", "1"]
TINY_SAC = [
    "--env",
    "Pendulum-v1",
    "--total-steps",
    "40",
    "--learning-starts",
    "40",
    "--batch-size",
    "8",
    "--hidden-dims",
    "8",
    "8",
    "--eval-every",
    "40",
    *QUIET,
]
N = 60  # rows of the generated datasets


@dataclasses.dataclass
class Ctx:
    """What a case builds its input from: a scratch directory and the shared tiny runs."""

    tmp: str
    runs: dict[str, str]

    def path(self, name: str) -> str:
        return os.path.join(self.tmp, name)

    def copy_run(self, kind: str, name: str = "run") -> str:
        """A private copy of the tiny ``sac`` (online) or ``bc`` (offline) run."""
        from jaxrl.loops.logging import write_json

        dst = self.path(name)
        shutil.copytree(self.runs[kind], dst)
        # As if trained here: a resume records --out, which would otherwise differ.
        config = json.load(open(os.path.join(dst, "config.json")))
        config["train"]["out"] = dst
        write_json(os.path.join(dst, "config.json"), config)
        return dst


@dataclasses.dataclass(frozen=True)
class Case:
    """One bad input.

    Attributes:
        id: the pytest id.
        build: ``ctx -> argv`` (``via="cli"``) or ``ctx -> callable`` (``via="api"``).
        fragments: substrings the message must contain (problem and fix), in any order.
        error: the exception type (``via="api"``; the CLI turns it into exit code 2).
        via: "cli" (``jaxrl.cli.main``) or "api" (a public function).
        keeps: a directory, relative to the scratch directory, whose bytes must not change.
        absent: a path, relative to the scratch directory, that must not exist afterwards.
    """

    id: str
    build: Callable[[Ctx], Any]
    fragments: tuple[str, ...]
    error: type[BaseException] = ValueError
    via: str = "cli"
    keeps: str | None = None
    absent: str | None = None


# ------------------------------------------------------------------------------ dataset files


def _arrays(**over: Any) -> dict[str, Any]:
    rng = np.random.default_rng(0)
    arrays = {
        "observations": rng.normal(size=(N, 3)).astype(np.float32),
        "actions": rng.uniform(-1, 1, (N, 1)).astype(np.float32),
        "rewards": rng.normal(size=N).astype(np.float32),
        "terminals": np.zeros(N, bool),
        "timeouts": np.arange(N) % 20 == 19,
    }
    arrays.update(over)
    return {k: v for k, v in arrays.items() if v is not None}


def _h5(ctx: Ctx, name: str = "d.hdf5", env_id: str | None = "Pendulum-v1", **over: Any) -> str:
    """A D4RL-layout file written with plain h5py (so it can hold what jaxrl would not write)."""
    path = ctx.path(name)
    with h5py.File(path, "w") as f:
        for key, value in _arrays(**over).items():
            f[key] = value
        if env_id:
            f.create_group("metadata")["env_id"] = env_id.encode()
    return path


def _info(path: str) -> list[str]:
    return ["dataset", "info", path]


def _truncated(ctx: Ctx) -> list[str]:
    path = _h5(ctx)
    data = open(path, "rb").read()
    with open(path, "wb") as f:
        f.write(data[: len(data) // 2])
    return _info(path)


def _empty_file(ctx: Ctx) -> list[str]:
    open(ctx.path("empty.hdf5"), "wb").close()
    return _info(ctx.path("empty.hdf5"))


def _no_keys(ctx: Ctx) -> list[str]:
    h5py.File(ctx.path("none.hdf5"), "w").close()
    return _info(ctx.path("none.hdf5"))


def _minari_layout_file(ctx: Ctx) -> list[str]:
    path = ctx.path("episodes.hdf5")  # like Minari's main_data.hdf5: one group per episode
    with h5py.File(path, "w") as f:
        episode = f.create_group("episode_0")
        for key, value in _arrays().items():
            episode[key] = value
    return _info(path)


def _group_key(ctx: Ctx) -> list[str]:
    path = ctx.path("grp.hdf5")
    with h5py.File(path, "w") as f:
        for key, value in _arrays().items():
            if key == "observations":
                f.create_group(key)["0"] = value
            else:
                f[key] = value
    return _info(path)


def _nan_next_obs(ctx: Ctx) -> list[str]:
    nxt = np.roll(_arrays()["observations"], -1, 0)
    nxt[7, 1] = np.nan
    return _info(_h5(ctx, next_observations=nxt))


def _flags(value: float, key: str) -> Callable[[Ctx], list[str]]:
    def build(ctx: Ctx) -> list[str]:
        flags = np.zeros(N)
        flags[4] = value
        return _info(_h5(ctx, **{key: flags}))

    return build


def _oob_actions(ctx: Ctx) -> list[str]:
    actions = _arrays()["actions"].copy()
    actions[3] = 5.0
    return _train_data(_h5(ctx, actions=actions), ctx)


def _train_data(path: str, ctx: Ctx, *extra: str) -> list[str]:
    return ["train", "bc", "--dataset", path, "--total-steps", "10", "--batch-size", "8",
            "--hidden-dims", "8", "8", "--out", ctx.path("out"), *QUIET, *extra]  # fmt: skip


def _minari_dir(ctx: Ctx, metadata: str) -> str:
    data = os.path.join(ctx.path("mini"), "data")
    os.makedirs(data)
    with open(os.path.join(data, "metadata.json"), "w") as f:
        f.write(metadata)
    return ctx.path("mini")


def _missing_minari_id(ctx: Ctx) -> list[str]:
    os.environ["MINARI_DATASETS_PATH"] = ctx.path("minari-root")  # restored by the test
    return ["train", "iql", "--dataset", "minari:mujoco/hopper/medium-v0", "--total-steps", "10",
            "--out", ctx.path("out"), *QUIET]  # fmt: skip


def _api_load(path_fn: Callable[[Ctx], str]) -> Callable[[Ctx], Callable[[], Any]]:
    return lambda ctx: lambda: load_dataset(path_fn(ctx))


def _dataset_obj(**over: Any) -> Callable[[Ctx], Callable[[], Any]]:
    """``Dataset(...)`` built in memory (what a script converting another format does)."""

    def build(ctx: Ctx) -> Callable[[], Any]:
        a = _arrays(**over)
        nxt = a.pop("next_observations", np.roll(np.asarray(a["observations"]), -1, 0))
        return lambda: Dataset(next_observations=nxt, source="script", **a)

    return build


DATASET_CASES = [
    Case(
        "hdf5-empty-file",
        _empty_file,
        ("empty.hdf5 is not a readable HDF5 file", "D4RL datasets are HDF5"),
    ),
    Case("hdf5-truncated", _truncated, ("is not a readable HDF5 file", "truncated file")),
    Case("hdf5-no-keys", _no_keys, ("lacks the D4RL key(s)", "found []", "A D4RL file needs")),
    Case(
        "hdf5-zero-rows",
        lambda c: _info(
            _h5(
                c,
                observations=np.zeros((0, 3)),
                actions=np.zeros((0, 1)),
                rewards=np.zeros(0),
                terminals=np.zeros(0, bool),
                timeouts=np.zeros(0, bool),
            )
        ),
        ("the dataset is empty (0 transitions)", "jaxrl dataset collect"),
    ),
    Case(
        "hdf5-minari-layout", _minari_layout_file, ("lacks the D4RL key(s)", "found ['episode_0']")
    ),
    Case(
        "hdf5-key-is-a-group",
        _group_key,
        ("['observations'] are HDF5 groups, not arrays", "minari:ID"),
    ),
    Case(
        "hdf5-scalar-rewards",
        lambda c: _info(_h5(c, rewards=np.float32(1.0))),
        ("['rewards'] hold a single value", "one row per transition"),
    ),
    Case(
        "dtype-string-observations",
        lambda c: _info(_h5(c, observations=np.array([b"abc"] * N))),
        ("observations has dtype |S3, not a real number type", "store it as float32"),
    ),
    Case(
        "dtype-complex-actions",
        lambda c: _info(_h5(c, actions=np.ones((N, 1), np.complex64))),
        ("actions has dtype complex64, not a real number type", "store it as float32"),
    ),
    Case(
        "dtype-string-terminals",
        lambda c: _info(_h5(c, terminals=np.array([b"n"] * N))),
        ("terminals has dtype |S1", "store it as bool"),
    ),
    Case(
        "shape-rewards-per-transition-pair",
        lambda c: _info(_h5(c, rewards=np.zeros((N, 2), np.float32))),
        ("rewards has shape (60, 2); expected [N] (one value per transition)",),
    ),
    Case(
        "shape-image-observations",
        lambda c: _info(_h5(c, observations=np.zeros((N, 3, 2), np.float32))),
        ("observations has shape (57, 3, 2); expected [N, dim] (flat vectors)",),
    ),
    Case(
        "nan-terminals",
        _flags(np.nan, "terminals"),
        ("terminals must be 0/1 (or bool) flags", "first at row 4", "Fix the file's terminals"),
    ),
    Case(
        "timeouts-not-flags",
        _flags(2.0, "timeouts"),
        ("timeouts must be 0/1 (or bool) flags", "first at row 4"),
    ),
    Case(
        "nan-next-observations",
        _nan_next_obs,
        ("next_observations has 1 rows with NaN or inf (first at row 7)", "Clean the data"),
    ),
    Case(
        "rewards-beyond-float32",
        lambda c: _info(_h5(c, rewards=np.where(np.arange(N) == 3, 1e39, 0.0))),
        ("rewards has values beyond the float32 range", "first at row 3", "Rescale or drop"),
    ),
    Case(
        "inf-observations-in-memory",
        _dataset_obj(observations=np.where(np.arange(N * 3).reshape(N, 3) == 10, -np.inf, 0.0)),
        ("script: observations has 1 rows with NaN or inf (first at row 3)", "Clean the data"),
        DatasetError,
        "api",
    ),
    Case(
        "dtype-object-rewards-in-memory",
        _dataset_obj(rewards=np.array([None] * N)),
        ("script: rewards has dtype object, not a real number type",),
        DatasetError,
        "api",
    ),
    Case(
        "actions-outside-bounds",
        _oob_actions,
        ("1 actions lie outside Pendulum-v1's bounds [-2.0, 2.0]", "rescale or clip them"),
        absent="out",
    ),
    Case(
        "action-dims-mismatch-env",
        lambda c: _train_data(_h5(c, actions=np.zeros((N, 2), np.float32)), c),
        (
            "actions have 2 dimensions but Pendulum-v1 has 1",
            "Pass the --env the data was collected on",
        ),
        absent="out",
    ),
    Case(
        "dataset-names-no-env",
        lambda c: _train_data(_h5(c, env_id=None), c),
        ("does not say which env it comes from", "pass --env"),
        absent="out",
    ),
    Case(
        "dataset-with-unknown-env",
        lambda c: _train_data(_h5(c), c, "--env", "Pendulumm-v1"),
        ("Unknown environment id 'Pendulumm-v1'", "Did you mean 'Pendulum-v1'"),
        absent="out",
    ),
    Case(
        "batch-larger-than-dataset",
        lambda c: _train_data(_h5(c), c, "--batch-size", "100"),
        (
            "BCConfig.batch_size (100) is larger than the dataset",
            "(57 transitions)",
            "set --batch-size to at most 57",
        ),
        absent="out",
    ),
    Case(
        "online-rows-need-the-host-loop",
        lambda c: [
            "train",
            "rebrac",
            "--dataset",
            _h5(c),
            "--env",
            "jax:pendulum",
            "--batch-size",
            "8",
            "--hidden-dims",
            "8",
            "8",
            "--offline-steps",
            "5",
            "--online-steps",
            "5",
            "--out",
            c.path("out"),
            *QUIET,
        ],
        ("rebrac's online rows need the next action", "fine-tune it on the Gymnasium version"),
    ),
    Case(
        "minari-id-not-on-disk",
        _missing_minari_id,
        (
            "Minari dataset 'mujoco/hopper/medium-v0' is not on local disk",
            "set MINARI_DATASETS_PATH",
            "never downloads",
        ),
        absent="out",
    ),
    Case(
        "minari-empty-id",
        lambda c: _info("minari:"),
        ("minari: needs a dataset id", "minari:mujoco/hopper/medium-v0"),
    ),
    Case(
        "minari-corrupt-metadata",
        lambda c: _info(_minari_dir(c, "{not json")),
        ("is not a readable Minari dataset (JSONDecodeError", "Copy or create it again"),
    ),
    Case(
        "minari-without-episode-data",
        _api_load(lambda c: _minari_dir(c, "{}")),
        ("is not a readable Minari dataset", "incomplete or corrupt"),
        DatasetError,
        "api",
    ),
    Case(
        "directory-not-a-dataset",
        lambda c: (os.makedirs(c.path("dir")), _info(c.path("dir")))[1],
        ("is a directory but not a Minari dataset", "no metadata.json"),
    ),
]


# ----------------------------------------------------------------- options, agents and configs


def _train(*argv: str) -> Callable[[Ctx], list[str]]:
    return lambda ctx: [*argv, "--total-steps", "10", "--out", ctx.path("out"), *QUIET]


def _config_file(text: str) -> Callable[[Ctx], list[str]]:
    def build(ctx: Ctx) -> list[str]:
        with open(ctx.path("cfg.json"), "w") as f:
            f.write(text)
        return _train("train", "sac", "--config", ctx.path("cfg.json"))(ctx)

    return build


def _parse_grid(*specs: str) -> Callable[[Ctx], Callable[[], Any]]:
    from jaxrl.tune.grid import parse_grid

    return lambda ctx: lambda: parse_grid(list(specs), registry.get("sac").config)


CONFIG_CASES = [
    Case(
        "unknown-option",
        _train("train", "sac", "--actr-lr", "1e-3"),
        ("Unrecognized options", "--actr-lr", "Perhaps you meant", "--actor-lr"),
        absent="out",
    ),
    Case(
        "unknown-sweep-agent",
        lambda c: [
            "sweep",
            "nosuch",
            "--env",
            "jax:pendulum",
            "--grid",
            "tau=0.1",
            "--out",
            c.path("out"),
        ],
        ("Unknown agent 'nosuch'; choose one of: sac, td3",),
        absent="out",
    ),
    Case(
        "unknown-export-format",
        lambda c: ["export", c.runs["sac"], "--format", "tflite"],
        ("invalid choice 'tflite'", "onnx"),
    ),
    Case(
        "negative-learning-rate",
        _train("train", "sac", "--actor-lr", "-0.001"),
        ("SACConfig.actor_lr must be positive, got -0.001", "set --actor-lr to a value > 0"),
        absent="out",
    ),
    Case(
        "nan-learning-rate",
        _train("train", "sac", "--actor-lr", "nan"),
        ("SACConfig.actor_lr must be positive, got nan", "--actor-lr"),
        absent="out",
    ),
    Case(
        "inf-learning-rate",
        _train("train", "iql", "--dataset", "unused.hdf5", "--critic-lr", "inf"),
        ("IQLConfig.critic_lr must be finite, got inf", "--critic-lr"),
        absent="out",
    ),
    Case(
        "inf-coefficient",
        _train("train", "td3", "--policy-noise", "inf"),
        ("TD3Config.policy_noise must be finite, got inf", "--policy-noise"),
        absent="out",
    ),
    Case(
        "num-min-qs-above-num-qs",
        _train("train", "sac", "--num-qs", "2", "--num-min-qs", "3"),
        ("num_min_qs (3) cannot exceed num_qs (2)", "lower --num-min-qs or raise --num-qs"),
        absent="out",
    ),
    Case(
        "planner-horizon-0",
        lambda c: ["plan", "--env", "jax:pendulum", "--horizon", "0", "--out", c.path("out")],
        ("PlannerConfig.horizon must be positive, got 0", "set --horizon to a value > 0"),
        absent="out",
    ),
    Case(
        "tdmpc2-horizon-0",
        _train("train", "tdmpc2", "--env", "jax:pendulum", "--horizon", "0"),
        ("TDMPC2Config.horizon must be positive, got 0", "--horizon"),
        absent="out",
    ),
    Case(
        "sweep-grid-value-out-of-range",
        lambda c: [
            "sweep",
            "sac",
            "--env",
            "jax:pendulum",
            "--grid",
            "tau=0.5,2.0",
            "--out",
            c.path("out"),
        ],
        ("--grid tau=2.0: SACConfig.tau must be in (0.0, 1.0], got 2.0",),
        absent="out",
    ),
    Case(
        "sweep-grid-nan",
        lambda c: [
            "sweep",
            "sac",
            "--env",
            "jax:pendulum",
            "--grid",
            "actor_lr=nan,1e-3",
            "--out",
            c.path("out"),
        ],
        ("--grid actor_lr=nan: SACConfig.actor_lr must be positive, got nan",),
        absent="out",
    ),
    Case(
        "config-file-missing",
        lambda c: _train("train", "sac", "--config", c.path("nope.json"))(c),
        ("nope.json: cannot read it as JSON",),
        absent="out",
    ),
    Case(
        "config-file-bad-value",
        _config_file('{"tau": 5}'),
        ("SACConfig.tau must be in (0.0, 1.0], got 5", "--tau"),
        absent="out",
    ),
]


# ------------------------------------------------------------ run directories and checkpoints


def _edit_config(edit: Callable[[dict], Any]) -> Callable[[Ctx], list[str]]:
    def build(ctx: Ctx) -> list[str]:
        run = ctx.copy_run("sac")
        path = os.path.join(run, "config.json")
        config = json.load(open(path))
        edit(config)
        json.dump(config, open(path, "w"))
        return ["eval", run, "--episodes", "1"]

    return build


def _corrupt_config(ctx: Ctx) -> list[str]:
    run = ctx.copy_run("sac")
    with open(os.path.join(run, "config.json"), "w") as f:
        f.write('{"agent": "sac", "env": ')  # cut off mid-write by another tool
    return ["eval", run]


def _partial_checkpoint(ctx: Ctx) -> list[str]:
    run = ctx.copy_run("sac")
    shutil.rmtree(os.path.join(run, "checkpoints", "40", "state"))  # copied without its arrays
    return ["eval", run]


def _junk_checkpoint(ctx: Ctx) -> list[str]:
    run = ctx.copy_run("sac")
    ckpts = os.path.join(run, "checkpoints")
    shutil.rmtree(ckpts)
    os.makedirs(os.path.join(ckpts, "100"))
    with open(os.path.join(ckpts, "100", "model.pt"), "wb") as f:  # another library's file
        f.write(b"\x80\x02 not a jaxrl checkpoint")
    return ["eval", run]


def _foreign_checkpoint(ctx: Ctx) -> list[str]:
    """A checkpoint another program wrote with jaxrl's Checkpointer: same phase, other arrays."""
    run = ctx.copy_run("sac")
    ckpts = os.path.join(run, "checkpoints")
    shutil.rmtree(ckpts)
    tree = {"params": {"w": jnp.ones((4, 4)), "b": jnp.zeros(4)}, "step": jnp.int32(40)}
    Checkpointer(ckpts).save(40, tree, {"step": 40, "phase": "online", "last_eval": []})
    return ["train", "sac", *TINY_SAC, "--out", run]


def _no_checkpoint(command: list[str]) -> Callable[[Ctx], list[str]]:
    def build(ctx: Ctx) -> list[str]:
        run = ctx.copy_run("sac")
        shutil.rmtree(os.path.join(run, "checkpoints"))
        return [command[0], run, *command[1:]]

    return build


def _resume_as(*argv: str) -> Callable[[Ctx], list[str]]:
    return lambda ctx: ["train", *argv, "--out", ctx.copy_run("sac")]


def _resume_longer_over_partial_checkpoint(ctx: Ctx) -> list[str]:
    argv = _partial_checkpoint(ctx)  # ["eval", run]
    longer = list(TINY_SAC)
    longer[longer.index("--total-steps") + 1] = "80"
    return ["train", "sac", *longer, "--out", argv[1]]


RUN_CASES = [
    Case(
        "run-config-not-json",
        _corrupt_config,
        ("config.json is not readable JSON", "Restore it from a copy", "new --out"),
        keeps="run",
    ),
    Case(
        "run-config-of-another-tool",
        _edit_config(lambda c: c.pop("agent")),
        ("config.json lacks agent", "not written by `jaxrl train`"),
        keeps="run",
    ),
    Case(
        "run-of-an-unknown-agent",
        _edit_config(lambda c: c.update(agent="dqn")),
        ("trained with unknown agent 'dqn'", "sac, td3", "jaxrl version that wrote it"),
        keeps="run",
    ),
    Case(
        "checkpoint-partial",
        _partial_checkpoint,
        ("checkpoints/40 is corrupt", "train into a new --out directory"),
        keeps="run",
    ),
    Case(
        "checkpoint-of-another-library",
        _junk_checkpoint,
        ("checkpoints/100 is corrupt", "train into a new --out directory"),
        keeps="run",
    ),
    Case(
        "checkpoint-foreign-arrays-resume",
        _foreign_checkpoint,
        (
            "checkpoints/40 was written by a run with a different configuration",
            "train into a new --out directory",
        ),
        keeps="run",
    ),
    Case(
        "resume-run-of-another-agent",
        _resume_as("td3", *TINY_SAC),
        ("holds a run with a different configuration (agent", "Use a new --out directory"),
        keeps="run",
    ),
    Case(
        "resume-run-with-another-learning-rate",
        _resume_as("sac", *TINY_SAC, "--actor-lr", "0.001"),
        (
            "holds a run with a different configuration (agent_config: actor_lr: 0.0003 in the "
            "run, 0.001 now)",
            "Use a new --out directory",
        ),
        keeps="run",
    ),
    Case(
        # A longer budget is a valid resume; the restore fails, and config.json keeps the
        # run's own total_steps (the new settings are committed only after a restore).
        "resume-longer-over-a-partial-checkpoint",
        _resume_longer_over_partial_checkpoint,
        ("checkpoints/40 is corrupt", "train into a new --out directory"),
        keeps="run",
    ),
    Case(
        "eval-zero-episodes",
        lambda c: ["eval", c.copy_run("sac"), "--episodes", "0"],
        ("--episodes must be at least 1, got 0",),
        keeps="run",
    ),
    Case(
        "resume-run-of-another-env",
        _resume_as("sac", *TINY_SAC, "--env", "MountainCarContinuous-v0"),
        ("holds a run with a different configuration (env", "Use a new --out directory"),
        keeps="run",
    ),
    Case(
        "finetune-an-online-run",
        lambda c: ["finetune", c.copy_run("sac"), "--online-steps", "10"],
        (
            "is a run of sac without a dataset",
            "`jaxrl finetune` continues an offline run",
            "--dataset D",
        ),
        keeps="run",
    ),
    Case(
        "finetune-negative-steps",
        lambda c: ["finetune", c.copy_run("bc"), "--online-steps", "-5"],
        ("online_steps must be positive, got -5", "--online-steps"),
        keeps="run",
    ),
    Case(
        "finetune-not-a-run",
        lambda c: ["finetune", c.path("nothing"), "--online-steps", "10"],
        ("nothing is not a jaxrl run directory (no config.json)",),
        absent="nothing",
    ),
    Case(
        "export-without-checkpoint",
        _no_checkpoint(["export", "--format", "numpy"]),
        ("has no checkpoint yet; train it first",),
        keeps="run",
        absent="run/export",
    ),
    Case(
        "export-missing-step",
        lambda c: ["export", c.copy_run("sac"), "--format", "numpy", "--step", "7"],
        ("has no checkpoint at step 7; its checkpoints are at steps [40]", "omit the step"),
        keeps="run",
        absent="run/export",
    ),
]

CASES = DATASET_CASES + CONFIG_CASES + RUN_CASES


# ------------------------------------------------------------------------------------ fixtures


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, str]:
    """A tiny finished SAC run (host loop) and a tiny offline BC run, shared read-only."""
    root = tmp_path_factory.mktemp("runs")
    sac = str(root / "sac")
    main(["train", "sac", *TINY_SAC, "--out", sac])
    rng = np.random.default_rng(0)
    obs = rng.normal(size=(100, 3)).astype(np.float32)
    ds = Dataset(obs, rng.uniform(-1, 1, (100, 1)), rng.normal(size=100), np.roll(obs, -1, 0),
                 np.zeros(100), np.arange(100) % 50 == 49, env_id="Pendulum-v1")  # fmt: skip
    data = save_d4rl(ds, root / "data.hdf5")
    bc = str(root / "bc")
    main(["train", "bc", "--dataset", data, "--total-steps", "10", "--batch-size", "8",
          "--hidden-dims", "8", "8", "--eval-every", "10", "--out", bc, *QUIET])  # fmt: skip
    return {"sac": sac, "bc": bc}


@pytest.fixture
def ctx(tmp_path, runs, monkeypatch) -> Ctx:
    monkeypatch.setenv("COLUMNS", "200")  # tyro's boxes on one line per message
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "minari-root"))
    monkeypatch.chdir(tmp_path)  # nothing a case writes by default lands in the repository
    return Ctx(str(tmp_path), runs)


def _snapshot(root: str) -> dict[str, bytes]:
    files = {}
    for dirpath, _, names in os.walk(root):
        for name in names:
            path = os.path.join(dirpath, name)
            files[os.path.relpath(path, root)] = open(path, "rb").read()
    return files


def _flat(text: str) -> str:
    return " ".join(re.sub(r"[│╭╮╰╯─]", " ", text).split())


def _raised_in_jaxrl(err: BaseException) -> bool:
    """The exception was raised by jaxrl's code (its innermost frame is in the package)."""
    frames = traceback.extract_tb(err.__traceback__)
    return bool(frames) and frames[-1].filename.startswith(JAXRL_DIR)


# --------------------------------------------------------------------------------------- tests


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input(case: Case, ctx: Ctx, capsys):
    built = case.build(ctx)
    keeps = os.path.join(ctx.tmp, case.keeps) if case.keeps else None
    before = _snapshot(keeps) if keeps else None
    capsys.readouterr()
    if case.via == "cli":
        with pytest.raises(SystemExit) as info:
            main(built)
        captured = capsys.readouterr()
        err = captured.err + (info.value.code if isinstance(info.value.code, str) else "")
        assert info.value.code == 2 or isinstance(info.value.code, str), info.value.code
        assert "Traceback" not in err + captured.out and 'File "' not in err
        lines = [line for line in err.splitlines() if line.strip()]
        if lines and lines[0].startswith("error: "):  # jaxrl's own refusal: exactly one line
            assert len(lines) == 1, err
        message = _flat(err)
    else:
        with pytest.raises(case.error) as info:
            built()
        assert _raised_in_jaxrl(info.value), traceback.format_tb(info.value.__traceback__)[-1]
        assert info.value.__cause__ is None  # no chained library exception shown
        message = str(info.value)
        assert "\n" not in message
    for fragment in case.fragments:
        assert fragment in message, f"{fragment!r} not in {message!r}"
    if keeps:
        assert _snapshot(keeps) == before, "a failed command changed the run directory"
    if case.absent:
        assert not os.path.exists(os.path.join(ctx.tmp, case.absent))


# ------------------------------------------- gaps the corpus found (fixed after it was written)


def test_config_file_holding_a_list(ctx, capsys):
    with pytest.raises(SystemExit) as info:
        main(_config_file("[1, 2]")(ctx))
    assert info.value.code == 2 and "JSON object" in capsys.readouterr().err


def test_resume_into_a_run_with_a_corrupt_config(ctx, capsys):
    argv = _corrupt_config(ctx)
    run = argv[1]
    before = _snapshot(run)
    with pytest.raises(SystemExit):
        main(["train", "sac", *TINY_SAC, "--out", run])
    err = capsys.readouterr().err
    assert _snapshot(run) == before
    assert "config.json" in err and "not readable JSON" in err


def test_resume_over_a_checkpoint_of_another_phase(ctx, capsys):
    run = ctx.copy_run("sac")
    shutil.rmtree(os.path.join(run, "checkpoints"))
    shutil.copytree(os.path.join(ctx.runs["bc"], "checkpoints"), os.path.join(run, "checkpoints"))
    before = _snapshot(run)
    with pytest.raises(SystemExit):
        main(["train", "sac", *TINY_SAC, "--out", run])
    assert _snapshot(run) == before


def test_sweep_grid_with_a_repeated_value():
    with pytest.raises(ConfigError, match="repeated"):
        _parse_grid("tau=0.1,0.1")(None)()


def test_jax_env_unknown_option_lists_the_options(ctx, capsys):
    with pytest.raises(SystemExit):
        main(_train("train", "sac", "--env", "jax:pendulum?gravity_x=3")(ctx))
    err = capsys.readouterr().err
    assert "gravity_x" in err and "episode_length" in err


# ------------------------------------------------------------------------------------- counts

PRE_EXISTING = {
    # file: {test function: collected cases} of user-facing bad-input tests written before this
    # corpus (the families: datasets, env ids and options, config values, grids,
    # run directories, checkpoints, export). Internal API misuse (buffers, planner calls) is not
    # counted.
    "test_errors.py": {
        "test_unknown_env_id_suggests_close_match": 1,
        "test_discrete_action_env_rejected": 1,
        "test_host_make_env_points_jax_ids_to_make_jax_env": 2,
        "test_nonpositive_num_envs_rejected": 1,
        "test_config_rejects_bad_values": 24,
        "test_config_rejects_empty_hidden_dims": 2,
        "test_sac_config_num_min_qs_above_num_qs": 1,
        "test_td3_config_rejects_negative_noise": 1,
        "test_cli_unknown_env": 1,
        "test_cli_bad_config_value": 1,
        "test_cli_bad_loop_value": 1,
        "test_cli_unknown_agent": 1,
        "test_cli_unknown_command": 1,
        "test_cli_train_without_agent": 1,
        "test_restore_without_checkpoint": 1,
        "test_corrupt_newest_checkpoint": 1,
        "test_restore_into_template_of_different_shape": 1,
        "test_restore_into_template_with_missing_leaf": 1,
    },
    "test_datasets.py": {
        "test_missing_keys_are_named": 1,
        "test_length_mismatch_is_reported": 1,
        "test_nan_and_inf_are_rejected_with_the_row": 3,
        "test_corrupt_or_missing_file": 1,
        "test_dimensions_and_bounds_must_match_the_env": 1,
        "test_collect_rejects_bad_requests": 1,
    },
    "test_offline_cli.py": {"test_offline_command_line_errors": 1},
    "test_training.py": {
        "test_cli_run_directory_contract_eval_and_corrupt_checkpoint": 1,
        "test_resume_with_a_different_config_is_refused": 1,
        "test_eval_of_a_run_from_another_version_names_its_unknown_options": 1,
    },
    "test_sweeps.py": {
        "test_bad_grids_get_clear_errors": 1,
        "test_train_takes_a_config_file_back": 1,
    },
    "test_export.py": {
        "test_refusal_says_what_to_do": 1,
        "test_truncated_or_corrupt_artifact_is_refused": 3,
        "test_contract_mismatches_are_refused": 1,
    },
    "test_planners.py": {"test_config_validation": 10},
    "test_gym_sim2real.py": {
        "test_bad_options_say_what_is_wrong": 10,
        "test_unknown_base_id_with_options_names_the_base_id": 1,
    },
    "test_jax_envs.py": {"test_env_id_parsing_and_errors": 1},
    "test_ppo.py": {
        "test_config_validation_names_the_flag": 7,
        "test_rollout_length_rejects_incompatible_num_envs": 1,
    },
    "test_tdmpc2.py": {"test_config_errors_are_clear": 6},
    "test_pets.py": {"test_config_validation_errors": 9},
    "test_offline_bc_iql.py": {"test_bad_config_raises_naming_the_flag": 12},
    "test_offline_generative.py": {"test_bad_config_raises_naming_the_flag": 14},
    "test_offline_cql.py": {"test_config_validation_names_the_flag": 1},
    "test_privileged.py": {"test_refusals": 1},
    "test_fused.py": {"test_num_seeds_needs_a_jax_env": 1},
    "test_classic_envs.py": {"test_registry_and_errors": 1},
}


def test_corpus_size():
    """At least 40 new cases; the README quotes them with the pre-existing ones."""
    assert len(CASES) >= 40
    assert len({c.id for c in CASES}) == len(CASES)
    here = os.path.dirname(os.path.abspath(__file__))
    for name, tests in PRE_EXISTING.items():  # the list stays true when tests are renamed
        source = open(os.path.join(here, name)).read()
        for test in tests:
            assert f"def {test}(" in source, f"{name}::{test} is gone; update PRE_EXISTING"
    pre = sum(n for tests in PRE_EXISTING.values() for n in tests.values())
    print(f"bad-input corpus: {len(CASES)} new cases + {pre} pre-existing = {len(CASES) + pre}")
