"""The ``jaxrl`` command line: ``jaxrl COMMAND ...`` dispatches to ``jaxrl.cli.COMMAND``.

Every command parses its options with tyro in its own module (``jaxrl.cli.train``,
``finetune``, ``eval``, ``dataset``, ``sweep``, ``plot``, ``plan``, ``export``), each with a
``run(argv)``. ``jaxrl --help`` imports none of them. ``jaxrl train AGENT --help`` lists every
loop option and agent hyperparameter with its docstring.
"""

from __future__ import annotations

import importlib
import sys

from jaxrl.cli.common import EXIT_DIVERGED, EXIT_STOPPED
from jaxrl.cli.train import parse_train_args

COMMANDS = ("train", "finetune", "eval", "dataset", "sweep", "plot", "plan", "export")
"""The commands; ``jaxrl COMMAND`` runs ``jaxrl.cli.COMMAND.run(argv)``."""

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


AGENTS = (
    "sac", "td3", "ppo", "rlpd", "bc", "td3-bc", "cql", "cal-ql", "iql", "rebrac", "idql",
    "diffusion-ql", "fql", "tdmpc2", "pets",
)  # fmt: skip
"""The built-in agents, named without importing them (``jaxrl.registry.names()``)."""


def usage() -> str:
    """The text of ``jaxrl --help``: the commands and the built-in agents (imports no agent)."""
    return USAGE.format(agents=", ".join(AGENTS))


def main(argv: list[str] | None = None) -> None:
    """Entry point of the ``jaxrl`` console script."""
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return
    cmd, rest = argv[0], argv[1:]
    if cmd not in COMMANDS:
        raise SystemExit(f"Unknown command {cmd!r}.\n{usage()}")
    importlib.import_module(f"jaxrl.cli.{cmd}").run(rest)


__all__ = [
    "AGENTS",
    "COMMANDS",
    "EXIT_DIVERGED",
    "EXIT_STOPPED",
    "main",
    "parse_train_args",
    "usage",
]


if __name__ == "__main__":
    main()
