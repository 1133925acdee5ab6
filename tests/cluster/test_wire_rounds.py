"""The compressed-round benchmark of the cluster study (benchmarks/cluster/wire_rounds.py) on the
emulated cluster: its flat round really sends every rank's payload across the links and its
hierarchical round one message a node, as the byte counts of docs/algorithms.md say."""

from __future__ import annotations

import json
import sys

from tests.cluster.conftest import JOB_TIMEOUT, ROOT, job_env

VALUES = 262_144  # 1 MB of float32: a round of a few tens of ms at 100 Mbit/s


def test_the_hierarchical_round_sends_under_half_the_flat_rounds_bytes(nodes, tmp_path):
    out = tmp_path / "rounds.json"
    job = nodes.mpiexec([sys.executable, "-m", "benchmarks.cluster.wire_rounds", "--json", str(out),
                         "--values", str(VALUES), "--rounds", "1", "--load", "0", "1"], "ofi", JOB_TIMEOUT,
                        job_env(), ROOT)
    assert job.returncode == 0, job.describe()
    data = json.loads(out.read_text())
    idle, loaded = data["levels"]
    assert idle["load"]["busy"] == 0 and loaded["load"]["busy"] == 1
    assert data["results"] == idle["results"]
    for level in data["levels"]:
        _check_bytes(level["results"])


def _check_bytes(results: dict) -> None:
    sent = {name: min(r["link_bytes"]) for name, r in results.items()}
    largest = {name: max(r["link_bytes"]) for name, r in results.items()}
    message = 4 * VALUES
    # float32: an allreduce over 2 nodes sends one message a node; flat bfloat16: a node's 2
    # ranks' half-size payloads reach the other node's 2 ranks (a ring allgather: 1.5 messages a
    # node), at least one message; hierarchical: the leaders' half message, a few bytes more
    assert 0.95 * message <= sent["float32"] <= largest["float32"] <= 1.1 * message, results
    assert sent["bfloat16 flat"] >= 0.95 * message, results
    hierarchical = results["bfloat16 hierarchical"]["link_bytes"]
    assert 0.45 * message <= min(hierarchical) <= max(hierarchical) <= 0.55 * message, results
    assert largest["int8 hierarchical"] < 0.45 * sent["int8 flat"], results
