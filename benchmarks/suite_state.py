"""Where each run of the results suite stands: finished, archived, stale or blocked.

A finished run is archived under ``results/suite_runs/NAME/``: its ``summary.json``,
``config.json`` and the evaluation rows of ``metrics.csv`` (a dataset recipe: its manifest and the
expert's summary; a run that reads datasets: the hashes of the files it read, ``data.json``;
every run: the CPU that finished it, ``machine.json``). The archive is committed, so a fresh
checkout (where ``runs/`` is empty) still knows which runs are finished; only the datasets are
remade, when a run that reads them is still to do.

The archived dataset is the dataset of record. A run made on other files is not finished, and a
dataset remade here with other files (another kind of CPU) is not archived: the runs still to do
that read it are blocked on this machine, so that a cell never mixes two datasets.
"""

from __future__ import annotations

import csv
import json
import os
import platform
import shutil
import sys
from collections.abc import Callable
from typing import Any

# benchmarks/ is on sys.path as a script
from suite_settings import retire, settings_changes

from jaxrl.loops.config import run_dir_in_use
from jaxrl.run.recipe_files import place_record, record_departure

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VENVS = {  # impl -> python of the virtualenv that runs it (and the make target that creates it)
    "jaxrl": (sys.executable, "make install"),
    "sbx-rl": (os.path.join(ROOT, ".venv-peers", "bin", "python"), "make peers"),
    "d3rlpy": (os.path.join(ROOT, ".venv-peers", "bin", "python"), "make peers"),
    "brax.training": (os.path.join(ROOT, ".venv-brax", "bin", "python"), "make peers-brax"),
}


def read_json(path: str) -> dict | None:
    """The JSON file at ``path``, or None when it is missing or unreadable."""
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def archive_dir(results: str, suite: str) -> str:
    """Where the finished runs of ``suite`` are archived (committed beside its table)."""
    return os.path.join(results, "suite_runs" if suite == "full" else f"suite_{suite}_runs")


DATA_STAMP = "data.json"
"""Beside a finished run that reads datasets: the sha256 of the files it read (``data_stamp``)."""

MACHINE = "machine.json"
"""Beside a finished run: the CPU model, kind and core count of the machine that finished it."""


def _stamp_at(base: str, need: str) -> dict[str, str] | None:
    """``{kind: sha256}`` of the dataset files recorded in ``base/need/manifest.json``, or None."""
    manifest = read_json(os.path.join(base, need, "manifest.json"))
    if manifest is None:
        return None
    return {k: f.get("sha256") for k, f in sorted(manifest.get("files", {}).items())}


def data_stamp(run: Any, root: str, archive: str | None) -> dict[str, dict] | None:
    """The sha256 of every file of the datasets ``run`` reads, from its needs' manifests.

    ``{need: {kind: sha256}}``. The archived manifest is the dataset of record once there is
    one (a cell never mixes two datasets); this checkout's dataset run counts only before that.
    None when a need has no manifest yet. A run without needs: ``{}``.
    """
    stamp = {}
    for need in run.needs:
        bases = (b for b in (archive, root) if b is not None)
        found = next((m for b in bases if (m := _stamp_at(b, need)) is not None), None)
        if found is None:
            return None
        stamp[need] = found
    return stamp


def foreign_data(needs: tuple[str, ...], root: str, archive: str | None) -> list[str]:
    """The datasets of ``needs`` that this checkout remade with other files than the archived ones.

    Dataset recipes are deterministic on one kind of CPU, not across kinds (XLA's and the
    simulator's floating point differ): a run trained here on such files would put a second
    dataset into its cell, so the suite leaves it for a machine that remakes the archived files.
    """
    if archive is None:
        return []
    return [
        n
        for n in needs
        if (here := _stamp_at(root, n)) is not None
        and (kept := _stamp_at(archive, n)) is not None
        and here != kept
    ]


def left_record(names: tuple[str, ...], root: str) -> list[str]:
    """For each dataset recipe of ``names`` that left its record's path here: what it did.

    A recipe remaking archived files follows their manifest (``follow_record``); on another kind
    of CPU its expert run takes another path, seen at the first step the record names, and the
    recipe stops (``--strict-record``). Its dataset cannot be remade here.
    """
    return [f"{n}: {why}" for n in names if (why := record_departure(os.path.join(root, n)))]


def finished_dir(run: Any, root: str, archive: str | None) -> str | None:
    """The directory holding ``run``'s finished marker: its run directory, else its archive.

    A run that reads datasets counts only if it read the datasets of record: the ``DATA_STAMP``
    beside its marker equals ``data_stamp`` now. A run directory of this checkout without a
    stamp read this checkout's files. Retiring a dataset's archive (``suite.py --retire``) makes
    the next remade files the ones of record, and the runs on the old files unfinished, so they
    run again. A run whose agent settings differ from today's
    (``suite_settings.settings_changes``) is not finished.
    """
    current = data_stamp(run, root, archive) if run.needs else {}
    for base in (b for b in (root, archive) if b is not None):
        summary = read_json(os.path.join(base, run.name, run.marker))
        if summary is None or not summary.get("completed", True):
            continue
        if settings_changes(run, os.path.join(base, run.name))[0]:
            continue  # made with other agent settings than the command resolves to today
        if base == root and foreign_data((run.name,), root, archive):
            continue  # a dataset remade here with other files: the archived one is of record
        recorded = read_json(os.path.join(base, run.name, DATA_STAMP))
        if recorded is None and base == root:
            recorded = data_stamp(run, root, None)
        if not run.needs or (current is not None and recorded == current):
            return os.path.join(base, run.name)
    return None


def archive_run(run: Any, root: str, archive: str) -> list[str]:
    """Copy a finished run's small files into the archive; return the paths written."""
    out, dest = os.path.join(root, run.name), os.path.join(archive, run.name)
    if run.needs and (stamp := data_stamp(run, root, None)) is not None:  # the files it read
        with open(os.path.join(out, DATA_STAMP), "w") as f:
            json.dump(stamp, f, indent=1)
    with open(os.path.join(out, MACHINE), "w") as f:
        json.dump({"cpu": cpu_model(), "kind": cpu_kind(), "cores": os.cpu_count()}, f)
    manifest = read_json(os.path.join(out, "manifest.json")) or {}
    expert = os.path.join(manifest.get("expert_run", ""), "summary.json")
    names = ("summary.json", "config.json", "manifest.json", DATA_STAMP, MACHINE, expert)
    written = []
    for name in (n for n in names if os.path.isfile(os.path.join(out, n))):
        os.makedirs(os.path.dirname(os.path.join(dest, name)), exist_ok=True)
        shutil.copyfile(os.path.join(out, name), os.path.join(dest, name))
        written.append(os.path.join(dest, name))
    if os.path.isfile(os.path.join(out, "metrics.csv")):  # the evaluation rows only: small
        with open(os.path.join(out, "metrics.csv"), newline="") as f:
            rows = list(csv.DictReader(f))
        if rows:
            cols = list(rows[0])
            with open(os.path.join(dest, "metrics.csv"), "w", newline="") as f:
                w = csv.DictWriter(f, cols, extrasaction="ignore")
                w.writeheader()
                w.writerows(r for r in rows if r.get("eval_return"))
            written.append(os.path.join(dest, "metrics.csv"))
    return written


def archived(run: Any, archive: str) -> bool:
    """True when ``run``'s finished marker is archived: run here only to remake its files."""
    return read_json(os.path.join(archive, run.name, run.marker)) is not None


def follow_record(run: Any, root: str, archive: str) -> bool:
    """Put an archived dataset's manifest in its run directory as ``record.json``.

    Before the recipe remakes archived files: it then trains its expert only as far as the
    files need, and takes the record's returns once its evaluations match the record's
    (``jaxrl.run.recipe_files``). True when a record was placed.
    """
    record = os.path.join(archive, run.name, "manifest.json")
    if run.marker != "manifest.json" or not os.path.isfile(record):
        return False
    place_record(record, os.path.join(root, run.name))
    return True


def retire_run(
    run: Any, root: str, archive: str, commit: Callable[[list[str], str], None] | None = None
) -> tuple[list[str], list[str]]:
    """Retire ``run`` by hand (``--retire``): ``(where things went, archive files written)``.

    A dataset this machine remade with other files than the archived ones is adopted: its
    archive moves aside and the files here become the ones of record (archived now, so the
    recipe is not made once more); the runs made on the old files then go stale and run again.
    """
    adopt = bool(foreign_data((run.name,), root, archive))
    moved = retire(run, root, archive, commit, keep_run_dir=adopt)
    if not adopt:
        return moved, []
    kept = f"{os.path.join(root, run.name)} kept: its files are now the ones of record"
    return [*moved, kept], archive_run(run, root, archive)


def cpu_fields() -> dict[str, str]:
    """``/proc/cpuinfo``'s fields of the first CPU (``{}`` where there is none: not Linux)."""
    fields: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                fields.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    return fields


def cpu_model() -> str:
    """The CPU's model name."""
    return cpu_fields().get("model name") or platform.processor() or platform.machine()


def widest_isa(fields: dict[str, str]) -> str:
    """The widest of avx512f, avx2 and avx in ``fields``' flags, else ""."""
    flags = fields.get("flags", "").split()
    return next((x for x in ("avx512f", "avx2", "avx") if x in flags), "")


def cpu_kind() -> str:
    """The CPU's family, model and widest vector flag (``/proc/cpuinfo``), else "".

    One model name covers several kinds: two "AMD EPYC" machines (family 25, models 1 and 17)
    trained the same capped SAC run onto different paths.
    """
    fields = cpu_fields()
    said = [f"family {fields['cpu family']}" if "cpu family" in fields else ""]
    said += [f"model {fields['model']}" if "model" in fields else "", widest_isa(fields)]
    return ", ".join(x for x in said if x)


def state(run: Any, root: str, done: set[str], archive: str) -> tuple[str, str]:
    """``(state, detail)``: done, stale, running, partial, blocked, no-venv or pending.

    Stale: made with other agent settings or dataset files than today's; it trains again from
    the start after ``retire`` moved the old run aside.
    """
    out = os.path.join(root, run.name)
    found = finished_dir(run, root, archive)
    if found is not None:
        summary = read_json(os.path.join(found, run.marker)) or {}
        where = "" if found == out else " (archived)"
        added = settings_changes(run, found)[1]
        new = f"; fields added since: {', '.join(added)}" if added else ""
        return "done", f"{summary.get('wall_clock_s') or 0.0:.0f} s{where}{new}"
    if missing := [n for n in run.needs if n not in done]:
        return "blocked", "needs " + ", ".join(missing)
    if foreign := foreign_data(run.needs, root, archive):
        return "blocked", (
            f"this machine remade {', '.join(foreign)} with other files than the archived "
            "ones; run it where the recipe remakes those (see the results page)"
        )
    if left := left_record((run.name, *run.needs), root):
        return "blocked", (
            f"{'; '.join(left)}; run it where the recipe remakes the archived files (see the "
            "results page)"
        )
    for base in (b for b in (root, archive) if not (b == root and run_dir_in_use(out))):
        if changed := settings_changes(run, os.path.join(base, run.name))[0]:
            return "stale", "settings changed since it ran: " + "; ".join(changed)
        marker = read_json(os.path.join(base, run.name, run.marker))
        if marker and marker.get("completed", True):  # so finished_dir refused its data
            return "stale", "finished on other (or unrecorded) dataset files than today's"
    if not os.path.exists(VENVS[run.impl][0]):
        return "no-venv", f"needs `{VENVS[run.impl][1]}`"
    if not os.path.isdir(out):
        return "pending", ""
    if run_dir_in_use(out):
        return "running", f"another process trains it, at step {last_step(out)} of {run.budget}"
    return "partial", f"at step {last_step(out)} of {run.budget}"


def last_step(out: str) -> int:
    """The newest step in ``out/metrics.csv``; 0 before the first row."""
    try:
        with open(os.path.join(out, "metrics.csv")) as f:
            rows = f.read().splitlines()
        col = rows[0].split(",").index("step")
        return max(int(float(r.split(",")[col])) for r in rows[1:] if r)
    except (OSError, ValueError, IndexError):
        return 0


def finished(runs: list[Any], root: str, archive: str) -> set[str]:
    """Names of the runs whose directories (or archives) hold a completed ``summary.json``."""
    done: set[str] = set()
    for run in runs:  # in order, so that a run's needs are settled before it
        if state(run, root, done, archive)[0] == "done":
            done.add(run.name)
    return done
