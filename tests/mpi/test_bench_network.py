"""``hpcopt bench allreduce|p2p`` at tiny sizes, and ``--network``: modelled seconds in the trace."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from hpcopt import train
from hpcopt.bench import run_bench
from hpcopt.bench.allreduce import measure
from hpcopt.comm.costmodel import SETUP_LABELS, comm_modelled, get_profile, trace_comm_seconds, trace_modelled
from hpcopt.config import build_config
from hpcopt.errors import HpcoptError
from hpcopt.io.trace import read_trace

pytestmark = pytest.mark.mpi


def shared_dir(tmp_path_factory, comm):
    path = str(tmp_path_factory.mktemp("bench")) if comm.rank == 0 else None
    return comm.mpi.bcast(path, root=0)


def test_bench_allreduce_tiny(comm, tmp_path_factory, capsys):
    out = shared_dir(tmp_path_factory, comm)
    assert run_bench("allreduce", ["--min-bytes", "4K", "--max-bytes", "64K", "--budget", "0.01",
                                   "--json", f"{out}/a.json"]) == 0
    if comm.rank == 0:
        text = capsys.readouterr().out
        assert "busbw" in text and "| 64 KB |" in text
        assert ("--network alpha=" in text) == (comm.size > 1)
    results = measure(comm.mpi, [4096, 8192], ["mpi"], budget=0.01, min_reps=3, max_reps=3)
    assert [r["reps"] for r in results] == [3, 3]
    assert all(r["seconds"]["mpi"] > 0 and r["seconds"]["raw"] > 0 for r in results)
    # the last rank to arrive waited for no other: its median is at most the slowest rank's
    assert all(0 < r["last_arrival"][case] <= r["seconds"][case] for r in results for case in ("mpi", "raw"))
    # shm: a private buffer (copied into the window) and one in node-shared memory (in place)
    results = measure(comm.mpi, [4096], ["shm"], budget=0.01, min_reps=3, max_reps=3)
    assert sorted(results[0]["seconds"]) == ["raw", "shm", "shm-shared"]


def test_bench_allreduce_within_a_node(comm, tmp_path_factory, capsys):
    """``--within node``: every node's own ranks (here one node: all of them); the fit line names
    the in-node profile's values."""
    out = shared_dir(tmp_path_factory, comm)
    assert run_bench("allreduce", ["--min-bytes", "4K", "--max-bytes", "16K", "--budget", "0.01", "--within",
                                   "node", "--json", f"{out}/node.json"]) == 0
    if comm.rank == 0:
        data = json.loads(Path(out, "node.json").read_text())
        assert (data["within"], data["ranks"]) == ("node", comm.size)
        assert ("--network memory_alpha=" in capsys.readouterr().out) == (comm.size > 1)


def test_bench_p2p_tiny(comm, capsys):
    if comm.size == 1:
        with pytest.raises(HpcoptError, match="needs 2 ranks"):
            run_bench("p2p", [])
        return
    assert run_bench("p2p", ["--max-bytes", "4K", "--reps", "5", "--window", "2"]) == 0
    if comm.rank == 0:
        text = capsys.readouterr().out
        assert "| 4 KB |" in text and "latency us" in text and "alpha=" in text


def test_network_profile_models_every_trace_row(comm, tmp_path_factory):
    out = shared_dir(tmp_path_factory, comm)
    config = build_config(None, {"dataset": "digits", "steps": "24", "interval": "4", "trace_every": "4",
                                 "eval_every": "12", "progress": "false", "network": "eth10",
                                 "out": f"{out}/run"})
    summary, _ = train(config, comm, verbose=False)
    eth10 = get_profile("eth10")
    modelled = comm_modelled(comm.stats.counters, comm.size, eth10)
    expected = sum(seconds for label, seconds in modelled.items()  # the summary's own: after it
                   if label != "summary" and label not in SETUP_LABELS)
    total = comm.mpi.allreduce(expected) / comm.size
    assert summary.network == "eth10" and summary.modelled_seconds == pytest.approx(total)
    if comm.rank == 0:
        trace = read_trace(f"{out}/run/trace.h5")
        assert trace.attrs["network"] == "eth10" and trace.ops["average"] == "allreduce"
        stored = sum(fields["modelled"] for fields in trace.comm.values())
        assert np.all(np.diff(stored) >= 0)
        average = trace.comm["average"]
        one = eth10.allreduce(average["bytes"][-1] / average["calls"][-1], comm.size)
        assert average["modelled"][-1] == pytest.approx(average["calls"][-1] * one)
        assert (average["modelled"][-1] > 0) == (comm.size > 1)
        # recomputed from calls, bytes and ops: the same (the trace label counts posts and waits),
        # set-up traffic before the clock started left out
        again = trace_modelled(trace.comm, trace.ops, comm.size, eth10)
        assert again == pytest.approx(trace_comm_seconds(trace.comm, "modelled"), rel=0.05, abs=1e-6)
        assert np.all(again <= stored + 1e-12)
    comm.mpi.Barrier()


def test_delay_mode_sleeps_the_modelled_time(comm):
    slow = "alpha=0.004,bandwidth=1e12"  # 4 ms a message: every average costs >= 4 ms
    config = build_config(None, {"dataset": "digits", "steps": "8", "interval": "4", "progress": "false",
                                 "network": slow, "network_delay": "true"})
    summary, _ = train(config, comm, verbose=False)
    average = comm.stats.counters[("allreduce", "average")]
    if comm.size > 1:
        assert average.calls == 2 and average.seconds >= 2 * 0.004
        assert summary.comm_seconds >= summary.modelled_seconds * 0.99
    assert comm.stats.delay is None
    with pytest.raises(HpcoptError, match="needs a profile"):
        build_config(None, {"network_delay": "true"})
