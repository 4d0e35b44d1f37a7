"""The results suite (benchmarks/suite.py): a stopped suite resumes; finished runs never rerun."""

from __future__ import annotations

import csv
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SUITE = os.path.join(ROOT, "benchmarks", "suite.py")


def _suite(tmp_path, *args: str) -> list[str]:
    return [
        sys.executable,
        SUITE,
        "--suite",
        "smoke",
        "--root",
        str(tmp_path / "runs"),
        "--results",
        str(tmp_path / "results"),
        *args,
    ]


def _eval_steps(run_dir) -> list[int]:
    """Steps of the rows with an evaluation (the header grows as columns first appear)."""
    if not (run_dir / "metrics.csv").exists():
        return []
    with open(run_dir / "metrics.csv", newline="") as f:
        return [int(float(r["step"])) for r in csv.DictReader(f) if r.get("eval_return")]


@pytest.mark.slow
def test_a_stopped_suite_resumes_and_never_repeats_a_finished_run(tmp_path):
    """SIGTERM during the second run; the rerun skips the first and resumes the second."""
    runs = tmp_path / "runs" / "online" / "jax:pendulum"
    sac, td3 = runs / "jaxrl-sac" / "s0", runs / "jaxrl-td3" / "s0"
    listing = subprocess.run(_suite(tmp_path, "--list"), capture_output=True, text=True)
    assert listing.returncode == 0 and listing.stdout.count("pending") == 2, listing.stdout

    suite = subprocess.Popen(_suite(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    deadline = time.time() + 300
    while not _eval_steps(td3) and suite.poll() is None and time.time() < deadline:
        time.sleep(0.2)  # stop once the second run has evaluated (and so is mid-way)
    assert suite.poll() is None, suite.stdout.read().decode()
    suite.send_signal(signal.SIGTERM)
    out = suite.communicate(timeout=120)[0].decode()
    assert suite.returncode == 130, out
    first = json.loads((sac / "summary.json").read_text())
    assert first["completed"] and first["total_steps"] == 500
    stopped = json.loads((td3 / "summary.json").read_text())
    assert not stopped["completed"] and stopped["total_steps"] < 3_000
    listing = subprocess.run(_suite(tmp_path, "--list"), capture_output=True, text=True).stdout
    assert "done" in listing and "partial" in listing and "1/2 runs done" in listing, listing

    mtime = (sac / "summary.json").stat().st_mtime_ns
    rerun = subprocess.run(_suite(tmp_path), capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    log = (tmp_path / "runs" / "suite.log").read_text()
    assert log.count("start online/jax:pendulum/jaxrl-sac/s0") == 1, log
    assert log.count("start online/jax:pendulum/jaxrl-td3/s0") == 2, log
    assert (sac / "summary.json").stat().st_mtime_ns == mtime
    final = json.loads((td3 / "summary.json").read_text())
    assert final["completed"] and final["total_steps"] == 3_000
    steps = _eval_steps(td3)
    assert steps == sorted(set(steps)) and steps[-1] == 3_000, steps  # one row per eval, resumed
    table = json.loads((tmp_path / "results" / "suite_smoke.json").read_text())
    assert sorted(len(c["seeds"]) for c in table["cells"]) == [1, 1]
    md = (tmp_path / "results" / "suite_smoke.md").read_text()
    assert "2 of 2 runs finished" in md and "not run yet" not in md

    # A fresh checkout has no runs/ but the committed archive: still finished, still in the table.
    archived = tmp_path / "results" / "suite_smoke_runs" / "online" / "jax:pendulum" / "jaxrl-td3"
    assert _eval_steps(archived / "s0") == steps
    shutil.rmtree(tmp_path / "runs")
    listing = subprocess.run(_suite(tmp_path, "--list"), capture_output=True, text=True).stdout
    assert "2/2 runs done" in listing and listing.count("(archived)") == 2, listing
    subprocess.run(_suite(tmp_path, "--report"), check=True, capture_output=True)
    again = json.loads((tmp_path / "results" / "suite_smoke.json").read_text())
    drop = lambda cells: [{k: v for k, v in c.items() if k != "dirs"} for c in cells]  # noqa: E731
    assert drop(again["cells"]) == drop(table["cells"])


def test_only_selects_runs_and_rejects_a_pattern_that_matches_none(tmp_path):
    """``--only`` filters by run name; a pattern matching nothing is a usage error."""
    ok = subprocess.run(
        _suite(tmp_path, "--list", "--only", "*td3*"), capture_output=True, text=True
    )
    assert ok.returncode == 0 and "jaxrl-td3" in ok.stdout and "jaxrl-sac" not in ok.stdout
    bad = subprocess.run(
        _suite(tmp_path, "--list", "--only", "nothing*"), capture_output=True, text=True
    )
    assert bad.returncode == 2 and "matches none" in bad.stderr
