"""``jaxrl dataset collect ...`` (write a D4RL-format file) and ``jaxrl dataset info FILE``."""

from __future__ import annotations

import dataclasses
import json
from typing import Annotated, Literal

import tyro

from jaxrl.cli.common import guard, parse
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
class InfoArgs:
    """Size, episodes, returns and reference scores of a dataset."""

    dataset: Annotated[str, tyro.conf.Positional]
    """a .hdf5 file, a Minari dataset directory, or minari:ID"""
    env: str | None = None
    """env id when the file does not name one (scores)"""


Action = (
    Annotated[CollectArgs, tyro.conf.subcommand("collect")]
    | Annotated[InfoArgs, tyro.conf.subcommand("info")]
)


def run(argv: list[str]) -> None:
    """Parse ``argv`` and collect a dataset or print a dataset's info as JSON."""
    from jaxrl.data import load_dataset

    a = parse(Action, argv, "jaxrl dataset", "Make D4RL-format datasets and inspect datasets.")
    if isinstance(a, InfoArgs):
        info = guard(lambda: load_dataset(a.dataset, a.env).info())
        print(json.dumps(info, indent=2, default=str))
        return
    guard(lambda: collect_dataset(a))


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
