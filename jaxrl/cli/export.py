"""``jaxrl export DIR --format onnx|numpy|jax [--out FILE] [--step N]``; prints one JSON line."""

from __future__ import annotations

import dataclasses
import json
from typing import Annotated, Any, Literal

import tyro

from jaxrl.cli.common import guard, parse
from jaxrl.export.contract import FORMATS


@dataclasses.dataclass(frozen=True)
class ExportArgs:
    """The options of ``jaxrl export``."""

    run_dir: Annotated[str, tyro.conf.Positional]
    """the run directory to export"""
    format: Literal[FORMATS]  # type: ignore[valid-type]
    """the artifact's format"""
    out: str | None = None
    """artifact path (default DIR/export/policy.EXT)"""
    step: int | None = None
    """checkpoint step (default: newest)"""


def run(argv: list[str]) -> dict[str, Any]:
    """Parse ``argv``, export the run's policy and print ``{"artifact", "contract", "format"}``."""
    from jaxrl.export.policy import contract_path, export_run

    description = (
        "Export the deterministic evaluation policy of a run directory (observation normalizer "
        "and action rescaling folded in) with a contract JSON."
    )
    a = parse(ExportArgs, argv, "jaxrl export", description)
    path = guard(lambda: export_run(a.run_dir, a.format, a.out, a.step))
    result = {"artifact": path, "contract": contract_path(path), "format": a.format}
    print(json.dumps(result))
    return result
