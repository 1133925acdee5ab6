"""benchmarks/common/load.py: the controlled load runs for the block and stops surely (at the
block's end, on an exception, and by itself when its parent is killed)."""

import os
import signal
import subprocess
import sys
import time

import pytest

from benchmarks.common.load import Load, busy, start_busy, stop_busy
from tests.command_line import ROOT
from tests.timeouts import scaled


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a reaped-later zombie counts as gone
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().split(") ")[-1][0] != "Z"


def _wait_gone(pids: list[int], seconds: float = 5.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not any(_alive(pid) for pid in pids):
            return True
        time.sleep(0.05)
    return False


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().split(") ")[-1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_busy_processes_spin_during_the_block_and_are_gone_after():
    with busy(2) as load:
        pids = _spinners()
        assert len(pids) == 2
        deadline = time.monotonic() + scaled(20)  # they burn CPU (their share of busy cores)
        while not all(_cpu_seconds(pid) > 0.05 for pid in pids):
            assert time.monotonic() < deadline, [_cpu_seconds(pid) for pid in pids]
            time.sleep(0.1)
    assert load.processes == 2 and load.load_after is not None
    assert "2 busy processes, load average" in load.describe()
    assert not any(_alive(pid) for pid in pids)


def _spinners() -> list[int]:
    """The busy processes this process started."""
    return [int(pid) for pid in os.listdir("/proc") if pid.isdigit() and _is_child_spinner(int(pid))]


def _is_child_spinner(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            ppid = int(stat.read().split(") ")[-1].split()[1])
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            return ppid == os.getpid() and b"getppid" in cmdline.read()
    except (FileNotFoundError, ProcessLookupError):
        return False


def test_an_exception_in_the_block_stops_them():
    with pytest.raises(KeyboardInterrupt):
        with busy(1):
            started = _spinners()
            raise KeyboardInterrupt
    assert started and not any(_alive(pid) for pid in started)


def test_they_end_by_themselves_when_their_parent_is_killed():
    parent = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\nsys.path.insert(0, sys.argv[1])\n"
         "from benchmarks.common.load import start_busy\n"
         "print(' '.join(str(p.pid) for p in start_busy(2)), flush=True)\ntime.sleep(60)", str(ROOT)],
        stdout=subprocess.PIPE, text=True)
    pids = [int(pid) for pid in parent.stdout.readline().split()]
    assert len(pids) == 2 and all(_alive(pid) for pid in pids)
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    assert _wait_gone(pids, scaled(5))


def test_idle_starts_nothing_and_says_so():
    assert start_busy(0) == []
    stop_busy([])
    with busy(0) as load:
        pass
    assert load.describe().startswith("idle, load average")
    assert Load(3).as_dict()["busy"] == 3
    with pytest.raises(ValueError):
        start_busy(-1)
