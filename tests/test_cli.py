"""The command line's contract: user errors, parsing with tyro, and the sweep worker pool.

A user error (``jaxrl.errors.JaxrlError``) exits 2 with one line; any other exception is a bug
and keeps its traceback. Every command parses with tyro; grid and Optuna workers start in one
spawn pool.
"""

import json
import os
import pickle
import subprocess
import sys

import pytest

import jaxrl
from jaxrl.cli import main, parse_train_args
from jaxrl.errors import ConfigError, MissingExtraError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(jaxrl.__file__)))


# ------------------------------------------------------------------------------------------ errors


def test_user_error_exits_2_with_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit) as info:
        main(["eval", str(tmp_path)])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ") and "config.json" in err


def test_internal_value_error_keeps_its_traceback(monkeypatch, tmp_path):
    def broken(*args, **kwargs):
        raise ValueError("internal: shapes (3,) and (4,) do not broadcast")

    import jaxrl.run.train  # noqa: F401  (``jaxrl.run.train`` is also the function's name)

    monkeypatch.setattr(sys.modules["jaxrl.run.train"], "train", broken)
    monkeypatch.setattr("jaxrl.cli.app.train", broken, raising=False)  # where it was bound
    argv = ["train", "sac", "--env", "Pendulum-v1", "--out", str(tmp_path / "run")]
    with pytest.raises(ValueError, match="do not broadcast") as info:
        main(argv)
    assert not isinstance(info.value, SystemExit)  # the console script exits 1 with it


def test_missing_extra_names_the_extra(monkeypatch, tmp_path, capsys):
    from jaxrl import registry
    from jaxrl.loops.config import TrainConfig
    from jaxrl.tune import Sweep, optuna_sweep, parse_search

    monkeypatch.setitem(sys.modules, "optuna", None)
    sac = registry.get("sac").config
    search = parse_search(["tau=uniform:0.001:0.02"], sac)
    with pytest.raises(MissingExtraError, match=r"jaxrl\[sweep\]") as info:
        optuna_sweep(
            Sweep.of("sac", TrainConfig(), sac(), search, trials=1, out_root=str(tmp_path))
        )
    assert isinstance(info.value, ImportError) and "optuna" in str(info.value)
    argv = ["sweep", "sac", "--env", "Pendulum-v1", "--backend", "optuna"]
    with pytest.raises(SystemExit) as exit_info:
        main([*argv, "--search", "tau=uniform:0.001:0.02", "--out", str(tmp_path / "s")])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "jaxrl[sweep]" in err


def test_config_file_errors_are_config_errors(tmp_path):
    path = tmp_path / "c.json"
    path.write_text("[1, 2]")
    with pytest.raises(ConfigError, match="JSON object"):
        parse_train_args("sac", ["--config", str(path)])


# ----------------------------------------------------------------------------------------- parsing


def test_sweep_help_lists_the_train_options(capsys):
    with pytest.raises(SystemExit) as info:
        main(["sweep", "sac", "--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    for flag in ("--grid", "--seeds", "--backend", "--total-steps", "--env", "--actor-lr"):
        assert flag in out, flag


def test_config_file_is_a_tyro_option_and_later_options_override_it(tmp_path, capsys):
    path = tmp_path / "best.json"
    path.write_text(json.dumps({"agent": "sac", "agent_config": {"tau": 0.01, "actor_lr": 1e-4}}))
    train_cfg, cfg = parse_train_args("sac", ["--config", str(path), "--tau", "0.03"])
    assert cfg.tau == 0.03 and cfg.actor_lr == 1e-4
    _, cfg = parse_train_args("sac", [f"--config={path}", "--total-steps", "7"])
    assert cfg.tau == 0.01
    with pytest.raises(SystemExit):
        parse_train_args("sac", ["--help"])
    assert "--config" in capsys.readouterr().out


def test_no_argparse_left_in_the_package():
    users = []
    for d, _, files in os.walk(os.path.join(ROOT, "jaxrl")):
        for f in files:
            if f.endswith(".py") and "argparse" in open(os.path.join(d, f)).read():
                users.append(os.path.relpath(os.path.join(d, f), ROOT))
    assert users == []


def test_help_imports_nothing_heavy():
    code = (
        "import sys; from jaxrl.cli import main; main(['--help']); "
        "heavy = ('jax', 'tyro', 'numpy', 'jaxrl.loops', 'jaxrl.run', 'optuna', 'flax'); "
        "print('LOADED', ' '.join(h for h in heavy if h in sys.modules))"
    )
    env = {**os.environ, "PYTHONPATH": ROOT}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    assert "jaxrl train AGENT" in out.stdout
    assert out.stdout.strip().splitlines()[-1] == "LOADED"


def test_help_lists_every_registered_agent(capsys):
    from jaxrl import registry

    main(["--help"])
    listed = capsys.readouterr().out.split("agents:")[1].splitlines()[0]
    assert [a.strip() for a in listed.split(",")] == registry.names()


@pytest.mark.parametrize(
    "argv",
    [
        ["finetune", "--help"],
        ["eval", "--help"],
        ["dataset", "collect", "--help"],
        ["dataset", "recipe", "--help"],
        ["dataset", "info", "--help"],
        ["plot", "--help"],
        ["export", "--help"],
        ["plan", "--help"],
    ],
)
def test_every_command_has_help(argv, capsys):
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 0
    assert "usage" in capsys.readouterr().out.lower()


def test_bad_flag_value_exits_2(tmp_path):
    with pytest.raises(SystemExit) as info:
        main(["export", str(tmp_path), "--format", "pickle"])
    assert info.value.code == 2


# ------------------------------------------------------------------------------------------ spawn


def _pid_plus(job):
    return os.getpid(), job + 1


def test_spawn_pool_runs_jobs_in_fresh_processes():
    from jaxrl.tune.workers import run_pool

    results = run_pool(_pid_plus, [1, 2, 3], workers=2)
    assert [r[1] for r in results] == [2, 3, 4]
    assert all(pid != os.getpid() for pid, _ in results)


def test_optuna_workers_start_in_the_spawn_pool(monkeypatch, tmp_path):
    import subprocess as sp

    import jaxrl.tune.workers as workers
    from jaxrl import registry
    from jaxrl.tune import Sweep, optuna_sweep, parse_search

    calls = []

    def fake_pool(fn, jobs, workers=None):
        pickle.dumps((fn, jobs))  # what the spawn pool sends its processes
        calls.append((fn, list(jobs), workers))
        return [None for _ in jobs]

    def no_popen(*args, **kwargs):
        raise AssertionError("workers must not start as `python -c`")

    monkeypatch.setattr(workers, "run_pool", fake_pool)
    monkeypatch.setattr(sp, "Popen", no_popen)
    train_cfg, agent_cfg = parse_train_args("sac", ["--env", "Pendulum-v1"])
    search = parse_search(["tau=uniform:0.001:0.02"], registry.get("sac").config)
    job = Sweep.of("sac", train_cfg, agent_cfg, search, trials=3, out_root=str(tmp_path))
    summary = optuna_sweep(job, n_jobs=2)
    assert summary["n_trials"] == 0
    ((fn, jobs, n),) = calls
    assert n == 2 and [job.trials for job in jobs] == [2, 1] and [j.worker for j in jobs] == [0, 1]
    assert fn.__module__ == "jaxrl.tune.optuna_search" and not fn.__name__.startswith("_")


def test_host_grid_sweep_trains_members_in_the_spawn_pool(tmp_path, capsys):
    tiny = ["--total-steps", "40", "--learning-starts", "20", "--batch-size", "8",
            "--hidden-dims", "8", "8", "--eval-every", "40", "--eval-episodes", "1",
            "--no-progress", "--no-tensorboard"]  # fmt: skip
    root = str(tmp_path / "sweep")
    argv = ["sweep", "sac", "--env", "Pendulum-v1", "--grid", "tau=0.01,0.02", "--workers", "1"]
    main([*argv, *tiny, "--out", root])
    assert "1 worker processes" in capsys.readouterr().out  # one fresh process, both members
    for setting in os.listdir(root):
        if os.path.isdir(os.path.join(root, setting)):
            with open(os.path.join(root, setting, "s0", "summary.json")) as f:
                assert json.load(f)["completed"]
    with open(os.path.join(root, "sweep.json")) as f:
        assert len(json.load(f)["settings"]) == 2
