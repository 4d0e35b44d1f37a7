"""Whether a suite run was made with today's agent settings, and retiring runs that were not.

A ``jaxrl train`` run's ``config.json`` records the agent config it trained with. When a default
changes later (a preset's update ratio, an initialization), the finished run no longer measures
what the suite's command now trains: ``settings_changes`` resolves that command's agent config
as ``jaxrl train`` would today and compares the two. A field whose value changed makes the run
stale: it is not finished, and the suite trains it again after ``retire`` has moved the old run
directory (and its archive) aside, never deleting it. A field the run's config does not have
(added since) is only reported: its default usually keeps the former behaviour, and making every
run of an agent stale whenever a field is added would cost hours for nothing; where the new
default does change the behaviour, retire those runs by hand (``suite.py --retire PATTERN``).

Fields that today's command leaves ``None`` are skipped: the run layer fills them from the run
(a schedule's horizon from the step budget), so the recorded value is the filled one.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import shutil
import time
from collections.abc import Callable
from typing import Any

RETIRED = "retired"
"""Where ``retire`` moves a run: ``ROOT/retired/NAME-STAMP`` (a run directory, with its log)."""


@functools.cache
def resolved_agent_config(args: tuple[str, ...]) -> dict[str, Any] | None:
    """The agent config (as JSON values) that ``jaxrl train`` resolves ``args`` to today."""
    if "train" not in args or args[:2] != ("-m", "jaxrl.cli"):
        return None
    from jaxrl.cli.train import parse_train_args

    i = args.index("train")
    try:  # the {out} and {root} placeholders parse as paths; nothing is read or written
        _, config = parse_train_args(args[i + 1], list(args[i + 2 :]))
    except (Exception, SystemExit):  # a command that no longer parses fails when it runs
        return None
    return json.loads(json.dumps(dataclasses.asdict(config)))


def settings_changes(run: Any, run_dir: str) -> tuple[list[str], list[str]]:
    """``(changed, added)``: the fields of ``run``'s agent config that differ from today's.

    ``changed`` names each field whose recorded value differs (``"lr 0.0003 -> 0.001"``);
    ``added`` the fields today's config has and the recorded one lacks. Both are empty for a
    run that is not a ``jaxrl train`` run or has no ``config.json`` yet.
    """
    now = resolved_agent_config(tuple(run.args)) if run.impl == "jaxrl" else None
    try:
        with open(os.path.join(run_dir, "config.json")) as f:
            then = json.load(f).get("agent_config")
    except (OSError, ValueError):
        then = None
    if now is None or not isinstance(then, dict):
        return [], []
    changed = [
        f"{k} {then[k]!r} -> {v!r}"
        for k, v in sorted(now.items())
        if v is not None and k in then and then[k] != v
    ]
    added = [k for k in sorted(now) if now[k] is not None and k not in then]
    return changed, added


def retire(
    run: Any,
    root: str,
    archive: str | None,
    commit: Callable[[list[str], str], None] | None = None,
    keep_run_dir: bool = False,
) -> list[str]:
    """Move ``run``'s run directory (and log) and its archive aside; return where they went.

    The run directory goes to ``root/retired/NAME-STAMP``; the archive (committed results) to
    ``ARCHIVE_retired/NAME-STAMP`` beside the archive, so that git keeps both until a person
    deletes them. ``keep_run_dir`` moves the archive alone (a dataset remade here with other
    files, which then become the ones of record). ``commit(paths, message)``, when given,
    commits the archive's move (the run directories under ``root`` are not in git).
    """
    stamp = time.strftime("%Y%m%d-%H%M%S")
    moved = []
    places = [] if keep_run_dir else [(os.path.join(root, run.name), os.path.join(root, RETIRED))]
    if archive is not None:
        places.append((os.path.join(archive, run.name), archive.rstrip(os.sep) + "_retired"))
    for src, dest_root in places:
        dest = os.path.join(dest_root, f"{run.name}-{stamp}")
        for suffix in ("", ".log"):
            if os.path.exists(src + suffix):
                os.makedirs(os.path.dirname(dest), exist_ok=True)
                shutil.move(src + suffix, dest + suffix)
                moved.append(dest + suffix)
    kept = [m for m in moved if not m.startswith(os.path.join(root, ""))]
    if commit is not None and archive is not None and kept:
        commit([os.path.join(archive, run.name), *kept], f"suite: retired {run.name}")
    return moved
