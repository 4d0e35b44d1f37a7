"""``jaxrl dataset recipe`` (``jaxrl.run.recipe``): D4RL's datasets from one expert SAC run.

One tiny recipe on InvertedPendulum-v5 (400 env steps, an evaluation every 100) is made once per
module; the tests check it against its own run directory, remake it elsewhere from a run killed
halfway (same bytes), rerun it in place (nothing retrained or rewritten) and drive a Pendulum-v1
recipe from the command line.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from jaxrl.agents import SACConfig
from jaxrl.cli import main
from jaxrl.data import load_dataset
from jaxrl.errors import DatasetError
from jaxrl.run.recipe import EXPERT_DIR, d4rl_recipe, eval_curve, expert_point, medium_point
from jaxrl.run.recipe_files import RECORD_FILE, place_record, record_departure

ENV = "InvertedPendulum-v5"  # MuJoCo: a checkpoint holds the simulator state (exact resume)
STEPS = 400
KINDS = ("medium", "medium-replay", "expert", "medium-expert")
OPTIONS = dict(
    seed=3,
    kinds=KINDS,
    dataset_steps=300,
    eval_every=100,
    eval_episodes=2,
    ref_episodes=2,
    agent_config=SACConfig(hidden_dims=(32, 32), learning_starts=100, batch_size=64),
    progress=False,
)


def _recipe(out: str) -> dict:
    return d4rl_recipe(ENV, out, STEPS, **OPTIONS)


@pytest.fixture(scope="module")
def made(tmp_path_factory) -> tuple[str, dict]:
    out = str(tmp_path_factory.mktemp("recipe") / "pendulum")
    return out, _recipe(out)


def _sha256(path: str) -> str:
    import hashlib

    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def test_expert_point_is_the_best_checkpointed_eval():
    # A late collapse (Hopper-v5: 3,187 at 290k, 1,244 at 300k) does not make the expert.
    curve = {100: 300.0, 200: 3187.0, 300: 1244.0, 400: 3187.0}
    assert expert_point(curve, [100, 200, 300, 400], 400) == 400  # tie: the later step
    assert expert_point(curve, [100, 200, 300], 400) == 200  # only kept checkpoints
    assert expert_point(curve, [], 400) == 400  # none kept: the end of the run
    # The first evaluation is never the expert: the medium policy must come before it.
    assert expert_point({100: 9.0, 200: 5.0, 300: 1.0}, [100, 200, 300], 300) == 200


def test_medium_point_is_the_checkpointed_eval_nearest_the_target():
    curve = {100: -1200.0, 200: -900.0, 300: -700.0, 400: -500.0, 500: -150.0}
    assert medium_point(curve, -800.0, [100, 200, 300, 400, 500], 500) == 200  # tie: earlier
    assert medium_point(curve, -790.0, [100, 200, 300, 400, 500], 500) == 300
    assert medium_point(curve, -200.0, [100, 200, 300, 400, 500], 500) == 400  # never the end
    assert medium_point(curve, -820.0, [100, 400, 500], 500) == 400  # only kept checkpoints
    with pytest.raises(ValueError, match="no checkpointed evaluation before step 500"):
        medium_point(curve, -820.0, [500], 500)


def test_recipe_follows_d4rl_from_its_own_run(made):
    out, manifest = made
    run = os.path.join(out, EXPERT_DIR)
    curve = eval_curve(run)
    assert sorted(curve) == [100, 200, 300, 400]
    # Every evaluation kept its checkpoint, so the medium point is any evaluation before the end.
    assert sorted(int(s) for s in os.listdir(os.path.join(run, "checkpoints"))) == [
        100,
        200,
        300,
        400,
    ]
    best = max(sorted(curve)[1:], key=lambda s: (curve[s], s))  # the best after the first
    expert, random = curve[best], manifest["random_return"]
    target = random + (expert - random) / 3
    nearest = min((s for s in curve if s < best), key=lambda s: (abs(curve[s] - target), s))
    assert manifest["expert_step"] == best and manifest["expert_return"] == expert
    assert manifest["medium_target_return"] == target
    assert manifest["medium_step"] == nearest and manifest["medium_return"] == curve[nearest]
    assert (manifest["ref_min_return"], manifest["ref_max_return"]) == (random, expert)
    with open(os.path.join(out, "manifest.json")) as f:
        assert json.load(f) == manifest
    data = {k: load_dataset(os.path.join(out, manifest["files"][k]["path"])) for k in KINDS}
    for kind, ds in data.items():
        entry = manifest["files"][kind]
        assert entry["sha256"] == _sha256(ds.source)
        assert entry["transitions"] == len(ds) and entry["episodes"] == ds.episode_returns().size
        assert entry["return_mean"] == pytest.approx(ds.episode_returns().mean())
        assert ds.ref_returns == (random, expert) and ds.metadata["kind"] == kind
        assert ds.info()["normalized_score_mean"] == pytest.approx(
            100 * (entry["return_mean"] - random) / (expert - random)
        )
    assert data["medium"].metadata["policy_step"] == nearest
    assert data["expert"].metadata["policy_step"] == best
    assert len(data["medium"]) == len(data["expert"]) == 300
    # medium-replay: the buffer at the medium point, every transition seen until then.
    assert len(data["medium-replay"]) == nearest
    assert data["medium-replay"].metadata["policy_step"] == nearest
    both = data["medium-expert"]
    np.testing.assert_array_equal(
        both.observations,
        np.concatenate([data["medium"].observations, data["expert"].observations]),
    )


def test_recipe_is_deterministic_and_resumes_a_killed_expert_run(made, tmp_path):
    from jaxrl.run.recipe import expert_config
    from jaxrl.run.train import train

    out, manifest = made
    # A recipe killed halfway through training: its expert run holds steps 100 and 200.
    again = str(tmp_path / "again")
    cfg = expert_config(ENV, os.path.join(again, EXPERT_DIR), STEPS // 2, 3, 100, 2)
    train("sac", cfg, OPTIONS["agent_config"])
    again = _recipe(again)
    assert again == manifest  # every file's sha256 included
    assert {k: v["sha256"] for k, v in again["files"].items()} == {
        k: _sha256(os.path.join(out, v["path"])) for k, v in manifest["files"].items()
    }


def test_rerun_trains_nothing_and_keeps_finished_files(made):
    out, manifest = made
    run = os.path.join(out, EXPERT_DIR)
    watched = [os.path.join(out, v["path"]) for v in manifest["files"].values()]
    watched += [os.path.join(run, n) for n in ("metrics.csv", "summary.json", "config.json")]
    before = {p: os.stat(p).st_mtime_ns for p in watched}
    checkpoints = sorted(os.listdir(os.path.join(run, "checkpoints")))
    assert _recipe(out) == manifest
    assert {p: os.stat(p).st_mtime_ns for p in watched} == before
    assert sorted(os.listdir(os.path.join(run, "checkpoints"))) == checkpoints
    with open(os.path.join(run, "summary.json")) as f:
        assert json.load(f)["total_steps"] == STEPS
    # A file that is missing (or not from this recipe) is made again, the same bytes.
    expert = watched[2]
    os.remove(expert)
    assert _recipe(out) == manifest and _sha256(expert) == manifest["files"]["expert"]["sha256"]
    assert all(os.stat(p).st_mtime_ns == before[p] for p in watched if p != expert)


def test_a_recipe_following_its_record_trains_only_to_the_medium_point(made, tmp_path, capsys):
    out, manifest = made
    follow = str(tmp_path / "follow")
    place_record(os.path.join(out, "manifest.json"), follow)
    options = {**OPTIONS, "kinds": ("medium", "medium-replay")}
    short = d4rl_recipe(ENV, follow, STEPS, **options)
    # Trained to the medium point only, yet the same files: the record's returns were taken.
    run = os.path.join(follow, EXPERT_DIR)
    steps = sorted(int(s) for s in os.listdir(os.path.join(run, "checkpoints")))
    assert steps[-1] == manifest["medium_step"] < STEPS
    assert short["followed_record"] == {"file": RECORD_FILE, "expert_trained_to": steps[-1]}
    for kind in options["kinds"]:
        assert short["files"][kind] == manifest["files"][kind]  # sha256 included
    same = ("expert_step", "expert_return", "random_return", "medium_step", "medium_return")
    assert all(short[k] == manifest[k] for k in (*same, "medium_target_return"))
    # A record the run does not follow (another CPU's): with strict_record the recipe stops
    # there; without, the expert trains its whole budget, resuming from the medium point, and
    # the recipe measures everything itself.
    with open(os.path.join(follow, RECORD_FILE)) as f:
        record = json.load(f)
    assert record_departure(follow) is None
    with open(os.path.join(follow, RECORD_FILE), "w") as f:
        json.dump({**record, "medium_return": record["medium_return"] + 1.0}, f)
    m = manifest["medium_step"]
    assert f"evaluates {manifest['medium_return']} at step {m}" in record_departure(follow)
    with pytest.raises(DatasetError, match=f"at step {m} .*leave out --strict-record"):
        d4rl_recipe(ENV, follow, STEPS, **options, strict_record=True)
    assert max(int(s) for s in os.listdir(os.path.join(run, "checkpoints"))) == m
    whole = d4rl_recipe(ENV, follow, STEPS, **options)
    assert "another path" in capsys.readouterr().out
    assert "followed_record" not in whole and whole["files"] == short["files"]
    assert max(int(s) for s in os.listdir(os.path.join(run, "checkpoints"))) == STEPS


def test_a_record_of_other_settings_or_none_is_refused(made, tmp_path, capsys):
    out, _ = made
    argv = ["dataset", "recipe", "--env", ENV, "--out", str(tmp_path / "r"), "--seed", "4"]
    for record, message in [
        (str(tmp_path / "missing.json"), "missing.json: no manifest there"),
        (os.path.join(out, "manifest.json"), "other settings: seed 3 (asked: 4), expert_steps"),
    ]:
        with pytest.raises(SystemExit) as exit_info:
            main([*argv, "--record", record, "--no-progress"])
        err = capsys.readouterr().err
        assert exit_info.value.code == 2 and err.count("\n") == 1 and message in err


def test_command_line_prints_the_manifest(tmp_path, capsys):
    out = str(tmp_path / "cli")
    argv = ["dataset", "recipe", "--env", "Pendulum-v1", "--out", out, "--expert-steps", "200"]
    argv += ["--eval-every", "100", "--eval-episodes", "1", "--ref-episodes", "1"]
    main([*argv, "--dataset-steps", "200", "--kinds", "medium", "--no-progress"])
    text = capsys.readouterr().out
    printed = json.loads(text[text.index("{\n") :])  # the last thing printed
    with open(os.path.join(out, "manifest.json")) as f:
        assert printed == json.load(f)
    assert printed["medium_step"] == 100 and list(printed["files"]) == ["medium"]
    main(["dataset", "info", os.path.join(out, printed["files"]["medium"]["path"])])
    info = json.loads(capsys.readouterr().out)
    assert (info["ref_min_return"], info["ref_max_return"]) == (
        printed["random_return"],
        printed["expert_return"],
    )
    assert info["normalized_score_mean"] == pytest.approx(
        printed["files"]["medium"]["normalized_score_mean"]
    )


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--kinds", "medium", "mediocre"], "Unknown dataset kind(s) ['mediocre']; --kinds takes"),
        (["--expert-steps", "0"], "--expert-steps must be positive, got 0."),
        (["--dataset-steps", "-5"], "--dataset-steps must be positive, got -5."),
        (["--expert-steps", "1000", "--eval-every", "600"], "at least twice --eval-every (600)"),
        (["--env", "jax:pendulum"], "'jax:pendulum' is a JAX env. Pass the Gymnasium id"),
    ],
)
def test_bad_requests_exit_2_with_one_line(tmp_path, capsys, options, message):
    out = str(tmp_path / "bad")
    with pytest.raises(SystemExit) as exit_info:
        main(["dataset", "recipe", "--env", "Pendulum-v1", "--out", out, *options])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and message in err
    assert not os.path.exists(out)
