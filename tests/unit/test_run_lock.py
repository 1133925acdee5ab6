"""The run directory's lock (hpcopt.run.lock): one job at a time, stale locks taken over."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time

import pytest

from hpcopt.errors import HpcoptError
from hpcopt.run import lock as lock_module
from hpcopt.run.lock import FILE_NAME, RunLock
from tests.crafted import lock_file
from tests.faults.jobs import ROOT


def _dead_pid() -> int:
    """The id of a process that has ended (and been reaped)."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_a_second_job_is_refused_with_the_holder_named_until_the_first_releases(tmp_path):
    first = RunLock.acquire(tmp_path, "run-a")
    assert (tmp_path / FILE_NAME).is_file()
    with pytest.raises(HpcoptError) as refused:
        RunLock.acquire(tmp_path, "run-b")
    message = str(refused.value)
    assert "\n" not in message and "in use by another job" in message
    assert f"host {socket.gethostname()}, pid {os.getpid()}" in message
    first.release()
    assert not (tmp_path / FILE_NAME).exists()
    RunLock.acquire(tmp_path, "run-b").release()


@pytest.mark.parametrize("stale", ["dead pid", "pid reused", "rebooted", "other host, unrefreshed"])
def test_a_stale_lock_is_taken_over(tmp_path, stale):
    host = socket.gethostname()
    crafted = {
        "dead pid": dict(host=host, pid=_dead_pid()),
        "pid reused": dict(host=host, pid=os.getpid(), started="1"),  # this pid, another process
        "rebooted": dict(host=host, pid=os.getpid(), boot="another-boot"),
        "other host, unrefreshed": dict(host="elsewhere", pid=1, age_seconds=lock_module.STALE_SECONDS + 60),
    }[stale]
    if stale == "rebooted" and not lock_module._boot_id():
        pytest.skip("no boot id on this system")
    if stale == "pid reused" and not lock_module._process_start(os.getpid()):
        pytest.skip("no process start times on this system")
    lock_file(tmp_path, **crafted)
    taken = RunLock.acquire(tmp_path, "run-b")
    assert lock_module._read(tmp_path / FILE_NAME) == taken.holder
    taken.release()
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no lock, no break file left


def test_a_lock_of_an_ended_but_unreaped_process_is_taken_over(tmp_path):
    """After MPI_Abort the launcher may exit before rank 0's process is reaped (a zombie)."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        deadline = time.monotonic() + 60
        while not lock_module._ending(child.pid):  # not waited for: it stays a zombie
            assert time.monotonic() < deadline, "the child never ended"
            time.sleep(0.02)
        lock_file(tmp_path, host=socket.gethostname(), pid=child.pid)
        RunLock.acquire(tmp_path, "run-b").release()
    finally:
        child.wait()


@pytest.mark.parametrize("how", ["it ends", "it releases"])
def test_a_holder_on_this_host_that_lets_go_within_the_hand_over_is_waited_for(tmp_path, how):
    """A stopped job's rank 0 may still be exiting when its launcher returns (Open MPI's mpirun):
    the requeue started at once waits for it instead of being refused."""
    if how == "it ends":
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(1)"])
        lock_file(tmp_path, host=socket.gethostname(), pid=child.pid)
        release = child.wait
    else:
        child, held = None, RunLock.acquire(tmp_path, "run-a")
        release = threading.Timer(1.0, held.release).start
    start = time.monotonic()
    waiter = threading.Thread(target=release)
    waiter.start()
    try:
        RunLock.acquire(tmp_path, "run-b").release()
    finally:
        waiter.join()
    assert 0.5 < time.monotonic() - start < lock_module.HANDOVER_SECONDS


def test_release_held_releases_every_lock_of_this_process(tmp_path):
    """What a thread ending the job at once calls (hpcopt.run.signals), the main thread's lock
    still held."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    held = [RunLock.acquire(tmp_path / "a", "run-a"), RunLock.acquire(tmp_path / "b", "run-b")]
    lock_module.release_held()
    assert not any((tmp_path / name / FILE_NAME).exists() for name in "ab")
    held[0].release()  # the main thread's own release after it is harmless
    assert lock_module._HELD == []


@pytest.mark.parametrize("crafted,fragment", [
    (dict(host="elsewhere", pid=1, age_seconds=5), "from another host is taken over once"),
    (dict(host=socket.gethostname(), pid=1), "in use by another job (host"),  # pid 1 runs
])
def test_a_live_or_unknowable_holder_is_refused_in_one_line(tmp_path, crafted, fragment, monkeypatch):
    """A live holder on this host after the hand-over's wait (shortened here)."""
    monkeypatch.setattr(lock_module, "HANDOVER_SECONDS", 0.5)
    path = lock_file(tmp_path, **crafted)
    before = path.read_bytes()
    start = time.monotonic()
    with pytest.raises(HpcoptError, match="in use by another job") as refused:
        RunLock.acquire(tmp_path, "run-b")
    assert (time.monotonic() - start >= 0.5) == (crafted["host"] == socket.gethostname())
    assert fragment in str(refused.value) and "\n" not in str(refused.value)
    assert path.read_bytes() == before  # the holder's lock is left alone


@pytest.mark.parametrize("content", [b"", b"{", b'{"host": "a\\nb"}', b"x" * 10000,
                                     b'{"host": "h", "pid": true, "started": "", "boot": "", '
                                     b'"run_id": "", "since": "", "token": ""}'])
def test_a_lock_file_naming_no_holder_is_refused_and_kept(tmp_path, content):
    (tmp_path / FILE_NAME).write_bytes(content)
    with pytest.raises(HpcoptError, match="names no holder") as refused:
        RunLock.acquire(tmp_path, "run-b")
    assert "\n" not in str(refused.value) and f"delete {tmp_path / FILE_NAME}" in str(refused.value)
    assert (tmp_path / FILE_NAME).read_bytes() == content


def test_release_leaves_a_lock_that_is_no_longer_its_own(tmp_path):
    held = RunLock.acquire(tmp_path, "run-a")
    (tmp_path / FILE_NAME).unlink()  # the user deleted it, and another job took the directory
    other = lock_file(tmp_path, host="elsewhere", pid=1)
    held.release()
    assert other.is_file()


def test_the_holder_refreshes_its_lock(tmp_path, monkeypatch):
    monkeypatch.setattr(lock_module, "HEARTBEAT_SECONDS", 0.05)
    held = RunLock.acquire(tmp_path, "run-a")
    path = tmp_path / FILE_NAME
    old = time.time() - 3600
    os.utime(path, (old, old))
    deadline = time.monotonic() + 30
    while path.stat().st_mtime < old + 1800:
        assert time.monotonic() < deadline, "the lock was never refreshed"
        time.sleep(0.05)
    held.release()


def test_two_jobs_taking_over_one_stale_lock_never_both_win(tmp_path):
    """Many threads (each posing as a job of its own) find the same stale lock at once: exactly
    one holds the directory, every other one is refused."""
    lock_file(tmp_path, host=socket.gethostname(), pid=_dead_pid())
    results: list[object] = []
    start = threading.Barrier(8)

    def contend() -> None:
        start.wait()
        try:
            results.append(RunLock.acquire(tmp_path, "run"))
        except HpcoptError as exc:
            results.append(exc)

    threads = [threading.Thread(target=contend) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    winners = [r for r in results if isinstance(r, RunLock)]
    assert len(winners) == 1, results
    assert lock_module._read(tmp_path / FILE_NAME) == winners[0].holder
    winners[0].release()


@pytest.mark.parametrize("content", [b"", b'{"host": "h", "pi'])
def test_an_abandoned_lock_naming_no_holder_is_taken_over(tmp_path, content):
    """A job that created the lock but could not write its holder (a full disk) left it empty or
    cut short: once unchanged for a few seconds, no job is about to write it, and it is stale."""
    path = tmp_path / FILE_NAME
    path.write_bytes(content)
    old = time.time() - 60  # a minute unchanged
    os.utime(path, (old, old))
    taken = RunLock.acquire(tmp_path, "run-b")
    assert lock_module._read(path) == taken.holder
    taken.release()
    assert sorted(p.name for p in tmp_path.iterdir()) == []


#: Takes the lock of argv[1] with no room to write (a file size limit of 0 bytes: EFBIG, as a
#: full disk's ENOSPC), printing the error as the command line does.
NO_ROOM = """
import resource, signal, sys
from pathlib import Path
from hpcopt.errors import HpcoptError
from hpcopt.run.lock import RunLock
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))
try:
    RunLock.acquire(Path(sys.argv[1]), "run")
except HpcoptError as exc:
    print(f"hpcopt: error: {exc}", file=sys.stderr)
    sys.exit(2)
"""


def test_a_lock_whose_holder_cannot_be_written_is_one_line_and_removed(tmp_path):
    result = subprocess.run([sys.executable, "-c", NO_ROOM, str(tmp_path)], capture_output=True, text=True,
                            timeout=60, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip() == result.stderr.strip().splitlines()[0], result.stderr
    assert f"cannot write the lock file {tmp_path / FILE_NAME}: File too large (" in result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no empty lock left to refuse every job
    RunLock.acquire(tmp_path, "run-b").release()
