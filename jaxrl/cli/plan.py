"""``jaxrl plan --env ENV``: MPPI/CEM with the true simulator as model; prints one line.

A run a stop signal ended exits with ``EXIT_STOPPED`` (the same command resumes it).
"""

from __future__ import annotations

import dataclasses
from typing import Annotated, Any

import tyro

from jaxrl.cli.common import EXIT_STOPPED, guard, parse


def run(argv: list[str]) -> dict[str, Any]:
    """Parse the run and planner options (tyro), plan and print one line."""
    from jaxrl.loops.plan import TRUE_SIM_PLANNER, PlanRunConfig, plan_run
    from jaxrl.planners import PlannerConfig

    omit = tyro.conf.OmitArgPrefixes
    args_cls = dataclasses.make_dataclass(
        "PlanArgs",
        [
            ("run", Annotated[PlanRunConfig, omit]),
            (
                "planner",
                Annotated[PlannerConfig, omit],
                dataclasses.field(default=TRUE_SIM_PLANNER),
            ),
        ],
    )
    description = (
        "Plan with MPPI or CEM using the true simulator as model (JAX envs). The planner "
        "defaults are the true-model ones (horizon 16, 64 samples, 8 elites, 3 iterations, "
        "max std 0.5), not TD-MPC2's."
    )
    args = parse(args_cls, argv, "jaxrl plan", description)
    summary = guard(lambda: plan_run(args.run, args.planner))
    if not summary["completed"]:  # a stop signal: the state is saved, the same command resumes
        raise SystemExit(EXIT_STOPPED)
    print(
        f"return {summary['final_eval_return_mean']:.2f} +/- {summary['final_eval_return_std']:.2f}"
        f" over {summary['episodes']} episode(s); planning latency per action: median "
        f"{summary['plan_latency_ms_median']:.2f} ms, p90 {summary['plan_latency_ms_p90']:.2f} ms"
    )
    return summary
