"""Whether hpcopt keeps its promises to batch users, measured from outside: the table of
docs/results/reliability.md's "Signals, kills and crafted files". Launches real ``mpiexec`` jobs
(PR-SGD, MLP 64-16-10 on digits) from the repository root::

    python benchmarks/faults/trust_times.py [--ranks 2 4] [--kills 7] [--parts signals ctrl-c start ...]

For each case: the exit code, the seconds from the event (the signal sent, the fault's
announcement, or the launch for a crafted file) to the end of the job, and what was lost:

- signals: SIGTERM to one rank in its step 20 (``--debug-fail-at R:20:sigterm``) for every
  ``--checkpoint-every`` in {0, 1, 2, 4, 8, 16} and ``--trace-every`` in {1, 2, 4, 8, 16}, and
  SIGTERM to the launcher 0.5 s into training: the tick the run stopped at, how many trace rows
  after the signal (the promise: at most 2), and whether the newest checkpoint is that tick;
- Ctrl-C: SIGINT to the launcher, to one rank, in a checkpoint's write, with no trace row
  within reach, and a second one to a rank as the job ends (the promise: exit 130 within 5 s,
  never 0);
- start-up: SIGTERM and SIGINT to one rank as it starts importing hpcopt's signal handling,
  numpy and mpi4py (MPI_Init), and SIGTERM at fixed delays after its exec, while Python itself
  starts (the promise: 143 or 130 and one line from hpcopt's first line on);
- sweep: SIGINT and SIGTERM to ``sweep --local -j 2`` while two of four tasks train (the
  promise: no task starts after it, exit 130 or 143, no process left), a sweep value with a
  line separator (U+2028) and a [job] value beyond any machine (exit 2, one line);
- kill -9 of a random rank at a random moment: the steps to redo from the newest checkpoint,
  and whether its resume ends bitwise where the uninterrupted run ends; and an MPI call failing
  as it fails on a rank whose peer has died (one line, not MPI's error stack);
- crafted files (tests/crafted.py): a checkpoint naming a module, one pointing at another run,
  links, FIFOs, virtual and external datasets, filters, declared sizes far beyond the file:
  exit 2 in seconds, no module they name imported, and no file of another run touched;
- a write failing in the middle of a checkpoint (a full disk): one line, exit 2, what is left
  on disk, and whether the resume ends bitwise;
- planted files (``--parts planted``): a FIFO among a live run's checkpoints (then SIGTERM), at
  the lock or the trace of ``train`` and ``resume``, at a task's record for ``collect``; the
  record linked to ``/dev/zero``; a trace declaring 7 GB in a 2 GB sparse file (``collect``'s
  peak memory, its vetting child included); no room to write at start; links planted at
  ``collect``'s and ``export``'s outputs, and ``export ..``: exit, lines, whether a file
  outside the run or ``--out`` changed.
"""

from __future__ import annotations

import argparse
import hashlib
import math
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from hpcopt.io.data_parallel_checkpoint import read_checkpoint  # noqa: E402
from tests import crafted  # noqa: E402
from tests.faults.jobs import INJECTED, ROOT, SMALL, Send, assert_same_run, run_job  # noqa: E402
from tests.faults.test_failures import MPI_FAILURE  # noqa: E402
from tests.faults.test_signals import SIGNAL_AT_IMPORT  # noqa: E402
from tests.faults.test_study import interrupt_local_sweep  # noqa: E402

CHECKPOINT_EVERY = (0, 1, 2, 4, 8, 16)
TRACE_EVERY = (1, 2, 4, 8, 16)
SIGNAL_STEP, STEPS = 20, 64
#: Long enough (a few seconds) for a kill at a random moment to land in training.
KILL_STEPS = 2000
HEADER = ("case", "ranks", "exit", "s to end", "outcome")
#: The run header, which a signal sent "after the header" waits for (SMALL turns progress off).
HEADER_SHOWN = ("--progress", "true")


def small(out: Path, *flags: str, steps: int = STEPS) -> list[str]:
    return ["train", *SMALL, "--steps", str(steps), "--out", str(out), *flags]


def newest_tick(out: Path) -> int | None:
    try:
        return read_checkpoint(out).tick
    except Exception:  # noqa: BLE001 - no checkpoint, or none readable: reported as such
        return None


def seconds(job) -> str:
    value = job.after_fault if job.after_fault is not None else job.seconds
    return f"{value:.2f}"


def signal_cases(ranks: int, work: Path) -> list[tuple[str, ...]]:
    rows = []
    for ce in CHECKPOINT_EVERY:
        for te in TRACE_EVERY:
            out = work / f"sig-{ranks}-{ce}-{te}"
            job = run_job(small(out, "--checkpoint-every", str(ce), "--trace-every", str(te),
                                "--debug-fail-at", f"{ranks - 1}:{SIGNAL_STEP}:sigterm"), ranks=ranks)
            tick = newest_tick(out)
            # the flag rides on the first row at or after the signal's step; finished one row on
            after = math.ceil((tick - SIGNAL_STEP + 1) / te) if tick is not None else None
            outcome = (f"stopped at tick {tick}, {after} row(s) after the signal, checkpoint there"
                       if tick is not None else "no checkpoint")
            rows.append((f"SIGTERM to rank {ranks - 1} in step {SIGNAL_STEP}, ce {ce}, te {te}",
                         str(ranks), str(job.returncode), seconds(job), outcome))
    out = work / f"sig-{ranks}-launcher"
    job = run_job(small(out, "--checkpoint-every", "8", "--trace-every", "8", *HEADER_SHOWN, steps=100_000),
                  ranks=ranks, send=Send(signal.SIGTERM, after=0.5))
    rows.append(("SIGTERM to mpiexec 0.5 s into training, ce 8, te 8", str(ranks),
                 str(job.returncode), seconds(job), f"stopped at tick {newest_tick(out)}, checkpoint there"))
    return rows


def ctrl_c_cases(ranks: int, work: Path) -> list[tuple[str, ...]]:
    cases: list[tuple[str, list[str], Send | None, int]] = [
        ("SIGINT to mpiexec in training, ce 8, te 8", [], Send(signal.SIGINT, after=0.5), 100_000),
        (f"SIGINT to rank {ranks - 1} in training, ce 1, te 4", ["--checkpoint-every", "1"],
         Send(signal.SIGINT, after=0.5, rank=ranks - 1), 100_000),
        ("SIGINT to rank 0 in the write of checkpoint 16", ["--debug-fail-at", "0:16:checkpoint-sigint"],
         None, STEPS),
        ("SIGINT to mpiexec, no trace row within reach", ["--checkpoint-every", "0", "--trace-every",
                                                          "100000000"], Send(signal.SIGINT, after=0.5),
         100_000),
        ("SIGINT to rank 0 in training, again after its stop's line", ["--checkpoint-every", "4"],
         Send(signal.SIGINT, after=0.5, rank=0, again_at="hpcopt: SIGINT: stopped"), 100_000),
    ]
    rows = []
    for i, (name, flags, send, steps) in enumerate(cases):
        out = work / f"int-{ranks}-{i}"
        job = run_job(small(out, *flags, *HEADER_SHOWN, steps=steps), ranks=ranks, send=send)
        tick = newest_tick(out)
        rows.append((name, str(ranks), str(job.returncode), seconds(job),
                     f"newest checkpoint {tick}; {len(job.hpcopt_lines())} hpcopt line(s)"))
    return rows


def outcome_lines(job) -> str:
    return (f"{len(job.hpcopt_lines())} hpcopt line(s); traceback: "
            f"{'yes' if 'Traceback' in job.stdout + job.stderr else 'no'}")


def start_cases(ranks: int, work: Path) -> list[tuple[str, ...]]:
    rows = []
    rank = ranks - 1
    for module in ("hpcopt.run.signals", "numpy", "mpi4py.MPI"):
        for signum in (signal.SIGTERM, signal.SIGINT):
            name = signal.Signals(signum).name
            hook = work / f"hook-{ranks}-{module}-{name}"
            hook.mkdir()
            (hook / "sitecustomize.py").write_text(SIGNAL_AT_IMPORT.format(
                module=module, rank=rank, signum=int(signum), marker=INJECTED, pause=0))
            job = run_job(small(work / f"start-{ranks}-{module}-{name}", steps=100_000), ranks=ranks,
                          path=(hook,))
            rows.append((f"{name} to rank {rank} as it starts importing {module}", str(ranks),
                         str(job.returncode), seconds(job), outcome_lines(job)))
    for after in (0.0, 0.05, 0.1, 0.2):
        job = run_job(small(work / f"exec-{ranks}-{after}", steps=100_000), ranks=ranks,
                      send=Send(signal.SIGTERM, after=after, rank=rank, when="exec"))
        rows.append((f"SIGTERM to rank {rank} {after:.2f} s after its exec", str(ranks),
                     str(job.returncode), seconds(job), outcome_lines(job)))
    return rows


def sweep_cases(ranks: int, work: Path) -> list[tuple[str, ...]]:
    """``sweep --local`` signalled (its tasks run on 2 ranks whatever ``ranks``), and sweep
    files it refuses."""
    rows = []
    for signum in (signal.SIGINT, signal.SIGTERM):
        name = signal.Signals(signum).name
        (work / f"sweep-{ranks}-{name}").mkdir()
        run = interrupt_local_sweep(work / f"sweep-{ranks}-{name}", signum)
        started = sum(f"task {i} started" in run.output for i in range(4))
        rows.append((f"{name} to sweep --local -j 2 while 2 of 4 tasks train", "2", str(run.returncode),
                     f"{run.seconds:.2f}", f"{started} task(s) started; {len(run.left)} of {run.started} "
                     "process(es) left running"))
    refused = {"a sweep value with U+2028": '[sweep]\npath = ["a\u2028b", "c"]\n',
               "[job] ranks_per_node = 1000000000": "[job]\nranks_per_node = 1000000000\n"}
    for name, text in refused.items():
        spec = work / f"refused-{ranks}-{len(rows)}.toml"
        spec.write_text(text)
        done = subprocess.run([sys.executable, "-m", "hpcopt", "sweep", str(spec), "--out",
                               str(work / "refused")], capture_output=True, text=True)
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        rows.append((name, "-", str(done.returncode), "-", f"{len(lines)} stderr line(s); study written: "
                     f"{'yes' if (work / 'refused').exists() else 'no'}"))
    return rows


def kill_cases(ranks: int, kills: int, work: Path, rng: random.Random) -> list[tuple[str, ...]]:
    reference = work / f"kill-{ranks}-reference"
    run_job(small(reference, steps=KILL_STEPS), ranks=ranks)
    rows = []
    for i in range(kills):
        out, rank, after = work / f"kill-{ranks}-{i}", rng.randrange(ranks), rng.uniform(0.0, 2.0)
        killed = run_job(small(out, steps=KILL_STEPS), ranks=ranks,
                         send=Send(signal.SIGKILL, after=after, rank=rank, when="start"))
        tick = newest_tick(out)
        if tick is None:  # killed before the first checkpoint: the directory is reused from scratch
            resumed = run_job(small(out, steps=KILL_STEPS), ranks=ranks)
        else:
            resumed = run_job(["resume", str(out), "--progress", "false"], ranks=ranks)
        try:
            assert_same_run(out, reference)
            same = "resumed bitwise" if resumed.returncode == 0 else f"resume exit {resumed.returncode}"
        except AssertionError:
            same = "resumed, NOT bitwise"
        rows.append((f"kill -9 of rank {rank} {after:.2f} s after start", str(ranks),
                     str(killed.returncode), seconds(killed),
                     f"newest checkpoint {tick}; {same}"))
    failed = run_job([], ranks=ranks, python_code=MPI_FAILURE.format(
        args=[*SMALL, "--steps", str(STEPS)], out=str(work / f"mpi-failure-{ranks}")))
    rows.append(("an MPI call failing on rank 1 in step 20, as after a peer's kill -9", str(ranks),
                 str(failed.returncode), seconds(failed), outcome_lines(failed)))
    return rows


def _digests(directory: Path) -> dict[str, str]:
    return {str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(directory.rglob("*")) if p.is_file() and p.name != "hpcopt.lock"}


def file_cases(ranks: int, work: Path) -> list[tuple[str, ...]]:
    victim, source = work / "victim", work / "source"
    run_job(small(victim, "--checkpoint-every", "8"), ranks=ranks)
    run_job(small(source, "--checkpoint-every", "8"), ranks=ranks)
    newest = source / "checkpoints" / "step-000000064.h5"
    evidence = work / "evidence_module.py"
    evidence.write_text("import pathlib\npathlib.Path(__file__).with_suffix('.imported').touch()\n"
                        "def build():\n    raise SystemExit('imported')\n")
    cases: list[tuple[str, Callable[[], list[str]]]] = [
        ("checkpoint naming a module (torch:evidence_module:build)", lambda: [
            "resume", str(crafted.checkpoint_naming_a_module(
                newest, work / "named" / "checkpoints" / newest.name, "torch:evidence_module:build"))]),
        ("loose copy whose stored out is another run", lambda: [
            "resume", str(crafted.checkpoint_with_foreign_out(newest, work / "loose.h5", victim))]),
        ("another run's checkpoint planted in a run directory", lambda: [
            "resume", str(_plant(newest, victim)), "--steps", "80"]),
        ("--out with a newline", lambda: small(work / "new\nline")),
    ]
    rows = []
    for name, prepare in cases:
        command = prepare()
        before = _digests(victim)
        job = run_job(command, ranks=ranks, path=(work,))  # evidence_module is importable
        touched = _digests(victim) != before
        imported = (work / "evidence_module.imported").exists()
        lines = [line for line in job.stderr.splitlines() if line.strip()]
        rows.append((name, str(ranks), str(job.returncode), f"{job.seconds:.2f}",
                     f"{len(lines)} stderr line(s); another run touched: {'yes' if touched else 'no'}; "
                     f"module imported: {'yes' if imported else 'no'}"))
    return rows


#: What a checkpoint or trace must not hold (tests/crafted.py), applied to a copy of a finished
#: run's newest checkpoint (or its trace), which ``resume`` then meets.
HOSTILE: dict[str, tuple[str, Callable[[Path, Path], Path]]] = {
    "soft link at /model/flat": ("checkpoint", lambda f, _: crafted.soft_link(f, "model/flat")),
    "external link at /model/flat": ("checkpoint", lambda f, other: crafted.external_link(
        f, "model/flat", other / "trace.h5")),
    "/model/flat linked to a FIFO": ("checkpoint", lambda f, _: crafted.fifo_link(f, "model/flat")),
    "virtual dataset with a missing source": ("checkpoint", lambda f, _: crafted.virtual_dataset(
        f, "model/flat")),
    "external raw storage": ("checkpoint", lambda f, _: crafted.external_storage(f, "model/flat")),
    "gzip filter": ("checkpoint", lambda f, _: crafted.gzip_filter(f, "model/flat")),
    "one dataset linked twice": ("checkpoint", lambda f, _: crafted.linked_twice(f, "model/flat", "alias")),
    "a 1 GiB model declared in a small file": ("checkpoint", lambda f, _: crafted.huge_model(f, 1 << 28)),
    "a trace declaring 64 M rows": ("trace", lambda f, _: crafted.huge_trace(f, 1 << 26)),
    "a trace whose /rows links to another run's": ("trace", lambda f, other: crafted.external_link(
        f, "rows", other / "trace.h5")),
    "a trace with contiguous /comm datasets": ("trace", lambda f, _: crafted.contiguous_comm(f)),
}


def hostile_cases(ranks: int, work: Path) -> list[tuple[str, ...]]:
    source, other = work / "hostile-source", work / "hostile-other"
    for run in (source, other):
        run_job(small(run, "--checkpoint-every", "8"), ranks=ranks)
    rows = []
    for i, (name, (kind, make)) in enumerate(HOSTILE.items()):
        run = work / f"hostile-{ranks}-{i}"
        shutil.copytree(source, run)
        make(run / "checkpoints" / "step-000000064.h5" if kind == "checkpoint" else run / "trace.h5", other)
        before = _digests(other)
        job = run_job(["resume", str(run), "--steps", "80"], ranks=ranks)
        lines = [line for line in job.stderr.splitlines() if line.strip()]
        rows.append((f"{kind}: {name}", str(ranks), str(job.returncode), f"{job.seconds:.2f}",
                     f"{len(lines)} stderr line(s); another run touched: "
                     f"{'yes' if _digests(other) != before else 'no'}"))
    return rows


def disk_cases(ranks: int, work: Path) -> list[tuple[str, ...]]:
    """A write failing in the middle of checkpoint 16 (a file size limit: EFBIG, as ENOSPC)."""
    from tests.faults.test_full_disk import FILE_SIZE_LIMIT, LARGE, LIMITED_RESUME

    out, reference = work / f"disk-{ranks}", work / f"disk-{ranks}-reference"
    job = run_job([], ranks=ranks, python_code=LIMITED_RESUME.format(
        args=LARGE, out=str(out), limit=FILE_SIZE_LIMIT, marker=INJECTED))
    left = sorted(p.name for p in (out / "checkpoints").iterdir())
    resumed = run_job(["resume", str(out), "--steps", "16"], ranks=ranks)
    run_job(["train", *LARGE, "--steps", "16", "--out", str(reference)], ranks=ranks)
    try:
        assert_same_run(out, reference)
        same = "resumed bitwise" if resumed.returncode == 0 else f"resume exit {resumed.returncode}"
    except AssertionError:
        same = "resumed, NOT bitwise"
    return [("a write failing mid checkpoint 16 (file size limit, EFBIG)", str(ranks),
             str(job.returncode), seconds(job), f"left {', '.join(left)}; {same}")]


#: ``train`` with no room to write: a file size limit of 0 bytes (EFBIG, as a full disk's ENOSPC).
NO_ROOM = """
import resource, signal, sys
from hpcopt.cli import main
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))
sys.exit(main(["train", *{args!r}, "--steps", "8", "--out", {out!r}]))
"""
#: A trace declaring 7 GB of rows in a sparse file of 2 GB (a few kB on disk).
SPARSE_ROWS, SPARSE_BYTES = 50_000_000, 2 << 30


def _cli(args: list[str], cwd: Path = ROOT, timeout: float = 120.0) -> tuple[int, float, str, float]:
    """``python -m hpcopt ARGS`` without MPI (collect, export): (exit, seconds, stderr, peak MB of
    it and the children it waited for), SIGKILLed past ``timeout`` (exit -9: a hang)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    start = time.monotonic()
    process = subprocess.Popen([sys.executable, "-m", "hpcopt", *args], cwd=cwd, env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                               start_new_session=True)
    killer = threading.Timer(timeout, os.killpg, (process.pid, signal.SIGKILL))
    killer.start()
    assert process.stderr is not None
    err = process.stderr.read()
    _, status, usage = os.wait4(process.pid, 0)
    killer.cancel()
    process.returncode = os.waitstatus_to_exitcode(status)  # reaped here: Popen must not wait
    return process.returncode, time.monotonic() - start, err, usage.ru_maxrss / 1024


def _lines(text: str) -> int:
    return len([line for line in text.splitlines() if line.strip()])


def planted_cases(ranks: int, work: Path) -> list[tuple[str, ...]]:
    """Files planted where hpcopt expects its own: each case's exit, seconds and what it did."""
    from hpcopt.study.layout import COLUMNS, LOGS, MANIFEST

    rows: list[tuple[str, ...]] = []
    precious = work / "precious"
    precious.mkdir()
    (precious / "notes.txt").write_text("keep me\n")
    before = _digests(precious)

    def touched() -> str:
        return "yes" if _digests(precious) != before else "no"

    def fresh(name: str, steps: int = 8) -> Path:
        out = work / f"planted-{ranks}-{name}"
        run_job(small(out, "--checkpoint-every", "8", steps=steps), ranks=ranks)
        return out

    live = fresh("live")
    fifo = live / "checkpoints" / "step-000000001.h5"
    os.mkfifo(fifo)
    job = run_job(["resume", str(live), "--steps", "100000", *HEADER_SHOWN], ranks=ranks,
                  send=Send(signal.SIGTERM, after=1.0))
    rows.append(("FIFO at RUN/checkpoints/step-000000001.h5 of a live run, then SIGTERM to mpiexec",
                  str(ranks), str(job.returncode), seconds(job),
                  f"stopped at tick {newest_tick(live)}, checkpoint there; FIFO left: "
                  f"{'yes' if fifo.exists() else 'no'}"))
    for planted, command in (("hpcopt.lock", "train"), ("trace.h5", "train"), ("trace.h5", "resume")):
        out = fresh(f"{planted}-old") if command == "resume" else work / f"planted-{ranks}-{planted}-new"
        out.mkdir(exist_ok=True)
        (out / planted).unlink(missing_ok=True)
        os.mkfifo(out / planted)
        args = ["resume", str(out), "--steps", "16"] if command == "resume" else small(out, steps=8)
        job = run_job(args, ranks=ranks)
        rows.append((f"FIFO at OUT/{planted}, {command}", str(ranks), str(job.returncode), seconds(job),
                     f"{_lines(job.stderr)} stderr line(s)"))
    out = work / f"planted-{ranks}-no-room"
    job = run_job([], ranks=ranks, python_code=NO_ROOM.format(args=SMALL, out=str(out)))
    rows.append(("no room to write at start (file size limit 0), train", str(ranks), str(job.returncode),
                 seconds(job), f"{_lines(job.stderr)} stderr line(s); lock left: "
                 f"{'yes' if (out / 'hpcopt.lock').exists() else 'no'}"))

    study = work / f"planted-{ranks}-study"
    (study / LOGS).mkdir(parents=True)
    (study / MANIFEST).write_text("\t".join(COLUMNS) + f"\n0\truns/t0\t{ranks}\t--dataset digits\n")
    record = study / LOGS / "task-0.json"
    for name, plant in (("FIFO at STUDY/logs/task-0.json", lambda: os.mkfifo(record)),
                        ("STUDY/logs/task-0.json linked to /dev/zero",
                         lambda: record.symlink_to("/dev/zero"))):
        record.unlink(missing_ok=True)
        plant()
        code, took, err, _ = _cli(["collect", str(study)])
        rows.append((f"{name}, collect", "-", str(code), f"{took:.2f}", f"{_lines(err)} stderr line(s)"))
    record.unlink()

    sparse = fresh("sparse")
    crafted.huge_trace(sparse / "trace.h5", SPARSE_ROWS)
    os.truncate(sparse / "trace.h5", SPARSE_BYTES)
    code, took, err, peak = _cli(["collect", str(sparse), "--out", str(work / "sparse-out")])
    table = work / "sparse-out" / "study.csv"
    refused = table.is_file() and "of data but the file holds" in table.read_text()
    rows.append(("a trace declaring 7 GB in a 2 GB sparse file, collect", "-", str(code), f"{took:.2f}",
                 f"{_lines(err)} stderr line(s); trace {'refused in its row' if refused else 'READ'}; "
                 f"peak RSS {peak:,.0f} MB"))

    finished = fresh("finished")
    out = work / "collect-out"
    out.mkdir()
    (out / "study.csv").symlink_to(precious / "notes.txt")
    code, took, err, _ = _cli(["collect", str(finished), "--out", str(out)])
    rows.append(("STUDY/study.csv linked to a file elsewhere, collect", "-", str(code), f"{took:.2f}",
                 f"{_lines(err)} stderr line(s); file elsewhere touched: {touched()}"))
    export = work / "export"
    export.mkdir()
    code, took, err, _ = _cli(["export", "..", "--format", "csv", "--out", str(export / "xo")],
                              cwd=finished / "checkpoints")
    beside = sorted(p.name for p in export.iterdir() if p.name != "xo")
    rows.append(("export .. --format csv --out xo (from RUN/checkpoints)", "-", str(code), f"{took:.2f}",
                 f"{_lines(err)} stderr line(s); files written beside --out: {len(beside)}"))
    link = export / "xo" / finished.name / "rows.csv"
    link.unlink()
    link.symlink_to(precious / "notes.txt")
    code, took, err, _ = _cli(["export", str(finished), "--format", "csv", "--out", str(export / "xo")])
    rows.append(("xo/RUN/rows.csv linked to a file elsewhere, export", "-", str(code), f"{took:.2f}",
                 f"{_lines(err)} stderr line(s); file elsewhere touched: {touched()}"))
    return rows


def _plant(checkpoint: Path, run: Path) -> Path:
    """A copy of another run's ``checkpoint`` in ``run``'s checkpoints, as its newest; ``run``."""
    shutil.copyfile(checkpoint, run / "checkpoints" / "step-000000072.h5")
    return run


PARTS = {"signals": signal_cases, "ctrl-c": ctrl_c_cases, "start": start_cases, "sweep": sweep_cases,
         "files": file_cases, "hostile": hostile_cases, "disk": disk_cases, "planted": planted_cases}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[2])
    parser.add_argument("--kills", type=int, default=7, help="random kill -9 cases per rank count")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--parts", nargs="+", default=[*PARTS, "kill"], choices=[*PARTS, "kill"])
    args = parser.parse_args()
    rng = random.Random(args.seed)
    print("| " + " | ".join(HEADER) + " |\n|" + "---|" * len(HEADER), flush=True)
    with tempfile.TemporaryDirectory() as directory:
        work = Path(directory)
        for ranks in args.ranks:
            for part in args.parts:
                rows = (kill_cases(ranks, args.kills, work, rng) if part == "kill"
                        else PARTS[part](ranks, work))
                for row in rows:
                    print("| " + " | ".join(row) + " |", flush=True)

if __name__ == "__main__":
    main()
