"""End to end from the command line: `jaxrl dataset collect`, `dataset info`, `train --dataset`."""

from __future__ import annotations

import csv
import json
import os

import pytest

from jaxrl.cli import main


def _run_cli(argv, capsys):
    main(argv)
    return capsys.readouterr().out


@pytest.mark.slow
def test_collect_then_train_iql_from_the_command_line(tmp_path, capsys):
    from offline_utils import pendulum_policies

    pol = pendulum_policies()
    data = str(tmp_path / "pendulum-medium.hdf5")
    out = _run_cli(
        [
            "dataset",
            "collect",
            "--env",
            "Pendulum-v1",
            "--policy",
            pol["medium"],
            "--kind",
            "medium",
            "--steps",
            "2000",
            "--seed",
            "3",
            "--expert-policy",
            pol["expert"],
            "--out",
            data,
        ],
        capsys,
    )
    assert "wrote" in out and os.path.exists(data)
    info = json.loads(_run_cli(["dataset", "info", data], capsys))
    assert info["transitions"] == 2000 and info["episodes"] == 10
    assert info["env_id"] == "Pendulum-v1" and info["metadata"]["kind"] == "medium"
    assert info["ref_min_return"] < info["return_mean"] < info["ref_max_return"]

    run = str(tmp_path / "run")
    argv = [
        "train",
        "iql",
        "--dataset",
        data,
        "--out",
        run,
        "--total-steps",
        "600",
        "--eval-every",
        "300",
        "--log-every",
        "300",
        "--eval-episodes",
        "2",
        "--hidden-dims",
        "32",
        "32",
        "--no-progress",
        "--no-tensorboard",
    ]
    _run_cli(argv, capsys)
    summary = json.load(open(os.path.join(run, "summary.json")))
    config = json.load(open(os.path.join(run, "config.json")))
    assert config["env"] == "Pendulum-v1"  # taken from the dataset's metadata
    assert config["dataset"] == data and config["agent_config"]["max_steps"] == 600
    assert summary["completed"] and summary["total_steps"] == 600
    lo, hi = info["ref_min_return"], info["ref_max_return"]
    expected = 100 * (summary["final_eval_return_mean"] - lo) / (hi - lo)
    assert summary["normalized_score"] == pytest.approx(expected)
    rows = list(csv.DictReader(open(os.path.join(run, "metrics.csv"))))
    assert [r["step"] for r in rows] == ["300", "600"]
    assert all(r["eval_normalized_score"] for r in rows)
    assert os.path.exists(os.path.join(run, "learning_curve.png"))

    # Resume to a longer budget from the checkpoint, then evaluate the run directory.
    _run_cli([*argv[:7], "900", *argv[8:]], capsys)
    rows = list(csv.DictReader(open(os.path.join(run, "metrics.csv"))))
    assert [r["step"] for r in rows] == ["300", "600", "900"]
    result = json.loads(_run_cli(["eval", run, "--episodes", "2"], capsys).strip())
    assert result["step"] == 900 and result["normalized_score"] is not None


def test_offline_command_line_errors(tmp_path, capsys):
    from jaxrl.data import Dataset, save_d4rl

    with pytest.raises(SystemExit) as exc:
        main(["train", "iql", "--env", "Pendulum-v1", "--total-steps", "10"])
    assert exc.value.code == 2
    assert "offline agent: pass --dataset" in capsys.readouterr().err

    import numpy as np

    rng = np.random.default_rng(0)
    obs = rng.normal(size=(50, 3)).astype(np.float32)
    ds = Dataset(
        obs,
        rng.uniform(-2, 2, (50, 1)),
        rng.normal(size=50),
        obs,
        np.zeros(50),
        np.zeros(50),
        env_id="Pendulum-v1",
    )
    path = save_d4rl(ds, tmp_path / "p.hdf5")
    with pytest.raises(SystemExit):
        main(["train", "ppo", "--dataset", path, "--total-steps", "10"])
    assert "ppo is on-policy and cannot reuse a dataset" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["train", "rlpd", "--dataset", path, "--offline-steps", "5", "--online-steps", "9"])
    assert "rlpd is an online agent: it has no offline phase" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["train", "sac", "--env", "Pendulum-v1", "--online-steps", "10"])
    assert "without a dataset use --total-steps" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["train", "bc", "--dataset", path, "--env", "HalfCheetah-v5", "--total-steps", "10"])
    err = capsys.readouterr().err
    assert "observations have 3 dimensions but HalfCheetah-v5 has 17" in err
    with pytest.raises(SystemExit):
        main(["dataset", "collect", "--env", "Pendulum-v1", "--kind", "expert", "--out", "x.h5"])
    assert "needs --policy" in capsys.readouterr().err


def test_dataset_info_takes_the_env_when_the_file_names_none(tmp_path, capsys):
    import numpy as np

    from jaxrl.data import Dataset, save_d4rl

    # Two 3-step episodes with returns 3 and 6, no env id in the file (as in D4RL's own files).
    obs = np.zeros((6, 4), np.float32)
    rewards = np.array([1, 1, 1, 2, 2, 2], np.float32)
    ends = np.array([0, 0, 1, 0, 0, 1], bool)
    ds = Dataset(obs, np.zeros((6, 2)), rewards, obs, np.zeros(6), ends)
    path = save_d4rl(ds, tmp_path / "d.hdf5")
    info = json.loads(_run_cli(["dataset", "info", path], capsys))
    assert info["env_id"] is None and info["normalized_score_mean"] is None
    info = json.loads(_run_cli(["dataset", "info", path, "--env", "Hopper-v5"], capsys))
    lo, hi = -20.272305, 3234.3  # D4RL's hopper references
    assert info["episodes"] == 2 and info["return_mean"] == pytest.approx(4.5)
    assert info["normalized_score_mean"] == pytest.approx(100 * (4.5 - lo) / (hi - lo))


def test_env_flag_scores_a_file_without_env_and_evals_land_on_their_steps(tmp_path, capsys):
    import numpy as np

    from jaxrl.data import Dataset, save_d4rl
    from jaxrl.run.collect import collect

    # Random Hopper-v5 data written without an env id, as D4RL's own files are.
    ds = collect("Hopper-v5", "random", 300, seed=0)
    bare = Dataset(ds.observations, ds.actions, ds.rewards, ds.next_observations, ds.terminals,
                   ds.timeouts)  # fmt: skip
    path = save_d4rl(bare, tmp_path / "hopper-random.hdf5")
    run = str(tmp_path / "run")
    main([
        "train", "bc", "--dataset", path, "--env", "Hopper-v5", "--out", run,
        "--total-steps", "60", "--log-every", "20", "--eval-every", "30", "--eval-episodes", "1",
        "--hidden-dims", "16", "16", "--batch-size", "32", "--no-progress", "--no-tensorboard",
    ])  # fmt: skip
    capsys.readouterr()
    rows = list(csv.DictReader(open(os.path.join(run, "metrics.csv"))))
    assert [r["step"] for r in rows] == ["20", "30", "40", "60"]
    assert [bool(r["eval_return"]) for r in rows] == [False, True, False, True]
    rates = [float(r["time/updates_per_s"]) for r in rows]
    assert all(0 < x < 1e6 for x in rates), rates
    summary = json.load(open(os.path.join(run, "summary.json")))
    lo, hi = -20.272305, 3234.3  # D4RL hopper, from --env since the file names no env
    ret = summary["final_eval_return_mean"]
    assert summary["normalized_score"] == pytest.approx(100 * (ret - lo) / (hi - lo))
    assert float(rows[-1]["eval_normalized_score"]) == pytest.approx(summary["normalized_score"])
    assert np.isfinite(ret)


def test_train_fql_from_the_command_line_and_diffusion_agents_help(tmp_path, capsys):
    from offline_utils import pendulum_dataset

    data = pendulum_dataset("medium").source
    run = str(tmp_path / "fql")
    argv = [
        "train", "fql", "--dataset", data, "--out", run, "--total-steps", "40",
        "--eval-every", "40", "--log-every", "20", "--eval-episodes", "2", "--no-progress",
        "--no-tensorboard", "--actor-hidden-dims", "16", "16", "--critic-hidden-dims", "16", "16",
        "--batch-size", "32", "--alpha", "3.0",
    ]  # fmt: skip
    _run_cli(argv, capsys)
    summary = json.load(open(os.path.join(run, "summary.json")))
    config = json.load(open(os.path.join(run, "config.json")))
    assert summary["completed"] and summary["agent"] == "fql" and summary["total_steps"] == 40
    assert summary["normalized_score"] is not None
    assert config["agent_config"]["alpha"] == 3.0 and config["env"] == "Pendulum-v1"
    result = json.loads(_run_cli(["eval", run, "--episodes", "2"], capsys).strip())
    assert result["step"] == 40 and result["normalized_score"] is not None

    # The diffusion agents take the same command line (their training runs in the learning tests).
    capsys.readouterr()
    with pytest.raises(SystemExit):
        main(["train", "diffusion-ql", "--help"])
    help_text = capsys.readouterr().out
    assert "--eta" in help_text and "--diffusion-steps" in help_text
