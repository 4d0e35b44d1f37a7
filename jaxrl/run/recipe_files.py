"""The recipe's files: the manifest entry of each dataset, and the record a recipe may follow.

A *record* is the ``manifest.json`` of a recipe made before (on this kind of machine, or
archived with the results it produced), copied to ``OUT/record.json`` (``jaxrl dataset recipe
--record FILE`` does the copy). A recipe that holds one trains its expert run only as far as the
files need (the medium point, for ``medium`` and ``medium-replay``) and compares its evaluation
there with the record's. Equal returns mean the run took the record's path bit for bit, so the
expert and random returns, which the full run would measure later, are the record's: the files
come out with the record's bytes, at a fraction of the training. Another return means another
path (another kind of CPU): the expert run goes on to its whole budget and the recipe measures
everything itself, as without a record; or, with ``strict`` (``--strict-record``), the recipe
stops there with an error, for a caller that wants the record's files or none (a results suite
that compares runs made on one dataset).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from typing import Any

from jaxrl.errors import ConfigError, DatasetError
from jaxrl.loops.logging import read_metrics

EXPERT_DIR = "expert_sac"
"""The expert run's directory inside the recipe's output directory."""
RECORD_FILE = "record.json"
"""The record a recipe follows, inside its output directory."""
# The values a record supplies to a recipe that follows it.
_VALUES = ("expert_step", "expert_return", "random_return", "medium_step", "medium_return")


def place_record(source: str, out: str) -> None:
    """Copy the manifest ``source`` to ``out/record.json`` (the CLI's ``--record``).

    Raises:
        ConfigError: ``source`` is missing or holds no JSON object.
    """
    if not read_json(source):
        raise ConfigError(
            f"--record {source}: no manifest there (a recipe's manifest.json is a JSON object); "
            "pass the manifest.json of the recipe to reproduce, or leave --record out."
        )
    os.makedirs(out, exist_ok=True)
    if os.path.abspath(source) != os.path.abspath(os.path.join(out, RECORD_FILE)):
        shutil.copyfile(source, os.path.join(out, RECORD_FILE))


def read_record(out: str, settings: dict[str, Any]) -> dict[str, Any] | None:
    """The record in ``out`` that a recipe with ``settings`` can follow, else None.

    A record written before recipes recorded their expert step cannot be followed (the recipe
    then runs whole and says so).

    Raises:
        ConfigError: the record was made with other settings than ``settings``.
    """
    path = os.path.join(out, RECORD_FILE)
    if not os.path.exists(path):
        return None
    record = read_json(path)
    differ = {k: (record.get(k), v) for k, v in settings.items() if record.get(k) != v}
    if differ:
        said = ", ".join(f"{k} {a!r} (asked: {b!r})" for k, (a, b) in differ.items())
        raise ConfigError(
            f"{path} was made with other settings: {said}. Run with the record's settings, "
            f"or delete {path} to make the recipe from scratch."
        )
    if missing := [k for k in _VALUES if not isinstance(record.get(k), int | float)]:
        print(f"{path} records no {', '.join(missing)} (an older recipe): the expert run trains "
              "its whole budget.")  # fmt: skip
        return None
    return record


def steps_to_follow(record: dict[str, Any], kinds: tuple[str, ...]) -> int:
    """How far the expert run must train for ``kinds`` when following ``record``."""
    expert = {"expert", "medium-expert"} & set(kinds)
    return max(record["medium_step"], record["expert_step"] if expert else 0)


_POINTS = {"medium_step": "medium_return", "expert_step": "expert_return"}


def follows(record: dict[str, Any], curve: dict[int, float]) -> bool:
    """True when the run's evaluations equal the record's at the steps the record names."""
    reached = any(record[s] in curve for s in _POINTS)
    return reached and departure(record, curve) is None


def departure(record: dict[str, Any], curve: dict[int, float]) -> str | None:
    """Where the run's evaluations ``curve`` leave ``record``'s path, else None.

    None also while the run has not reached a step the record names, and for a record that
    names none (an older recipe's).
    """
    for step_key, return_key in _POINTS.items():
        step, kept = record.get(step_key), record.get(return_key)
        if isinstance(step, int) and step in curve and curve[step] != kept:
            return f"the expert run evaluates {curve[step]} at step {step} (the record: {kept})"
    return None


def record_departure(out: str) -> str | None:
    """Where the expert run in ``out`` left the path of ``out/record.json``, else None.

    None also when ``out`` holds no record, or its run has not reached a step the record names.
    """
    record = read_json(os.path.join(out, RECORD_FILE))
    return departure(record, eval_curve(os.path.join(out, EXPERT_DIR))) if record else None


def eval_curve(run_dir: str) -> dict[int, float]:
    """``{step: eval_return}`` of a run directory's evaluation points (its ``metrics.csv``)."""
    rows = read_metrics(os.path.join(run_dir, "metrics.csv"))
    return {int(r["step"]): r["eval_return"] for r in rows if "eval_return" in r}


def checked_record(
    record: dict[str, Any], curve: dict[int, float], strict: bool
) -> dict[str, Any] | None:
    """``record`` when the expert run's evaluations ``curve`` follow it; else None, said aloud.

    Raises:
        DatasetError: ``strict`` and the run does not follow the record: its files would
            differ from the record's.
    """
    if follows(record, curve):
        return record
    why = departure(record, curve) or "the expert run has no evaluation at the record's steps"
    if strict:
        raise DatasetError(
            f"{why}: this machine takes another path than the record (another kind of CPU), so "
            "its files would differ from the record's. Make them on the kind of machine that "
            "made the record, or leave out --strict-record to train the whole expert run and "
            "make this machine's own files."
        )
    print(f"{why}: it takes another path (another kind of CPU); training the whole expert run.")
    return None


def file_entry(path: str, info: dict[str, Any], out: str) -> dict[str, Any]:
    """The manifest's entry of the file at ``path``: its sha256 and ``info``'s statistics."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return {
        "path": os.path.relpath(path, out),
        "sha256": digest.hexdigest(),
        **{k: info[k] for k in ("transitions", "episodes", "return_mean", "return_std")},
        "normalized_score_mean": info["normalized_score_mean"],
    }


def read_json(path: str) -> dict[str, Any]:
    """The JSON object at ``path``; ``{}`` when it is missing, unreadable or not an object."""
    try:
        with open(path) as f:
            value = json.load(f)
    except (OSError, json.JSONDecodeError):
        return {}
    return value if isinstance(value, dict) else {}


__all__ = [
    "EXPERT_DIR",
    "RECORD_FILE",
    "checked_record",
    "departure",
    "eval_curve",
    "file_entry",
    "follows",
    "place_record",
    "read_record",
    "record_departure",
]
