"""The results suite: agents x tasks x seeds beside the peer libraries, resumable.

Every run is an ordinary run directory under ``runs/suite/`` (git-ignored), made by one command:
``jaxrl train`` / ``jaxrl plan`` / ``jaxrl dataset recipe`` for jaxrl, and the scripts in
``benchmarks/peers/`` for Stable-Baselines-Jax, d3rlpy and brax.training (each in its own
virtualenv: ``make peers``, ``make peers-brax``). The runs are declared in ``full_suite()`` below;
their budgets are the table's budgets.

    .venv/bin/python benchmarks/suite.py --list                 # every run and its state
    .venv/bin/python benchmarks/suite.py --nice                 # run what is unfinished, nice 19
    .venv/bin/python benchmarks/suite.py --only 'online/Hopper*' # a subset (fnmatch on the name)
    .venv/bin/python benchmarks/suite.py --report               # only rewrite the tables
    .venv/bin/python benchmarks/suite.py --nice --workers 2     # two runs at once

Runs go in the listed order (datasets before the offline runs that read them), one at a time or
``--workers N`` at once (``suite_runner.py``). Stopping the suite (Ctrl-C, SIGTERM, a killed
session) stops the current runs at their next checkpoint-safe point; running the suite again
skips every finished run (its directory holds ``summary.json``) and resumes the unfinished ones
from their checkpoints. A finished run made with other agent settings than its command gives
today (a default changed) is stale: the suite moves it aside (``retired``) and trains it again;
``--retire --only PATTERN`` does so by hand. After each finished run the tables
``benchmarks/results/suite.{md,json}`` and the plots are rewritten (``--commit`` commits them):
a partial suite always has a partial table that says what is missing.
"""

from __future__ import annotations

import argparse
import dataclasses
import fnmatch
import json
import os
import platform
import subprocess
import sys
import threading
import time
from collections.abc import Callable

# benchmarks/ is on sys.path as a script
from suite_report import write_report
from suite_runner import Runner, run_queue
from suite_settings import resolved_agent_config, retire
from suite_state import (
    ROOT,
    VENVS,
    archive_dir,
    archive_run,
    archived,
    finished,
    finished_dir,
    follow_record,
    foreign_data,
    left_record,
    retire_run,
    state,
)

PEERS = os.path.join(ROOT, "benchmarks", "peers")
SEEDS = (0, 1, 2)
EVAL_EPISODES = 10


@dataclasses.dataclass(frozen=True)
class Run:
    """One cell's seed: a command that makes one run directory.

    Attributes:
        section: the table it belongs to (``online``, ``ppo``, ``datasets``, ``offline``, ``o2o``,
            ``planners``).
        task: the env id or dataset name of its row.
        impl: ``jaxrl`` or the peer library.
        agent: the agent (the peer's run is named after the jaxrl agent it stands beside).
        seed: the seed.
        budget: env steps (online), gradient steps (offline) or episodes (planning).
        unit: what ``budget`` counts.
        args: the command's arguments after the program (``{out}`` becomes the run directory,
            ``{root}`` the suite's directory).
        needs: names of runs that must finish first (the datasets an offline run reads).
        marker: the file that says the run finished (``summary.json`` of a run directory).
        environ: ``VAR=value`` settings the command runs with (through ``env``, so that the
            command line in ``DIR.log`` is the one to rerun).
    """

    section: str
    task: str
    impl: str
    agent: str
    seed: int
    budget: int
    unit: str
    args: tuple[str, ...]
    needs: tuple[str, ...] = ()
    marker: str = "summary.json"
    environ: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        """``section/task/impl-agent/sSEED``: the run directory below the suite's root."""
        return f"{self.section}/{self.task}/{self.impl}-{self.agent}/s{self.seed}"

    def command(self, root: str) -> list[str]:
        """The full command line, with the virtualenv's python and the paths filled in."""
        out = os.path.join(root, self.name)
        program = [VENVS[self.impl][0], *(a.format(out=out, root=root) for a in self.args)]
        return ["env", *self.environ, *program] if self.environ else program


def _train(agent: str, env: str, seed: int, steps: int, every: int, *extra: str,
           episodes: int = EVAL_EPISODES) -> tuple:  # fmt: skip
    """``jaxrl train`` of one run ({out} is filled in later, so paths may hold spaces)."""
    line = (
        f"-m jaxrl.cli train {agent} --env {env} --seed {seed} --total-steps {steps} "
        f"--eval-every {every} --eval-episodes {episodes} --out {{out}} --no-progress "
        "--no-tensorboard"
    )
    return (*line.split(), *extra)


def _peer(script: str, seed: int, steps: int, every: int, *extra: str) -> tuple:
    """A peer script of ``benchmarks/peers`` (same options as its docstring's contract)."""
    line = f"--out {{out}} --seed {seed} --steps {steps} --eval-every {every}"
    return (
        os.path.join(PEERS, script),
        *line.split(),
        "--eval-episodes",
        str(EVAL_EPISODES),
        *extra,
    )


def _peer_config(agent: str, env: str, steps: int, data: str) -> tuple[str, ...]:
    """``--config JSON``: the agent config jaxrl's run of the cell resolves to, for the peer.

    So the peer trains with jaxrl's settings wherever it can follow them (observation
    normalization, a schedule's horizon); the peer's ``config.json`` lists what it cannot.
    """
    jaxrl_run = _train(agent, env, 0, steps, steps // 10, "--dataset", data)
    config = resolved_agent_config(tuple(jaxrl_run))
    text = json.dumps(config, sort_keys=True).replace("{", "{{").replace("}", "}}")
    return ("--config", text) if config else ()  # braces doubled: ``Run.command`` formats args


# Budgets (the tables state them). Online: 100k env steps. Offline: gradient steps per
# agent, chosen so that one run takes at most about an hour on 2 CPU cores (the papers train 1M;
# CQL's 3x10 sampled actions per update make it ~30x slower than IQL here).
ONLINE_STEPS = 100_000
ONLINE_TASKS = ("HalfCheetah-v5", "Hopper-v5")
SBX = ("sac", "td3", "crossq")  # the online agents sbx runs beside jaxrl's
EPISODIC = ("Hopper-v5",)  # tasks whose episodes terminate
EXPERT_STEPS = 300_000  # the SAC expert behind each generated dataset
DATASET_STEPS = 200_000  # transitions of each medium dataset (D4RL: 1M)
OFFLINE_STEPS = {
    "bc": 100_000,
    "td3-bc": 100_000,
    "iql": 100_000,
    "fql": 100_000,
    "rebrac": 50_000,
    "idql": 50_000,
    "diffusion-ql": 30_000,
    "cql": 20_000,
    "prdc": 100_000,
    "a2pr": 100_000,
    "famo2o": 100_000,
}
OFFLINE_TASKS = (("hopper-medium", "Hopper-v5"), ("halfcheetah-medium-replay", "HalfCheetah-v5"))
D3RLPY = ("bc", "td3-bc", "cql", "iql", "prdc")
O2O_OFFLINE, O2O_ONLINE = 20_000, 25_000
PPO_TASKS = {"brax:inverted_pendulum": 1_000_000, "brax:hopper": 3_000_000}
PETS_STEPS = 5_000
# PETS at the CPU size of its learning test (mbrl-lib's defaults plan ~180 GFLOP per env step),
# learned reward, mbrl-lib's known termination of the inverted pendulum.
PETS_CPU = tuple(
    "--ensemble-size 4 --num-elites 2 --hidden-dims 64 64 --num-particles 4 --horizon 15 "
    "--population 64 --cem-elites 8 --cem-iterations 3 --buffer-size 5000 --model-train-freq 25 "
    "--model-epochs 25 --patience 25 --batch-size 64 --model-lr 7.5e-4 --validation-ratio 0.1 "
    "--termination-fn inverted_pendulum".split()
)
PLAN_TASKS = ("jax:pendulum", "brax:inverted_pendulum")
PLAN_EPISODES = 5


def _dataset_path(name: str) -> str:
    """Where the recipe of ``name``'s env writes it: ``{root}/datasets/ENV/.../env-kind.hdf5``."""
    env = {d: e for d, e in OFFLINE_TASKS} | {"hopper-medium-replay": "Hopper-v5"}
    kind = name.split("-", 1)[1]
    recipe = _dataset_run(env[name])
    return os.path.join("{root}", recipe.name, f"{env[name].lower()}-{kind}.hdf5")


PORTABLE_XLA = "--xla_cpu_max_isa=AVX2"
"""XLA compiles CPU code for the machine's vector instructions, and the floats follow them: on
one machine, SAC trained with ``--xla_cpu_max_isa=AVX`` takes another path from the same seed
than with AVX2 (the default there, and bit-identical to it). The dataset recipes run with AVX2 as
the ceiling, so that the AVX2 machines of one kind make the same files from one session to the
next. It is not enough across CPU makers (an Intel Xeon with AVX-512 made other Hopper-v5 files
than two AMD EPYCs did): the archived files stay the dataset of record (``suite_state``)."""


def _portable_xla() -> tuple[str, ...]:
    """``XLA_FLAGS=...`` with ``PORTABLE_XLA`` added, on an x86 CPU whose flags do not set it."""
    flags = os.environ.get("XLA_FLAGS", "")
    if platform.machine().lower() not in ("x86_64", "amd64") or "xla_cpu_max_isa" in flags:
        return ()
    return ("XLA_FLAGS=" + " ".join(f for f in (flags, PORTABLE_XLA) if f),)


def _dataset_run(env: str) -> Run:
    """``jaxrl dataset recipe``: a SAC expert, then the medium and medium-replay files.

    Remaking archived files (``follow_record``), the recipe stops once its expert run leaves the
    record's path (``--strict-record``) rather than train hours for files no cell may use.
    """
    line = (
        f"-m jaxrl.cli dataset recipe --env {env} --out {{out}} --seed 0 --expert-steps "
        f"{EXPERT_STEPS} --dataset-steps {DATASET_STEPS} --no-progress --kinds medium medium-replay"
        " --strict-record"
    )
    return Run("datasets", env, "jaxrl", "recipe", 0, EXPERT_STEPS, "expert env steps",
               tuple(line.split()), marker="manifest.json", environ=_portable_xla())  # fmt: skip


# fmt: off
# The declarative table: one line (or a few) per cell, kept in this layout on purpose.
def cell(section: str, task: str, impl: str, agent: str, budget: int, unit: str,
         args: Callable[[int], tuple], needs: tuple[str, ...] = ()) -> list[Run]:
    """One table cell: a run per seed in ``SEEDS``, ``args(seed)`` its command."""
    return [Run(section, task, impl, agent, s, budget, unit, args(s), needs) for s in SEEDS]


def full_suite() -> list[Run]:
    """Every run of the results table, in the order the suite runs them (a cell at a time)."""
    datasets = {env: _dataset_run(env) for env in ("Hopper-v5", "HalfCheetah-v5")}
    runs: list[Run] = list(datasets.values())  # first: 84 runs read them
    for env in ONLINE_TASKS:
        for agent in ("sac", "td3", "crossq", "sac-fast"):
            runs += cell("online", env, "jaxrl", agent, ONLINE_STEPS, "env steps",
                         lambda s, a=agent, e=env: _train(a, e, s, ONLINE_STEPS, 5_000))
            if agent in SBX:
                runs += cell("online", env, "sbx-rl", agent, ONLINE_STEPS, "env steps",
                             lambda s, a=agent, e=env: _peer("suite_sbx.py", s, ONLINE_STEPS,
                                                             5_000, "--algo", a, "--env", e))
        # TD-MPC2 at its named CPU size; a task whose episodes terminate trains episodic.
        extra = ("--model-size", "cpu", *(("--episodic",) if env in EPISODIC else ()))
        runs += cell("online", env, "jaxrl", "tdmpc2", ONLINE_STEPS, "env steps",
                     lambda s, e=env, x=extra: _train("tdmpc2", e, s, ONLINE_STEPS, 5_000, *x))
    for name, env in OFFLINE_TASKS:
        data, need = _dataset_path(name), (datasets[env].name,)
        for agent, n in OFFLINE_STEPS.items():
            runs += cell("offline", name, "jaxrl", agent, n, "gradient steps",
                         lambda s, a=agent, e=env, n=n, d=data: _train(a, e, s, n, n // 10,
                                                                       "--dataset", d), need)
            if agent in D3RLPY:
                runs += cell("offline", name, "d3rlpy", agent, n, "gradient steps",
                             lambda s, a=agent, e=env, n=n, d=data: _peer(
                                 "suite_d3rlpy.py", s, n, n // 10, "--algo", a, "--dataset", d,
                                 "--env", e, *_peer_config(a, e, n, d)), need)
    data, need = _dataset_path("hopper-medium-replay"), (datasets["Hopper-v5"].name,)
    phases = ("--offline-steps", str(O2O_OFFLINE), "--online-steps", str(O2O_ONLINE))
    o2o = {"rlpd": ("--total-steps", str(O2O_ONLINE)), "cal-ql": phases, "iql": phases,
           "famo2o": phases, "sac": ("--offline-steps", "0", "--online-steps", str(O2O_ONLINE))}
    for agent, extra in o2o.items():
        runs += cell("o2o", "hopper-medium-replay", "jaxrl", agent, O2O_ONLINE, "online env steps",
                     lambda s, a=agent, x=extra: _train(a, "Hopper-v5", s, O2O_ONLINE, 2_500,
                                                        "--dataset", data, *x), need)
    for env, n in PPO_TASKS.items():
        runs += cell("ppo", env, "jaxrl", "ppo", n, "env steps",
                     lambda s, e=env, n=n: _train("ppo", e, s, n, n // 10, "--num-envs", "64"))
        runs += cell("ppo", env, "brax.training", "ppo", n, "env steps",
                     lambda s, e=env, n=n: _peer("suite_brax.py", s, n, n // 10, "--env",
                                                 e.split(":", 1)[1], "--num-envs", "64"))
    runs += cell("planners", "InvertedPendulum-v5", "jaxrl", "pets", PETS_STEPS, "env steps",
                 lambda s: _train("pets", "InvertedPendulum-v5", s, PETS_STEPS, 500, *PETS_CPU))
    for env in PLAN_TASKS:
        runs += cell("planners", env, "jaxrl", "mppi", PLAN_EPISODES, "episodes",
                     lambda s, e=env: ("-m", "jaxrl.cli", "plan", "--env", e, "--episodes",
                                       str(PLAN_EPISODES), "--seed", str(s), "--out", "{out}",
                                       "--method", "mppi"))
    return runs


def smoke_suite() -> list[Run]:
    """Two tiny runs on the pure-JAX pendulum (the test of the suite's stop and resume)."""
    tiny = ("--num-envs", "1", "--learning-starts", "100", "--hidden-dims", "32", "32")
    return [
        Run("online", "jax:pendulum", "jaxrl", agent, 0, n, "env steps",
            _train(agent, "jax:pendulum", 0, n, 500, *tiny, episodes=2))
        for agent, n in (("sac", 500), ("td3", 3_000))
    ]
# fmt: on


SUITES: dict[str, Callable[[], list[Run]]] = {"full": full_suite, "smoke": smoke_suite}


def _commit(paths: list[str], message: str) -> None:
    subprocess.run(["git", "add", "--", *paths], cwd=ROOT, check=False)
    subprocess.run(["git", "commit", "-q", "-m", message, "--", *paths], cwd=ROOT, check=False)


def main(argv: list[str] | None = None) -> int:
    """Parse the options, then list, report or run the suite."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--suite", choices=sorted(SUITES), default="full")
    p.add_argument("--root", default=os.path.join(ROOT, "runs", "suite"), help="run directories")
    p.add_argument("--results", default=os.path.join(ROOT, "benchmarks", "results"))
    p.add_argument("--only", action="append", default=[], help="fnmatch pattern on run names")
    p.add_argument("--list", action="store_true", help="print each run's state and exit")
    p.add_argument("--report", action="store_true", help="only rewrite the tables and plots")
    p.add_argument("--nice", action="store_true", help="run at the lowest CPU priority (19)")
    p.add_argument("--commit", action="store_true", help="git-commit the tables after each run")
    p.add_argument("--max-runs", type=int, default=None, help="stop after this many runs")
    p.add_argument("--workers", type=int, default=1, help="runs at once (2 cores: 2 is faster)")
    p.add_argument("--retire", action="store_true", help="move the --only runs aside; exit")
    a = p.parse_args(argv)
    root = os.path.abspath(a.root)
    runs = SUITES[a.suite]()
    chosen = [r for r in runs if not a.only or any(fnmatch.fnmatch(r.name, o) for o in a.only)]
    if not chosen:
        p.error(f"--only {a.only} matches none of the {len(runs)} runs (see --list)")
    archive = archive_dir(a.results, a.suite)
    done = finished(runs, root, archive)
    if a.list:
        for r in chosen:
            st, detail = state(r, root, done, archive)
            print(f"{st:8} {r.name:58} {r.budget:>9,} {r.unit:16} {detail}")
        print(f"{sum(r.name in done for r in chosen)}/{len(chosen)} runs done")
        return 0
    if a.retire:
        if not a.only:
            p.error("--retire needs --only PATTERN (the runs to train again)")
        written = []
        for r in chosen:
            moved, adopted = retire_run(r, root, archive, _commit if a.commit else None)
            written += adopted
            print(f"{r.name}: " + (", ".join(moved) or "nothing to move"))
        written += write_report(runs, root, a.results, a.suite)
        if a.commit:
            _commit(written, f"benchmarks/results/suite: tables without {len(chosen)} retired runs")
        return 0
    if a.report:
        print("\n".join(write_report(runs, root, a.results, a.suite)))
        return 0
    if a.nice:
        os.nice(19)
    os.makedirs(root, exist_ok=True)

    def log(msg: str) -> None:
        with open(os.path.join(root, "suite.log"), "a") as f:
            f.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {msg}\n")
        print(msg, flush=True)

    by_name = {r.name: r for r in runs}
    report = threading.Lock()  # workers finish runs one at a time: archive, tables, commit

    def remake(r: Run) -> list[Run]:
        # A need finished in an earlier checkout is archived, but its files (a dataset) are
        # not: remake it here first (deterministic given its seed on one machine).
        return [by_name[n] for n in r.needs if finished_dir(by_name[n], root, None) is None]

    def finish(run: Run, rc: int) -> bool:
        with report:
            if left := left_record((run.name,), root):
                log(f"{left[0]}; the runs that read it are left for a machine that remakes the "
                    "archived files")  # fmt: skip
                return False
            if foreign_data((run.name,), root, archive):
                # Kept out of the archive: the archived files stay the dataset of record, and
                # the runs that read this dataset wait for a machine that remakes them.
                log(f"{run.name}: remade files differ from the archived ones (another kind of "
                    "CPU); the archived dataset stays the one of record, and the runs that read "
                    "it are left for a machine that remakes those files")  # fmt: skip
                return False
            if finished_dir(run, root, None) is None:
                log(f"failed {run.name} (exit {rc}); see {os.path.join(root, run.name)}.log")
                return False
            done.add(run.name)
            if archived(run, archive):  # a dataset remade: the archive stays as it is
                log(f"{run.name}: remade, the same files as the archived ones")
                return True
            written = archive_run(run, root, archive)
            written += write_report(runs, root, a.results, a.suite)
            if a.commit:
                _commit(written, f"benchmarks/results/suite: {run.name} finished")
            return True

    def prepare(run: Run) -> None:
        if state(run, root, done, archive)[0] == "stale":  # its old run goes aside, kept
            moved = retire(run, root, archive, _commit if a.commit else None)
            log(f"retired {run.name} (stale): " + ", ".join(moved))
        follow_record(run, root, archive)

    runner = Runner(root, log)
    rc = run_queue(chosen, lambda r: state(r, root, done, archive), remake, finish, runner,
                   a.workers, a.max_runs, prepare)  # fmt: skip
    if rc:
        return rc
    write_report(runs, root, a.results, a.suite)
    return 0


if __name__ == "__main__":
    sys.exit(main())
