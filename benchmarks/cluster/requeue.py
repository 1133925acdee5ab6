"""Preemption and requeue under a real Slurm: one study stopped again and again, each run
compared bit for bit with its uninterrupted twin; writes docs/results/slurm.md.

On a Slurm of 2 namespaced nodes (benchmarks/cluster/slurm.py), a study of ``--tasks`` 2-rank
tasks (one rank per node, the digits MLP, a checkpoint every 200 steps) runs twice, from the
project's own array script: once untouched (the twins), once stopped at random moments. A
**cycle**: when the running task has trained for a random 1-5 s since it (re)started, a stop
signal (``scancel --signal=TERM``, ``--signal=USR1 --full`` or ``--signal=USR1 --batch`` in
turn) makes it checkpoint and exit 143; it requeues itself; the script lets it start at once
(``scontrol update StartTime=now``) except in ``--natural`` cycles, where it waits Slurm's own
requeue delay. A **node failure** kills every process of node 2 instead: Slurm declares it
down, cancels the step and requeues the job; the node's slurmd is restarted and the job resumes
from its newest checkpoint. Each finished run is then compared with its twin (model, sampler,
optimizer rows of the final checkpoint, every trace column but the wall clock).

The time lost per cycle is split, from the moments this script sees (polling every 0.1 s):
Slurm's delay (the attempt's exit to its next start, or for a node failure the kill to the
restart), start-up (the next attempt's start to hpcopt's "resuming from" line: Python, MPI,
the checkpoint vetted and read), to the first step (that line to the first new trace row), and
the steps redone (those after the checkpoint it resumed from; 0 after a stop signal, which
checkpoints where it stops).

    python -m benchmarks.cluster.requeue --cycles 20 --node-failures 2 --natural 1 --out docs/results/slurm.md
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from benchmarks.cluster.slurm import (
    MPICH_ON_THE_NETWORK,
    OPEN_MPI_ON_THE_NETWORK,
    SlurmCluster,
    slurm_unavailable,
)

ROOT = Path(__file__).resolve().parents[2]
CHECKPOINT_EVERY = 200
SIGNALS = (["--signal=TERM"], ["--signal=USR1", "--full"], ["--signal=USR1", "--batch"])
POLL = 0.1


@dataclass
class Cycle:
    task: int
    kind: str           # the scancel options, or "node failure"
    delay: float        # Slurm's delay to the next start
    startup: float      # the next start to "resuming from"
    first_step: float   # "resuming from" to the first new trace row
    redone: int         # steps trained again


def sweep_file(tasks: int, requeue: int, steps: int) -> str:
    return ("[job]\nname = \"rq\"\ntime = \"00:30:00\"\nranks_per_node = 1\n"
            f"requeue = {requeue}\n[train]\ndataset = \"digits\"\nhidden = [32]\nsteps = {steps}\n"
            f"interval = 4\ntrace_every = 8\ncheckpoint_every = {CHECKPOINT_EVERY}\nprogress = false\n"
            f"[sweep]\nranks = [2]\nseed = {list(range(tasks))}\n")


def make_study(where: Path, name: str, tasks: int, requeue: int, steps: int) -> Path:
    (where / "sweep.toml").write_text(sweep_file(tasks, requeue, steps))
    site = where / "site.sh"
    variables = {**MPICH_ON_THE_NETWORK, **OPEN_MPI_ON_THE_NETWORK, "PYTHONPATH": str(ROOT)}
    site.write_text("".join(f"export {k}={v}\n" for k, v in variables.items())
                    + "export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_osc=^ucx\n")
    study = where / name
    subprocess.run([sys.executable, "-m", "hpcopt", "sweep", str(where / "sweep.toml"), "--out", str(study),
                    "--site", str(site)], check=True, capture_output=True, cwd=ROOT,
                   env=dict(os.environ, PYTHONPATH=str(ROOT)))
    return study


class Watch:
    """What a task's log and trace show, read as they grow."""

    def __init__(self, study: Path, index: int) -> None:
        self.index = index
        from hpcopt.study.layout import read_manifest

        self.log = study / "logs" / f"task-{index}.log"
        self.run = study / read_manifest(study)[index].run
        self.trace = self.run / "trace.h5"

    def text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.is_file() else ""

    def count(self, needle: str) -> int:
        return self.text().count(needle)

    def training(self) -> bool:
        return self.rows() > 0

    def rows(self) -> int:
        """Rows in the trace (its /rows length), -1 while it cannot be read."""
        import h5py

        try:
            with h5py.File(self.trace, "r", locking=False) as handle:
                return int(handle["rows"].shape[0])
        except (OSError, KeyError):
            return -1

    def last_step(self) -> int:
        import h5py

        try:
            with h5py.File(self.trace, "r", locking=False) as handle:
                rows = handle["rows"]
                return int(rows[rows.shape[0] - 1]["step"]) if rows.shape[0] else 0
        except (OSError, KeyError, IndexError, ValueError):
            return 0

    def newest_checkpoint(self) -> int:
        found = sorted((self.run / "checkpoints").glob("step-*.h5"))
        return int(found[-1].stem.split("-")[1]) if found else 0


def until(check, timeout: float, what: str) -> float:
    """Poll ``check`` until true; the moment it was (TimeoutError after ``timeout`` s)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return time.monotonic()
        time.sleep(POLL)
    raise TimeoutError(what)


def resumed(cluster: SlurmCluster, job: str, watch: Watch, attempt: int, stopped: float,
            natural: bool) -> tuple[float, float, float]:
    """After a stop: let the job start (at once, or after Slurm's own delay), and time it:
    (Slurm's delay, start-up, to the first step)."""
    resumes = watch.count("resuming from")
    until(lambda: "PENDING" in (cluster.states(job) or []), 180, "requeued")

    def started() -> bool:
        return watch.count(f"attempt {attempt} (Slurm job") > 0

    if not natural:
        cluster.start_now(job, started, 400)
    begun = until(started, 400, f"attempt {attempt}")
    ready = until(lambda: watch.count("resuming from") > resumes, 120, "resuming")
    rows = watch.rows()
    first = until(lambda: watch.rows() > rows, 120, "a new row")
    return begun - stopped, ready - begun, first - ready


def signal_job(cluster: SlurmCluster, how: list[str], job: str, timeout: float = 120) -> None:
    """``scancel HOW JOB``, again while the controller says "try again later" or does not answer."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            done = cluster.client(["scancel", *how, job], timeout=30, check=False)
            if done.returncode == 0:
                return
            why = done.stderr.strip()
        except subprocess.TimeoutExpired:
            why = "no answer in 30 s"
        if time.monotonic() > deadline:
            raise RuntimeError(f"scancel {' '.join(how)} {job}: {why}")
        print(f"  scancel {' '.join(how)} {job}: {why}; again", flush=True)
        time.sleep(2)


def stop_cycle(cluster: SlurmCluster, job: str, watch: Watch, attempt: int, how: list[str],
               natural: bool) -> Cycle:
    """Stop the task with ``scancel HOW``; it checkpoints, exits 143, requeues itself, resumes."""
    exits = watch.count("exit 143")
    signal_job(cluster, how, job)
    stopped = until(lambda: watch.count("exit 143") > exits, 120, "exit 143")
    delay, startup, first = resumed(cluster, job, watch, attempt, stopped, natural)
    kind = " ".join(how) + (" (Slurm's own delay)" if natural else "")
    return Cycle(watch.index, kind, delay, startup, first, 0)


def node_failure_cycle(cluster: SlurmCluster, job: str, watch: Watch, attempt: int) -> Cycle:
    """Kill every process of node 2; the job is requeued (by Slurm or the task), the node's
    slurmd restarted, and the task resumes from its newest checkpoint."""
    at_step, checkpoint = watch.last_step(), watch.newest_checkpoint()
    cluster.kill_node(2)
    killed = time.monotonic()
    until(lambda: "PENDING" in (cluster.states(job) or []), 180, "requeued after the node failure")
    cluster.start_slurmd(2)
    delay, startup, first = resumed(cluster, job, watch, attempt, killed, False)
    return Cycle(watch.index, "node failure", delay, startup, first, max(0, at_step - checkpoint))


def run_cycles(cluster: SlurmCluster, study: Path, tasks: int, cycles: int, failures: int, natural: int,
               rng: random.Random) -> list[Cycle]:
    """Submit the study's array and interrupt its tasks, one at a time, until ``cycles`` stops and
    ``failures`` node failures are done (spread over the tasks); then let it finish."""
    plan = ["node failure"] * failures + ["signal"] * cycles
    rng.shuffle(plan)
    done: list[Cycle] = []
    signals = 0
    for index in range(tasks):  # one task at a time: the array script, for index i alone
        job_id = cluster.sbatch("array-n2.sh", f"--array={index}", cwd=study)
        watch, job = Watch(study, index), f"{job_id}_{index}"
        until(watch.training, 300, f"task {index} training")
        for attempt, kind in enumerate(plan[index::tasks], start=2):
            time.sleep(rng.uniform(1, 5))
            if kind == "signal":
                done.append(stop_cycle(cluster, job, watch, attempt, SIGNALS[signals % len(SIGNALS)],
                                       signals < natural))
                signals += 1
            else:
                done.append(node_failure_cycle(cluster, job, watch, attempt))
            c = done[-1]
            print(f"  cycle {len(done)}: task {index}, {c.kind}: Slurm {c.delay:.1f} s, start-up "
                  f"{c.startup:.1f} s, first step {c.first_step:.1f} s, redone {c.redone} steps", flush=True)
        cluster.wait_gone(job_id, 1800)
    return done


def same_run(run: Path, twin: Path) -> bool:
    """Whether two finished runs are bitwise the same (final checkpoint and trace, not the wall clock)."""
    from hpcopt.io.data_parallel_checkpoint import read_checkpoint
    from hpcopt.io.trace import read_trace

    a, b = read_checkpoint(run), read_checkpoint(twin)
    pairs = ((a.model, b.model), (a.sampler, b.sampler))
    if a.tick != b.tick or any(x.tobytes() != y.tobytes() for x, y in pairs):
        return False
    if sorted(a.rows) != sorted(b.rows) or any(a.rows[k].tobytes() != b.rows[k].tobytes() for k in a.rows):
        return False
    ta, tb = read_trace(run / "trace.h5"), read_trace(twin / "trace.h5")
    return ta.rows == tb.rows and ta.summary is not None and all(
        np.array_equal(ta.columns[k], c, equal_nan=True) for k, c in tb.columns.items() if k != "wall")


def median(values: list[float]) -> str:
    return f"{statistics.median(values):.1f}" if values else "-"


def page(cycles: list[Cycle], same: list[bool], tasks: int, steps: int, seconds: float, library: str) -> str:
    signal_cycles = [c for c in cycles if c.kind != "node failure"]
    quick = [c for c in signal_cycles if "own delay" not in c.kind]
    natural = [c for c in signal_cycles if "own delay" in c.kind]
    failures = [c for c in cycles if c.kind == "node failure"]
    lines = [
        "# Preemption and requeue under a real Slurm",
        "",
        f"Written by `python -m benchmarks.cluster.requeue` ({seconds / 60:.0f} minutes): a real Slurm "
        "22.05 of 2 namespaced nodes (benchmarks/cluster/slurm.py, `MpiDefault=none`) on one "
        f"{os.cpu_count()}-core machine ({platform.machine()}), {library}, load average "
        f"{os.getloadavg()[0]:.1f} at the end. One study of {tasks} tasks from the project's own "
        f"array script: the digits MLP (64-32-10) with PR-SGD on 2 ranks (one per node), {steps} "
        f"steps, a checkpoint every {CHECKPOINT_EVERY}, the tasks one at a time (the array "
        "script submitted for one index at a time: `sbatch --array=i`). Each task was "
        "stopped at random moments (1-5 s into each attempt) by `scancel` with a stop signal "
        "(TERM to the ranks, USR1 to every process, USR1 to the batch shell only, in turn): it "
        "checkpointed, exited 143 and requeued itself; or its second node was killed (every "
        "process of it) and Slurm requeued the job. Every finished run was compared with its "
        "uninterrupted twin (the same study, never stopped).",
        "",
        "## Bit for bit",
        "",
        f"**{sum(same)} of {len(same)} runs** ended bitwise equal to their uninterrupted twins (final "
        "checkpoint's model, sampler and optimizer rows; every trace column but the wall clock), "
        f"after {len(signal_cycles)} stop-and-requeue cycles and {len(failures)} node failures in all.",
        "",
        "## Time lost per cycle (medians, seconds)",
        "",
        "| cycles | n | Slurm's delay | start-up (to 'resuming from') | to the first step | steps redone |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for label, group in (("stop signal, then `StartTime=now`", quick),
                         ("stop signal, Slurm's own requeue delay", natural),
                         ("node failure (killed), slurmd restarted once the job was requeued", failures)):
        if group:
            lines.append(f"| {label} | {len(group)} | {median([c.delay for c in group])} | "
                         f"{median([c.startup for c in group])} | {median([c.first_step for c in group])} | "
                         f"{median([float(c.redone) for c in group])} |")
    lines += [
        "",
        "Slurm's delay is from the attempt's exit (its log's `exit 143`) to the next attempt's "
        "first line, or for a node failure from the kill; it includes this script's polling (0.1 s) "
        "and, with `StartTime=now`, the 3 s the fixture leaves a requeued job pending first "
        "(`REQUEUE_SETTLE_SECONDS`: a start in the second of the requeue meets its revoked "
        "credential and fails the job) and Slurm's scheduling pass (`sched_interval=2`). Left alone, "
        "Slurm 22.05 holds a requeued job about 121 s before it may start. A node failure is seen "
        "only when Slurm declares the node down (`SlurmdTimeout=10` here; often 300 s on real "
        "clusters), and the steps since the newest checkpoint are trained again (counted from the "
        "trace's last row on disk at the kill, which rank 0 flushes every 64 rows, every 10 s and "
        "at each checkpoint: a lower bound, at most the checkpoint interval); a stop signal "
        "checkpoints where it stops, so it redoes none. Start-up is Python and MPI starting on "
        "both nodes, the checkpoint read first by a child process (its digest checked), then by "
        "each rank.",
        "",
        "## Every cycle",
        "",
        "| # | task | how | Slurm's delay | start-up | first step | steps redone |",
        "|---:|---:|---|---:|---:|---:|---:|",
        *(f"| {i + 1} | {c.task} | {c.kind} | {c.delay:.1f} | {c.startup:.1f} | {c.first_step:.1f} | "
          f"{c.redone} |" for i, c in enumerate(cycles)),
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cycles", type=int, default=20, help="stop-and-requeue cycles in all")
    parser.add_argument("--node-failures", type=int, default=2)
    parser.add_argument("--natural", type=int, default=1, help="cycles that wait Slurm's own requeue delay")
    parser.add_argument("--tasks", type=int, default=4)
    parser.add_argument("--steps", type=int, default=60000, help="each run's steps")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="docs/results/slurm.md")
    args = parser.parse_args(argv)
    reason = slurm_unavailable()
    if reason:
        print(f"no Slurm cluster: {reason}", file=sys.stderr)
        return 2
    from hpcopt.comm.mpi_support import mpi_library

    rng = random.Random(args.seed)
    start = time.monotonic()
    where = Path(tempfile.mkdtemp(prefix="hpcopt-requeue-"))
    try:
        with SlurmCluster(2) as cluster:
            requeues = (args.cycles + args.node_failures) // args.tasks + 2
            twins = make_study(where, "twins", args.tasks, requeues, args.steps)
            study = make_study(where, "study", args.tasks, requeues, args.steps)
            print(f"twins: {args.tasks} uninterrupted runs", flush=True)
            cluster.wait_gone(cluster.sbatch("array-n2.sh", cwd=twins), 3600)
            print(f"study: {args.cycles} stop cycles, {args.node_failures} node failures", flush=True)
            cycles = run_cycles(cluster, study, args.tasks, args.cycles, args.node_failures, args.natural,
                                rng)
            same = [same_run(Watch(study, i).run, Watch(twins, i).run) for i in range(args.tasks)]
            records = [json.loads((study / "logs" / f"task-{i}.json").read_text()) for i in range(args.tasks)]
            assert all(r.get("exit_code") == 0 for r in records), records
    except BaseException:
        print(f"the studies are kept in {where}", file=sys.stderr)
        raise
    text = page(cycles, same, args.tasks, args.steps, time.monotonic() - start, mpi_library())
    Path(args.out).write_text(text)
    print(text)
    shutil.rmtree(where, ignore_errors=True)
    return 0 if all(same) else 1


if __name__ == "__main__":
    sys.exit(main())
