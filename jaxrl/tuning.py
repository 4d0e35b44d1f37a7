"""Hyperparameter sweeps over ``jaxrl.cli.train`` with Optuna or Ray Tune (``jaxrl sweep``).

Every trial is an ordinary jaxrl run: ``train`` runs it in-process into its own run directory
under ``out_root`` (``config.json``, ``metrics.csv``, ``summary.json``, ``checkpoints/``), and an
``jaxrl.loops.harness.on_eval`` hook hands each evaluation to the tuner, which may end the run
there (Optuna's pruner, Ray's ASHA) or, with Ray's PBT, restart it from another trial's
checkpoint with mutated settings. A run whose agent holds NaN values (``nonfinite > 0`` at an
evaluation) or whose evaluation return is not finite is a failed trial (Optuna: FAIL, Ray:
ERROR), never a pruned one, and the sweep goes on.

Searches are written as ``FIELD=DIST:ARGS`` (``parse_search``) over the agent's config fields:
``actor_lr=loguniform:1e-5:1e-3``, ``tau=uniform:0.001:0.02``, ``batch_size=int:64:512``,
``n_step=choice:1,3,5`` (``hidden_dims=choice:64 64,256 256`` for tuples).

Both backends write ``out_root/best_config.json``: the best trial's ``config.json`` (same layout,
every field of ``agent_config``) plus a ``sweep`` section with the study, trial, value and
searched settings.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import warnings
from typing import Any

DISTRIBUTIONS = ("uniform", "loguniform", "int", "choice")
"""Distributions ``parse_search`` accepts."""

SETTINGS_KEYS = ("hparams", "hyperparams")
"""Agent attributes holding config values as leaves: ``agent.hparams`` (discount, tau, ...)
and ``opt_state.hyperparams`` (``optax.inject_hyperparams``: learning rates, Adam's b1, ...)."""


class Diverged(RuntimeError):
    """A trial's agent went non-finite (NaN parameters or a non-finite evaluation return)."""


@dataclasses.dataclass(frozen=True)
class Param:
    """One searched config field.

    Attributes:
        kind: one of ``DISTRIBUTIONS``.
        low: lower end (``uniform``, ``loguniform``, ``int``; inclusive).
        high: upper end (inclusive).
        choices: the values of a ``choice``.
    """

    kind: str
    low: float | None = None
    high: float | None = None
    choices: tuple[Any, ...] = ()

    def spec(self) -> str:
        """The ``DIST:ARGS`` text this parameter was parsed from (``parse_search`` reads it)."""
        if self.kind == "choice":
            items = (
                " ".join(map(_text, c)) if isinstance(c, tuple) else _text(c) for c in self.choices
            )
            return "choice:" + ",".join(items)
        return f"{self.kind}:{_text(self.low)}:{_text(self.high)}"


def _text(value: Any) -> str:
    return json.dumps(value) if value is None or isinstance(value, bool) else str(value)


def _literal(text: str) -> Any:
    """``"3"`` -> 3, ``"0.5"`` -> 0.5, ``"true"``/``"null"`` -> True/None, else the text."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def _number(name: str, text: str, integer: bool) -> float:
    try:
        return int(text) if integer else float(text)
    except ValueError:
        kind = "an integer" if integer else "a number"
        raise ValueError(f"Search {name}: {text!r} is not {kind}.") from None


def parse_search(specs: list[str], config_cls: Any, *, base: Any = None) -> dict[str, Param]:
    """Parse ``FIELD=DIST:ARGS`` search specs over the fields of ``config_cls``.

    ``DIST`` is ``uniform:LOW:HIGH``, ``loguniform:LOW:HIGH`` (``LOW > 0``), ``int:LOW:HIGH``
    (integers, both ends included) or ``choice:A,B,C`` (each value read as JSON, else as text; a
    value with spaces is a tuple, e.g. ``hidden_dims=choice:64 64,256 256``). Each end and each
    choice is checked against the config's own validation, set on ``base``.

    Args:
        specs: e.g. ``["actor_lr=loguniform:1e-5:1e-3", "n_step=choice:1,3,5"]``.
        config_cls: the agent's config dataclass (``jaxrl.registry.get(name).config``).
        base: the config the values will be set on (checks that relate fields, such as
            ``num_min_qs <= num_qs``, depend on it); default ``config_cls()``.

    Returns:
        ``{field: Param}`` in the order given.

    Raises:
        ValueError: a malformed spec, an unknown field (the message lists the known ones), an
            unknown distribution, ``LOW >= HIGH``, a ``loguniform`` with ``LOW <= 0``, an empty
            ``choice``, a field given twice, or a value the config rejects.
    """
    fields = {f.name: f for f in dataclasses.fields(config_cls)}
    search: dict[str, Param] = {}
    for spec in specs:
        name, eq, rest = spec.partition("=")
        kind, colon, args = rest.partition(":")
        name, kind = name.strip(), kind.strip()
        if not (eq and colon and name):
            raise ValueError(
                f"Search {spec!r} is not FIELD=DIST:ARGS; e.g. actor_lr=loguniform:1e-5:1e-3, "
                "tau=uniform:0.001:0.02, batch_size=int:64:512, n_step=choice:1,3,5."
            )
        if name not in fields:
            raise ValueError(
                f"Search {spec!r}: {config_cls.__name__} has no field {name!r}; known fields: "
                f"{', '.join(fields)}."
            )
        if name in search:
            raise ValueError(f"Search: {name!r} is given twice; keep one spec per field.")
        if kind not in DISTRIBUTIONS:
            raise ValueError(
                f"Search {spec!r}: unknown distribution {kind!r}; use one of "
                f"{', '.join(DISTRIBUTIONS)} (e.g. {name}=uniform:LOW:HIGH)."
            )
        if kind == "choice":
            items = [a.strip() for a in args.split(",") if a.strip()]
            if not items:
                raise ValueError(
                    f"Search {spec!r}: the choice is empty; list values, e.g. {name}=choice:1,3,5."
                )
            choices = tuple(
                tuple(_literal(x) for x in item.split()) if " " in item else _literal(item)
                for item in items
            )
            param = Param(kind, choices=choices)
            values = list(choices)
        else:
            parts = args.split(":")
            if len(parts) != 2:
                raise ValueError(f"Search {spec!r}: write {name}={kind}:LOW:HIGH.")
            integer = kind == "int"
            low, high = (_number(name, p.strip(), integer) for p in parts)
            if low >= high:
                raise ValueError(
                    f"Search {spec!r}: LOW ({low}) must be below HIGH ({high}); swap or widen them."
                )
            if kind == "loguniform" and low <= 0:
                raise ValueError(
                    f"Search {spec!r}: loguniform needs LOW > 0 (got {low}); use uniform for a "
                    "range that includes 0, or a positive LOW such as 1e-6."
                )
            annotation = fields[name].type  # a string under ``from __future__ import annotations``
            if not isinstance(annotation, str):
                annotation = getattr(annotation, "__name__", str(annotation))
            if not integer and annotation.split("|")[0].strip() == "int":
                raise ValueError(
                    f"Search {spec!r}: {name} is an integer field; use {name}=int:LOW:HIGH "
                    "or a choice."
                )
            param = Param(kind, low, high)
            values = [low, high]
        for value in values:
            try:
                dataclasses.replace(config_cls() if base is None else base, **{name: value})
            except (TypeError, ValueError) as err:
                raise ValueError(
                    f"Search {spec!r}: {name}={value!r} is not accepted: {err}"
                ) from None
        search[name] = param
    return search


def apply_settings(agent_cfg: Any, settings: dict[str, Any]) -> Any:
    """``agent_cfg`` with ``settings`` (JSON-like values: lists become tuples); validated."""
    values = {k: tuple(v) if isinstance(v, list) else v for k, v in settings.items()}
    return dataclasses.replace(agent_cfg, **values)


# ------------------------------------------------------------------------------ shared helpers


def _absolute(train_cfg: Any) -> Any:
    """``train_cfg`` with a local ``--dataset`` path made absolute (``minari:ID`` stays)."""
    dataset = train_cfg.dataset
    if dataset and not dataset.startswith("minari:"):
        dataset = os.path.abspath(dataset)
    return dataclasses.replace(train_cfg, dataset=dataset)


def _check_sweep(train_cfg: Any, search: dict[str, Param], trials: int) -> None:
    if not search:
        raise ValueError("The search is empty; give at least one FIELD=DIST:ARGS.")
    if trials < 1:
        raise ValueError(f"trials must be at least 1, got {trials}.")
    if train_cfg.num_seeds != 1:
        raise ValueError(
            "--num-seeds trains several seeds in one run; a sweep's trials are single runs. "
            "Drop --num-seeds (repeat the sweep with another --seed to compare seeds)."
        )


def _budget(spec: Any, train_cfg: Any) -> int:
    """The step of a run's last evaluation (the harness numbers offline-then-online steps on)."""
    if not train_cfg.dataset:
        return train_cfg.total_steps
    if spec.kind == "offline":
        offline = (
            train_cfg.total_steps if train_cfg.offline_steps is None else train_cfg.offline_steps
        )
        return offline + (train_cfg.online_steps or 0)
    return train_cfg.online_steps or train_cfg.total_steps


def _eval_failure(out: str, step: int, eval_return: float, nonfinite: int) -> str | None:
    """Why an evaluation means the run diverged, or None."""
    if nonfinite > 0:
        return f"{out}: the agent held NaN values after {nonfinite} updates by step {step}"
    if not math.isfinite(eval_return):
        return f"{out}: evaluation return {eval_return} at step {step}"
    return None


def _write_best(out_root: str, run_dir: str | None, fallback: dict[str, Any], sweep: dict) -> str:
    """Write ``out_root/best_config.json`` from the best run's ``config.json``; its path."""
    from jaxrl.logging import write_json

    config = fallback
    if run_dir and os.path.exists(os.path.join(run_dir, "config.json")):
        with open(os.path.join(run_dir, "config.json")) as f:
            config = json.load(f)
    path = os.path.join(out_root, "best_config.json")
    write_json(path, {**config, "sweep": sweep})
    return path


# ------------------------------------------------------------------------------------ Optuna


def optuna_sweep(
    agent_name: str,
    train_cfg: Any,
    agent_cfg: Any,
    search: dict[str, Param],
    *,
    trials: int,
    out_root: str,
    storage: str | None = None,
    study_name: str | None = None,
    n_jobs: int = 1,
    seed: int = 0,
    sampler: str = "tpe",
    pruner: str = "median",
    n_startup_trials: int = 10,
) -> dict[str, Any]:
    """Search ``search`` with an Optuna study that maximizes the final evaluation return.

    The sampler and pruner are set as RL Baselines3 Zoo sets them (``exp_manager.py``):
    ``TPESampler(n_startup_trials=10, multivariate=True)`` (Optuna's ``constant_liar`` stays on,
    so parallel workers do not sample the same point) and ``MedianPruner(n_startup_trials=10,
    n_warmup_steps=...)`` on the evaluation returns, its warm-up the first third of the run (the
    Zoo's ``n_evaluations // 3`` evaluations). Evaluation returns are reported at their env step
    (offline: gradient step); the last evaluation is never pruned.

    Trial ``n`` trains into ``out_root/trial-<n>``. A trial whose agent diverges (NaN) or whose
    evaluation return is not finite, or whose sampled settings the config rejects, is marked
    FAILED (its reason in the trial's ``fail_reason`` user attribute) and the study goes on.
    Ctrl-C stops the sweep: the running trial is marked FAILED and the summary is returned.

    Storage: by default ``sqlite:///<out_root>/sweep.db``; any Optuna RDB URL works. The study is
    created with ``load_if_exists=True``, so another process (another machine, with an RDB
    server) given the same ``storage`` and ``study_name`` joins the study and adds its trials.
    Each process seeds its sampler from ``seed``, its worker index and the number of trials
    already in the study, so processes joining a study do not repeat each other's random
    start-up points.

    Parallel trials (``n_jobs > 1``): JAX programs and the training loop's signal handlers do
    not belong in threads, so instead of Optuna's thread pool this starts ``n_jobs`` worker
    processes (``python -c``, importing this same ``jaxrl``) that join the study in the same
    storage and run ``trials`` between them (the first ``trials % n_jobs`` run one more). Use a
    server database (PostgreSQL/MySQL) for many workers; SQLite serializes their writes.

    Args:
        agent_name: a registered agent.
        train_cfg: the loop options of every trial (``out`` is replaced per trial; a relative
            ``dataset`` path is made absolute).
        agent_cfg: the agent config the searched fields are set on.
        search: ``parse_search`` output.
        trials: trials to run (in total over ``n_jobs`` workers).
        out_root: directory of the trial run directories, ``sweep.db`` and ``best_config.json``
            (one study per directory).
        storage: Optuna storage URL (default: SQLite in ``out_root``).
        study_name: the study (default ``<agent>-<env>``).
        n_jobs: worker processes running trials at once.
        seed: sampler seed (the trials' training seed is ``train_cfg.seed``).
        sampler: ``"tpe"`` or ``"random"``.
        pruner: ``"median"`` or ``"none"``.
        n_startup_trials: random trials before TPE models the results, and trials before the
            median pruner prunes.

    Returns:
        ``{"study_name", "storage", "out_root", "best_value", "best_params", "best_trial",
        "best_run_dir", "best_config", "n_trials", "trials": {state: count}}``; the ``best_*``
        entries are None when no trial completed (then no ``best_config.json`` is written).

    Raises:
        ValueError: an empty search, ``trials``/``n_jobs`` < 1, an unknown sampler or pruner,
            ``--num-seeds``, or optuna not installed.
    """
    optuna = _require("optuna")
    _check_sweep(train_cfg, search, trials)
    if n_jobs < 1:
        raise ValueError(f"n_jobs must be at least 1, got {n_jobs}.")
    if sampler not in ("tpe", "random"):
        raise ValueError(f"Unknown sampler {sampler!r}; use 'tpe' or 'random'.")
    if pruner not in ("median", "none"):
        raise ValueError(f"Unknown pruner {pruner!r}; use 'median' or 'none'.")
    out_root = os.path.abspath(out_root)
    os.makedirs(out_root, exist_ok=True)
    storage = storage or f"sqlite:///{os.path.join(out_root, 'sweep.db')}"
    study_name = study_name or f"{agent_name}-{train_cfg.env.replace(':', '_')}"
    train_cfg = _absolute(train_cfg)
    options = {"sampler": sampler, "pruner": pruner, "n_startup_trials": n_startup_trials}
    # Created here first, so that parallel workers only ever load it.
    optuna.create_study(
        storage=storage, study_name=study_name, direction="maximize", load_if_exists=True
    )
    try:
        if n_jobs == 1:
            _optimize(
                agent_name,
                train_cfg,
                agent_cfg,
                search,
                trials,
                out_root,
                storage,
                study_name,
                seed,
                0,
                options,
            )
        else:
            _run_workers(
                agent_name,
                train_cfg,
                agent_cfg,
                search,
                trials,
                out_root,
                storage,
                study_name,
                seed,
                n_jobs,
                options,
            )
    except KeyboardInterrupt:
        print("Sweep stopped; the interrupted trial is marked FAILED.")
    return _optuna_summary(agent_name, train_cfg, agent_cfg, out_root, storage, study_name)


def _require(module: str) -> Any:
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        raise ValueError(
            f"Sweeps with {module.split('.')[0]} need the sweep extra: pip install 'jaxrl[sweep]'."
        ) from None


def _sampler_seed(seed: int, worker: int, existing: int) -> int:
    import numpy as np

    return int(np.random.SeedSequence([seed, worker, existing]).generate_state(1)[0])


def _optimize(
    agent_name: str,
    train_cfg: Any,
    agent_cfg: Any,
    search: dict[str, Param],
    trials: int,
    out_root: str,
    storage: str,
    study_name: str,
    seed: int,
    worker: int,
    options: dict[str, Any],
) -> None:
    """Run ``trials`` trials of the study in this process."""
    import optuna

    from jaxrl import registry
    from jaxrl.cli import train
    from jaxrl.config import ConfigError
    from jaxrl.loops.harness import on_eval

    study = optuna.load_study(study_name=study_name, storage=storage)
    n_start = options["n_startup_trials"]
    sampler_seed = _sampler_seed(seed, worker, len(study.trials))
    if options["sampler"] == "tpe":
        study.sampler = optuna.samplers.TPESampler(
            n_startup_trials=n_start, multivariate=True, seed=sampler_seed
        )
    else:
        study.sampler = optuna.samplers.RandomSampler(seed=sampler_seed)
    budget = _budget(registry.get(agent_name), train_cfg)
    if options["pruner"] == "median":
        study.pruner = optuna.pruners.MedianPruner(
            n_startup_trials=n_start, n_warmup_steps=budget // 3
        )
    else:
        study.pruner = optuna.pruners.NopPruner()

    def objective(trial: Any) -> float:
        settings = {name: _suggest(trial, name, p) for name, p in search.items()}
        out = os.path.join(out_root, f"trial-{trial.number}")
        trial.set_user_attr("run_dir", out)
        if os.path.exists(os.path.join(out, "config.json")):  # numbers are unique per study
            raise ValueError(
                f"{out} already holds a run, of another study in {out_root}; give each study "
                f"its own out_root, or pass study_name={study_name!r} to add trials to it."
            )
        try:
            cfg = apply_settings(agent_cfg, settings)
        except ConfigError as err:
            trial.set_user_attr("fail_reason", f"settings rejected: {err}")
            raise

        def report(o: str, step: int, eval_return: float, nonfinite: int) -> None:
            failure = _eval_failure(o, step, eval_return, nonfinite)
            if failure:
                trial.set_user_attr("fail_reason", failure)
                raise Diverged(failure)
            trial.report(eval_return, step)
            if step < budget and trial.should_prune():
                raise optuna.TrialPruned(f"step {step}: eval return {eval_return:.2f}")

        with on_eval(report):
            summary = train(agent_name, dataclasses.replace(train_cfg, out=out), cfg)
        if not summary["completed"]:  # a stop signal: the run saved its state
            raise KeyboardInterrupt
        value = float(summary["final_eval_return_mean"])
        if not math.isfinite(value):
            trial.set_user_attr("fail_reason", f"final evaluation return {value}")
            raise Diverged(f"{out}: final evaluation return {value}")
        return value

    # Optuna marks a trial that raises one of ``catch`` FAILED and goes on with the next.
    study.optimize(objective, n_trials=trials, catch=(Diverged, ConfigError))


def _suggest(trial: Any, name: str, p: Param) -> Any:
    if p.kind == "uniform":
        return trial.suggest_float(name, p.low, p.high)
    if p.kind == "loguniform":
        return trial.suggest_float(name, p.low, p.high, log=True)
    if p.kind == "int":
        return trial.suggest_int(name, int(p.low), int(p.high))
    if all(c is None or isinstance(c, bool | int | float | str) for c in p.choices):
        return trial.suggest_categorical(name, list(p.choices))
    # Optuna stores only scalars: tuples are suggested by their text and mapped back.
    texts = [" ".join(map(_text, c)) if isinstance(c, tuple) else _text(c) for c in p.choices]
    return p.choices[texts.index(trial.suggest_categorical(name, texts))]


def _run_workers(
    agent_name: str,
    train_cfg: Any,
    agent_cfg: Any,
    search: dict[str, Param],
    trials: int,
    out_root: str,
    storage: str,
    study_name: str,
    seed: int,
    n_jobs: int,
    options: dict[str, Any],
) -> None:
    """``n_jobs`` worker processes share ``trials`` trials of the study."""
    import jaxrl
    from jaxrl.config import config_to_dict

    job = {
        "agent": agent_name,
        "train": config_to_dict(train_cfg),
        "agent_config": config_to_dict(agent_cfg),
        "search": {name: p.spec() for name, p in search.items()},
        "out_root": out_root,
        "storage": storage,
        "study_name": study_name,
        "seed": seed,
        "options": options,
    }
    # The workers import the jaxrl this process runs (a checkout may shadow an installed one).
    env = dict(os.environ)
    root = os.path.dirname(os.path.dirname(os.path.abspath(jaxrl.__file__)))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    procs = []
    for worker in range(n_jobs):
        share = trials // n_jobs + (worker < trials % n_jobs)
        if share == 0:
            continue
        args = json.dumps({**job, "trials": share, "worker": worker})
        code = "import sys; from jaxrl.tuning import _optuna_worker; _optuna_worker(sys.argv[1])"
        procs.append(subprocess.Popen([sys.executable, "-c", code, args], env=env))
    try:
        codes = [p.wait() for p in procs]
    except KeyboardInterrupt:  # the workers got the same Ctrl-C: let them save and stop
        codes = [p.wait() for p in procs]
        raise
    if any(codes):
        raise RuntimeError(f"Optuna worker processes exited with codes {codes}; see their output.")


def _optuna_worker(job_json: str) -> None:
    """Entry point of an ``n_jobs`` worker process (``_run_workers``)."""
    from jaxrl import registry
    from jaxrl.loops.config import TrainConfig

    job = json.loads(job_json)
    spec = registry.get(job["agent"])
    train_cfg = TrainConfig(
        **{k: tuple(v) if isinstance(v, list) else v for k, v in job["train"].items()}
    )
    agent_cfg = spec.make_config(**job["agent_config"])
    specs = [f"{k}={v}" for k, v in job["search"].items()]
    search = parse_search(specs, spec.config, base=agent_cfg)
    try:
        _optimize(
            job["agent"],
            train_cfg,
            agent_cfg,
            search,
            job["trials"],
            job["out_root"],
            job["storage"],
            job["study_name"],
            job["seed"],
            job["worker"],
            job["options"],
        )
    except KeyboardInterrupt:
        pass


def _optuna_summary(
    agent_name: str, train_cfg: Any, agent_cfg: Any, out_root: str, storage: str, study_name: str
) -> dict[str, Any]:
    import optuna

    from jaxrl.loops.config import run_config

    study = optuna.load_study(study_name=study_name, storage=storage)
    all_trials = study.get_trials(deepcopy=False)
    counts: dict[str, int] = {}
    for t in all_trials:
        counts[t.state.name] = counts.get(t.state.name, 0) + 1
    summary: dict[str, Any] = {
        "study_name": study_name,
        "storage": storage,
        "out_root": out_root,
        "best_value": None,
        "best_params": None,
        "best_trial": None,
        "best_run_dir": None,
        "best_config": None,
        "n_trials": len(all_trials),
        "trials": counts,
    }
    if not counts.get("COMPLETE"):
        return summary
    best = study.best_trial
    run_dir = best.user_attrs.get("run_dir")
    params = {k: _from_optuna(v) for k, v in best.params.items()}
    fallback = run_config(agent_name, apply_settings(agent_cfg, params), train_cfg)
    sweep = {
        "backend": "optuna",
        "study_name": study_name,
        "storage": storage,
        "trial": best.number,
        "value": best.value,
        "params": params,
    }
    summary |= {
        "best_value": best.value,
        "best_params": params,
        "best_trial": best.number,
        "best_run_dir": run_dir,
        "best_config": _write_best(out_root, run_dir, fallback, sweep),
    }
    return summary


def _from_optuna(value: Any) -> Any:
    """A stored categorical text of a tuple back as the tuple (``_suggest``)."""
    if isinstance(value, str) and " " in value:
        return tuple(_literal(x) for x in value.split())
    return value


# ------------------------------------------------------------------------------------ Ray Tune


def ray_sweep(
    agent_name: str,
    train_cfg: Any,
    agent_cfg: Any,
    search: dict[str, Param],
    *,
    trials: int,
    out_root: str,
    address: str | None = None,
    scheduler: str = "fifo",
    seed: int = 0,
    cpus_per_trial: float = 1.0,
    gpus_per_trial: float = 0.0,
    num_cpus: int | None = None,
    grace_period: int | None = None,
    perturbation_interval: int | None = None,
    pbt_synch: bool = False,
    env_vars: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Search ``search`` with Ray Tune, maximizing the evaluation return.

    Each trial is a function trainable that runs ``jaxrl.cli.train`` in its Ray worker process
    into ``out_root/trial-<trial id>`` and reports every evaluation with ``tune.report`` (keys
    ``eval_return``, ``step``, ``nonfinite``, ``run_dir``). The first configurations are drawn at
    random (seeded by ``seed``) from the search; the trials' training seed is ``train_cfg.seed``.

    Schedulers (``time_attr`` is the run's step, ``metric`` ``eval_return``):

    - ``"fifo"``: every trial runs to the end.
    - ``"asha"``: ``ASHAScheduler`` stops the worse trials at rungs from ``grace_period``
      (default: a third of the run, as the Optuna pruner's warm-up) to the end of the run.
    - ``"pbt"``: ``PopulationBasedTraining`` every ``perturbation_interval`` steps (default and
      multiple of ``eval_every``) restarts a trial of the bottom quarter from a top trial's
      checkpoint with settings perturbed by x0.8 / x1.2 or resampled (kept within the search
      range). Every report then carries a checkpoint: a copy of the run's newest jaxrl
      checkpoint (replay buffer included: mind the disk; Ray keeps 4 per trial) with its
      ``config.json`` and ``metrics.csv``. The restarted trial continues in a new run directory
      ``<trial dir>-s<step>`` holding the donor's full training state (agent, optimizer, replay
      buffer, env state, RNG) and its metrics up to that step, with the new settings written
      into that state: ``agent.hparams`` (discount, tau, ...) and the injected optimizer
      hyperparameters (learning rates) come from the new config, everything else from the
      donor. PBT therefore only searches fields that are such settings: a field that changes
      the agent's arrays or learned values at creation (layer sizes, ensemble size, initial
      temperature) or the replay buffer (``buffer_size``) is refused, as are runs with
      ``--dataset``. A trial exploited at the very end of the run has nothing left to train
      with its new settings: it reports the donor's run directory and final evaluation. The
      last evaluation of every trial is reported after ``summary.json`` is written, so a trial
      Ray pauses or stops there leaves a finished run directory.

    Ray runs locally by default: ``ray.init(num_cpus=num_cpus or all cores,
    include_dashboard=False)``, a one-node instance that contacts no other host (usage
    statistics off: ``RAY_USAGE_STATS_ENABLED=0`` unless set; Ray's own token authentication
    stays on), its session files and logs in ``out_root/ray-tmp`` (a link to a short directory
    under the system temp directory when ``out_root`` is too long for Ray's socket paths) and
    Tune's results in ``out_root/ray``.
    With ``address`` it joins that cluster (``ray.init(address=...)``); every node must then
    see ``out_root`` (a shared file system) and have jaxrl installed. If Ray is already
    initialized in this process it is used as it is (each trial then sets the env vars below
    itself, except ``PYTHONPATH``).

    Trial environment (``runtime_env`` env vars, also set in the trial before JAX loads):
    ``XLA_PYTHON_CLIENT_PREALLOCATE=false``, so several JAX trials on one GPU do not each
    reserve 75% of its memory, and ``PYTHONPATH`` starting with the directory of this jaxrl.
    ``env_vars`` adds or overrides variables, e.g. ``{"XLA_PYTHON_CLIENT_MEM_FRACTION": "0.2"}``
    or ``JAX_COMPILATION_CACHE_DIR`` (trials that sweep only learning rates, tau and the like
    compile the same programs, so a shared compilation cache saves each trial's compile time).

    Args:
        agent_name: a registered agent.
        train_cfg: the loop options of every trial (``out`` is replaced per trial; a relative
            ``dataset`` path is made absolute before Ray changes the trials' working directory).
        agent_cfg: the agent config the searched fields are set on.
        search: ``parse_search`` output.
        trials: number of trials (PBT: the population size).
        out_root: directory of the trial run directories, Ray's files and ``best_config.json``.
        address: a Ray cluster to join (``"auto"``, ``"ray://host:10001"``, ...).
        scheduler: ``"fifo"``, ``"asha"`` or ``"pbt"``.
        seed: seed of the random search.
        cpus_per_trial: CPUs Ray reserves per trial.
        gpus_per_trial: GPUs Ray reserves per trial (fractions share a GPU).
        num_cpus: CPUs of the local Ray node (default: all).
        grace_period: ASHA's first rung, in steps.
        perturbation_interval: PBT's period, in steps.
        pbt_synch: synchronous PBT (Ray's ``synch=True``): all trials pause at each
            perturbation point and the bottom ones restart from the top ones' checkpoints
            there; the asynchronous default exploits a trial's checkpoint only when that trial
            was itself in the top quantile at its last perturbation point.
        env_vars: extra environment variables of the trials.

    Returns:
        ``{"out_root", "storage_path", "best_value", "best_params", "best_trial",
        "best_run_dir", "best_config", "n_trials", "trials": {"COMPLETE"|"STOPPED"|"ERROR":
        count}, "run_dirs"}``; a trial is COMPLETE when it reported its last evaluation, STOPPED
        when the scheduler ended it earlier, ERROR when it diverged or failed. The best trial is
        the COMPLETE one with the highest final return (the ``best_*`` entries are None when no
        trial completed, and no ``best_config.json`` is written).

    Raises:
        ValueError: an empty search, ``trials`` < 1, an unknown scheduler, a PBT search over a
            field PBT cannot mutate, a bad ``perturbation_interval``, or ray not installed.
    """
    import jaxrl
    from jaxrl import registry

    _require("ray.tune")
    import ray
    from ray import tune

    _check_sweep(train_cfg, search, trials)
    if scheduler not in ("fifo", "asha", "pbt"):
        raise ValueError(f"Unknown scheduler {scheduler!r}; use 'fifo', 'asha' or 'pbt'.")
    spec = registry.get(agent_name)
    out_root = os.path.abspath(out_root)
    os.makedirs(out_root, exist_ok=True)
    train_cfg = _absolute(train_cfg)
    budget = _budget(spec, train_cfg)
    if scheduler == "pbt":
        if train_cfg.dataset:
            raise ValueError(
                "PBT restarts online runs only; with --dataset use --scheduler asha or fifo."
            )
        perturbation_interval = perturbation_interval or train_cfg.eval_every
        if perturbation_interval % train_cfg.eval_every:
            raise ValueError(
                f"perturbation_interval ({perturbation_interval}) must be a multiple of "
                f"--eval-every ({train_cfg.eval_every}): trials report at evaluations."
            )
    root = os.path.dirname(os.path.dirname(os.path.abspath(jaxrl.__file__)))
    trial_env = {
        "XLA_PYTHON_CLIENT_PREALLOCATE": "false",
        "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p),
        **(env_vars or {}),
    }
    # Ray would otherwise report usage statistics over the network.
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    started = not ray.is_initialized()
    if started:
        kwargs = {"include_dashboard": False, "runtime_env": {"env_vars": trial_env}}
        if address:
            ray.init(address=address, **kwargs)
        else:
            with warnings.catch_warnings():
                # Ray starts its processes with fork + exec, which is safe after JAX has
                # started threads; Python warns about any fork in a threaded process.
                warnings.filterwarnings("ignore", "os.fork", RuntimeWarning)
                ray.init(
                    num_cpus=num_cpus or os.cpu_count(),
                    _temp_dir=_ray_temp_dir(out_root),
                    **kwargs,
                )
    try:
        if scheduler == "pbt":
            # After ray.init: creating agents starts JAX's threads, and ray.init forks.
            check_pbt_search(agent_name, train_cfg, agent_cfg, search)
        results = _fit(
            tune,
            agent_name,
            train_cfg,
            agent_cfg,
            search,
            trials,
            out_root,
            scheduler,
            seed,
            {"cpu": cpus_per_trial, "gpu": gpus_per_trial},
            budget,
            {"grace": grace_period, "interval": perturbation_interval, "synch": pbt_synch},
            trial_env,
        )
    finally:
        if started:
            ray.shutdown()
    return _ray_summary(agent_name, train_cfg, agent_cfg, search, out_root, results, budget)


def _ray_temp_dir(out_root: str) -> str:
    """``out_root/ray-tmp``, or a link there to a short directory when the path is too long.

    Ray keeps Unix sockets under its temp dir, whose paths may not exceed 107 bytes; the session
    directory and socket names add about 65.
    """
    path = os.path.join(out_root, "ray-tmp")
    if len(path) <= 40 or os.path.islink(path):
        return os.path.realpath(path) if os.path.islink(path) else path
    short = tempfile.mkdtemp(prefix="jaxrl-ray-")
    os.symlink(short, path)
    return short


def _ray_domain(tune: Any, p: Param) -> Any:
    if p.kind == "uniform":
        return tune.uniform(p.low, p.high)
    if p.kind == "loguniform":
        return tune.loguniform(p.low, p.high)
    if p.kind == "int":
        return tune.randint(int(p.low), int(p.high) + 1)  # randint excludes its upper end
    return tune.choice(list(p.choices))


def _fit(
    tune: Any,
    agent_name: str,
    train_cfg: Any,
    agent_cfg: Any,
    search: dict[str, Param],
    trials: int,
    out_root: str,
    scheduler: str,
    seed: int,
    resources: dict[str, float],
    budget: int,
    options: dict[str, Any],
    trial_env: dict[str, str],
) -> Any:
    """Build the Tuner and run it; the ``ResultGrid``."""
    from ray.tune.schedulers import ASHAScheduler, FIFOScheduler, PopulationBasedTraining
    from ray.tune.search.basic_variant import BasicVariantGenerator

    space = {name: _ray_domain(tune, p) for name, p in search.items()}
    if scheduler == "asha":
        grace = options["grace"] or max(train_cfg.eval_every, budget // 3)
        sched = ASHAScheduler(time_attr="step", max_t=budget, grace_period=grace)
    elif scheduler == "pbt":
        sched = PopulationBasedTraining(
            time_attr="step",
            perturbation_interval=options["interval"],
            hyperparam_mutations=space,
            synch=options["synch"],
        )
    else:
        sched = FIFOScheduler()
    pbt = scheduler == "pbt"
    trainable = tune.with_parameters(
        _ray_trial,
        agent_name=agent_name,
        train_cfg=train_cfg,
        agent_cfg=agent_cfg,
        search=search,
        out_root=out_root,
        pbt=pbt,
        budget=budget,
        trial_env=trial_env,
    )
    tuner = tune.Tuner(
        tune.with_resources(trainable, resources),
        param_space=space,
        tune_config=tune.TuneConfig(
            metric="eval_return",
            mode="max",
            num_samples=trials,
            scheduler=sched,
            search_alg=BasicVariantGenerator(random_state=seed),
        ),
        run_config=tune.RunConfig(
            name="tune",
            storage_path=os.path.join(out_root, "ray"),
            failure_config=tune.FailureConfig(max_failures=0),
            # PBT restores from checkpoints other trials may still want: keep a few.
            checkpoint_config=tune.CheckpointConfig(num_to_keep=4 if pbt else None),
            verbose=1,
        ),
    )
    return tuner.fit()


def _clip(value: Any, p: Param) -> Any:
    """A (PBT-perturbed) value of ``p`` back in its search range, integral for ``int``."""
    if p.kind == "choice":
        return value
    value = min(max(value, p.low), p.high)
    return int(round(value)) if p.kind == "int" else float(value)


def _ray_trial(
    config: dict[str, Any],
    *,
    agent_name: str,
    train_cfg: Any,
    agent_cfg: Any,
    search: dict[str, Param],
    out_root: str,
    pbt: bool,
    budget: int,
    trial_env: dict[str, str],
) -> None:
    """One Ray Tune trial: ``train`` into the trial's run directory, reporting evaluations."""
    for key, value in trial_env.items():
        if key != "PYTHONPATH":  # already read at start-up; the rest JAX reads when it loads
            os.environ.setdefault(key, value)
    from ray import tune

    from jaxrl.cli import train
    from jaxrl.loops.harness import on_eval

    settings = {name: _clip(config[name], p) for name, p in search.items()}
    cfg = apply_settings(agent_cfg, settings)
    out = os.path.join(out_root, f"trial-{tune.get_context().get_trial_id()}")
    checkpoint = tune.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as packed:
            out, final = _restore_packed(packed, out, agent_name, cfg, budget)
        if final is not None:
            tune.report(final)
            return
    finals: list[dict[str, Any]] = []

    def send(metrics: dict[str, Any]) -> None:
        if not pbt:
            tune.report(metrics)
            return
        with tempfile.TemporaryDirectory() as packed:
            _pack_run(metrics["run_dir"], packed)
            tune.report(metrics, checkpoint=tune.Checkpoint.from_directory(packed))

    def report(run_dir: str, step: int, eval_return: float, nonfinite: int) -> None:
        failure = _eval_failure(run_dir, step, eval_return, nonfinite)
        if failure:
            raise Diverged(failure)
        metrics = {"eval_return": eval_return, "step": step, "nonfinite": nonfinite}
        metrics["run_dir"] = run_dir
        if step >= budget:  # sent once summary.json is written: Ray may pause the trial there
            finals.append(metrics)
        else:
            send(metrics)

    with on_eval(report):
        summary = train(agent_name, dataclasses.replace(train_cfg, out=out), cfg)
    if not summary["completed"]:
        raise RuntimeError(f"{out} stopped at step {summary['total_steps']} (a stop signal).")
    # Without a final evaluation here, the trial restarted after its run had finished.
    value = summary["final_eval_return_mean"]
    send(finals[-1] if finals else {"eval_return": value, "step": budget, "run_dir": out})


def _pack_run(run_dir: str, dest: str) -> None:
    """Copy ``run_dir``'s newest checkpoint, ``config.json`` and ``metrics.csv`` to ``dest``."""
    from jaxrl.checkpoint import Checkpointer

    step = Checkpointer(os.path.join(run_dir, "checkpoints")).latest_step()
    for name in ("config.json", "metrics.csv"):
        if os.path.exists(os.path.join(run_dir, name)):
            shutil.copy2(os.path.join(run_dir, name), os.path.join(dest, name))
    src = os.path.join(run_dir, "checkpoints", str(step))
    shutil.copytree(src, os.path.join(dest, "checkpoints", str(step)))
    with open(os.path.join(dest, "origin.json"), "w") as f:
        json.dump({"run_dir": run_dir, "step": step}, f)


def _restore_packed(
    packed: str, trial_out: str, agent_name: str, agent_cfg: Any, budget: int
) -> tuple[str, dict[str, Any] | None]:
    """Where a restored trial continues (``_pack_run`` wrote ``packed``); a final report or None.

    A trial restarted from its own checkpoint with its own settings continues in that run
    directory (which resumes from its checkpoints). One restarted from another trial's
    checkpoint, or with other settings (PBT's exploit), gets ``<trial_out>-s<step>`` seeded with
    the donor's state and the new settings (``transplant``), unless the donor had already
    finished its run: then nothing is left to train with the new settings, and the trial's
    final report is the donor's (its run directory and evaluation), so that the sweep's best
    run and settings are always ones that were trained.
    """
    from jaxrl.checkpoint import Checkpointer
    from jaxrl.config import config_to_dict

    with open(os.path.join(packed, "origin.json")) as f:
        origin = json.load(f)
    with open(os.path.join(packed, "config.json")) as f:
        donor_settings = json.load(f)["agent_config"]
    src, step = origin["run_dir"], origin["step"]
    own = src == trial_out or src.startswith(f"{trial_out}-s")  # its own lineage
    if own and donor_settings == json.loads(json.dumps(config_to_dict(agent_cfg))):
        return src, None
    if step >= budget:
        last = Checkpointer(os.path.join(packed, "checkpoints")).meta(step)["last_eval"][0]
        return src, {"eval_return": last, "step": step, "nonfinite": 0, "run_dir": src}
    # Async PBT may restart a trial twice from checkpoints of the same step: a new directory each.
    out, k = f"{trial_out}-s{step}", 1
    while os.path.exists(out):
        k += 1
        out = f"{trial_out}-s{step}.{k}"
    transplant(packed, out, agent_name, agent_cfg, donor=src)
    return out, None


# ------------------------------------------------------------------------- PBT state transplant


def _settings_path(path: tuple) -> bool:
    import jax

    return any(isinstance(k, jax.tree_util.GetAttrKey) and k.name in SETTINGS_KEYS for k in path)


def with_settings(trained: Any, fresh: Any) -> Any:
    """``trained`` (an agent) with the settings of ``fresh`` (the same agent, another config).

    The leaves under ``hparams`` and the injected optimizer ``hyperparams`` (learning rates and
    the other optimizer settings) come from ``fresh``, every other leaf (parameters, optimizer
    moments and counts, target networks, RNG, ...) from ``trained``; the static config is
    ``fresh``'s.

    Raises:
        ValueError: the two agents differ in structure or in a leaf's shape.
    """
    import jax
    import numpy as np

    flat_t, treedef_t = jax.tree_util.tree_flatten_with_path(trained)
    flat_f, treedef_f = jax.tree_util.tree_flatten_with_path(fresh)
    if [p for p, _ in flat_t] != [p for p, _ in flat_f]:
        raise ValueError("The agents differ in structure; settings cannot be carried over.")
    leaves = []
    for (path, t), (_, f) in zip(flat_t, flat_f, strict=True):
        if np.shape(t) != np.shape(f):
            raise ValueError(
                f"{jax.tree_util.keystr(path)} has shape {np.shape(t)} in the trained agent and "
                f"{np.shape(f)} in the new one."
            )
        leaves.append(f if _settings_path(path) else t)
    return jax.tree_util.tree_unflatten(treedef_f, leaves)


def _examples(env_id: str) -> tuple[Any, Any]:
    """An observation and an action example of ``env_id`` (what ``create`` takes)."""
    import jax.numpy as jnp

    from jaxrl.envs.jax_envs import is_jax_env, make_jax_env

    if is_jax_env(env_id):
        env = make_jax_env(env_id, 1)
        return jnp.zeros(env.observation_size, jnp.float32), jnp.zeros(env.action_size, jnp.float32)
    from jaxrl.envs import make_env

    env = make_env(env_id, 1)
    obs, act = env.obs_example, env.action_example
    env.close()
    return obs, act


def transplant(
    src: str, out: str, agent_name: str, agent_cfg: Any, donor: str | None = None
) -> None:
    """Start run directory ``out`` from the newest checkpoint of run ``src`` with ``agent_cfg``.

    The checkpoint written to ``out/checkpoints`` is ``src``'s full training state (same step)
    with the agent's settings taken from ``agent_cfg`` (``with_settings``); ``config.json`` is
    ``src``'s with ``agent_config`` (and ``out``) replaced, and ``src``'s ``metrics.csv`` is
    copied. ``train`` with ``--out out`` and ``agent_cfg`` then resumes there. This is PBT's
    exploit step.

    Args:
        src: a run directory (or a packed copy: ``config.json`` and ``checkpoints/``).
        out: the new run directory (must not hold a checkpoint).
        agent_name: the agent of both runs.
        agent_cfg: the new settings (static fields must equal ``src``'s where they shape the
            state).
        donor: the run directory recorded as the origin (default ``src``).

    Raises:
        ValueError: ``out`` already holds a checkpoint, or the settings change the state's
            structure.
    """
    from jaxrl import registry
    from jaxrl.checkpoint import Checkpointer
    from jaxrl.config import config_to_dict
    from jaxrl.envs import episode_length
    from jaxrl.loops.config import prepare_run_dir
    from jaxrl.runs import load_run

    ckpt = Checkpointer(os.path.join(out, "checkpoints"))
    if ckpt.latest_step() is not None:
        raise ValueError(f"{out} already holds a checkpoint; transplant into a new directory.")
    spec = registry.get(agent_name)
    run = load_run(src)
    env_id = run.config["env"]
    if spec.env_defaults is not None:  # as ``train`` resolves it
        agent_cfg = spec.with_env_defaults(agent_cfg, episode_length(env_id))
    fresh = spec.agent.create(agent_cfg, *_examples(env_id), run.config["seed"])
    state = run.state.replace(agent=with_settings(run.agent, fresh))
    step = Checkpointer(os.path.join(src, "checkpoints")).latest_step()
    config = {**run.config, "agent_config": config_to_dict(agent_cfg)}
    prepare_run_dir(out, {**config, "train": {**run.config["train"], "out": out}})
    meta = {**run.meta, "pbt_donor": {"run_dir": donor or src, "step": step}}
    ckpt.save(step, state, meta)
    if os.path.exists(os.path.join(src, "metrics.csv")):
        shutil.copy2(os.path.join(src, "metrics.csv"), os.path.join(out, "metrics.csv"))


def _host(x: Any) -> Any:
    """``x`` as a NumPy array (typed PRNG keys as their key data)."""
    import jax
    import numpy as np

    if isinstance(x, jax.Array) and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
        x = jax.random.key_data(x)
    return np.asarray(x)


def check_pbt_search(agent_name: str, train_cfg: Any, agent_cfg: Any, search: dict) -> None:
    """Refuse searched fields PBT cannot mutate in a running trial (see ``ray_sweep``).

    A field qualifies when agents created with its different values (same seed) differ only
    in settings leaves (``with_settings``) and in the static config.

    Raises:
        ValueError: a run with ``--dataset``, ``buffer_size`` in the search, or a field whose
            values change the agent's arrays or learned values.
    """
    import jax
    import numpy as np

    from jaxrl import registry
    from jaxrl.envs.jax_envs import is_jax_env

    if train_cfg.dataset:
        raise ValueError(
            "PBT restarts online runs only; with --dataset use --scheduler asha or fifo."
        )
    if "buffer_size" in search:
        raise ValueError(
            "PBT cannot mutate buffer_size (it shapes the replay buffer a restarted trial "
            "inherits); search it with --scheduler asha or fifo."
        )
    spec = registry.get(agent_name)
    env_id = train_cfg.env
    obs, act = _examples(env_id) if is_jax_env(env_id) or env_id else (None, None)
    for name, p in search.items():
        values = list(p.choices) if p.kind == "choice" else [p.low, p.high]
        agents = [
            spec.agent.create(apply_settings(agent_cfg, {name: v}), obs, act, 0) for v in values
        ]
        ref = jax.tree_util.tree_flatten_with_path(agents[0])
        for other in agents[1:]:
            flat = jax.tree_util.tree_flatten_with_path(other)
            same = [p for p, _ in flat[0]] == [p for p, _ in ref[0]] and all(
                _settings_path(path)
                or (np.shape(a) == np.shape(b) and np.array_equal(_host(a), _host(b)))
                for (path, a), (_, b) in zip(flat[0], ref[0], strict=True)
            )
            if not same:
                raise ValueError(
                    f"PBT cannot mutate {name}: its values change the agent's arrays or initial "
                    "learned values, which a restarted trial inherits from its donor. Search it "
                    "with --scheduler asha or fifo, or fix it for the PBT sweep."
                )


def _ray_summary(
    agent_name: str,
    train_cfg: Any,
    agent_cfg: Any,
    search: dict[str, Param],
    out_root: str,
    results: Any,
    budget: int,
) -> dict[str, Any]:
    from jaxrl.loops.config import run_config

    counts: dict[str, int] = {}
    best = None
    run_dirs = []
    for result in results:
        metrics = result.metrics or {}
        if metrics.get("run_dir"):
            run_dirs.append(metrics["run_dir"])
        if result.error is not None:
            state = "ERROR"
        elif metrics.get("step", 0) >= budget:
            state = "COMPLETE"
            if best is None or metrics["eval_return"] > best.metrics["eval_return"]:
                best = result
        else:
            state = "STOPPED"
        counts[state] = counts.get(state, 0) + 1
    summary: dict[str, Any] = {
        "out_root": out_root,
        "storage_path": os.path.join(out_root, "ray", "tune"),
        "best_value": None,
        "best_params": None,
        "best_trial": None,
        "best_run_dir": None,
        "best_config": None,
        "n_trials": len(results),
        "trials": counts,
        "run_dirs": run_dirs,
    }
    if best is None:
        return summary
    run_dir = best.metrics["run_dir"]
    params = {name: _clip(best.config[name], p) for name, p in search.items()}
    if os.path.exists(os.path.join(run_dir, "config.json")):  # the settings it trained with
        with open(os.path.join(run_dir, "config.json")) as f:
            trained = json.load(f)["agent_config"]
        params = {name: trained[name] for name in search}
    fallback = run_config(agent_name, apply_settings(agent_cfg, params), train_cfg)
    trial_id = best.metrics.get("trial_id")
    value = float(best.metrics["eval_return"])
    sweep = {"backend": "ray", "trial": trial_id, "value": value, "params": params}
    summary |= {
        "best_value": value,
        "best_params": params,
        "best_trial": trial_id,
        "best_run_dir": run_dir,
        "best_config": _write_best(out_root, run_dir, fallback, sweep),
    }
    return summary


__all__ = [
    "DISTRIBUTIONS",
    "Diverged",
    "Param",
    "apply_settings",
    "check_pbt_search",
    "optuna_sweep",
    "parse_search",
    "ray_sweep",
    "transplant",
    "with_settings",
]
