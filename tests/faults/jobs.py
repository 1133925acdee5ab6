"""Launching real ``mpiexec`` jobs with a hard timeout, timing how fast a failure ends them."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tests.command_line import ROOT
from tests.launcher import RANK_VARIABLES
from tests.timeouts import scaled

#: A small PR-SGD job: 2 ranks x 32 steps of an MLP on digits, checkpoints every 8 ticks.
SMALL = ["--dataset", "digits", "--hidden", "16", "--interval", "4", "--trace-every", "4",
         "--checkpoint-every", "8", "--keep-checkpoints", "10", "--progress", "false"]
STEPS = 32
#: Hard limit on any one job: a test that would hang fails instead.
HARD_TIMEOUT = scaled(60)
INJECTED = "hpcopt: debug: injecting"


@dataclass
class Job:
    returncode: int
    stdout: str
    stderr: str
    seconds: float                       # launch to exit
    after_fault: float | None = None     # the fault's announcement (or the signal sent) to exit

    def describe(self) -> str:
        return f"exit {self.returncode}\n--- stdout\n{self.stdout}\n--- stderr\n{self.stderr}"

    def hpcopt_lines(self) -> list[str]:
        """The lines hpcopt printed about the job's end (not progress, not debug faults)."""
        return [line for line in (self.stdout + self.stderr).splitlines()
                if line.startswith("hpcopt: ") and not line.startswith("hpcopt: debug:")]


@dataclass(frozen=True)
class Send:
    """A signal for a running job: ``signum`` to the launcher (``rank`` None) or to one rank's
    process, ``after`` seconds after ``when``: "launch" (the launcher started), "start" (every
    rank's hpcopt handles signals: its handlers are installed, ``hpcopt.run.signals``), "exec"
    (every rank's process runs Python, which may not have reached hpcopt yet), "header" (the
    run header appeared: training starts) or "fault" (a debug fault announced itself)."""

    signum: int
    after: float = 0.0
    rank: int | None = None
    when: str = "header"
    again_at: str = ""  # sent once more, to the same process, when a line starts with this


def _deliver(send: Send, process: subprocess.Popen, pids: dict[int, int]) -> None:
    if send.rank is None:
        process.send_signal(send.signum)  # the launcher forwards it to every rank
    else:
        with contextlib.suppress(ProcessLookupError):  # the rank has just ended by itself
            os.kill(pids[send.rank], send.signum)


def run_job(args: list[str], ranks: int = 2, python_code: str | None = None,
            send: Send | None = None, timeout: float = HARD_TIMEOUT, path: tuple[Path, ...] = (),
            launcher: tuple[str, ...] = (), mpiexec_args: tuple[str, ...] = ()) -> Job:
    """``mpiexec -n ranks python -m hpcopt ARGS`` (or ``python -c CODE``) from the repository
    (and ``path`` on the module path), sending ``send`` while it runs. ``launcher``: a command
    that runs the ``mpiexec`` command line given as its arguments (e.g. in a file system of its
    own); ``mpiexec_args``: options of ``mpiexec`` itself. The launcher runs in its own
    session; past ``timeout`` the whole session is SIGKILLed and the test fails, so no job can
    hang the suite."""
    command = [*launcher, "mpiexec", *mpiexec_args, "-n", str(ranks), sys.executable]
    command += ["-c", python_code] if python_code else ["-m", "hpcopt", *args]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(map(str, (ROOT, *path))),
               MPIEXEC_TIMEOUT=str(int(timeout) + 10))
    start = time.monotonic()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env=env, cwd=ROOT, start_new_session=True)
    out: list[str] = []
    err: list[str] = []
    marks: dict[str, float] = {}
    pids: dict[int, int] = {}

    def pump(stream, sink: list[str]) -> None:
        for line in stream:
            sink.append(line)
            if send and send.again_at and line.startswith(send.again_at) and "again" not in marks:
                marks["again"] = time.monotonic()
                _deliver(send, process, pids)
            if INJECTED in line:
                marks.setdefault("fault", time.monotonic())
            if line.startswith("run directory"):
                marks.setdefault("header", time.monotonic())

    readers = [threading.Thread(target=pump, args=(process.stdout, out), daemon=True),
               threading.Thread(target=pump, args=(process.stderr, err), daemon=True)]
    for reader in readers:
        reader.start()
    try:
        if send is not None:
            pids.update(_send(send, process, ranks, marks, start + timeout, err))
            marks["fault"] = time.monotonic()
            _deliver(send, process, pids)
        process.wait(timeout=max(1.0, timeout - (time.monotonic() - start)))
    except subprocess.TimeoutExpired:
        raise AssertionError(f"the job did not end within {timeout} s: {' '.join(command)}\n"
                             + "".join(err)) from None
    finally:
        if process.poll() is None:
            _kill_tree(process.pid)
            process.wait()
    end = time.monotonic()
    for reader in readers:
        reader.join(timeout=5)
    after = end - marks["fault"] if "fault" in marks else None
    return Job(process.returncode, "".join(out), "".join(err), end - start, after)


def _send(send: Send, process: subprocess.Popen, ranks: int, marks: dict[str, float],
          deadline: float, err: list[str]) -> dict[int, int]:
    """Wait until ``send`` is due; rank -> pid of the job's ranks."""
    pids: dict[int, int] = {}
    while True:
        assert process.poll() is None and time.monotonic() < deadline, "".join(err)
        pids = _rank_pids(process.pid)
        if send.when == "launch":
            due = True
        elif send.when == "start":
            due = len(pids) == ranks and all(map(_handles_sigterm, pids.values()))
        elif send.when == "exec":
            due = len(pids) == ranks
        else:
            due = send.when in marks
        if due:
            break
        time.sleep(0.01)
    time.sleep(send.after)
    return pids


def _rank_pids(launcher: int) -> dict[int, int]:
    """rank -> pid of the processes below ``launcher`` that the launcher told their rank
    (``PMI_RANK`` under MPICH, ``OMPI_COMM_WORLD_RANK`` under Open MPI)."""
    pids = {}
    for pid in _tree(launcher):
        try:
            environ = (Path("/proc") / str(pid) / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        announced = dict(entry.split(b"=", 1) for entry in environ if b"=" in entry)
        for name in RANK_VARIABLES:  # MPICH's Hydra, then Open MPI's PRRTE
            if announced.get(name, b"").isdigit():
                pids[int(announced[name])] = pid
                break
    return pids


def _handles_sigterm(pid: int) -> bool:
    """Whether process ``pid`` has a handler for SIGTERM (hpcopt's are installed)."""
    try:
        status = (Path("/proc") / str(pid) / "status").read_text()
    except OSError:
        return False
    caught = next(line for line in status.splitlines() if line.startswith("SigCgt:"))
    return bool(int(caught.split()[1], 16) >> (signal.SIGTERM - 1) & 1)


def _tree(pid: int) -> list[int]:
    """``pid`` and every process below it."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(parent, []).append(int(entry.name))
    tree, queue = [], [pid]
    while queue:
        current = queue.pop()
        tree.append(current)
        queue += children.get(current, [])
    return tree


def _kill_tree(pid: int) -> None:
    """SIGKILL ``pid`` and every process below it (the ranks run in sessions of their own)."""
    for member in _tree(pid):
        try:
            os.kill(member, signal.SIGKILL)
        except ProcessLookupError:
            pass


def assert_fault_ended_the_job(job: Job, code: int | None, message: str, seconds: float) -> None:
    """The job failed (with exit code ``code`` when given), said ``message``, and ended within
    ``seconds`` of the fault's announcement."""
    assert job.returncode != 0 and job.returncode == (code or job.returncode), job.describe()
    assert message in job.stderr + job.stdout, job.describe()
    assert job.after_fault is not None and job.after_fault < seconds, (job.after_fault, job.describe())


def assert_same_run(run_dir: Path, reference: Path) -> None:
    """The final checkpoints and the traces of two runs are bitwise the same (but wall time)."""
    from hpcopt.io.data_parallel_checkpoint import read_checkpoint
    from hpcopt.io.trace import read_trace

    ckpt, ref = read_checkpoint(run_dir), read_checkpoint(reference)
    assert ckpt.tick == ref.tick
    np.testing.assert_array_equal(ckpt.model, ref.model)
    assert sorted(ckpt.rows) == sorted(ref.rows)
    for name in ref.rows:
        np.testing.assert_array_equal(ckpt.rows[name], ref.rows[name])
    np.testing.assert_array_equal(ckpt.sampler, ref.sampler)
    trace, ref_trace = read_trace(run_dir / "trace.h5"), read_trace(reference / "trace.h5")
    assert trace.rows == ref_trace.rows
    for name, column in ref_trace.columns.items():
        if name != "wall":
            np.testing.assert_array_equal(trace.columns[name], column, err_msg=name)
