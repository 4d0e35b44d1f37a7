"""Optuna backend of ``jaxrl sweep`` (``optuna_sweep``).

One study; its trials run in this process or in worker processes that join the study's
storage (see ``jaxrl.tune``).
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Any

from jaxrl.errors import ConfigError, require
from jaxrl.tune import space
from jaxrl.tune import workers as worker_pool


def optuna_sweep(
    job: space.Sweep,
    *,
    storage: str | None = None,
    study_name: str | None = None,
    n_jobs: int = 1,
    sampler: str = "tpe",
    pruner: str = "median",
    n_startup_trials: int = 10,
) -> dict[str, Any]:
    """Search ``job.search`` with an Optuna study that maximizes the final evaluation return.

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
    processes (the spawn pool of ``jaxrl.tune.workers``, importing this same ``jaxrl``) that
    join the study in the same storage and run ``trials`` between them (the first
    ``trials % n_jobs`` run one more). Use a server database (PostgreSQL/MySQL) for many
    workers; SQLite serializes their writes.

    Args:
        job: the sweep (``Sweep.of(agent_name, train_cfg, agent_cfg, search, trials=...,
            out_root=..., seed=...)``): ``trials`` in total over ``n_jobs`` workers, into
            ``out_root`` (one study per directory); ``seed`` seeds the sampler (the trials'
            training seed is ``train_cfg.seed``).
        storage: Optuna storage URL (default: SQLite in ``out_root``).
        study_name: the study (default ``<agent>-<env>``).
        n_jobs: worker processes running trials at once.
        sampler: ``"tpe"`` or ``"random"``.
        pruner: ``"median"`` or ``"none"``.
        n_startup_trials: random trials before TPE models the results, and trials before the
            median pruner prunes.

    Returns:
        ``{"study_name", "storage", "out_root", "best_value", "best_params", "best_trial",
        "best_run_dir", "best_config", "n_trials", "trials": {state: count}}``; the ``best_*``
        entries are None when no trial completed (then no ``best_config.json`` is written).

    Raises:
        ConfigError: ``n_jobs`` < 1, an unknown sampler or pruner.
        MissingExtraError: optuna is not installed.
    """
    optuna: Any = require("optuna", "sweep")
    if n_jobs < 1:
        raise ConfigError(f"n_jobs must be at least 1, got {n_jobs}.")
    if sampler not in ("tpe", "random"):
        raise ConfigError(f"Unknown sampler {sampler!r}; use 'tpe' or 'random'.")
    if pruner not in ("median", "none"):
        raise ConfigError(f"Unknown pruner {pruner!r}; use 'median' or 'none'.")
    os.makedirs(job.out_root, exist_ok=True)
    storage = storage or f"sqlite:///{os.path.join(job.out_root, 'sweep.db')}"
    study_name = study_name or f"{job.agent_name}-{job.train_cfg.env.replace(':', '_')}"
    options = {"sampler": sampler, "pruner": pruner, "n_startup_trials": n_startup_trials}
    # Created here first, so that parallel workers only ever load it.
    optuna.create_study(
        storage=storage, study_name=study_name, direction="maximize", load_if_exists=True
    )
    try:
        if n_jobs == 1:
            _optimize(job, storage, study_name, 0, options)
        else:
            _run_workers(job, storage, study_name, n_jobs, options)
    except KeyboardInterrupt:
        print("Sweep stopped; the interrupted trial is marked FAILED.")
    return _optuna_summary(job, storage, study_name)


def _sampler_seed(seed: int, worker: int, existing: int) -> int:
    import numpy as np

    return int(np.random.SeedSequence([seed, worker, existing]).generate_state(1)[0])


def _optimize(
    job: space.Sweep, storage: str, study_name: str, worker: int, options: dict[str, Any]
) -> None:
    """Run ``job.trials`` trials of the study in this process."""
    import optuna

    from jaxrl import registry
    from jaxrl.config import ConfigError
    from jaxrl.loops.cadence import on_eval
    from jaxrl.run.train import train

    agent_name, train_cfg, out_root = job.agent_name, job.train_cfg, job.out_root
    study = optuna.load_study(study_name=study_name, storage=storage)
    n_start = options["n_startup_trials"]
    sampler_seed = _sampler_seed(job.seed, worker, len(study.trials))
    if options["sampler"] == "tpe":
        study.sampler = optuna.samplers.TPESampler(
            n_startup_trials=n_start, multivariate=True, seed=sampler_seed
        )
    else:
        study.sampler = optuna.samplers.RandomSampler(seed=sampler_seed)
    budget = space.last_eval_step(registry.get(agent_name), train_cfg)
    if options["pruner"] == "median":
        study.pruner = optuna.pruners.MedianPruner(
            n_startup_trials=n_start, n_warmup_steps=budget // 3
        )
    else:
        study.pruner = optuna.pruners.NopPruner()

    def objective(trial: Any) -> float:
        settings = {name: _suggest(trial, name, p) for name, p in job.search.items()}
        out = os.path.join(out_root, f"trial-{trial.number}")
        trial.set_user_attr("run_dir", out)
        if os.path.exists(os.path.join(out, "config.json")):  # numbers are unique per study
            raise ConfigError(
                f"{out} already holds a run, of another study in {out_root}; give each study "
                f"its own out_root, or pass study_name={study_name!r} to add trials to it."
            )
        try:
            cfg = space.apply_settings(job.agent_cfg, settings)
        except ConfigError as err:
            trial.set_user_attr("fail_reason", f"settings rejected: {err}")
            raise _Rejected(str(err)) from err

        def report(o: str, step: int, eval_return: float, nonfinite: int) -> None:
            failure = space.eval_failure(o, step, eval_return, nonfinite)
            if failure:
                trial.set_user_attr("fail_reason", failure)
                raise space.Diverged(failure)
            trial.report(eval_return, step)
            if step < budget and trial.should_prune():
                raise optuna.TrialPruned(f"step {step}: eval return {eval_return:.2f}")

        with on_eval(report):
            summary = train(agent_name, dataclasses.replace(train_cfg, out=out), cfg)
        if summary.get("status") == "diverged":  # the NaN guard stopped it
            reason = f"{out}: diverged (NaN) by step {summary['diverged_at']}"
            trial.set_user_attr("fail_reason", reason)
            raise space.Diverged(reason)
        if not summary["completed"]:  # a stop signal: the run saved its state
            raise KeyboardInterrupt
        value = float(summary["final_eval_return_mean"])
        if not math.isfinite(value):
            trial.set_user_attr("fail_reason", f"final evaluation return {value}")
            raise space.Diverged(f"{out}: final evaluation return {value}")
        return value

    # Optuna marks a trial that raises one of ``catch`` FAILED and goes on with the next; any
    # other error (a user error of the sweep itself, a bug) stops the sweep.
    study.optimize(objective, n_trials=job.trials, catch=(space.Diverged, _Rejected))


class _Rejected(RuntimeError):
    """The agent config rejects a trial's sampled settings: the trial FAILS, the study goes on."""


def _suggest(trial: Any, name: str, p: space.Param) -> Any:
    if p.kind == "uniform":
        return trial.suggest_float(name, p.low, p.high)
    if p.kind == "loguniform":
        return trial.suggest_float(name, p.low, p.high, log=True)
    if p.kind == "int":
        return trial.suggest_int(name, int(p.low), int(p.high))
    if all(c is None or isinstance(c, bool | int | float | str) for c in p.choices):
        return trial.suggest_categorical(name, list(p.choices))
    # Optuna stores only scalars: tuples are suggested by their text and mapped back.
    texts = [
        " ".join(map(space.setting_text, c)) if isinstance(c, tuple) else space.setting_text(c)
        for c in p.choices
    ]
    return p.choices[texts.index(trial.suggest_categorical(name, texts))]


@dataclasses.dataclass(frozen=True)
class OptunaJob:
    """One worker's share of a study, handed to ``optuna_worker`` in a worker process.

    Attributes:
        sweep: what every trial shares; ``sweep.trials`` is this worker's share.
        storage: the study's Optuna storage URL.
        study_name: the study to join.
        worker: the worker's index (seeds its sampler apart from the others').
        options: ``{"sampler", "pruner", "n_startup_trials"}`` of ``optuna_sweep``.
    """

    sweep: space.Sweep
    storage: str
    study_name: str
    worker: int
    options: dict[str, Any]

    @property
    def trials(self) -> int:
        """Trials this worker runs."""
        return self.sweep.trials


def optuna_worker(job: OptunaJob) -> None:
    """Run ``job``'s trials of its study: the entry of an ``n_jobs`` worker process."""
    try:
        _optimize(job.sweep, job.storage, job.study_name, job.worker, job.options)
    except KeyboardInterrupt:  # the trial is marked FAILED; the parent returns the summary
        pass


def _run_workers(
    job: space.Sweep, storage: str, study_name: str, n_jobs: int, options: dict[str, Any]
) -> None:
    """``n_jobs`` worker processes (``jaxrl.tune.workers``) share ``job.trials`` trials."""
    jobs = []
    for worker in range(n_jobs):
        share = job.trials // n_jobs + (worker < job.trials % n_jobs)
        if share:
            sweep = dataclasses.replace(job, trials=share)
            jobs.append(OptunaJob(sweep, storage, study_name, worker, options))
    worker_pool.run_pool(optuna_worker, jobs, len(jobs))


def _optuna_summary(job: space.Sweep, storage: str, study_name: str) -> dict[str, Any]:
    import optuna

    study = optuna.load_study(study_name=study_name, storage=storage)
    all_trials = study.get_trials(deepcopy=False)
    counts: dict[str, int] = {}
    for t in all_trials:
        counts[t.state.name] = counts.get(t.state.name, 0) + 1
    best = None
    if counts.get("COMPLETE"):
        trial = study.best_trial
        params = {k: _from_optuna(v) for k, v in trial.params.items()}
        where = {"backend": "optuna", "study_name": study_name, "storage": storage}
        best = space.Best(trial.number, trial.value, params, trial.user_attrs.get("run_dir"), where)
    extra = {"study_name": study_name, "storage": storage}
    return space.sweep_summary(job, counts, len(all_trials), best, **extra)


def _from_optuna(value: Any) -> Any:
    """A stored categorical text of a tuple back as the tuple (``_suggest``)."""
    if isinstance(value, str) and " " in value:
        return tuple(space.literal_value(x) for x in value.split())
    return value


__all__ = ["OptunaJob", "optuna_sweep", "optuna_worker"]
