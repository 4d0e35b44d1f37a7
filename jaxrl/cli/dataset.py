"""``jaxrl dataset collect|recipe|info``: write a D4RL-format file, make D4RL's datasets, inspect.

``collect`` rolls out a policy run into one file; ``recipe`` trains a SAC expert and writes the
D4RL kinds from its run (``jaxrl.run.recipe``); ``info FILE`` prints a dataset's statistics.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Annotated, Literal

import tyro

from jaxrl.cli.common import EXIT_DIVERGED, EXIT_STOPPED, guard, parse
from jaxrl.run.collect import KINDS


@dataclasses.dataclass(frozen=True)
class CollectArgs:
    """Generate a D4RL-style dataset from a policy run."""

    kind: Literal[KINDS]  # type: ignore[valid-type]
    """the D4RL kind of dataset"""
    out: str
    """output .hdf5 path"""
    env: str | None = None
    """Gymnasium env id (default: the policy's env)"""
    policy: str | None = None
    """run directory of the behavior policy"""
    policy_step: int | None = None
    """checkpoint step of --policy"""
    medium_policy: str | None = None
    """medium run directory (medium-expert)"""
    expert_policy: str | None = None
    """run whose return is the reference max"""
    steps: int = 1_000_000
    """transitions to collect"""
    seed: int = 0
    """seed of the rollouts"""
    ref_min_return: float | None = None
    """reference return of a random policy (normalized score 0)"""
    ref_max_return: float | None = None
    """reference return of an expert policy (normalized score 100)"""


@dataclasses.dataclass(frozen=True)
class RecipeArgs:
    """Train a SAC expert and write D4RL's datasets from its run (resumes; deterministic)."""

    env: str
    """Gymnasium env id, e.g. Hopper-v5"""
    out: str
    """output directory: the expert run, the .hdf5 files and manifest.json"""
    expert_steps: int = 1_000_000
    """environment steps of the expert SAC run"""
    seed: int = 0
    """seed of the expert run (the rollouts use seed+1, seed+2, ...)"""
    kinds: tuple[str, ...] = ("medium", "medium-replay")
    """datasets to write: medium, medium-replay, expert, medium-expert, random"""
    dataset_steps: int = 1_000_000
    """transitions of each rolled-out dataset (each half of medium-expert)"""
    eval_every: int = 10_000
    """steps between the expert run's evaluations (the expert and medium candidates)"""
    eval_episodes: int = 10
    """episodes per evaluation"""
    ref_episodes: int = 50
    """episodes measuring the uniform random policy's return"""
    record: str | None = None
    """an earlier recipe's manifest.json to reproduce: train only to the medium point"""
    strict_record: bool = False
    """with a record: stop (exit 2) when the expert run leaves its path, not train it whole"""
    progress: bool = True
    """show the training progress bar"""


@dataclasses.dataclass(frozen=True)
class InfoArgs:
    """Size, episodes, returns and reference scores of a dataset."""

    dataset: Annotated[str, tyro.conf.Positional]
    """a .hdf5 file, a Minari dataset directory, or minari:ID"""
    env: str | None = None
    """env id when the file does not name one (scores)"""


Action = (
    Annotated[CollectArgs, tyro.conf.subcommand("collect")]
    | Annotated[RecipeArgs, tyro.conf.subcommand("recipe")]
    | Annotated[InfoArgs, tyro.conf.subcommand("info")]
)


def run(argv: list[str]) -> None:
    """Parse ``argv``; collect a dataset, run the recipe, or print a dataset's info as JSON."""
    from jaxrl.data import load_dataset

    a = parse(Action, argv, "jaxrl dataset", "Make D4RL-format datasets and inspect datasets.")
    if isinstance(a, InfoArgs):
        info = guard(lambda: load_dataset(a.dataset, a.env).info())
        print(json.dumps(info, indent=2, default=str))
        return
    if isinstance(a, RecipeArgs):
        run_recipe(a)
        return
    guard(lambda: collect_dataset(a))


def run_recipe(a: RecipeArgs) -> None:
    """Run ``d4rl_recipe`` (with ``--record`` copied into ``--out``); print its manifest as JSON.

    A stopped expert run exits as ``jaxrl train`` does; the same command resumes it.
    """
    from jaxrl.run.recipe import TrainingStopped, d4rl_recipe
    from jaxrl.run.recipe_files import place_record

    options = dataclasses.asdict(a)  # the fields are d4rl_recipe's arguments, and --record
    env_id, record = options.pop("env"), options.pop("record")
    if record is not None:  # the recipe follows OUT/record.json
        guard(lambda: place_record(record, a.out))
    try:
        manifest = guard(lambda: d4rl_recipe(env_id, **options))
    except TrainingStopped as stop:
        diverged = stop.summary.get("status") == "diverged"
        raise SystemExit(EXIT_DIVERGED if diverged else EXIT_STOPPED) from None
    print(json.dumps(manifest, indent=2))


def collect_dataset(a: CollectArgs) -> None:
    """Roll out ``a.policy`` into a D4RL-format file and print one line about it."""
    from jaxrl.data import save_d4rl
    from jaxrl.run.collect import collect

    options = dataclasses.asdict(a)  # the fields are collect's arguments, plus the output
    out, env_id = options.pop("out"), options.pop("env")
    ds = collect(env_id, **options)
    path = save_d4rl(ds, out)
    info = ds.info()
    print(
        f"wrote {path}: {info['transitions']} transitions, {info['episodes']} episodes, return "
        f"{info['return_mean']:.1f} +/- {info['return_std']:.1f}, normalized "
        f"{info['normalized_score_mean']:.1f} (refs {info['ref_min_return']:.1f} .. "
        f"{info['ref_max_return']:.1f})"
    )
