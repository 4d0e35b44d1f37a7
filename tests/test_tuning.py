"""Sweeps (jaxrl.tune): search specs, Optuna studies, Ray Tune trials, PBT's state transplant.

Every trial is a tiny SAC run on Pendulum-v1 (400 env steps, evaluations at 200 and 400). The
learning rates and tau are pytree leaves, so all trials compile the same programs: a persistent
compilation cache (a fresh directory for this module, also handed to the subprocess and the Ray
workers) keeps each trial after the first to about a second of compiling.
"""

import dataclasses
import json
import os
import shutil
import subprocess
import sys

import jax
import numpy as np
import optuna
import pytest
from jax.experimental.compilation_cache import compilation_cache

import jaxrl
from jaxrl import registry
from jaxrl.cli import parse_train_args
from jaxrl.run import train
from jaxrl.tune import (
    Param,
    Sweep,
    apply_settings,
    check_pbt_search,
    optuna_sweep,
    parse_search,
    ray_sweep,
    transplant,
)

ARGS = (
    "--env Pendulum-v1 --num-envs 2 --hidden-dims 32 32 --total-steps 400 --learning-starts 100 "
    "--eval-every 200 --eval-episodes 2 --batch-size 32 --buffer-size 2000 --no-progress "
    "--no-tensorboard"
).split()
SEARCH = ["actor_lr=loguniform:1e-4:1e-3", "tau=uniform:0.002:0.02"]
SAC = registry.get("sac").config
CACHE_OPTIONS = {
    "jax_persistent_cache_min_compile_time_secs": 0,
    "jax_persistent_cache_min_entry_size_bytes": 0,
}


@pytest.fixture(scope="module")
def cache_env(tmp_path_factory):
    """A persistent compilation cache for this module; its env vars for other processes."""
    path = str(tmp_path_factory.mktemp("jax-cache"))
    names = ["jax_compilation_cache_dir", *CACHE_OPTIONS]
    old = {name: getattr(jax.config, name) for name in names}
    for name, value in {"jax_compilation_cache_dir": path, **CACHE_OPTIONS}.items():
        jax.config.update(name, value)
    compilation_cache.reset_cache()  # re-read the settings at the next compile
    yield {
        "JAX_COMPILATION_CACHE_DIR": path,
        "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
        "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0",
    }
    for name, value in old.items():
        jax.config.update(name, value)
    compilation_cache.reset_cache()


def configs():
    return parse_train_args("sac", ARGS)


@pytest.fixture(scope="module")
def study(tmp_path_factory, cache_env):
    """A 4-trial Optuna study in SQLite (the default storage), and its summary."""
    out = tmp_path_factory.mktemp("optuna")
    train_cfg, agent_cfg = configs()
    search = parse_search(SEARCH, SAC)
    summary = optuna_sweep(
        Sweep.of("sac", train_cfg, agent_cfg, search, trials=4, out_root=str(out))
    )
    return out, summary


# ---------------------------------------------------------------------------------- search specs


def test_parse_search_reads_every_distribution():
    search = parse_search(
        [
            "actor_lr=loguniform:1e-5:1e-3",
            "tau=uniform:0.001:0.02",
            "batch_size=int:64:512",
            "num_qs=choice:2,5",
            "hidden_dims=choice:64 64,256 256",
            "policy_q=choice:min,mean",
        ],
        SAC,
    )
    assert search["actor_lr"] == Param("loguniform", 1e-5, 1e-3)
    assert search["tau"] == Param("uniform", 0.001, 0.02)
    assert search["batch_size"] == Param("int", 64, 512)
    assert search["num_qs"].choices == (2, 5)
    assert search["hidden_dims"].choices == ((64, 64), (256, 256))
    assert search["policy_q"].choices == ("min", "mean")
    # A spec survives its text form (how n_jobs workers receive the search).
    again = parse_search([f"{k}={p.spec()}" for k, p in search.items()], SAC)
    assert again == search


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("actor_learning_rate=uniform:0.1:0.2", "no field 'actor_learning_rate'; known fields:"),
        ("tau=normal:0:1", "unknown distribution 'normal'"),
        ("tau=uniform:0.02:0.001", "must be below HIGH"),
        ("tau=uniform:0.01:0.01", "must be below HIGH"),
        ("actor_lr=loguniform:0:1e-3", "loguniform needs LOW > 0"),
        ("num_qs=choice:", "the choice is empty"),
        ("num_qs=choice: , ", "the choice is empty"),
        ("tau", "is not FIELD=DIST:ARGS"),
        ("tau=uniform:0.1", "write tau=uniform:LOW:HIGH"),
        ("batch_size=int:1.5:8", "is not an integer"),
        ("batch_size=uniform:32:64", "is an integer field; use batch_size=int:LOW:HIGH"),
        ("tau=uniform:0:0.5", "tau=0.0 is not accepted"),
    ],
)
def test_parse_search_errors(spec, message):
    with pytest.raises(ValueError, match="Search") as err:
        parse_search([spec], SAC)
    assert message in str(err.value)
    if "known fields" in message:
        assert "actor_lr" in str(err.value) and "tau" in str(err.value)


def test_parse_search_checks_values_on_the_base_config():
    with pytest.raises(ValueError, match="num_min_qs=5 is not accepted"):
        parse_search(["num_min_qs=choice:2,5"], SAC)  # SAC's default num_qs is 2
    base = SAC(num_qs=10)
    assert parse_search(["num_min_qs=choice:2,5"], SAC, base=base)["num_min_qs"].choices == (2, 5)


def test_parse_search_rejects_a_repeated_field():
    with pytest.raises(ValueError, match="'tau' is given twice"):
        parse_search(["tau=uniform:0.001:0.01", "tau=uniform:0.01:0.02"], SAC)


# ----------------------------------------------------------------------------------------- Optuna


def test_optuna_study_writes_trials_and_best_config(study):
    out, summary = study
    assert summary["storage"] == f"sqlite:///{out}/sweep.db"
    assert summary["n_trials"] == 4 and summary["trials"] == {"COMPLETE": 4}
    for n in range(4):
        with open(out / f"trial-{n}" / "summary.json") as f:
            assert json.load(f)["completed"]
    best = optuna.load_study(study_name=summary["study_name"], storage=summary["storage"])
    assert summary["best_value"] == best.best_value == max(t.value for t in best.trials)
    assert summary["best_run_dir"] == str(out / f"trial-{best.best_trial.number}")
    with open(summary["best_config"]) as f:
        config = json.load(f)
    assert config["agent"] == "sac"
    fields = {f.name for f in dataclasses.fields(SAC)}
    assert set(config["agent_config"]) == fields
    loaded = registry.get("sac").make_config(**config["agent_config"])
    assert loaded.actor_lr == summary["best_params"]["actor_lr"]
    assert loaded.tau == summary["best_params"]["tau"]
    assert loaded.hidden_dims == (32, 32)  # the base config's other fields
    assert config["sweep"]["trial"] == best.best_trial.number


def test_second_process_joins_the_study(study, cache_env):
    out, summary = study
    name, storage = summary["study_name"], summary["storage"]
    before = optuna.load_study(study_name=name, storage=storage).get_trials()
    assert len(before) == 4
    code = (
        "from jaxrl.cli import parse_train_args; from jaxrl import registry; "
        "from jaxrl.tune import Sweep, optuna_sweep, parse_search; "
        f"t, a = parse_train_args('sac', {ARGS!r}); "
        f"s = parse_search({SEARCH!r}, registry.get('sac').config); "
        f"optuna_sweep(Sweep.of('sac', t, a, s, trials=1, out_root={str(out)!r}), "
        f"storage={storage!r}, study_name={name!r})"
    )
    root = os.path.dirname(os.path.dirname(jaxrl.__file__))
    env = {**os.environ, **cache_env, "PYTHONPATH": root}
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=120)
    after = optuna.load_study(study_name=name, storage=storage).get_trials()
    assert len(after) == 5
    new = after[-1]
    assert new.state == optuna.trial.TrialState.COMPLETE
    assert new.user_attrs["run_dir"] == str(out / "trial-4")
    assert os.path.exists(out / "trial-4" / "summary.json")
    # The joining process seeds its sampler apart: no repeat of the first random settings.
    assert all(new.params != t.params for t in before)


def test_diverging_trial_is_failed_and_the_study_goes_on(tmp_path, cache_env):
    train_cfg, agent_cfg = configs()
    # A critic step size this large overflows the critic within the first 100 updates.
    search = parse_search(["critic_lr=loguniform:1e7:1e8"], SAC)
    job = Sweep.of("sac", train_cfg, agent_cfg, search, trials=2, out_root=str(tmp_path))
    summary = optuna_sweep(job)
    assert summary["trials"] == {"FAIL": 2}
    assert summary["best_value"] is None and summary["best_config"] is None
    assert not os.path.exists(tmp_path / "best_config.json")
    trials = optuna.load_study(study_name=summary["study_name"], storage=summary["storage"]).trials
    for trial in trials:
        assert trial.state == optuna.trial.TrialState.FAIL
        assert "held NaN values" in trial.user_attrs["fail_reason"]


def test_optuna_sweep_argument_errors(tmp_path):
    train_cfg, agent_cfg = configs()
    search = parse_search(SEARCH, SAC)
    with pytest.raises(ValueError, match="search is empty"):
        optuna_sweep(Sweep.of("sac", train_cfg, agent_cfg, {}, trials=1, out_root=str(tmp_path)))
    with pytest.raises(ValueError, match="trials must be at least 1"):
        optuna_sweep(
            Sweep.of("sac", train_cfg, agent_cfg, search, trials=0, out_root=str(tmp_path))
        )
    with pytest.raises(ValueError, match="n_jobs must be at least 1"):
        job = Sweep.of("sac", train_cfg, agent_cfg, search, trials=1, out_root=str(tmp_path))
        optuna_sweep(job, n_jobs=0)
    (tmp_path / "trial-0").mkdir()
    (tmp_path / "trial-0" / "config.json").write_text("{}")
    with pytest.raises(ValueError, match="already holds a run, of another study"):
        optuna_sweep(
            Sweep.of("sac", train_cfg, agent_cfg, search, trials=1, out_root=str(tmp_path))
        )
    seeds = dataclasses.replace(train_cfg, num_seeds=2)
    with pytest.raises(ValueError, match="Drop --num-seeds"):
        optuna_sweep(Sweep.of("sac", seeds, agent_cfg, search, trials=1, out_root=str(tmp_path)))


# ---------------------------------------------------------------------------- PBT's exploit step


def test_transplant_takes_the_donor_state_and_the_new_settings(study, tmp_path, cache_env):
    from jaxrl.run.runs import load_run

    _, summary = study
    donor_dir = summary["best_run_dir"]
    train_cfg, agent_cfg = configs()
    donor = load_run(donor_dir)
    new_cfg = apply_settings(donor.agent_config, {"actor_lr": 7e-4, "tau": 0.0123})
    out = str(tmp_path / "exploited")
    transplant(donor_dir, out, "sac", new_cfg)

    run = load_run(out)  # the transplanted checkpoint, read with the new config
    assert run.meta["step"] == donor.meta["step"] == 400
    assert run.meta["pbt_donor"] == {"run_dir": donor_dir, "step": 400}
    assert run.agent.config == new_cfg
    np.testing.assert_allclose(run.agent.hparams["tau"], 0.0123)
    np.testing.assert_allclose(run.agent.actor.opt_state.hyperparams["learning_rate"], 7e-4)
    # Unchanged settings stay, and every learned leaf is the donor's.
    np.testing.assert_allclose(
        run.agent.critic.opt_state.hyperparams["learning_rate"], donor.agent_config.critic_lr
    )
    for a, b in zip(
        jax.tree.leaves((run.agent.actor.params, run.agent.critic.params, run.agent.temp)),
        jax.tree.leaves((donor.agent.actor.params, donor.agent.critic.params, donor.agent.temp)),
        strict=True,
    ):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(
        jax.tree.leaves(run.state.buffer), jax.tree.leaves(donor.state.buffer), strict=True
    ):
        np.testing.assert_array_equal(a, b)
    with open(os.path.join(out, "metrics.csv")) as f, open(f"{donor_dir}/metrics.csv") as g:
        assert f.read() == g.read()

    # ``train`` continues the transplanted run with the new settings.
    longer = dataclasses.replace(train_cfg, total_steps=600, out=out)
    result = train("sac", longer, new_cfg)
    assert result["completed"] and result["total_steps"] == 600
    with pytest.raises(ValueError, match="already holds a checkpoint"):
        transplant(donor_dir, out, "sac", new_cfg)


def test_pbt_refuses_fields_it_cannot_mutate():
    train_cfg, agent_cfg = configs()
    check_pbt_search(
        "sac", train_cfg, agent_cfg, parse_search([*SEARCH, "discount=uniform:0.9:0.99"], SAC)
    )
    for spec in ("hidden_dims=choice:32 32,64 64", "init_temperature=uniform:0.1:1"):
        with pytest.raises(ValueError, match="PBT cannot mutate"):
            check_pbt_search("sac", train_cfg, agent_cfg, parse_search([spec], SAC))
    with pytest.raises(ValueError, match="PBT cannot mutate buffer_size"):
        check_pbt_search(
            "sac", train_cfg, agent_cfg, parse_search(["buffer_size=int:1000:2000"], SAC)
        )


# ----------------------------------------------------------------------------------------- Ray


@pytest.mark.slow
def test_ray_sweep_runs_trials_locally(tmp_path, cache_env):
    train_cfg, agent_cfg = configs()
    search = parse_search(SEARCH, SAC)
    summary = ray_sweep(
        Sweep.of("sac", train_cfg, agent_cfg, search, trials=2, out_root=str(tmp_path)),
        scheduler="fifo",
        env_vars=cache_env,
    )
    assert summary["n_trials"] == 2 and summary["trials"] == {"COMPLETE": 2}
    assert len(set(summary["run_dirs"])) == 2
    for run_dir in summary["run_dirs"]:
        assert os.path.dirname(run_dir) == str(tmp_path)
        with open(os.path.join(run_dir, "summary.json")) as f:
            done = json.load(f)
        assert done["completed"] and done["total_steps"] == 400
    with open(summary["best_config"]) as f:
        config = json.load(f)
    assert set(config["agent_config"]) == {f.name for f in dataclasses.fields(SAC)}
    assert config["agent_config"]["actor_lr"] == summary["best_params"]["actor_lr"]
    logs = os.path.realpath(tmp_path / "ray-tmp")  # Ray's session files and logs
    assert os.path.isdir(logs)
    if logs != str(tmp_path / "ray-tmp"):  # a short directory outside tmp_path (socket paths)
        shutil.rmtree(logs, ignore_errors=True)
