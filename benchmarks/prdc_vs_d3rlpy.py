r"""PRDC beside d3rlpy's PRDC on any D4RL-layout file: same data, same gradient steps, 3 seeds.

The results suite (``suite.py``) puts both on its own generated datasets. This script runs the
same two commands on a file given by path, e.g. a dataset made by another library::

    make peers
    .venv/bin/python benchmarks/prdc_vs_d3rlpy.py --data halfcheetah-medium.hdf5 \
        --env HalfCheetah-v5 --steps 50000 --alpha 40 --label halfcheetah-sbx100k --nice

Each seed of each library is an ordinary run directory under ``runs/prdc_vs_d3rlpy/LABEL/``
(``jaxrl train prdc`` and ``benchmarks/peers/suite_d3rlpy.py --algo prdc``, both evaluated every
tenth of the budget over 10 episodes). Runs go two at a time, each pinned to its own core
(``suite_runner``); stopping (Ctrl-C, SIGTERM) checkpoints them, and running the script again
resumes them. After each finished run the table ``benchmarks/results/prdc_vs_d3rlpy.md`` is
rewritten (one section per label; ``--commit`` commits it): final returns per seed, mean ± std
(population, as the suite), the check ``jaxrl mean >= d3rlpy mean - d3rlpy std``, updates/s
with evaluations, and both curves.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import sys

import numpy as np
from suite import EVAL_EPISODES, ROOT, Run, _commit, _peer, _train
from suite_runner import Runner, run_queue
from suite_state import last_step, read_json

from jaxrl.loops.config import run_dir_in_use
from jaxrl.loops.logging import read_metrics

RESULTS = os.path.join(ROOT, "benchmarks", "results", "prdc_vs_d3rlpy.md")
IMPLS = ("jaxrl", "d3rlpy")
INDEX = {
    "sklearn": "its own (scikit-learn `NearestNeighbors`)",
    "torch": "the same exact search in torch (`TorchNeighbours` of `benchmarks/peers/"
    "d3rlpy_offline.py`), in place of scikit-learn's, which is too slow on this key width",
}


def runs_for(a: argparse.Namespace) -> list[Run]:
    """Both libraries' runs, alternating, so that two workers run one of each at a time."""
    data = os.path.abspath(a.data)
    fields = {"alpha": a.alpha, "beta": a.beta}
    jaxrl_extra = ("--dataset", data, "--alpha", str(a.alpha), "--beta", str(a.beta))
    # Braces doubled: ``Run.command`` fills in ``{out}`` with ``str.format``.
    config = json.dumps(fields).replace("{", "{{").replace("}", "}}")
    peer_extra = ("--algo", "prdc", "--dataset", data, "--env", a.env, "--config", config)
    peer_extra += ("--prdc-index", a.d3rlpy_index)
    every = a.steps // 10
    runs = []
    for seed in a.seeds:
        for impl in IMPLS:
            args = (
                _train("prdc", a.env, seed, a.steps, every, *jaxrl_extra)
                if impl == "jaxrl"
                else _peer("suite_d3rlpy.py", seed, a.steps, every, *peer_extra)
            )
            runs.append(Run("prdc", a.label, impl, "prdc", seed, a.steps, "gradient steps", args))
    return runs


def state(run: Run, root: str) -> tuple[str, str]:
    """``(state, detail)``: done, running, partial or pending (``run_queue``'s states)."""
    out = os.path.join(root, run.name)
    summary = read_json(os.path.join(out, "summary.json"))
    if summary is not None and summary.get("completed", True):
        return "done", ""
    if os.path.isdir(out) and run_dir_in_use(out):
        return "running", "another process trains it"
    return ("partial", f"at step {last_step(out)}") if os.path.isdir(out) else ("pending", "")


def _curve(out: str) -> list[tuple[int, float]]:
    try:
        rows = read_metrics(os.path.join(out, "metrics.csv"))
    except (OSError, ValueError):
        return []
    evals = [(r["step"], r.get("eval_return")) for r in rows]
    return [(int(s), float(v)) for s, v in evals if v is not None and v == v]


def section(runs: list[Run], root: str, a: argparse.Namespace) -> list[str]:
    """The markdown section of one label: per-seed returns, the check, speed and curves."""
    lines = [
        f"## {a.label}: {os.path.basename(a.data)} on {a.env}, {a.steps:,} gradient steps",
        "",
        f"PRDC alpha {a.alpha}, beta {a.beta}, every other field at both libraries' defaults "
        f"(jaxrl's paper defaults; d3rlpy configured to match by "
        "`benchmarks/peers/d3rlpy_offline.py`). Final return: the deterministic policy over "
        f"{EVAL_EPISODES} episodes at the last step. d3rlpy's neighbour search: "
        f"{INDEX[a.d3rlpy_index]}. Updates/s: gradient steps over the whole run's wall clock, "
        "evaluations included, each run pinned to its own core; a run that shared its core with "
        "other work (a test suite, another benchmark) counts that time too, so compare speeds "
        "in `prdc_speed*.md`.",
        "",
        "| library | " + " | ".join(f"s{s}" for s in a.seeds) + " | mean ± std | updates/s |",
        "|---" * (len(a.seeds) + 3) + "|",
    ]
    finals: dict[str, list[float]] = {}
    for impl in IMPLS:
        cells, speeds = [], []
        for run in (r for r in runs if r.impl == impl):
            summary = read_json(os.path.join(root, run.name, "summary.json"))
            if summary is None:
                cells.append(f"(at {last_step(os.path.join(root, run.name)):,})")
                continue
            finals.setdefault(impl, []).append(summary["final_eval_return_mean"])
            cells.append(f"{summary['final_eval_return_mean']:,.0f}")
            speeds.append(summary.get("updates_per_s") or float("nan"))
        done = finals.get(impl, [])
        stat = f"{np.mean(done):,.0f} ± {np.std(done):,.0f}" if done else "-"
        speed = f"{np.mean(speeds):.1f}" if speeds else "-"
        lines.append(f"| {impl} | " + " | ".join(cells) + f" | {stat} | {speed} |")
    lines.append("")
    ours, peer = finals.get("jaxrl", []), finals.get("d3rlpy", [])
    if len(ours) == len(peer) == len(a.seeds):
        bar = np.mean(peer) - np.std(peer)
        verdict = "met" if np.mean(ours) >= bar else "NOT met"
        lines.append(
            f"Check: jaxrl mean {np.mean(ours):,.0f} against d3rlpy mean - std {bar:,.0f}: "
            f"**{verdict}**."
        )
    else:
        lines.append("Check: not yet (every seed of both libraries must finish).")
    lines += ["", "Evaluation returns by gradient step:", ""]
    steps = [a.steps * k // 10 for k in range(1, 11)]
    lines.append("| run | " + " | ".join(f"{s / 1000:g}k" for s in steps) + " |")
    lines.append("|---" * (len(steps) + 1) + "|")
    for run in runs:
        curve = dict(_curve(os.path.join(root, run.name)))
        vals = " | ".join(f"{curve[s]:,.0f}" if s in curve else "" for s in steps)
        lines.append(f"| {run.impl} s{run.seed} | {vals} |")
    lines += ["", f"Regenerate: `.venv/bin/python benchmarks/prdc_vs_d3rlpy.py {a.cmdline}`", ""]
    return lines


def write(runs: list[Run], root: str, a: argparse.Namespace) -> None:
    """Rewrite this label's section of ``RESULTS``, keeping the other labels' sections."""
    head = "# PRDC beside d3rlpy's PRDC\n\n"
    text = open(RESULTS).read() if os.path.exists(RESULTS) else head
    parts = text.split("\n## ")
    kept = [p for p in parts[1:] if not p.startswith(f"{a.label}:")]
    body = "\n".join(section(runs, root, a)).removeprefix("## ")
    out = parts[0].rstrip("\n") + "\n\n## " + "\n## ".join([*kept, body])
    with open(RESULTS, "w") as f:
        f.write(out.rstrip("\n") + "\n")


def main(argv: list[str] | None = None) -> int:
    """Parse the options, run what is unfinished, and write the table."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", required=True, help="D4RL-layout HDF5 file")
    p.add_argument("--env", required=True, help="Gymnasium env id of the evaluation")
    p.add_argument("--label", required=True, help="names the section and the run directories")
    p.add_argument("--steps", type=int, default=100_000, help="gradient steps of every run")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--alpha", type=float, default=2.5, help="PRDC's alpha (paper: 40 on cheetah)")
    p.add_argument("--beta", type=float, default=2.0, help="PRDC's beta")
    p.add_argument(
        "--d3rlpy-index",
        choices=("sklearn", "torch"),
        default="sklearn",
        help="d3rlpy's neighbour search: its own scikit-learn index, or the same exact search in "
        "torch (peers/d3rlpy_offline.TorchNeighbours; scikit-learn searches keys over 15 "
        "features by brute force with a full argpartition, about 0.5 s per query at 100k rows)",
    )
    p.add_argument("--root", default=os.path.join(ROOT, "runs", "prdc_vs_d3rlpy"))
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--nice", action="store_true", help="run at the lowest CPU priority (19)")
    p.add_argument("--commit", action="store_true", help="git-commit the table after each run")
    p.add_argument("--report", action="store_true", help="only rewrite the table")
    p.add_argument(
        "--only", action="append", default=[], help="run only these (fnmatch on IMPL-prdc/sSEED)"
    )
    a = p.parse_args(argv)
    a.cmdline = " ".join(
        f"--{k} {' '.join(map(str, v)) if isinstance(v, list) else v}"
        for k, v in (("data", "FILE"), ("env", a.env), ("label", a.label), ("steps", a.steps),
                     ("seeds", a.seeds), ("alpha", a.alpha), ("beta", a.beta),
                     ("d3rlpy-index", a.d3rlpy_index))
    )  # fmt: skip
    if not os.path.exists(a.data):
        p.error(f"--data {a.data}: no such file")
    root = os.path.abspath(a.root)
    runs = runs_for(a)
    if a.report:
        write(runs, root, a)
        return 0
    if a.nice:
        os.nice(19)
    os.makedirs(root, exist_ok=True)

    def log(msg: str) -> None:
        print(msg, flush=True)

    def finish(run: Run, rc: int) -> bool:
        write(runs, root, a)
        if a.commit:
            _commit([RESULTS], f"benchmarks/results/prdc_vs_d3rlpy.md: {run.name} (exit {rc})")
        return state(run, root)[0] == "done"

    runner = Runner(root, log)
    only = [f"*/{o}" for o in a.only]
    chosen = [r for r in runs if not only or any(fnmatch.fnmatch(r.name, o) for o in only)]
    rc = run_queue(chosen, lambda r: state(r, root), lambda r: [], finish, runner, a.workers)
    write(runs, root, a)
    return rc


if __name__ == "__main__":
    sys.exit(main())
