"""The emulated cluster itself: links shaped to their rate, and no namespace left behind by a
SIGTERM of its maker or, after ``down --stale``, by a SIGKILL."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest

from benchmarks.cluster.emulated import bucket_bytes, clusters, namespaces_unavailable, rate_bits
from tests.cluster.conftest import JOB_TIMEOUT, ROOT, job_env
from tests.timeouts import scaled

#: Rank 0 sends 6 MB to rank 2 (the other node) after a warm-up; rank 0 prints the rate in bit/s.
SEND = """
import time
import numpy as np
from mpi4py import MPI
world = MPI.COMM_WORLD
data = np.ones(6 << 20, dtype=np.uint8)
for part in (data[:1 << 16], data):
    world.Barrier()
    start = time.perf_counter()
    if world.rank == 0:
        world.Send(part, dest=2)
        world.Recv(data[:1], source=2)
    elif world.rank == 2:
        world.Recv(part, source=0)
        world.Send(data[:1], dest=0)
if world.rank == 0:
    print(data.nbytes * 8 / (time.perf_counter() - start))
"""


def test_rates_and_buckets():
    assert rate_bits("100mbit") == 1e8 and rate_bits("2.5gbit") == 2.5e9 and rate_bits("none") is None
    with pytest.raises(ValueError, match="100mbit"):
        rate_bits("fast")
    assert bucket_bytes(1e8) == 68 << 10  # one offload packet, more than 1 ms at 100 Mbit/s
    assert bucket_bytes(1e10) == 1_250_000  # 1 ms at 10 Gbit/s


@pytest.mark.parametrize("netmod", ["ofi", "ucx"])
def test_a_link_carries_its_rate(nodes, netmod):
    job = nodes.mpiexec([sys.executable, "-c", SEND], netmod, JOB_TIMEOUT, job_env(), ROOT)
    assert job.returncode == 0, job.describe()
    rate = float(job.stdout.split()[-1])
    assert 0.6e8 < rate < 1.05e8, rate  # 100 Mbit/s less the headers; unshaped, Gbit/s
    assert job.sent[0] >= 6 << 20 and job.received[1] >= 6 << 20, job.describe()


def _cluster_of(process: subprocess.Popen) -> None:
    """Wait until ``process`` has made its cluster."""
    deadline = time.monotonic() + scaled(30)
    while process.pid not in clusters().values():
        assert process.poll() is None and time.monotonic() < deadline, process.communicate()
        time.sleep(0.05)


@pytest.mark.skipif(bool(namespaces_unavailable()), reason="ip netns add is not permitted here")
def test_sigterm_to_the_maker_removes_its_cluster_and_down_stale_removes_a_killed_ones():
    command = [sys.executable, "-m", "benchmarks.cluster.emulated", "run", "--nodes", "2", "--ppn",
               "1", "--", "sleep", "60"]
    makers = []
    for signum in (signal.SIGTERM, signal.SIGKILL):
        process = subprocess.Popen(command, env=job_env(), cwd=ROOT, stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True)
        _cluster_of(process)
        process.send_signal(signum)
        process.communicate(timeout=scaled(30))
        makers.append(process.pid)
    assert makers[0] not in clusters().values()  # SIGTERM: the maker removed it on its way out
    assert makers[1] in clusters().values()  # SIGKILL: nothing could run
    down = subprocess.run([sys.executable, "-m", "benchmarks.cluster.emulated", "down", "--stale"],
                          env=job_env(), cwd=ROOT, capture_output=True, text=True)
    assert down.returncode == 0 and "removed hpcopt-" in down.stdout, down
    assert makers[1] not in clusters().values()
