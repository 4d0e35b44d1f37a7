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
    """SIGTERM during the second run; the rerun skips the first and resumes the second. A run
    another process trains (its directory's lock held) is left to it."""
    import fcntl

    runs = tmp_path / "runs" / "online" / "jax:pendulum"
    sac, td3 = runs / "jaxrl-sac" / "s0", runs / "jaxrl-td3" / "s0"
    listing = subprocess.run(_suite(tmp_path, "--list"), capture_output=True, text=True)
    assert listing.returncode == 0 and listing.stdout.count("pending") == 2, listing.stdout

    td3.mkdir(parents=True)
    with open(td3 / ".lock", "a") as held:  # as a `jaxrl train` of td3 in another process
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        listing = subprocess.run(_suite(tmp_path, "--list"), capture_output=True, text=True)
        assert "running  online/jax:pendulum/jaxrl-td3" in listing.stdout, listing.stdout
        left = subprocess.run(_suite(tmp_path, "--only", "*td3*"), capture_output=True, text=True)
        assert left.returncode == 0 and "another process trains it" in left.stdout, left.stdout
        assert not (td3 / "metrics.csv").exists()

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
    machine = json.loads((archived / "s0" / "machine.json").read_text())  # which CPU finished it
    assert machine["cpu"] and machine["cores"] == os.cpu_count(), machine
    label = f"{machine['cpu']} [{machine['kind']}]" if machine["kind"] else machine["cpu"]
    assert f"Machines that finished the runs: {label} (2 runs)" in md, md
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


class _Job:
    """A stand-in for a suite run: a short Python child that records its start and end."""

    def __init__(self, name: str, seconds: float, needs: tuple[str, ...] = ()):
        self.name, self.seconds, self.needs = name, seconds, needs

    def command(self, root: str) -> list[str]:
        code = f"import time; time.sleep({self.seconds})"
        return [sys.executable, "-c", code]


def _queue(tmp_path, jobs, workers, needs=(), stop_after=None):
    """Run fake jobs through ``run_queue`` (``needs``: jobs to remake first, as an archived-only
    dataset is); the log lines without their timings, and the return code."""
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    try:
        from suite_runner import Runner, run_queue
    finally:
        sys.path.pop(0)
    lines, done = [], set()
    runner = Runner(str(tmp_path), lines.append)
    if stop_after is not None:
        import threading

        threading.Timer(stop_after, runner.stop, (signal.SIGTERM, None)).start()
    by_name = {j.name: j for j in (*jobs, *needs)}

    def finish(job, rc):
        done.add(job.name)
        return rc == 0

    rc = run_queue(
        jobs,
        lambda j: ("done", "") if j.name in done else ("pending", ""),
        lambda j: [by_name[n] for n in j.needs if n not in done],
        finish,
        runner,
        workers,
    )
    return [" ".join(line.split()[:2]) for line in lines], rc


def test_workers_run_jobs_at_once_and_a_remade_need_once(tmp_path):
    """Two workers start two runs together; a dataset two runs need is remade once, by the
    worker that took the first of them, while the other worker goes on with a run that does
    not need it; a stop ends every child and returns 130."""
    data = _Job("data", 1.5)
    jobs = [_Job("a", 0.5, ("data",)), _Job("b", 0.5, ("data",)), _Job("c", 0.5)]
    lines, rc = _queue(tmp_path, jobs, workers=2, needs=[data])
    assert rc == 0, lines
    assert lines.count("start data") == 1, lines
    assert lines.index("start c") < lines.index("end data"), lines  # no idle worker
    assert lines.index("end data") < min(lines.index("start a"), lines.index("start b")), lines
    ends = sorted(x for x in lines if x.startswith("end"))
    assert ends == ["end a", "end b", "end c", "end data"], lines
    lines, rc = _queue(tmp_path, [_Job("x", 60.0), _Job("y", 60.0)], workers=2, stop_after=3.0)
    assert rc == 130 and sorted(lines[:2]) == ["start x", "start y"], lines
    assert lines[-1].startswith("stopped"), lines


class _BrokenJob(_Job):
    """A job whose command cannot be built (a bug in the suite, not in the run)."""

    def command(self, root: str) -> list[str]:
        raise KeyError("a placeholder the command line does not fill")


def test_an_error_in_the_suite_stops_every_run_and_exits_1(tmp_path):
    """A worker that raises logs the traceback and stops the runs beside it, which save their
    state; the suite exits 1 instead of letting the worker thread die and the others go on."""
    lines, rc = _queue(tmp_path, [_Job("slow", 60.0), _BrokenJob("bad", 0.0)], workers=2)
    assert rc == 1, lines
    assert "error while" in lines and "end slow" in lines, lines
    assert lines[-1] == "stopped by", lines


class _AffinityJob(_Job):
    """A job that writes the cores it may run on (``os.sched_getaffinity``) to ``DIR/NAME``."""

    def command(self, root: str) -> list[str]:
        path = os.path.join(root, self.name)
        code = (
            f"import os, time; time.sleep({self.seconds}); "
            f"open({path!r}, 'w').write(' '.join(map(str, sorted(os.sched_getaffinity(0)))))"
        )
        return [sys.executable, "-c", code]


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 cores")
def test_two_workers_children_get_their_own_cores(tmp_path):
    """With two workers the runs side by side get disjoint shares of the cores (no thread pool
    per core in each of them); with one worker a run may use every core."""
    cores = sorted(os.sched_getaffinity(0))
    lines, rc = _queue(tmp_path, [_AffinityJob("a", 0.5), _AffinityJob("b", 0.5)], workers=2)
    assert rc == 0, lines
    got = [{int(c) for c in (tmp_path / n).read_text().split()} for n in "ab"]
    assert got[0] and got[1] and not got[0] & got[1], got
    assert sorted(got[0] | got[1]) == cores, got
    lines, rc = _queue(tmp_path, [_AffinityJob("c", 0.0)], workers=1)
    assert rc == 0 and (tmp_path / "c").read_text().split() == [str(c) for c in cores], lines


def test_dataset_recipes_run_with_the_portable_xla_isa(tmp_path, monkeypatch):
    """A recipe run's child gets ``--xla_cpu_max_isa=AVX2`` added to the caller's XLA_FLAGS on
    an x86 CPU (its log line shows it), unless the caller chose an ISA; other runs get nothing."""
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    try:
        import suite
        from suite_runner import Runner
    finally:
        sys.path.remove(os.path.join(ROOT, "benchmarks"))
    monkeypatch.setattr(suite.platform, "machine", lambda: "x86_64")
    monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=1")
    recipe = suite._dataset_run("Hopper-v5")
    assert recipe.environ == (
        "XLA_FLAGS=--xla_force_host_platform_device_count=1 --xla_cpu_max_isa=AVX2",
    )
    assert recipe.command("/r")[:2] == ["env", recipe.environ[0]]
    assert all(not r.environ for r in suite.full_suite() if r.section != "datasets")
    monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_max_isa=AVX512")
    assert suite._dataset_run("Hopper-v5").environ == ()
    monkeypatch.setattr(suite.platform, "machine", lambda: "aarch64")
    monkeypatch.delenv("XLA_FLAGS")
    assert suite._dataset_run("Hopper-v5").environ == ()

    code = "import os; print('flags:', os.environ['XLA_FLAGS'])"
    run = suite.Run("datasets", "Env", "jaxrl", "recipe", 0, 1, "steps", ("-c", code),
                    environ=("XLA_FLAGS=" + suite.PORTABLE_XLA,))  # fmt: skip
    assert Runner(str(tmp_path), lambda _: None).execute(run) == 0
    log = (tmp_path / (run.name + ".log")).read_text()
    assert f"$ env XLA_FLAGS={suite.PORTABLE_XLA} " in log, log
    assert f"flags: {suite.PORTABLE_XLA}" in log, log


def test_a_d3rlpy_run_gets_the_agent_settings_of_the_jaxrl_run_beside_it():
    """The peer's ``--config`` is the agent config jaxrl's run of the same cell resolves to, so
    both normalize observations alike and IQL's cosine schedule spans the same budget."""
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    try:
        import suite
        from suite_settings import resolved_agent_config
    finally:
        sys.path.remove(os.path.join(ROOT, "benchmarks"))
    runs = suite.full_suite()
    jaxrl = {(r.task, r.agent, r.seed): r for r in runs if r.impl == "jaxrl"}
    peers = [r for r in runs if r.impl == "d3rlpy"]
    assert {r.agent for r in peers} == set(suite.D3RLPY)
    for peer in peers:
        line = peer.command("/r")  # as the suite runs it, the placeholders filled in
        sent = json.loads(line[line.index("--config") + 1])
        assert sent == resolved_agent_config(tuple(jaxrl[peer.task, peer.agent, peer.seed].args))
        assert sent["normalize_observations"] is (peer.agent != "cql"), (peer.name, sent)
        if peer.agent == "iql":
            assert sent["max_steps"] is None  # the peer fills it with its --steps, as jaxrl


def test_a_dataset_remade_with_other_files_blocks_its_runs_and_keeps_the_archived_ones(tmp_path):
    """The archived dataset is the one of record: remade here with other hashes (another kind of
    CPU), its finished runs stay finished and the unfinished ones are blocked, so a cell never
    mixes two datasets. Retiring the dataset makes new files the ones of record."""
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    try:
        from suite import Run, state
        from suite_state import (
            DATA_STAMP,
            archive_run,
            archived,
            data_stamp,
            finished_dir,
            follow_record,
            retire_run,
        )
    finally:
        sys.path.remove(os.path.join(ROOT, "benchmarks"))
    root, archive = str(tmp_path / "runs"), str(tmp_path / "archive")
    data = Run("datasets", "Env", "jaxrl", "recipe", 0, 1, "steps", (), marker="manifest.json")
    run, other = (
        Run("offline", "env-medium", "jaxrl", agent, 0, 1, "steps", (), needs=(data.name,))
        for agent in ("bc", "iql")
    )

    def write(base, name, file, content):
        os.makedirs(os.path.join(base, name), exist_ok=True)
        with open(os.path.join(base, name, file), "w") as f:
            json.dump(content, f)

    manifest = {"files": {"medium": {"sha256": "aaa"}, "medium-replay": {"sha256": "bbb"}}}
    write(root, data.name, "manifest.json", manifest)
    write(root, run.name, "summary.json", {"completed": True})
    # Trained in this checkout: finished, and archived with the hashes of the files it read.
    assert finished_dir(run, root, archive) == os.path.join(root, run.name)
    archive_run(run, root, archive)
    with open(os.path.join(archive, run.name, DATA_STAMP)) as f:
        assert json.load(f) == {data.name: {"medium": "aaa", "medium-replay": "bbb"}}
    # A fresh checkout: the archive alone; the dataset's archived manifest says the same files.
    write(archive, data.name, "manifest.json", manifest)
    shutil.rmtree(root)
    assert finished_dir(run, root, archive) == os.path.join(archive, run.name)
    assert state(other, root, {data.name}, archive)[0] == "pending"
    # The dataset is remade first, following its archived manifest (the recipe's record.json);
    # once remade with the same files, the archive is left as it is.
    assert archived(data, archive) and not archived(other, archive)
    assert follow_record(data, root, archive) and not follow_record(other, root, archive)
    with open(os.path.join(root, data.name, "record.json")) as f:
        assert json.load(f) == manifest
    # Remade here with other files: the archived dataset and the run on it stay of record; the
    # runs still to do wait for a machine that remakes the archived files.
    write(root, data.name, "manifest.json", {"files": {"medium": {"sha256": "ccc"}}})
    assert finished_dir(data, root, archive) == os.path.join(archive, data.name)
    assert finished_dir(run, root, archive) == os.path.join(archive, run.name)
    assert data_stamp(other, root, archive) == {
        data.name: {"medium": "aaa", "medium-replay": "bbb"}
    }
    st, detail = state(other, root, {data.name}, archive)
    assert st == "blocked" and "other files than the archived ones" in detail, (st, detail)
    write(root, other.name, "summary.json", {"completed": True})  # trained here on them anyway
    assert finished_dir(other, root, archive) is None
    shutil.rmtree(os.path.join(root, other.name))
    # An archived run without a stamp (its files unknown) is not finished.
    os.remove(os.path.join(archive, run.name, DATA_STAMP))
    assert finished_dir(run, root, archive) is None
    st, detail = state(run, root, {data.name}, archive)
    assert st == "blocked", (st, detail)  # not on this machine's files either
    # The dataset retired on purpose: the files this machine remade become the ones of record,
    # archived at once (not made again); the old archive is kept aside.
    moved, written = retire_run(data, root, archive)
    assert os.path.join(archive, data.name, "manifest.json") in written, written
    assert [m for m in moved if "_retired" in m], moved
    with open(os.path.join(archive, data.name, "manifest.json")) as f:
        assert json.load(f)["files"] == {"medium": {"sha256": "ccc"}}
    assert finished_dir(data, root, archive) == os.path.join(root, data.name)
    assert state(other, root, {data.name}, archive)[0] == "pending"
    st, detail = state(run, root, {data.name}, archive)  # so the suite retires it and reruns
    assert st == "stale" and "dataset files" in detail, (st, detail)
    # Retired again with nothing remade here: the run directory and archive both move aside.
    moved, written = retire_run(data, root, archive)
    assert written == [] and len(moved) == 2, (moved, written)
    assert finished_dir(data, root, archive) is None


def test_a_recipe_that_left_its_record_blocks_itself_and_the_runs_that_read_it(tmp_path):
    """Remaking archived files on another kind of CPU, the recipe's expert run evaluates another
    return at the record's medium step (the recipe stops there, ``--strict-record``): the
    dataset and every run that reads it are blocked on this machine, not remade again."""
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    try:
        from suite import Run, full_suite, state
    finally:
        sys.path.remove(os.path.join(ROOT, "benchmarks"))
    root, archive = tmp_path / "runs", str(tmp_path / "archive")
    data = Run("datasets", "Env", "jaxrl", "recipe", 0, 1, "steps", (), marker="manifest.json")
    run = Run("offline", "env-medium", "jaxrl", "iql", 0, 1, "steps", (), needs=(data.name,))
    recipe = root / data.name
    (recipe / "expert_sac").mkdir(parents=True)
    record = {"medium_step": 20, "medium_return": 5.5, "expert_step": 40, "expert_return": 9.0}
    (recipe / "record.json").write_text(json.dumps(record))
    metrics = recipe / "expert_sac" / "metrics.csv"
    metrics.write_text("step,eval_return,train/loss\n10,1.25,0.5\n15,,0.4\n")
    # Not yet at the record's step: nothing is known, the runs go on.
    assert state(data, str(root), set(), archive)[0] == "partial"
    assert state(run, str(root), {data.name}, archive)[0] == "pending"
    metrics.write_text(metrics.read_text() + "20,5.5,0.3\n")  # on the record's path
    assert state(run, str(root), {data.name}, archive)[0] == "pending"
    metrics.write_text(metrics.read_text().replace("20,5.5", "20,4.75"))  # another path
    for each, done in ((data, set()), (run, {data.name})):
        st, detail = state(each, str(root), done, archive)
        assert st == "blocked" and f"{data.name}: the expert run evaluates 4.75 at step 20 " in (
            detail
        ), (st, detail)
    # The suite's recipes stop there rather than train the whole expert run.
    assert all("--strict-record" in r.args for r in full_suite() if r.agent == "recipe")


def test_a_peer_run_directory_is_locked_as_a_jaxrl_one(tmp_path):
    # Two suite processes took one d3rlpy run at once before peer runs held the lock.
    from jaxrl.loops.config import run_dir_in_use

    out = str(tmp_path / "peer-run")
    held = (
        f"import sys, time; sys.path.insert(0, {os.path.join(ROOT, 'benchmarks', 'peers')!r}); "
        f"import rundir; run = rundir.RunDir({out!r}); print('held', flush=True); time.sleep(60)"
    )
    holder = subprocess.Popen([sys.executable, "-c", held], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        assert run_dir_in_use(out)  # the suite leaves it to that process
        second = held.replace("time.sleep(60)", "pass")
        r = subprocess.run([sys.executable, "-c", second], capture_output=True, text=True)
        assert r.returncode == 2 and "being trained by another process" in r.stderr
    finally:
        holder.kill()
        holder.wait()
    assert not run_dir_in_use(out)  # the OS drops the lock with its process


def test_a_run_made_with_other_agent_settings_is_stale_and_retired_not_deleted(tmp_path):
    """A finished run whose recorded agent config differs from what its command resolves to
    today is not finished: ``--list`` calls it stale with the field, and ``--retire`` (as the
    suite does before training it again) moves it and its archive aside, deleting nothing. A
    field added since the run only shows in the detail."""
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    try:
        import suite
        from suite_settings import resolved_agent_config
        from suite_state import finished_dir
    finally:
        sys.path.remove(os.path.join(ROOT, "benchmarks"))
    root, results = tmp_path / "runs", tmp_path / "results"
    archive = results / "suite_smoke_runs"
    run = suite.smoke_suite()[0]
    today = resolved_agent_config(tuple(run.args))
    assert today["actor_lr"] == 3e-4  # SAC's default: the command does not set it

    def finish_in(base, config):
        (base / run.name).mkdir(parents=True, exist_ok=True)
        (base / run.name / "summary.json").write_text(json.dumps({"completed": True}))
        (base / run.name / "config.json").write_text(json.dumps({"agent_config": config}))

    finish_in(archive, today)
    assert finished_dir(run, str(root), str(archive)) == str(archive / run.name)
    finish_in(archive, {k: v for k, v in today.items() if k != "backup_entropy"})
    st, detail = suite.state(run, str(root), set(), str(archive))
    assert st == "done" and detail.endswith("fields added since: backup_entropy"), detail
    finish_in(archive, {**today, "actor_lr": 1e-3})
    finish_in(root, {**today, "actor_lr": 1e-3})
    assert finished_dir(run, str(root), str(archive)) is None
    st, detail = suite.state(run, str(root), set(), str(archive))
    assert st == "stale" and "actor_lr 0.001 -> 0.0003" in detail, (st, detail)
    rc = suite.main(["--suite", "smoke", "--root", str(root), "--results", str(results),
                     "--retire", "--only", run.name])  # fmt: skip
    assert rc == 0 and not (root / run.name).exists() and not (archive / run.name).exists()
    kept = [*(root / "retired").rglob("config.json"), *results.rglob("*_retired/**/config.json")]
    assert len(kept) == 2 and all("0.001" in p.read_text() for p in kept), kept
    assert suite.state(run, str(root), set(), str(archive))[0] == "pending"


def test_the_queue_trains_a_stale_run_after_preparing_it(tmp_path):
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    try:
        from suite_runner import Runner, run_queue
    finally:
        sys.path.pop(0)
    lines, prepared, done = [], [], set()
    rc = run_queue(
        [_Job("old", 0.0)],
        lambda j: ("done", "") if j.name in done else ("stale", "settings changed"),
        lambda j: [],
        lambda j, rc: done.add(j.name) or rc == 0,
        Runner(str(tmp_path), lines.append),
        prepare=lambda j: prepared.append((j.name, len(lines))),
    )
    assert rc == 0 and prepared == [("old", 0)] and lines[0].startswith("start old"), lines


def test_the_task_plots_draw_one_line_per_cell_labelled_by_library_and_agent(tmp_path, monkeypatch):
    # A peer's configs differ from jaxrl's in many settings and record the seed inside them; the
    # plot still draws each cell's seeds as one line named after the cell.
    import jaxrl.analysis.curves as curves

    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    try:
        from suite_report import _plots
    finally:
        sys.path.remove(os.path.join(ROOT, "benchmarks"))
    cells = []
    for impl, settings in (("jaxrl", {"lr": 3e-4}), ("sbx-rl", {"qf": [256, 256]})):
        dirs = []
        for seed in range(3):
            d = tmp_path / impl / f"s{seed}"
            d.mkdir(parents=True)
            config = {"agent": "sac", "env": "Hopper-v5", "seed": seed,
                      "settings": {**settings, "sbx": {"seed": seed}}}  # fmt: skip
            (d / "config.json").write_text(json.dumps(config))
            (d / "metrics.csv").write_text(f"step,eval_return\n5000,{seed}\n10000,{10 + seed}\n")
            dirs.append(str(d))
        cells.append({"section": "online", "task": "Hopper-v5", "impl": impl, "agent": "sac",
                      "dirs": dirs, "normalized": []})  # fmt: skip
    drawn = {}

    def record(groups, lines, png, title=""):
        drawn[title] = [
            (g.label, len(g.runs), c.mean.tolist()) for g, c in zip(groups, lines, strict=True)
        ]
        return png

    monkeypatch.setattr(curves, "plot_groups", record)
    written = _plots(cells, str(tmp_path))
    assert written == [str(tmp_path / "suite_online_Hopper-v5.png")]
    assert drawn == {"Hopper-v5": [("jaxrl sac", 3, [1.0, 11.0]), ("sbx-rl sac", 3, [1.0, 11.0])]}
