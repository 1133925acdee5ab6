"""``hpcopt bench allreduce --stream`` across the emulated nodes: the raw TCP stream is measured
on the link in the same run, and every case's link rate is given as a fraction of it."""

from __future__ import annotations

import json
import sys

from tests.cluster.conftest import JOB_TIMEOUT, ROOT, job_env


def test_the_raw_stream_carries_the_link_rate_and_the_cases_a_fraction_of_it(nodes, tmp_path):
    out = tmp_path / "allreduce.json"
    job = nodes.mpiexec([sys.executable, "-m", "hpcopt", "bench", "allreduce", "--min-bytes", "1M",
                         "--max-bytes", "2M", "--factor", "2", "--budget", "0.05", "--min-reps", "2",
                         "--stream", "--json", str(out)], "ofi", JOB_TIMEOUT, job_env(), ROOT)
    assert job.returncode == 0, job.describe()
    data = json.loads(out.read_text())
    rate = data["stream"]["bytes_per_second"]
    assert data["stream"]["nodes"] == 2
    assert 0.6e8 < 8 * rate < 1.05e8, rate  # 100 Mbit/s less the headers
    assert "raw TCP stream, first node to second" in job.stdout
    result = data["results"][-1]
    cases = list(result["seconds"])
    rows = [line.strip("| ").split(" | ") for line in job.stdout.splitlines() if line.startswith("| 2 MB |")]
    [printed] = [row[1:] for row in rows if len(row) == len(cases) + 1]  # the fractions' row
    expected = [result["bytes"] / result["seconds"][case] / rate for case in cases]  # 2 nodes: n bytes
    assert printed == [f"{f:.2f}" for f in expected]
    assert all(0.2 < f < 1.1 for f in expected), expected
