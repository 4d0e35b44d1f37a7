"""What every ``jaxrl`` command shares: parsing with tyro, user errors, the summary line."""

from __future__ import annotations

import errno
import sys
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

T = TypeVar("T")

EXIT_STOPPED = 75
"""Exit status after SIGTERM/SIGINT with the state saved (EX_TEMPFAIL): requeue and resume."""
EXIT_DIVERGED = 3
"""Exit status when the NaN guard stopped a run (the last good checkpoint is kept)."""

USAGE = """usage: jaxrl {{train,finetune,eval,dataset,sweep,plot,plan,export}} ...

  jaxrl train AGENT --env ENV [--total-steps N] [--seed S] [--num-envs E] [--out DIR]
                    [--eval-every N] [--eval-episodes N] [agent options...]
  jaxrl train AGENT --dataset PATH|minari:ID [--env ENV] ...   offline agents
  jaxrl train AGENT --dataset D --env E --offline-steps N --online-steps M   offline-to-online
  jaxrl train rlpd --env E --dataset D [--total-steps M] [--offline-ratio 0.5]   online + data
  jaxrl train AGENT --config FILE.json ...   agent settings from a file (a run's config.json,
                    a sweep's best_config.json); options after it override them
  jaxrl finetune DIR --online-steps M [--offline-ratio R]   continue an offline run online
  jaxrl dataset collect --env ENV --policy RUN_DIR --kind KIND --steps N --out FILE.hdf5
  jaxrl dataset recipe --env ENV --out DIR [--expert-steps N] [--seed S] [--kinds K ...]
                    train a SAC expert, write D4RL's medium/medium-replay/expert/medium-expert
  jaxrl dataset info FILE [--env ENV]   size, episodes, returns, reference scores
  jaxrl eval DIR [--episodes N]      print one JSON line with the evaluation return
  jaxrl plot DIR [DIR ...] [--out PREFIX|FILE.png] [--boot N] [--seed S]
                    learning curves and IQM table of runs, seeds and sweeps (grouped by config)
  jaxrl sweep AGENT --env ENV|--dataset D --seeds N --grid FIELD=V1,V2 [--grid ...] [options]
                    settings x seeds; vmapped in one program on JAX envs and datasets
  jaxrl sweep AGENT --backend optuna|ray --search FIELD=loguniform:LO:HI --trials N ...
  jaxrl plan --env ENV [--episodes N] [--out DIR] [--seed S] [planner options...]
                    MPPI/CEM with the true simulator as model (JAX envs; no learning;
                    resumes from DIR)
  jaxrl export DIR --format onnx|numpy|jax [--out FILE] [--step N]
                    the deterministic evaluation policy, with FILE.contract.json

agents: {agents}
`jaxrl train AGENT --help` lists every option with its documentation.
"""


def usage() -> str:
    """The text of ``jaxrl --help``: the commands and the built-in agents (imports no agent)."""
    from jaxrl import registry  # names its agents without importing them

    return USAGE.format(agents=", ".join(registry.names()))


def parse(cls: type[T], argv: Sequence[str], prog: str, description: str) -> T:
    """Parse ``argv`` into ``cls`` (a dataclass) with tyro; a bad option exits 2 with usage."""
    import tyro

    return guard(lambda: tyro.cli(cls, args=list(argv), prog=prog, description=description))


def guard(fn: Callable[[], T]) -> T:
    """Run ``fn``, turning the errors a user can cause into a one-line message and exit code 2.

    A user error is a ``jaxrl.errors.JaxrlError`` (a bad option, env, dataset or checkpoint, a
    missing extra) or a full disk; anything else is a bug and propagates with its traceback
    (exit 1).
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


def print_summary(summary: dict[str, Any]) -> None:
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


__all__ = [
    "EXIT_DIVERGED",
    "EXIT_STOPPED",
    "USAGE",
    "guard",
    "parse",
    "print_summary",
    "usage",
]
