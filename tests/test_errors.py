import ast
import dataclasses
import functools
import gc
import inspect
import os
import pathlib
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl import cli, registry
from jaxrl.agents import SACConfig, TD3Config
from jaxrl.config import ConfigError
from jaxrl.envs import EnvError, make_env
from jaxrl.loops.checkpoint import Checkpointer, CheckpointError

# ------------------------------------------------------------------------------------ environments


def test_unknown_env_id_suggests_close_match():
    with pytest.raises(EnvError) as info:
        make_env("HalfCheatah-v5")
    assert isinstance(info.value, ValueError)
    message = str(info.value)
    assert "'HalfCheatah-v5'" in message
    assert "'HalfCheetah-v5'" in message


def test_discrete_action_env_rejected():
    with pytest.raises(EnvError, match="continuous") as info:
        make_env("CartPole-v1")
    assert "CartPole-v1" in str(info.value)


@pytest.mark.parametrize("env_id", ["brax:ant", "jax:pendulum"])
def test_host_make_env_points_jax_ids_to_make_jax_env(env_id):
    with pytest.raises(EnvError, match=re.escape(env_id) + ".*make_jax_env"):
        make_env(env_id)


def test_nonpositive_num_envs_rejected():
    with pytest.raises(EnvError, match="num_envs"):
        make_env("Pendulum-v1", num_envs=0)


# ----------------------------------------------------------------------------------------- configs

BAD_VALUES = [
    ("hidden_dims", (0,)),
    ("hidden_dims", (256, -1)),
    ("batch_size", 0),
    ("num_qs", -1),
    ("buffer_size", 0),
    ("utd_ratio", 0),
    ("actor_lr", 0.0),
    ("tau", 0.0),
    ("tau", 1.5),
    ("discount", 1.5),
    ("discount", -0.1),
    ("learning_starts", -1),
]


@pytest.mark.parametrize("config_cls", [SACConfig, TD3Config])
@pytest.mark.parametrize("field,value", BAD_VALUES)
def test_config_rejects_bad_values(config_cls, field, value):
    with pytest.raises(ConfigError) as info:
        config_cls(**{field: value})
    message = str(info.value)
    assert isinstance(info.value, ValueError)
    assert f"{config_cls.__name__}.{field}" in message
    assert "--" + field.replace("_", "-") in message  # tells the user which flag to fix


@pytest.mark.parametrize("config_cls", [SACConfig, TD3Config])
def test_config_rejects_empty_hidden_dims(config_cls):
    with pytest.raises(ConfigError, match="hidden_dims must not be empty"):
        config_cls(hidden_dims=())


def test_sac_config_num_min_qs_above_num_qs():
    with pytest.raises(ValueError, match=r"num_min_qs \(3\).*num_qs \(2\)"):
        SACConfig(num_qs=2, num_min_qs=3)
    with pytest.raises(ConfigError, match="num_min_qs"):
        SACConfig(num_min_qs=0)


def test_td3_config_rejects_negative_noise():
    with pytest.raises(ConfigError, match="TD3Config.policy_noise"):
        TD3Config(policy_noise=-0.1)


def test_valid_configs_accepted():
    assert SACConfig(tau=1.0, discount=1.0, learning_starts=0, num_qs=10, num_min_qs=2).tau == 1.0
    assert TD3Config(discount=0.0, hidden_dims=(8,)).hidden_dims == (8,)


# --------------------------------------------------------------------------------------------- CLI


@pytest.fixture
def wide_terminal(monkeypatch):
    # tyro renders with rich; a wide console keeps flags and messages on one line.
    monkeypatch.setenv("COLUMNS", "200")


def _run_cli(argv):
    with pytest.raises(SystemExit) as info:
        cli.main(argv)
    return info.value.code


def _flat(text: str) -> str:
    """Help/error text without rich's box characters and line wrapping."""
    return " ".join(re.sub(r"[│╭╮╰╯─]", " ", text).split())


def test_cli_unknown_env(tmp_path, capsys, wide_terminal):
    out = tmp_path / "run"
    code = _run_cli(
        ["train", "sac", "--env", "NoSuchEnv-v0", "--total-steps", "10", "--out", str(out)]
    )
    captured = capsys.readouterr()
    assert code == 2
    assert "NoSuchEnv-v0" in captured.err
    assert "Traceback" not in captured.err + captured.out
    assert not out.exists()  # nothing was written for a run that never started


def test_cli_bad_config_value(tmp_path, capsys, wide_terminal):
    out = tmp_path / "run"
    code = _run_cli(["train", "sac", "--batch-size", "0", "--total-steps", "10", "--out", str(out)])
    captured = capsys.readouterr()
    assert code == 2
    assert "batch_size" in _flat(captured.err)
    assert "--batch-size" in _flat(captured.err)
    assert "Traceback" not in captured.err + captured.out
    assert not out.exists()


def test_cli_bad_loop_value(tmp_path, capsys, wide_terminal):
    code = _run_cli(["train", "td3", "--total-steps", "0", "--out", str(tmp_path / "run")])
    captured = capsys.readouterr()
    assert code == 2
    assert "total_steps" in _flat(captured.err)
    assert "Traceback" not in captured.err + captured.out


def test_cli_unknown_agent(capsys):
    code = _run_cli(["train", "nosuchagent"])
    message = str(code) + capsys.readouterr().err
    assert code != 0
    assert "nosuchagent" in message
    for name in registry.names():
        assert name in message
    assert "sac" in message


def test_cli_unknown_command(capsys):
    code = _run_cli(["fly"])
    assert code != 0
    assert "'fly'" in str(code)
    assert "sac" in str(code)


@pytest.mark.parametrize("argv", [[], ["--help"]])
def test_cli_top_level_usage(argv, capsys):
    cli.main(argv)
    out = capsys.readouterr().out
    assert "jaxrl train AGENT" in out
    assert "sac, td3, ppo" in out


def test_cli_train_without_agent(capsys):
    code = _run_cli(["train"])
    assert "jaxrl train AGENT" in str(code)


@functools.cache
def _module_tree(path: str):
    """A module's AST, parsed once per file (conftest retries CPython 3.11's spurious failure)."""
    return ast.parse(pathlib.Path(path).read_text())


def _field_docs(config_cls) -> dict[str, str]:
    """Field docstrings, read from the source the way tyro reads them."""
    docs = {}
    for cls in reversed(config_cls.__mro__[:-1]):  # a subclass's docstrings win; inherited kept
        tree = _module_tree(inspect.getsourcefile(cls))
        (node,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls.__name__]
        body = node.body
        for node, nxt in zip(body, body[1:], strict=False):
            if isinstance(node, ast.AnnAssign) and isinstance(nxt, ast.Expr):
                docs[node.target.id] = nxt.value.value
    return docs


@pytest.mark.parametrize("agent", sorted(registry.names("off-policy", "on-policy")))
def test_cli_help_lists_every_config_field(agent, capsys, monkeypatch):
    # One column of options (tyro puts two side by side from about 130 columns on, and wrapped
    # docstrings of the two would interleave line by line); _flat undoes the wrapping.
    monkeypatch.setenv("COLUMNS", "120")
    code = _run_cli(["train", agent, "--help"])
    help_text = capsys.readouterr().out
    assert code in (0, None)
    config_cls = registry.get(agent).config
    flags = set(re.findall(r"--[a-z0-9-]+", help_text))
    for field in dataclasses.fields(config_cls):
        assert "--" + field.name.replace("_", "-") in flags, field.name
    for loop_flag in ("--env", "--total-steps", "--seed", "--num-envs", "--out", "--eval-every"):
        assert loop_flag in flags
    flat = _flat(help_text)
    docs = _field_docs(config_cls)
    for field in dataclasses.fields(config_cls):  # every field's docstring is shown
        assert _flat(docs[field.name]) in flat, field.name


# ------------------------------------------------------------------------------------- checkpoints


def _tree(i: int):
    return {
        "params": {
            "w": jnp.arange(6.0, dtype=jnp.float32).reshape(2, 3) * i,
            "b": jnp.full((3,), -i, jnp.float32),
        },
        "step": jnp.int32(10 * i),
        "rng": jax.random.key(i),
    }


def _assert_tree_equal(got, want):
    np.testing.assert_array_equal(got["params"]["w"], want["params"]["w"])
    np.testing.assert_array_equal(got["params"]["b"], want["params"]["b"])
    assert int(got["step"]) == int(want["step"])
    assert got["params"]["w"].dtype == want["params"]["w"].dtype
    assert got["step"].dtype == want["step"].dtype
    assert jax.dtypes.issubdtype(got["rng"].dtype, jax.dtypes.prng_key)
    np.testing.assert_array_equal(jax.random.key_data(got["rng"]), jax.random.key_data(want["rng"]))
    np.testing.assert_array_equal(
        jax.random.uniform(got["rng"], (4,)), jax.random.uniform(want["rng"], (4,))
    )


@pytest.fixture
def two_checkpoints(tmp_path):
    directory = tmp_path / "checkpoints"
    ckpt = Checkpointer(directory)
    ckpt.save(1, _tree(1), {"step": 1, "note": "first"})
    ckpt.save(2, _tree(2), {"step": 2, "note": "second"})
    yield ckpt, directory
    # Collect orbax's abandoned read coroutines of a failed restore now, inside this test.
    gc.collect()


def test_checkpoint_round_trip(two_checkpoints):
    ckpt, _ = two_checkpoints
    assert ckpt.latest_step() == 2
    assert ckpt.all_steps() == [1, 2]
    state, meta = ckpt.restore(_tree(0))
    _assert_tree_equal(state, _tree(2))
    assert meta == {"step": 2, "note": "second"}
    state, meta = ckpt.restore(_tree(0), step=1)
    _assert_tree_equal(state, _tree(1))
    assert meta["note"] == "first"


def test_checkpoint_reopened_by_new_checkpointer(two_checkpoints):
    _, directory = two_checkpoints
    state, meta = Checkpointer(directory).restore(_tree(0))
    _assert_tree_equal(state, _tree(2))
    assert meta["step"] == 2


def test_restore_without_checkpoint(tmp_path):
    with pytest.raises(CheckpointError, match="No checkpoint"):
        Checkpointer(tmp_path / "empty").restore(_tree(0))


def test_corrupt_newest_checkpoint(two_checkpoints):
    ckpt, directory = two_checkpoints
    newest = os.path.join(os.path.abspath(directory), "2")
    corrupted = 0
    for root, _, files in os.walk(os.path.join(newest, "state")):
        for name in files:
            with open(os.path.join(root, name), "wb") as f:
                f.write(b"\xffgarbage\x00" * 3)
            corrupted += 1
    assert corrupted > 0

    with pytest.raises(CheckpointError) as info:
        ckpt.restore(_tree(0))
    message = str(info.value)
    assert newest in message
    assert f"delete {newest}" in message
    assert "step 1" in message

    import shutil

    shutil.rmtree(newest)
    assert ckpt.latest_step() == 1
    state, meta = ckpt.restore(_tree(0))
    _assert_tree_equal(state, _tree(1))
    assert meta["step"] == 1


def test_checkpoint_of_another_layout_is_named_intact_not_corrupt(two_checkpoints):
    # What a checkpoint of an older jaxrl looks like: a field renamed, or one added since that
    # holds no array (None, like a buffer column an agent does not use).
    ckpt, directory = two_checkpoints
    renamed = _tree(0)
    renamed["params"]["kernel"] = renamed["params"].pop("w")
    added = {**_tree(0), "extra": None}
    for template, detail in ((renamed, "params/kernel"), (added, "extra")):
        with pytest.raises(CheckpointError) as info:
            ckpt.restore(template)
        message = str(info.value)
        assert "intact" in message and "another version of jaxrl" in message, message
        assert detail in message and "corrupt" not in message and "delete" not in message
    assert ckpt.all_steps() == [1, 2]  # nothing was touched
    _assert_tree_equal(ckpt.restore(_tree(0))[0], _tree(2))


def test_failed_save_keeps_last_good_checkpoint(two_checkpoints):
    ckpt, directory = two_checkpoints
    # The array state is written first; the metadata then fails to serialize mid-save.
    with pytest.raises(
        CheckpointError, match="Could not write the checkpoint of step 3.*not JSON.*step 2"
    ):
        ckpt.save(3, _tree(3), {"step": 3, "unserializable": object()})
    assert not [p for p in os.listdir(directory) if "tmp" in p]  # the partial write is removed
    for c in (ckpt, Checkpointer(directory)):
        assert c.latest_step() == 2
        assert c.all_steps() == [1, 2]
        state, meta = c.restore(_tree(0))
        _assert_tree_equal(state, _tree(2))
        assert meta["step"] == 2
    # The next save works and becomes the newest.
    ckpt.save(3, _tree(3), {"step": 3})
    assert ckpt.latest_step() == 3
    _assert_tree_equal(ckpt.restore(_tree(0))[0], _tree(3))


def test_killed_mid_write_leftover_is_ignored(two_checkpoints):
    _, directory = two_checkpoints
    # A process killed mid-write leaves only orbax's temporary directory behind.
    leftover = directory / "3.orbax-checkpoint-tmp"
    (leftover / "state.orbax-checkpoint-tmp").mkdir(parents=True)
    (leftover / "state.orbax-checkpoint-tmp" / "manifest.ocdbt").write_bytes(b"partial")
    ckpt = Checkpointer(directory)
    assert ckpt.latest_step() == 2
    state, _ = ckpt.restore(_tree(0))
    _assert_tree_equal(state, _tree(2))


# Orbax abandons the reads of the other arrays when one fails; their coroutines are reported as
# "exception ignored" on garbage collection (noise on stderr, not an error of the restore).
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_restore_into_template_of_different_shape(two_checkpoints):
    ckpt, directory = two_checkpoints
    template = _tree(0)
    template["params"]["w"] = jnp.zeros((3, 3), jnp.float32)
    with pytest.raises(CheckpointError) as info:
        ckpt.restore(template)
    assert os.path.join(os.path.abspath(directory), "2") in str(info.value)
    assert "(3, 3)" in str(info.value) and "(2, 3)" in str(info.value)
    # The checkpoint itself is fine: the right template still restores it.
    _assert_tree_equal(ckpt.restore(_tree(0))[0], _tree(2))


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_restore_into_template_with_missing_leaf(two_checkpoints):
    ckpt, _ = two_checkpoints
    template = _tree(0)
    template["extra"] = jnp.zeros(2)
    with pytest.raises(CheckpointError):
        ckpt.restore(template)


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_failed_restore_of_older_step_does_not_point_to_newer_step(two_checkpoints):
    ckpt, _ = two_checkpoints
    template = _tree(0)
    template["params"]["w"] = jnp.zeros((3, 3), jnp.float32)
    with pytest.raises(CheckpointError) as info:
        ckpt.restore(template, step=1)
    assert "step 2" not in str(info.value)


def test_checkpoint_round_trips_zero_size_arrays(tmp_path):
    # MJX states hold zero-size arrays (e.g. no actuator activations); orbax cannot store them.
    tree = {**_tree(2), "act": jnp.zeros((0,), jnp.float32), "rows": jnp.zeros((3, 0))}
    ckpt = Checkpointer(tmp_path / "ck")
    ckpt.save(1, tree, {"step": 1})
    template = {**_tree(0), "act": jnp.zeros((0,), jnp.float32), "rows": jnp.zeros((3, 0))}
    got, meta = ckpt.restore(template)
    _assert_tree_equal(got, _tree(2))
    assert got["act"].shape == (0,) and got["rows"].shape == (3, 0) and meta["step"] == 1
