"""Offline-to-online on one MuJoCo task: SAC from scratch, RLPD, IQL and Cal-QL fine-tuning.

Everything runs through ``jaxrl``'s command line, in-process: a short SAC run is the "medium"
behavior policy, ``jaxrl dataset collect --kind medium`` rolls it out into a D4RL-format file,
then SAC (no data), RLPD (SAC + 10 LayerNorm critics + half of each minibatch from the data),
IQL and Cal-QL (``--offline-steps`` on the data, then fine-tuned online) all train for the same
online env steps. The table gives the evaluation return at online env steps 0 (fine-tuning: the
end of the offline phase), E, 2E, ..., the D4RL-normalized final score and wall clock. The full
default run takes about an hour on 2 CPU cores, far below the papers' budgets (see the notes).

Usage:
    .venv/bin/python benchmarks/offline_to_online.py [--env Hopper-v5] [--seed 0]
        [--online-steps 10000] [--eval-every 2000] [--iql-offline-steps 20000]
        [--calql-offline-steps 5000] [--rlpd-utd 4] [--methods sac,rlpd,iql,cal-ql]
        [--out-dir runs/bench_o2o] [--results-dir benchmarks/results] [--quick]

Writes RESULTS/offline_to_online.{md,json,png}. Finished runs are read back and cut ones resume,
so rerunning the same command completes an interrupted benchmark; other settings need another
``--out-dir``. ``--quick`` is a smoke test with tiny budgets (runs and results in
runs/bench_o2o_quick unless given).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import time

import jax

from jaxrl.cli import main as jaxrl
from jaxrl.data import load_dataset, normalized_score
from jaxrl.loops.logging import read_metrics

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
METHODS = ("sac", "rlpd", "iql", "cal-ql")
QUICK = (  # --quick: these first, so that flags given explicitly still win
    "--policy-steps 1500 --policy-learning-starts 500 --dataset-steps 2000 --online-steps 600 "
    "--eval-every 300 --iql-offline-steps 200 --calql-offline-steps 200 --learning-starts 500"
)


def run(argv: list[str], out: str) -> tuple[dict, float]:
    """``jaxrl ARGV`` unless ``out`` holds its finished run; returns (summary, wall seconds).

    ``out/benchmark.json`` records the command and its wall clock summed over invocations (a cut
    run resumes and adds to it): an offline-to-online ``summary.json`` times the online phase only.
    """
    record_path, summary_path = (os.path.join(out, f) for f in ("benchmark.json", "summary.json"))
    record = {"argv": argv, "wall_s": 0.0, "completed": False}
    if os.path.exists(record_path):
        with open(record_path) as f:
            old = json.load(f)
        record = old if old["argv"] == argv else record
    if record["completed"] and os.path.exists(summary_path):
        print(f"{out}: finished run, read back", flush=True)
    else:
        print("jaxrl " + " ".join(argv), flush=True)
        t = time.perf_counter()
        jaxrl(argv)  # exits with jaxrl's message on a user error (e.g. another config in out)
        record["wall_s"] += time.perf_counter() - t
        with open(summary_path) as f:
            record["completed"] = bool(json.load(f).get("completed"))
        with open(record_path, "w") as f:
            json.dump(record, f, indent=2)
        if not record["completed"]:
            raise SystemExit(f"{out} was interrupted; rerun the same command to continue.")
    with open(summary_path) as f:
        return json.load(f), record["wall_s"]


def curve(out: str, fine_tune: bool) -> dict[int, float]:
    """Eval return by online env step; a fine-tuned run's last offline evaluation is step 0."""
    rows = [r for r in read_metrics(os.path.join(out, "metrics.csv")) if "eval_return" in r]
    if not fine_tune:
        return {int(r["step"]): r["eval_return"] for r in rows}
    points = {int(r["env_step"]): r["eval_return"] for r in rows if "env_step" in r}
    pre = [r["eval_return"] for r in rows if "env_step" not in r]
    return {0: pre[-1], **points} if pre else points


def fmt(x: float | None, spec: str = ",.0f") -> str:
    """``x`` formatted, ``-`` when missing."""
    return "-" if x is None else format(x, spec)


def machine() -> str:
    """CPU model, cores, OS and jax version."""
    cpu = platform.processor() or "unknown CPU"
    if os.path.exists("/proc/cpuinfo"):
        with open("/proc/cpuinfo") as f:
            cpu = next((ln.split(":")[1].strip() for ln in f if ln.startswith("model name")), cpu)
    cores = len(os.sched_getaffinity(0))
    return f"{cpu}, {cores} cores, {platform.platform()}, jax {jax.__version__}"


def parse_args() -> argparse.Namespace:
    """The flags, with ``--quick``'s budgets and the default directories filled in."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--env", default="Hopper-v5")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--methods", default=",".join(METHODS), help="subset of " + ",".join(METHODS))
    p.add_argument("--policy-steps", type=int, default=15_000, help="env steps of the SAC policy")
    p.add_argument("--policy-learning-starts", type=int, default=5000, help="its random steps")
    p.add_argument("--dataset-steps", type=int, default=50_000, help="transitions collected")
    p.add_argument("--online-steps", type=int, default=10_000, help="env steps of every method")
    p.add_argument("--eval-every", type=int, default=2000, help="env (and offline) steps")
    p.add_argument("--eval-episodes", type=int, default=5)
    p.add_argument("--learning-starts", type=int, default=1000, help="SAC and RLPD random steps")
    p.add_argument("--rlpd-utd", type=int, default=4, help="RLPD updates per env step (paper 20)")
    p.add_argument("--iql-offline-steps", type=int, default=20_000)
    p.add_argument("--calql-offline-steps", type=int, default=5000)
    p.add_argument("--calql-hidden-dims", type=int, nargs="+", default=[256, 256])
    p.add_argument("--calql-n-actions", type=int, default=4, help="CQL sampled actions (paper 10)")
    p.add_argument("--out-dir", default=None, help="run directories (default runs/bench_o2o)")
    p.add_argument("--results-dir", default=None, help="default benchmarks/results")
    p.add_argument("--quick", action="store_true", help="tiny budgets: a smoke test")
    p.add_argument("--no-plot", action="store_true", help="skip offline_to_online.png")
    a = p.parse_args()
    if a.quick:
        a = p.parse_args([*QUICK.split(), *sys.argv[1:]])
    name = "bench_o2o_quick" if a.quick else "bench_o2o"
    a.out_dir = os.path.abspath(a.out_dir or os.path.join(ROOT, "runs", name))
    a.results_dir = a.results_dir or (
        a.out_dir if a.quick else os.path.join(ROOT, "benchmarks", "results")
    )
    if unknown := set(a.methods.split(",")) - set(METHODS):
        raise SystemExit(f"unknown methods {sorted(unknown)}; choose from {', '.join(METHODS)}")
    return a


def main() -> None:
    """Policy, dataset, then every method; read back what is finished; write the tables."""
    a = parse_args()
    load, d = os.getloadavg()[0], a.out_dir
    common = f"--env {a.env} --seed {a.seed} --eval-episodes {a.eval_episodes} --no-progress"
    common += " --no-tensorboard"
    commands: list[list[str]] = []

    def train(agent: str, name: str, options: str) -> tuple[dict, float]:
        argv = [data if t == "DATA" else t for t in f"{options} {common}".split()]
        commands.append(["train", agent, *argv, "--out", os.path.join(d, name)])
        return run(commands[-1], os.path.join(d, name))

    # The medium behavior policy and its dataset (written under another name until complete).
    data = os.path.join(d, f"{a.env.split('-')[0].lower()}-medium.hdf5")
    options = f"--total-steps {a.policy_steps} --learning-starts {a.policy_learning_starts}"
    policy, policy_wall = train("sac", "sac_medium", f"{options} --eval-every {a.policy_steps}")
    collect = f"collect --env {a.env} --kind medium --steps {a.dataset_steps} --seed {a.seed}"
    commands.append(["dataset", *collect.split(), "--policy", os.path.join(d, "sac_medium")])
    if not os.path.exists(data):
        print("jaxrl " + " ".join(commands[-1]), flush=True)
        jaxrl([*commands[-1], "--out", data + ".partial.hdf5"])
        os.replace(data + ".partial.hdf5", data)
    commands[-1] += ["--out", data]
    info = load_dataset(data, a.env).info()
    refs = (info["ref_min_return"], info["ref_max_return"])

    # Every method: the same online env steps and evaluation schedule.
    n, e, ls = a.online_steps, a.eval_every, a.learning_starts
    hidden = " ".join(map(str, a.calql_hidden_dims))
    specs = {
        "sac": f"--total-steps {n} --learning-starts {ls}",
        "rlpd": f"--dataset DATA --total-steps {n} --learning-starts {ls} "
        f"--utd-ratio {a.rlpd_utd} --num-qs 10 --num-min-qs 2",
        "iql": f"--dataset DATA --offline-steps {a.iql_offline_steps} --online-steps {n} "
        "--actor-lr-schedule constant",
        "cal-ql": f"--dataset DATA --offline-steps {a.calql_offline_steps} --online-steps {n} "
        f"--hidden-dims {hidden} --cql-n-actions {a.calql_n_actions}",
    }
    steps = sorted({0, *range(e, n, e), n})
    rows = []
    for m in a.methods.split(","):
        summary, wall = train(m, m, f"{specs[m]} --eval-every {e}")
        returns = curve(os.path.join(d, m), "--offline-steps" in specs[m])
        final = summary["final_eval_return_mean"]
        rows.append(
            {
                "method": m,
                "offline_steps": summary.get("offline_steps", 0),
                "returns": {s: returns.get(s) for s in steps},
                "final_return": final,
                "final_normalized": normalized_score(final, refs),
                "wall_s": wall,
                "online_wall_s": summary["wall_clock_s"],
            }
        )
    cmds = ["jaxrl " + " ".join(c).replace(d, "DIR") for c in commands]
    res = {
        "env": a.env,
        "machine": machine(),
        "date": str(datetime.date.today()),
        "load_average_start": load,
        "settings": vars(a),
        "dataset": {k: v for k, v in info.items() if k != "metadata"},
        "policy": {"return": policy["final_eval_return_mean"], "wall_s": policy_wall},
        "commands": cmds,
        "steps": steps,
        "rows": rows,
    }
    write_results(res, a)


def write_results(res: dict, a: argparse.Namespace) -> None:
    """Print the table; write offline_to_online.{md,json} (and .png) into ``a.results_dir``."""
    info, steps = res["dataset"], res["steps"]
    lines = [
        f"# Offline-to-online on {a.env}: evaluation return against online env steps",
        "",
        f"Machine: {res['machine']}; 1-min load average at the start "
        f"{res['load_average_start']:.1f} (other work shares the cores: wall clocks are rough). "
        f"Seed {a.seed}; each point is the mean return of "
        f"{a.eval_episodes} deterministic episodes.",
        "",
        f"Dataset (`jaxrl dataset collect --kind medium`): {info['transitions']:,} transitions, "
        f"{info['episodes']} episodes of a SAC policy trained {a.policy_steps:,} env steps (eval "
        f"return {res['policy']['return']:,.0f}; {res['policy']['wall_s']:.0f} s). Behavior "
        f"return {info['return_mean']:,.0f} ± {info['return_std']:,.0f}, D4RL-normalized "
        f"{fmt(info['normalized_score_mean'], '.1f')} (reference returns: random "
        f"{fmt(info['ref_min_return'], '.1f')}, expert {fmt(info['ref_max_return'], '.1f')}).",
        "",
        "| method | offline steps | "
        + " | ".join(f"{s:,}" for s in steps)
        + " | final normalized | wall (online phase) |",
        "|---|---|" + "---|" * len(steps) + "---|---|",
    ]
    for r in res["rows"]:
        vals = " | ".join(fmt(r["returns"][s]) for s in steps)
        score = fmt(r["final_normalized"], ".1f")
        lines.append(
            f"| {r['method']} | {r['offline_steps']:,} | {vals} | {score} | "
            f"{r['wall_s']:.0f} s ({r['online_wall_s']:.0f} s) |"
        )
    lines += [
        "",
        "- Column 0 is the start of the online phase: for IQL and Cal-QL the last evaluation of "
        "offline pretraining; SAC and RLPD have no policy yet. Wall clock includes dataset "
        "loading, compilation and evaluations (offline phase included).",
        f"- Fairness: SAC and RLPD act at random for their first {a.learning_starts:,} env steps "
        "(`--learning-starts`; SAC's default is 5,000); IQL and Cal-QL act with their pretrained "
        "policy from the first step (their default, 0). All make one update per env step except "
        "RLPD; RLPD, IQL and Cal-QL draw half of every minibatch from the dataset.",
        f"- Deviations from the papers, to fit about an hour on 2 CPU cores: RLPD at {a.rlpd_utd} "
        "updates per env step (paper: 20; it keeps 10 LayerNorm critics, min over 2); Cal-QL with "
        f"{'x'.join(map(str, a.calql_hidden_dims))} networks and {a.calql_n_actions} sampled "
        "actions (paper: 3x256 and 10); offline phases of thousands of steps (papers: 1M). IQL "
        "uses a constant actor learning rate, as the authors' fine-tuning runs.",
        "",
        f"Commands (DIR = {a.out_dir.removeprefix(ROOT + os.sep)}):",
        "",
        "```",
        *res["commands"],
        "```",
        "",
        "Regenerate: `"
        + " ".join([".venv/bin/python benchmarks/offline_to_online.py", *sys.argv[1:]])
        + "` (finished runs are read back, cut ones resume).",
        "",
    ]
    text = "\n".join(lines)
    print(text)
    out = a.results_dir
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "offline_to_online.md"), "w") as f:
        f.write(text)
    with open(os.path.join(out, "offline_to_online.json"), "w") as f:
        json.dump(res, f, indent=2)
    if not a.no_plot:
        plot(res["rows"], info["return_mean"], a.env, os.path.join(out, "offline_to_online.png"))
    print(f"wrote {out}/offline_to_online.md, .json" + ("" if a.no_plot else ", .png"))


def plot(rows: list[dict], behavior: float, env: str, path: str) -> None:
    """Eval return against online env steps, one line per method, the behavior return dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for r in rows:
        pts = sorted((s, v) for s, v in r["returns"].items() if v is not None)
        ax.plot([s for s, _ in pts], [v for _, v in pts], marker="o", label=r["method"])
    ax.axhline(behavior, color="gray", linestyle="--", label="dataset")
    ax.set(xlabel="online environment steps", ylabel="eval return", title=env)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


if __name__ == "__main__":
    main()
