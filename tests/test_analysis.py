"""`jaxrl plot` for seeds and sweeps: IQM, bootstrap CIs, run discovery, grouping, the command."""

import json
import os

import numpy as np
import pytest
from scipy.stats import trim_mean

from jaxrl import cli
from jaxrl.analysis.curves import (
    bootstrap_ci,
    find_runs,
    group_runs,
    iqm,
    learning_curve,
    load_run,
    output_paths,
)
from jaxrl.cli.plot import plot_command

# ---------------------------------------------------------------------------- IQM


@pytest.mark.parametrize(
    "values, expected",
    [
        ([1, 2, 3, 4, 5, 6, 7, 8], 4.5),  # mean of 3, 4, 5, 6
        ([8, 1, 7, 2, 6, 3, 5, 4], 4.5),  # order does not matter
        ([1, 2, 3, 100], 2.5),  # n=4: one cut from each end
        ([1, 2, 3, 4, 100], 3.0),  # n=5: int(1.25) = 1 cut from each end
        ([1, 2, 3, 4, 5, 6, 1000], 4.0),  # n=7: int(1.75) = 1
        ([1, 2, 3, 4, 5, 6, 7, 8, 1000], 5.0),  # n=9: int(2.25) = 2, mean of 3..7
        ([1, 2, 9], 4.0),  # n=3: nothing cut
        ([7.5], 7.5),
    ],
)
def test_iqm_hand_values(values, expected):
    assert iqm(values) == pytest.approx(expected, abs=1e-12)


def test_iqm_matches_scipy_trim_mean_for_every_size():
    rng = np.random.default_rng(0)
    for n in range(1, 14):
        x = rng.normal(size=n) ** 3  # skewed, so a wrong cut changes the result
        assert iqm(x) == pytest.approx(trim_mean(x, 0.25), abs=1e-12), n


def test_iqm_empty_raises():
    with pytest.raises(ValueError, match="empty"):
        iqm([])


# ---------------------------------------------------------------------------- bootstrap


def test_bootstrap_two_values_hand_computed():
    # Resampled means of [0, 1] are 0, 0.5, 1 with probabilities 1/4, 1/2, 1/4, so the 2.5% and
    # 97.5% quantiles of 2000 resamples are 0 and 1.
    point, low, high = bootstrap_ci([0.0, 1.0], np.mean, n_boot=2000, seed=0)
    assert (point, low, high) == (0.5, 0.0, 1.0)


def test_bootstrap_constant_sample_has_zero_width():
    point, low, high = bootstrap_ci([3.0] * 6, iqm)
    assert low == high == point == 3.0


def test_bootstrap_single_run_is_the_point():
    assert bootstrap_ci([-42.5], iqm) == (-42.5, -42.5, -42.5)


def test_bootstrap_contains_point_and_is_deterministic():
    x = np.random.default_rng(1).normal(10.0, 2.0, size=20)
    point, low, high = bootstrap_ci(x, iqm, seed=3)
    assert point == iqm(x)
    assert low < point < high
    assert bootstrap_ci(x, iqm, seed=3) == (point, low, high)
    assert bootstrap_ci(x, iqm, seed=4) != (point, low, high)


def test_bootstrap_narrows_with_more_runs():
    rng = np.random.default_rng(2)
    small, large = rng.normal(size=10), rng.normal(size=1000)
    _, lo_s, hi_s = bootstrap_ci(small, np.mean, n_boot=500)
    _, lo_l, hi_l = bootstrap_ci(large, np.mean, n_boot=500)
    # The width shrinks like 1/sqrt(n): about 10x here; 3x leaves a wide margin.
    assert (hi_l - lo_l) < (hi_s - lo_s) / 3


def test_bootstrap_interval_has_the_asked_coverage():
    # For the mean of 400 draws the bootstrap distribution is close to normal with the sample's
    # standard error, so a 95% interval is about +-1.96 se wide (a 90% one would be +-1.645).
    x = np.random.default_rng(5).normal(size=400)
    se = x.std() / np.sqrt(x.size)
    for confidence, z in ((0.95, 1.96), (0.8, 1.2816)):
        _, low, high = bootstrap_ci(x, np.mean, confidence=confidence)
        assert (high - low) / 2 / se == pytest.approx(z, rel=0.08), confidence


def test_bootstrap_array_statistic_per_step():
    table = np.array([[0.0, 10.0], [2.0, 10.0], [4.0, 10.0]])  # 3 runs x 2 steps
    mean, low, high = bootstrap_ci(table, lambda v: v.mean(axis=0))
    np.testing.assert_allclose(mean, [2.0, 10.0])
    assert low.shape == high.shape == (2,)
    assert low[0] < 2.0 < high[0]
    assert low[1] == high[1] == 10.0  # every run agrees at the second step


@pytest.mark.parametrize(
    "kwargs, match",
    [({"n_boot": 0}, "n_boot"), ({"confidence": 1.0}, "confidence")],
)
def test_bootstrap_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        bootstrap_ci([1.0, 2.0], np.mean, **kwargs)
    with pytest.raises(ValueError, match="at least one run"):
        bootstrap_ci([], np.mean)


# ---------------------------------------------------------------------------- run directories


def write_run(path, *, seed, evals, agent="sac", env="Pendulum-v1", **agent_config):
    """A run directory as `jaxrl train` leaves it: config.json and metrics.csv (by hand)."""
    os.makedirs(path, exist_ok=True)
    config = {
        "agent": agent,
        "env": env,
        "dataset": None,
        "seed": seed,
        "train": {
            "env": env,
            "seed": seed,
            "out": str(path),
            "total_steps": 3000,
            "eval_every": 1000,
            "progress": seed % 2 == 0,  # bookkeeping that must not split a group
            "tensorboard": True,
            "wandb_project": None,
        },
        "agent_config": {"hidden_dims": [256, 256], **agent_config},
        "versions": {"jax": f"0.{seed}"},
    }
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(config, f)
    lines = ["step,eval_return,critic/loss"]
    for step, ret in evals:
        lines.append(f"{step},{ret},")
        lines.append(f"{step + 500},,0.25")  # a training row: eval_return left empty
    with open(os.path.join(path, "metrics.csv"), "w") as f:
        f.write("\n".join(lines) + "\n")


A = {"actor_lr": 0.0003, "tau": 0.005}
B = {"actor_lr": 0.0001, "tau": 0.01}
# Final returns: A -> IQM 30 (n=3: nothing cut), mean 30, median 20.
#                B -> IQM mean(40, 50, 90) = 60, mean -144, median 50.
FINALS_A = [10.0, 20.0, 60.0]
FINALS_B = [-1000.0, 40.0, 50.0, 90.0, 100.0]


def make_sweep(root):
    """A sweep root with aggregate files and member runs of two configs (A: 3 seeds, B: 5)."""
    os.makedirs(root)
    with open(os.path.join(root, "config.json"), "w") as f:
        json.dump({"agent": "sac", "env": "Pendulum-v1"}, f)
    with open(os.path.join(root, "summary.json"), "w") as f:
        json.dump({"final_eval_return_mean": 0.0}, f)
    for seed, final in enumerate(FINALS_A):
        evals = [(0, -100.0 + seed), (1000, 2.0 * seed), (2000, final)]
        if seed == 2:
            evals = [(0, -98.0), (1000, 4.0), (2000, 7.0), (3000, final)]  # one more evaluation
        write_run(root / "a" / f"s{seed}", seed=seed, evals=evals, **A)
    for seed, final in enumerate(FINALS_B):
        write_run(root / "b" / f"s{seed}", seed=seed, evals=[(0, 0.0), (2000, final)], **B)


def test_find_runs_skips_aggregate_roots_and_dedupes(tmp_path):
    make_sweep(tmp_path / "sweep")
    runs = find_runs([str(tmp_path / "sweep"), str(tmp_path / "sweep" / "a" / "s1")])
    assert len(runs) == 8  # the root holds no metrics.csv; a/s1 is not listed twice
    assert str(tmp_path / "sweep") not in runs
    assert find_runs([str(tmp_path / "sweep" / "b" / "s3")]) == [str(tmp_path / "sweep/b/s3")]


def test_find_runs_errors_name_the_problem(tmp_path):
    (tmp_path / "empty" / "sub").mkdir(parents=True)
    with pytest.raises(ValueError, match=r"No runs under .*empty.*metrics\.csv"):
        find_runs([str(tmp_path / "empty")])
    with pytest.raises(ValueError, match="not a directory"):
        find_runs([str(tmp_path / "missing")])


def test_grouping_two_configs_three_seeds(tmp_path):
    for i, cfg in enumerate((A, B)):
        for seed in range(3):
            write_run(tmp_path / f"c{i}s{seed}", seed=seed, evals=[(0, 1.0)], **cfg)
    runs = [load_run(p) for p in find_runs([str(tmp_path)])]
    groups = group_runs(runs)
    labels = {g.label: len(g.runs) for g in groups}
    assert labels == {"actor_lr=0.0003 tau=0.005": 3, "actor_lr=0.0001 tau=0.01": 3}
    assert groups[0].fields == {"actor_lr": 0.0003, "tau": 0.005}
    assert {os.path.basename(r.path) for r in groups[0].runs} == {"c0s0", "c0s1", "c0s2"}


def test_one_group_is_labelled_by_agent_and_env(tmp_path):
    for seed in range(3):
        write_run(tmp_path / f"s{seed}", seed=seed, evals=[(0, 1.0)], **A)
    groups = group_runs([load_run(p) for p in find_runs([str(tmp_path)])])
    assert [(g.label, len(g.runs)) for g in groups] == [("sac on Pendulum-v1", 3)]


def test_a_seed_recorded_inside_a_settings_block_does_not_split_the_seeds(tmp_path):
    # Peer libraries' runs record their constructor's kwargs, the seed among them, under
    # settings; three seeds of one configuration are still one group, the others' another.
    for seed in range(3):
        write_run(tmp_path / f"s{seed}", seed=seed, evals=[(0, 1.0)], sbx={"seed": seed}, **A)
        write_run(tmp_path / f"b{seed}", seed=seed, evals=[(0, 1.0)], sbx={"seed": seed}, **B)
    groups = group_runs([load_run(p) for p in find_runs([str(tmp_path)])])
    assert sorted(len(g.runs) for g in groups) == [3, 3]
    assert {g.label for g in groups} == {"actor_lr=0.0003 tau=0.005", "actor_lr=0.0001 tau=0.01"}


def test_agents_with_different_configs_are_labelled_by_agent(tmp_path):
    # Fields only one agent has (policy_noise, num_qs) do not make the label; the agent does.
    write_run(tmp_path / "sac", seed=0, evals=[(0, 1.0)], actor_lr=0.0003, num_qs=2)
    write_run(
        tmp_path / "td3", seed=0, evals=[(0, 1.0)], agent="td3", actor_lr=0.0003, policy_noise=0.2
    )
    groups = group_runs([load_run(p) for p in find_runs([str(tmp_path)])])
    assert sorted(g.label for g in groups) == ["agent=sac", "agent=td3"]


def test_learning_curve_uses_common_steps(tmp_path):
    make_sweep(tmp_path / "sweep")
    runs = [load_run(p) for p in find_runs([str(tmp_path / "sweep" / "a")])]
    (group,) = group_runs(runs)
    curve = learning_curve(group)
    np.testing.assert_array_equal(curve.steps, [0, 1000, 2000])  # s2's step 3000 is not shared
    np.testing.assert_allclose(
        curve.mean, [(-100 - 99 - 98) / 3, (0 + 2 + 4) / 3, (10 + 20 + 7) / 3]
    )
    assert np.all(curve.low <= curve.mean) and np.all(curve.mean <= curve.high)
    assert np.all(curve.low < curve.high)


# ---------------------------------------------------------------------------- the command


def test_plot_command_writes_figure_and_table(tmp_path, capsys):
    make_sweep(tmp_path / "sweep")
    prefix = str(tmp_path / "out" / "sweep")
    paths = plot_command([str(tmp_path / "sweep"), "--out", prefix, "--boot", "500"])
    assert paths == {"png": prefix + ".png", "md": prefix + ".md", "json": prefix + ".json"}
    with open(paths["png"], "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"

    with open(paths["json"]) as f:
        groups = json.load(f)["groups"]
    b, a = groups  # sorted by IQM, best first (by mean, A would come first)
    assert b["label"] == "actor_lr=0.0001 tau=0.01" and a["label"] == "actor_lr=0.0003 tau=0.005"
    assert (b["n_runs"], a["n_runs"]) == (5, 3)
    assert b["iqm"] == pytest.approx(60.0) and a["iqm"] == pytest.approx(30.0)
    assert b["mean"] == pytest.approx(-144.0) and a["mean"] == pytest.approx(30.0)
    assert b["median"] == pytest.approx(50.0) and a["median"] == pytest.approx(20.0)
    for g in groups:
        assert g["iqm_low"] <= g["iqm"] <= g["iqm_high"]
    assert (a["last_step_min"], a["last_step_max"]) == (2000, 3000)

    with open(paths["md"]) as f:
        table = f.read()
    rows = [line for line in table.splitlines() if line.startswith("| actor_lr")]
    assert rows[0].startswith("| actor_lr=0.0001 tau=0.01 | 5 | 2000 | -144.00 | 60.00 [")
    assert rows[0].endswith("| 50.00 |")
    assert rows[1].startswith("| actor_lr=0.0003 tau=0.005 | 3 | 2000-3000 | 30.00 | 30.00 [")
    out = capsys.readouterr().out
    assert table in out and paths["png"] in out


def test_plot_command_is_reproducible_for_a_seed(tmp_path):
    make_sweep(tmp_path / "sweep")
    results = []
    for name in ("x", "y"):
        paths = plot_command(
            [str(tmp_path / "sweep"), "--out", str(tmp_path / name), "--boot", "300"]
        )
        with open(paths["md"]) as f:
            results.append(f.read())
    assert results[0] == results[1]


def test_cli_keeps_png_out_and_reports_bad_input(tmp_path, capsys):
    make_sweep(tmp_path / "sweep")
    png = tmp_path / "figs" / "curves.png"
    cli.main(
        [
            "plot",
            str(tmp_path / "sweep" / "a"),
            str(tmp_path / "sweep" / "b"),
            "--out",
            str(png),
            "--boot",
            "200",
        ]
    )
    assert png.exists() and (tmp_path / "figs" / "curves.md").exists()
    (tmp_path / "nothing").mkdir()
    with pytest.raises(SystemExit) as exc:
        cli.main(["plot", str(tmp_path / "nothing")])
    assert exc.value.code == 2
    assert "No runs under" in capsys.readouterr().err


def test_plot_command_rejects_runs_without_evaluations(tmp_path):
    run = tmp_path / "fresh"
    run.mkdir()
    (run / "metrics.csv").write_text("step,critic/loss\n500,0.3\n")
    with pytest.raises(ValueError, match="has an evaluation yet"):
        plot_command([str(run)])


def test_output_paths():
    assert output_paths("runs/c.png") == ("runs/c.png", "runs/c.md", "runs/c.json")
    assert output_paths("plots/") == tuple(
        os.path.join("plots", "learning_curves") + e for e in (".png", ".md", ".json")
    )
    assert output_paths("sweep") == ("sweep.png", "sweep.md", "sweep.json")


def test_run_without_config_is_its_own_group(tmp_path):
    write_run(tmp_path / "a0", seed=0, evals=[(0, 1.0)], **A)
    write_run(tmp_path / "a1", seed=1, evals=[(0, 2.0)], **A)
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "metrics.csv").write_text("step,eval_return\n0,5\n1000,6\n")
    groups = group_runs([load_run(p) for p in find_runs([str(tmp_path)])])
    assert {(g.label, len(g.runs)) for g in groups} == {
        ("sac on Pendulum-v1", 2),
        (str(tmp_path / "old"), 1),
    }
