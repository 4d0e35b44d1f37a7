"""The recipe's files: the manifest entry of each dataset, and the record a recipe may follow.

A *record* is the ``manifest.json`` of a recipe made before (on this kind of machine, or
archived with the results it produced), copied to ``OUT/record.json`` (``jaxrl dataset recipe
--record FILE`` does the copy). A recipe that holds one trains its expert run only as far as the
files need (the medium point, for ``medium`` and ``medium-replay``) and compares its evaluation
there with the record's. Equal returns mean the run took the record's path bit for bit, so the
expert and random returns, which the full run would measure later, are the record's: the files
come out with the record's bytes, at a fraction of the training. Another return means another
path (another kind of CPU): the expert run goes on to its whole budget and the recipe measures
everything itself, as without a record.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from typing import Any

from jaxrl.errors import ConfigError

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


def follows(record: dict[str, Any], curve: dict[int, float]) -> bool:
    """True when the run's evaluations equal the record's at the steps the record names."""
    steps = [s for s in ("medium_step", "expert_step") if record[s] in curve]
    returns = {"medium_step": "medium_return", "expert_step": "expert_return"}
    return bool(steps) and all(curve[record[s]] == record[returns[s]] for s in steps)


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


__all__ = ["RECORD_FILE", "file_entry", "follows", "place_record", "read_record"]
