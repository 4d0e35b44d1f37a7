"""Robustness of the learning tests: every slow test under several seeds, as a pass-rate table.

A learning test must pass on any machine, not only the one it was written on (a rule of the test
suite). XLA's numerics and the data the tests generate for themselves differ between CPUs, so this
script reruns every ``pytest -m slow`` test under ``JAXRL_TEST_SEED`` = 0..4. The seed
changes the generated Pendulum datasets (the SAC behavior policies and their rollouts, see
``tests/offline_utils.py``), the agents' seeds and the evaluation episodes. It is not run in CI.

    .venv/bin/python benchmarks/learning_tests.py --fresh            # seeds 0-4, all slow tests
    .venv/bin/python benchmarks/learning_tests.py --seeds 3 -k iql   # rerun some tests, one seed

Results are merged into the existing table (a rerun replaces those tests' cells for those seeds);
``--fresh`` starts a new table.

Each seed is one ``pytest`` process (``--workers`` xdist workers, default 1 so that per-test
durations are comparable); the first test that needs a generated dataset pays for generating it
(~2-4 min on 2 cores), which the table reports per seed. A test's measured numbers are the
``record_property`` values it records (its return and threshold). Results are written after every
seed to ``benchmarks/results/learning_tests.{json,md}``, each test's result with a label of the
CPU it ran on (XLA's numerics, and so the generated data, differ between CPUs).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "benchmarks", "results", "learning_tests")


def run_seed(seed: int, workers: int, select: list[str], extra: list[str]) -> dict:
    """One pytest run of the slow tests under ``JAXRL_TEST_SEED=seed``; per-test results."""
    with tempfile.TemporaryDirectory() as tmp:
        xml = os.path.join(tmp, "junit.xml")
        cmd = [sys.executable, "-m", "pytest", "-m", "slow", "-q", "-p", "no:cacheprovider"]
        cmd += [f"--junitxml={xml}", "-o", "junit_logging=system-out"]
        cmd += ["-o", "junit_log_passing_tests=true", "-o", "junit_family=xunit1"]
        if workers > 1:
            cmd += ["-n", str(workers)]
        cmd += [*extra, *(select or ["tests"])]
        env = {**os.environ, "JAXRL_TEST_SEED": str(seed)}
        start = time.perf_counter()
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
        wall = time.perf_counter() - start
        if not os.path.exists(xml):
            raise RuntimeError(f"pytest wrote no report (exit {proc.returncode}):\n{proc.stdout}")
        tests = parse_junit(xml)
    here = machine()
    for result in tests.values():  # rows merge runs from several machines: each cell says which
        result["machine"] = here
    print(proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else "(no output)")
    run = {"wall_s": round(wall, 1), "workers": workers, "select": select, "tests": len(tests)}
    return {"seed": seed, "runs": [run], "tests": tests}


def machine() -> str:
    """A short label of this CPU: its model name, core count and widest vector extension."""
    from suite_state import cpu_fields, cpu_model, widest_isa  # benchmarks/ is on sys.path

    isa = widest_isa(cpu_fields())
    return f"{cpu_model()}, {os.cpu_count()} cores" + (f", {isa}" if isa else "")


def parse_junit(path: str) -> dict[str, dict]:
    """``{test id: {outcome, duration_s, measured, message}}`` from a junit XML report."""
    tests = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        module = case.get("classname", "").replace(".", "/")
        name = f"{module}.py::{case.get('name')}"
        outcome, message = "passed", ""
        for tag in ("failure", "error", "skipped"):
            node = case.find(tag)
            if node is not None:
                outcome = {"failure": "failed", "error": "error", "skipped": "skipped"}[tag]
                message = (
                    (node.get("message") or "").strip().splitlines()[0][:300]
                    if (node.get("message"))
                    else ""
                )
                break
        measured = {}
        for prop in case.iter("property"):
            value = prop.get("value", "")
            try:
                measured[prop.get("name")] = round(float(value), 2)
            except ValueError:
                measured[prop.get("name")] = value
        tests[name] = {
            "outcome": outcome,
            "duration_s": round(float(case.get("time", 0.0)), 1),
            "measured": measured,
            "message": message,
        }
    return tests


def _cell(result: dict | None) -> str:
    if result is None:
        return ""
    mark = {"passed": "pass", "failed": "FAIL", "error": "ERROR", "skipped": "skip"}
    text = mark[result["outcome"]]
    m = result["measured"]
    if "value" in m and "threshold" in m:
        text += f" {m['value']:.4g} ({m.get('op', '>=')} {m['threshold']:.4g})"
        if "members" in m:  # the returns of the agents the value averages
            text += f" [{m['members']}]"
    elif m:
        text += " " + ", ".join(
            f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in m.items()
        )
    return text


def write_tables(runs: list[dict]) -> None:
    """``learning_tests.json`` (everything) and ``learning_tests.md`` (the pass-rate table)."""
    os.makedirs(os.path.dirname(RESULTS), exist_ok=True)
    with open(RESULTS + ".json", "w") as f:
        json.dump({"runs": runs}, f, indent=1)
    names = sorted({t for r in runs for t in r["tests"]})
    seeds = [r["seed"] for r in runs]
    lines = [
        "# Learning tests under several seeds",
        "",
        "`benchmarks/learning_tests.py`: every `pytest -m slow` test with `JAXRL_TEST_SEED` = "
        "seed (the generated Pendulum data, the agents' seeds and the evaluation episodes all "
        "change with it). A cell is the outcome, the measured value and the test's threshold. "
        "A row's cells can come from different machines (a rerun replaces some of them): the "
        "last column names the CPUs (*unrecorded*: measured before the script recorded them).",
        "",
        "| test | passed | median s | " + " | ".join(f"seed {s}" for s in seeds) + " | machines |",
        "|---|---|---|" + "---|" * len(seeds) + "---|",
    ]
    for name in names:
        results = [r["tests"].get(name) for r in runs]
        ran = [x for x in results if x is not None and x["outcome"] != "skipped"]
        passed = sum(x["outcome"] == "passed" for x in ran)
        durations = sorted(x["duration_s"] for x in ran) or [float("nan")]
        median = durations[len(durations) // 2]
        short = name.removeprefix("tests/")
        cells = " | ".join(_cell(x) for x in results)
        where = sorted({x.get("machine", "*unrecorded*") for x in results if x is not None})
        lines.append(
            f"| `{short}` | {passed}/{len(ran)} | {median:.0f} | {cells} | {'; '.join(where)} |"
        )
    lines += [
        "",
        "Time per seed: the sum of the tests' durations (the first test to need a generated "
        "dataset includes generating it), and each pytest run's wall clock (tests, workers).",
        "",
        "| seed | sum of test durations (s) | pytest runs: wall s (tests, workers) |",
        "|---|---|---|",
    ]
    for r in runs:
        total = sum(t["duration_s"] for t in r["tests"].values())
        calls = ", ".join(f"{c['wall_s']:.0f} ({c['tests']}, {c['workers']})" for c in r["runs"])
        lines.append(f"| {r['seed']} | {total:.0f} | {calls} |")
    lines.append("")
    with open(RESULTS + ".md", "w") as f:
        f.write("\n".join(lines))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--workers", type=int, default=1, help="pytest-xdist workers per seed")
    parser.add_argument("-k", dest="keyword", help="pytest -k expression (a subset of tests)")
    parser.add_argument("--fresh", action="store_true", help="start a new table")
    parser.add_argument("tests", nargs="*", help="test files or node ids (default: tests/)")
    args = parser.parse_args(argv)
    runs: dict[int, dict] = {}
    if not args.fresh and os.path.exists(RESULTS + ".json"):
        with open(RESULTS + ".json") as f:
            runs = {r["seed"]: r for r in json.load(f)["runs"]}
    extra = ["-k", args.keyword] if args.keyword else []
    for seed in args.seeds:
        print(f"seed {seed}: running the slow tests ...", flush=True)
        result = run_seed(seed, args.workers, args.tests, extra)
        if seed in runs:
            result["tests"] = {**runs[seed]["tests"], **result["tests"]}
            result["runs"] = runs[seed]["runs"] + result["runs"]
        runs[seed] = result
        write_tables([runs[s] for s in sorted(runs)])
        failed = [n for n, t in result["tests"].items() if t["outcome"] in ("failed", "error")]
        wall = result["runs"][-1]["wall_s"]
        print(f"seed {seed}: {wall:.0f} s; failed: {failed or 'none'}", flush=True)
    print(f"wrote {RESULTS}.md and .json")


if __name__ == "__main__":
    main()
