"""Ray Tune backend of ``jaxrl sweep`` (``ray_sweep``).

FIFO, ASHA or PBT over trainables that run ``jaxrl.run.train`` (see ``jaxrl.tune``).
"""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
import warnings
from typing import Any

from jaxrl.errors import ConfigError, require
from jaxrl.tune import space
from jaxrl.tune.pbt import check_pbt_search, pack_run, restore_packed


def ray_sweep(
    job: space.Sweep,
    *,
    address: str | None = None,
    scheduler: str = "fifo",
    cpus_per_trial: float = 1.0,
    gpus_per_trial: float = 0.0,
    num_cpus: int | None = None,
    grace_period: int | None = None,
    perturbation_interval: int | None = None,
    pbt_synch: bool = False,
    env_vars: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Search ``job.search`` with Ray Tune, maximizing the evaluation return.

    Each trial is a function trainable that runs ``jaxrl.run.train`` in its Ray worker process
    into ``out_root/trial-<trial id>`` and reports every evaluation with ``tune.report`` (keys
    ``eval_return``, ``step``, ``nonfinite``, ``run_dir``). The first configurations are drawn at
    random (seeded by ``job.seed``) from the search; the trials' training seed is
    ``job.train_cfg.seed``.

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
        job: the sweep (``Sweep.of(agent_name, train_cfg, agent_cfg, search, trials=...,
            out_root=..., seed=...)``): ``trials`` is the number of trials (PBT: the population
            size), ``out_root`` holds the trial run directories, Ray's files and
            ``best_config.json``, ``seed`` seeds the random search.
        address: a Ray cluster to join (``"auto"``, ``"ray://host:10001"``, ...).
        scheduler: ``"fifo"``, ``"asha"`` or ``"pbt"``.
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
        ConfigError: an unknown scheduler, a PBT search over a field PBT cannot mutate, or a bad
            ``perturbation_interval``.
        MissingExtraError: ray is not installed.
    """
    import jaxrl
    from jaxrl import registry

    require("ray.tune", "sweep")
    import ray
    from ray import tune

    if scheduler not in ("fifo", "asha", "pbt"):
        raise ConfigError(f"Unknown scheduler {scheduler!r}; use 'fifo', 'asha' or 'pbt'.")
    train_cfg, out_root = job.train_cfg, job.out_root
    os.makedirs(out_root, exist_ok=True)
    budget = space.last_eval_step(registry.get(job.agent_name), train_cfg)
    if scheduler == "pbt":
        if train_cfg.dataset:
            raise ConfigError(
                "PBT restarts online runs only; with --dataset use --scheduler asha or fifo."
            )
        perturbation_interval = perturbation_interval or train_cfg.eval_every
        if perturbation_interval % train_cfg.eval_every:
            raise ConfigError(
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
            check_pbt_search(job.agent_name, train_cfg, job.agent_cfg, job.search)
        results = _fit(
            tune,
            job,
            scheduler,
            {"cpu": cpus_per_trial, "gpu": gpus_per_trial},
            budget,
            {"grace": grace_period, "interval": perturbation_interval, "synch": pbt_synch},
            trial_env,
        )
    finally:
        if started:
            ray.shutdown()
    return _ray_summary(job, results, budget)


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


def _ray_domain(tune: Any, p: space.Param) -> Any:
    if p.kind == "uniform":
        return tune.uniform(p.low, p.high)
    if p.kind == "loguniform":
        return tune.loguniform(p.low, p.high)
    if p.kind == "int":
        return tune.randint(int(p.low), int(p.high) + 1)  # randint excludes its upper end
    return tune.choice(list(p.choices))


def _fit(
    tune: Any,
    job: space.Sweep,
    scheduler: str,
    resources: dict[str, float],
    budget: int,
    options: dict[str, Any],
    trial_env: dict[str, str],
) -> Any:
    """Build the Tuner and run it; the ``ResultGrid``."""
    from ray.tune.schedulers import ASHAScheduler, FIFOScheduler, PopulationBasedTraining
    from ray.tune.search.basic_variant import BasicVariantGenerator

    space = {name: _ray_domain(tune, p) for name, p in job.search.items()}
    if scheduler == "asha":
        grace = options["grace"] or max(job.train_cfg.eval_every, budget // 3)
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
        job=job,
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
            num_samples=job.trials,
            scheduler=sched,
            search_alg=BasicVariantGenerator(random_state=job.seed),
        ),
        run_config=tune.RunConfig(
            name="tune",
            storage_path=os.path.join(job.out_root, "ray"),
            failure_config=tune.FailureConfig(max_failures=0),
            # PBT restores from checkpoints other trials may still want: keep a few.
            checkpoint_config=tune.CheckpointConfig(num_to_keep=4 if pbt else None),
            verbose=1,
        ),
    )
    return tuner.fit()


def _clip(value: Any, p: space.Param) -> Any:
    """A (PBT-perturbed) value of ``p`` back in its search range, integral for ``int``."""
    if p.kind == "choice":
        return value
    value = min(max(value, p.low), p.high)
    return int(round(value)) if p.kind == "int" else float(value)


def _ray_trial(
    config: dict[str, Any],
    *,
    job: space.Sweep,
    pbt: bool,
    budget: int,
    trial_env: dict[str, str],
) -> None:
    """One Ray Tune trial: ``train`` into the trial's run directory, reporting evaluations."""
    for key, value in trial_env.items():
        if key != "PYTHONPATH":  # already read at start-up; the rest JAX reads when it loads
            os.environ.setdefault(key, value)
    from ray import tune

    from jaxrl.loops.cadence import on_eval
    from jaxrl.run.train import train

    settings = {name: _clip(config[name], p) for name, p in job.search.items()}
    cfg = space.apply_settings(job.agent_cfg, settings)
    out = os.path.join(job.out_root, f"trial-{tune.get_context().get_trial_id()}")
    checkpoint = tune.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as packed:
            out, final = restore_packed(packed, out, job.agent_name, cfg, budget)
        if final is not None:
            tune.report(final)
            return
    finals: list[dict[str, Any]] = []

    def send(metrics: dict[str, Any]) -> None:
        if not pbt:
            tune.report(metrics)
            return
        with tempfile.TemporaryDirectory() as packed:
            pack_run(metrics["run_dir"], packed)
            tune.report(metrics, checkpoint=tune.Checkpoint.from_directory(packed))

    def report(run_dir: str, step: int, eval_return: float, nonfinite: int) -> None:
        failure = space.eval_failure(run_dir, step, eval_return, nonfinite)
        if failure:
            raise space.Diverged(failure)
        metrics = {"eval_return": eval_return, "step": step, "nonfinite": nonfinite}
        metrics["run_dir"] = run_dir
        if step >= budget:  # sent once summary.json is written: Ray may pause the trial there
            finals.append(metrics)
        else:
            send(metrics)

    with on_eval(report):
        summary = train(job.agent_name, dataclasses.replace(job.train_cfg, out=out), cfg)
    if summary.get("status") == "diverged":  # the NaN guard stopped it
        raise space.Diverged(f"{out}: diverged (NaN) by step {summary['diverged_at']}")
    if not summary["completed"]:
        raise RuntimeError(f"{out} stopped at step {summary['total_steps']} (a stop signal).")
    # Without a final evaluation here, the trial restarted after its run had finished.
    value = summary["final_eval_return_mean"]
    send(finals[-1] if finals else {"eval_return": value, "step": budget, "run_dir": out})


def _ray_summary(job: space.Sweep, results: Any, budget: int) -> dict[str, Any]:

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
    extra = {"storage_path": os.path.join(job.out_root, "ray", "tune"), "run_dirs": run_dirs}
    if best is None:
        return space.sweep_summary(job, counts, len(results), None, **extra)
    run_dir = best.metrics["run_dir"]
    params = {name: _clip(best.config[name], p) for name, p in job.search.items()}
    if os.path.exists(os.path.join(run_dir, "config.json")):  # the settings it trained with
        with open(os.path.join(run_dir, "config.json")) as f:
            trained = json.load(f)["agent_config"]
        params = {name: trained[name] for name in job.search}
    value = float(best.metrics["eval_return"])
    found = space.Best(best.metrics.get("trial_id"), value, params, run_dir, {"backend": "ray"})
    return space.sweep_summary(job, counts, len(results), found, **extra)


__all__ = ["ray_sweep"]
