"""A write that fails in the middle of a checkpoint (a full disk) ends the job with one line and
exit 2 on every rank, removes its temporary file and loses nothing: every earlier checkpoint
reads, and the run resumes from the newest one bitwise (real ``mpiexec`` jobs on 2 ranks).

Two ways to make the write fail: a real small file system (tmpfs in a mount namespace of the
job's own; skipped where this machine cannot mount one), and a file size limit
(``RLIMIT_FSIZE``: every write past it fails with EFBIG, in the kernel, as ENOSPC does on a full
disk), which always works. A small ``/dev/shm`` (a tmpfs mounted there the same way) does not
stop a run whose model would not fit in it: the model stays in private memory."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from hpcopt.io.data_parallel_checkpoint import read_checkpoint
from hpcopt.io.trace import read_trace
from tests.command_line import assert_one_line_error
from tests.faults.jobs import INJECTED, SMALL, assert_same_run, run_job

#: A model whose checkpoints (187 kB) are larger than its trace (89 kB): a file size limit
#: between the two stops a checkpoint, not the trace.
LARGE = [*SMALL, "--hidden", "256"]
FILE_SIZE_LIMIT = 150_000

LIMITED_RESUME = """
import resource, signal, sys
from hpcopt.cli import main
if main(["train", *{args!r}, "--steps", "8", "--out", {out!r}]) != 0:
    sys.exit(99)
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG instead
resource.setrlimit(resource.RLIMIT_FSIZE, ({limit}, {limit}))
print("{marker} a file size limit of {limit} bytes", flush=True)
sys.exit(main(["resume", {out!r}, "--steps", "16"]))
"""


def test_a_write_failing_mid_checkpoint_is_one_line_and_loses_nothing(tmp_path):
    out = tmp_path / "run"
    job = run_job([], python_code=LIMITED_RESUME.format(args=LARGE, out=str(out), limit=FILE_SIZE_LIMIT,
                                                        marker=INJECTED))
    newest = out / "checkpoints" / "step-000000016.h5"
    assert_one_line_error(job, f"cannot write the checkpoint {newest}: File too large (",
                          "free on its file system)")
    assert job.after_fault is not None and job.after_fault < 30, job.describe()
    assert sorted(p.name for p in newest.parent.iterdir()) == ["step-000000008.h5"]  # no .tmp
    assert read_checkpoint(out).tick == 8
    resumed = run_job(["resume", str(out), "--steps", "16"])
    assert resumed.returncode == 0, resumed.describe()
    reference = tmp_path / "reference"
    uninterrupted = run_job(["train", *LARGE, "--steps", "16", "--out", str(reference)])
    assert uninterrupted.returncode == 0, uninterrupted.describe()
    assert_same_run(out, reference)


#: Runs ``mpiexec ...`` (its arguments after the first two) with a small tmpfs mounted at $1 in a
#: mount namespace of its own, then copies the run directory out to $2 (the tmpfs ends with it).
SMALL_DISK = """
mount -t tmpfs -o size=1600k hpcopt-test "$1" || exit 97
run="$1/run" keep="$2"
shift 2
"$@"
code=$?
cp -a "$run" "$keep"
exit $code
"""


def _namespace(probe_at: Path) -> tuple[str, ...]:
    """``unshare`` with a mount namespace (and a user namespace unless root), or skip."""
    unshare = shutil.which("unshare")
    if unshare is None:
        pytest.skip("no unshare(1) to mount a small file system")
    command = (unshare, "--mount", *(() if os.geteuid() == 0 else ("--map-root-user",)))
    probe_at.mkdir()
    probe = subprocess.run([*command, "mount", "-t", "tmpfs", "-o", "size=64k", "probe", str(probe_at)],
                           capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {probe.stderr.strip()}")
    return command


def test_a_disk_filling_mid_checkpoint_is_one_line_and_loses_nothing(tmp_path):
    """1.6 MB of tmpfs: room for the trace and 8 checkpoints of 187 kB (every one is kept);
    the 9th fills the disk part-way through."""
    namespace = _namespace(tmp_path / "probe")
    mount, kept = tmp_path / "mnt", tmp_path / "kept"
    mount.mkdir()
    job = run_job(["train", *LARGE, "--steps", "100000", "--keep-checkpoints", "1000",
                   "--out", str(mount / "run")],
                  launcher=(*namespace, "sh", "-c", SMALL_DISK, "sh", str(mount), str(kept)))
    assert job.returncode != 97, job.describe()
    assert_one_line_error(job, "cannot write the checkpoint", ": No space left on device (",
                          "free on its file system)")
    assert job.seconds < 60, job.describe()
    names = sorted(p.name for p in (kept / "checkpoints").iterdir())
    assert len(names) >= 2 and not any(name.endswith(".tmp") for name in names), names
    ticks = [read_checkpoint(kept / "checkpoints" / name).tick for name in names]  # digests check
    assert ticks == [8 * (i + 1) for i in range(len(names))], ticks
    assert read_trace(kept / "trace.h5").rows >= read_checkpoint(kept).trace_rows


#: Runs ``mpiexec ...`` (its arguments after the first) with a /dev/shm of $1 bytes, in a mount
#: namespace of its own.
SMALL_SHM = """
mount -t tmpfs -o size="$1" hpcopt-test /dev/shm || exit 97
shift
exec "$@"
"""


def test_a_small_dev_shm_keeps_the_model_in_private_memory_and_trains(tmp_path):
    """A model of 46 MB a rank on 2 ranks with 48 MB of /dev/shm (a default Docker container
    has 64 MB): its node-shared window (92 MB) would end the job with a bus error on its first
    write; the model stays in private memory (the copying path, the same bits) and trains."""
    namespace = _namespace(tmp_path / "probe")
    out = tmp_path / "run"
    job = run_job(["train", *SMALL, "--hidden", "4096,2048", "--steps", "4", "--out", str(out)],
                  launcher=(*namespace, "sh", "-c", SMALL_SHM, "sh", str(48 << 20)))
    assert job.returncode == 0, job.describe()
    assert read_checkpoint(out).tick == 4
