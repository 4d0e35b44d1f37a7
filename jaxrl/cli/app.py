"""The ``jaxrl`` command line: ``jaxrl train AGENT ...``, ``jaxrl eval DIR``, ``jaxrl plot``.

``jaxrl train AGENT --help`` lists every loop option and agent hyperparameter with its docstring.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import sys
from typing import Annotated, Any

from jaxrl.cli.train import parse_train_args
from jaxrl.run.train import train

USAGE = """usage: jaxrl {{train,finetune,eval,dataset,sweep,plot,plan}} ...

  jaxrl train AGENT --env ENV [--total-steps N] [--seed S] [--num-envs E] [--out DIR]
                    [--eval-every N] [--eval-episodes N] [agent options...]
  jaxrl train AGENT --dataset PATH|minari:ID [--env ENV] ...   offline agents
  jaxrl train AGENT --dataset D --env E --offline-steps N --online-steps M   offline-to-online
  jaxrl train rlpd --env E --dataset D [--total-steps M] [--offline-ratio 0.5]   online + data
  jaxrl train AGENT --config FILE.json ...   agent settings from a file (a run's config.json,
                    a sweep's best_config.json); options after it override them
  jaxrl finetune DIR --online-steps M [--offline-ratio R]   continue an offline run online
  jaxrl dataset collect --env ENV --policy RUN_DIR --kind KIND --steps N --out FILE.hdf5
  jaxrl dataset info FILE [--env ENV]   size, episodes, returns, reference scores
  jaxrl eval DIR [--episodes N]      print one JSON line with the evaluation return
  jaxrl plot DIR [DIR ...] [--out PREFIX|FILE.png] [--boot N] [--seed S]
                    learning curves and IQM table of runs, seeds and sweeps (grouped by config)
  jaxrl sweep AGENT --env ENV|--dataset D --seeds N --grid FIELD=V1,V2 [--grid ...] [options]
                    settings x seeds; vmapped in one program on JAX envs and datasets
  jaxrl sweep AGENT --backend optuna|ray --search FIELD=loguniform:LO:HI --trials N ...
  jaxrl plan --env ENV [--episodes N] [--out DIR] [--seed S] [planner options...]
                    MPPI/CEM with the true simulator as model (JAX envs; no learning)
  jaxrl export DIR --format onnx|numpy|jax [--out FILE] [--step N]
                    the deterministic evaluation policy, with FILE.contract.json

agents: {agents}
`jaxrl train AGENT --help` lists every option with its documentation.
"""


def _usage() -> str:
    from jaxrl import registry

    return USAGE.format(agents=", ".join(registry.names()))


def main(argv: list[str] | None = None) -> None:
    """Entry point of the ``jaxrl`` console script."""
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage())
        return
    cmd, rest = argv[0], argv[1:]
    if cmd == "train":
        if not rest or rest[0].startswith("-"):
            raise SystemExit(_usage())
        train_cfg, agent_cfg = _guard(lambda: parse_train_args(rest[0], rest[1:]))
        summary = _guard(lambda: train(rest[0], train_cfg, agent_cfg))
        _print_summary(summary)
    elif cmd == "finetune":
        import argparse

        from jaxrl.run.finetune import finetune_run

        p = argparse.ArgumentParser(
            prog="jaxrl finetune", description="Continue an offline run directory online."
        )
        p.add_argument("run_dir")
        p.add_argument("--online-steps", type=int, required=True, help="env steps online")
        p.add_argument(
            "--offline-ratio", type=float, default=None, help="dataset share of each minibatch"
        )
        p.add_argument(
            "--online-lr-schedule",
            choices=("constant", "cosine"),
            default=None,
            help="online learning rates: constant (default) or a new cosine decay",
        )
        a = p.parse_args(rest)
        summary = _guard(
            lambda: finetune_run(a.run_dir, a.online_steps, a.offline_ratio, a.online_lr_schedule)
        )
        _print_summary(summary)
    elif cmd == "eval":
        import argparse

        p = argparse.ArgumentParser(prog="jaxrl eval")
        p.add_argument("run_dir")
        p.add_argument("--episodes", type=int, default=None)
        a = p.parse_args(rest)
        from jaxrl.run.commands import evaluate_run

        print(json.dumps(_guard(lambda: evaluate_run(a.run_dir, a.episodes))))
    elif cmd == "dataset":
        from jaxrl.run.commands import dataset_command

        _guard(lambda: dataset_command(rest))
    elif cmd == "plot":
        from jaxrl.analysis.curves import plot_command

        _guard(lambda: plot_command(rest))
    elif cmd == "sweep":
        from jaxrl.cli.sweep import sweep_command

        result = _guard(lambda: sweep_command(rest))
        keys = ("out", "programs", "best_value", "best_params", "best_config", "n_trials")
        if "kinds" not in result or "settings" in result:  # not --list-fields
            print(json.dumps({k: result[k] for k in keys if k in result}, default=str))
    elif cmd == "plan":
        _plan_command(rest)
    elif cmd == "export":
        from jaxrl.export.policy import export_command

        _guard(lambda: export_command(rest))
    else:
        raise SystemExit(f"Unknown command {cmd!r}.\n{_usage()}")


def _plan_command(argv: list[str]) -> dict[str, Any]:
    """``jaxrl plan``: parse the run and planner options (tyro), plan, print one line."""
    import tyro

    from jaxrl.loops.plan import PlanRunConfig, plan_run
    from jaxrl.planners import PlannerConfig

    omit = tyro.conf.OmitArgPrefixes
    args_cls = dataclasses.make_dataclass(
        "PlanArgs",
        [
            ("run", Annotated[PlanRunConfig, omit]),
            ("planner", Annotated[PlannerConfig, omit], dataclasses.field(default=PlannerConfig())),
        ],
    )
    description = "Plan with MPPI or CEM using the true simulator as model (JAX envs)."
    args = _guard(lambda: tyro.cli(args_cls, args=argv, prog="jaxrl plan", description=description))
    summary = _guard(lambda: plan_run(args.run, args.planner))
    print(
        f"return {summary['final_eval_return_mean']:.2f} +/- {summary['final_eval_return_std']:.2f}"
        f" over {summary['episodes']} episode(s); planning latency per action: median "
        f"{summary['plan_latency_ms_median']:.2f} ms, p90 {summary['plan_latency_ms_p90']:.2f} ms"
    )
    return summary


EXIT_STOPPED = 75
"""Exit status after SIGTERM/SIGINT with the state saved (EX_TEMPFAIL): requeue and resume."""
EXIT_DIVERGED = 3
"""Exit status when the NaN guard stopped a run (the last good checkpoint is kept)."""


def _print_summary(summary: dict[str, Any]) -> None:
    """The one line ``jaxrl train`` / ``jaxrl finetune`` print when a run completes.

    A run that did not complete exits with ``EXIT_DIVERGED`` (the NaN guard stopped it) or
    ``EXIT_STOPPED`` (a stop signal; the state is saved and the same command resumes).
    """
    status = summary.get("status", "completed" if summary["completed"] else "stopped")
    if status == "diverged":
        raise SystemExit(EXIT_DIVERGED)
    if not summary["completed"]:
        raise SystemExit(EXIT_STOPPED)
    if summary.get("dataset") and not summary.get("online_steps"):
        rate = f"{summary['updates_per_s']:.0f} updates/s"
    else:
        rate = f"{summary['env_steps_per_s']:.0f} env steps/s"
    if summary.get("dataset"):
        score = summary["normalized_score"]
        rate += "; normalized score " + ("n/a" if score is None else f"{score:.1f}")
    print(
        f"final eval return: {summary['final_eval_return_mean']:.2f} "
        f"+/- {summary['final_eval_return_std']:.2f} ({rate})"
    )


def _guard(fn: Any) -> Any:
    """Run ``fn``, turning the errors a user can cause into a one-line message and exit code 2.

    A user error is a ``jaxrl.errors.JaxrlError`` (a bad option, env, dataset or checkpoint, a
    missing extra) or a full disk; anything else is a bug and propagates with its traceback.
    """
    from jaxrl.errors import JaxrlError

    try:
        return fn()
    except JaxrlError as err:
        print(f"error: {err}", file=sys.stderr)
        raise SystemExit(2) from None
    except OSError as err:
        if err.errno != errno.ENOSPC:
            raise
        print(
            f"error: no space left on the device writing {err.filename or 'a file'}. Checkpoints "
            "are written atomically, so the newest complete one is intact: free disk space and "
            "rerun the same command to resume.",
            file=sys.stderr,
        )
        raise SystemExit(2) from None


if __name__ == "__main__":
    main()
