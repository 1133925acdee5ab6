"""Files planted where a job expects its own end it in one line, never a hang, and a full disk at
start leaves no lock behind (real ``mpiexec`` jobs on 2 ranks; the readers and writers one by
one: tests/unit/test_planted_files.py)."""

from __future__ import annotations

import os
import signal
import socket

import pytest

from hpcopt.comm.mpi_support import launcher_stop_signal
from hpcopt.io.data_parallel_checkpoint import read_checkpoint
from tests.command_line import assert_one_line_error
from tests.faults.jobs import SMALL, Send, run_job
from tests.timeouts import scaled

#: Long enough for a SIGTERM 1 s into training to land in it.
LONG = "100000"
#: A job refusing a planted file ends in seconds; one that waited on a FIFO would not.
PROMPT = scaled(30)


def finished_run(out):
    job = run_job(["train", *SMALL, "--steps", "8", "--out", str(out)])
    assert job.returncode == 0, job.describe()
    return out


def test_a_fifo_among_a_live_runs_checkpoints_never_blocks_it_and_sigterm_stops_it(tmp_path):
    """``mkfifo RUN/checkpoints/step-000000001.h5``: the run reads every checkpoint's run id
    before pruning, and opening the FIFO blocked it for good, SIGTERM or not. It is now of an
    unknown run, never opened, never pruned."""
    out = finished_run(tmp_path / "run")
    fifo = out / "checkpoints" / "step-000000001.h5"
    os.mkfifo(fifo)
    job = run_job(["resume", str(out), "--steps", LONG, "--progress", "true"],
                  send=Send(launcher_stop_signal(signal.SIGTERM), after=1.0), timeout=scaled(60))
    assert job.returncode == 143, job.describe()
    assert job.after_fault is not None and job.after_fault < PROMPT, job.describe()
    assert read_checkpoint(out).tick > 8 and fifo.exists()


@pytest.mark.parametrize("planted,command", [("hpcopt.lock", "train"), ("trace.h5", "train"),
                                             ("trace.h5", "resume")])
def test_a_fifo_where_a_file_is_expected_is_one_line_not_a_hang(tmp_path, planted, command):
    out = tmp_path / "run"
    if command == "resume":
        finished_run(out)
        (out / planted).unlink()
        args = ["resume", str(out), "--steps", "16"]
    else:
        out.mkdir()
        args = ["train", *SMALL, "--steps", "8", "--out", str(out)]
    os.mkfifo(out / planted)
    job = run_job(args, timeout=PROMPT)
    assert_one_line_error(job, f"{out / planted} is a FIFO, not a regular file")


@pytest.mark.parametrize("planted", ["text", "socket"])
def test_a_planted_fault_record_is_one_line_from_rank_0(tmp_path, planted):
    """Every rank reads the record of ``--fault``: each once refused it with a line of its own;
    a socket read "No such device or address"."""
    out = tmp_path / "run"
    out.mkdir()
    if planted == "socket":
        with socket.socket(socket.AF_UNIX) as sock:
            sock.bind(str(out / "fault.json"))
        said = f"{out / 'fault.json'} is a socket, not a regular file (expected a fault record)"
    else:
        (out / "fault.json").write_text('{"run_id": 3}\n')
        said = f"{out / 'fault.json'}: not a fault record (fields run_id, rank, step"
    job = run_job(["train", *SMALL, "--steps", "8", "--fault", "1:6", "--checkpoint-every", "4",
                   "--out", str(out)], timeout=PROMPT)
    assert_one_line_error(job, said)


#: ``train`` with no room to write (a file size limit of 0 bytes: every write fails with EFBIG,
#: as a full disk's fail with ENOSPC).
NO_ROOM = """
import resource, signal, sys
from hpcopt.cli import main
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))
sys.exit(main(["train", *{args!r}, "--steps", "8", "--out", {out!r}]))
"""


def test_a_full_disk_at_start_is_one_line_and_leaves_no_lock(tmp_path):
    out = tmp_path / "run"
    job = run_job([], python_code=NO_ROOM.format(args=SMALL, out=str(out)), timeout=PROMPT)
    assert_one_line_error(job, f"cannot write the lock file {out / 'hpcopt.lock'}: File too large (")
    assert not (out / "hpcopt.lock").exists()
    finished_run(out)  # the next job takes the directory
