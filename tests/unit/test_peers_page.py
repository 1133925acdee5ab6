"""benchmarks/speed/peers.py's page from a tiny measured run at 1 rank: every pair's row carries
the measured figures, the verdict lines agree with the ratios, the figure is written, and a
missing ceiling script is said on the page rather than drawn."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.extra
torch = pytest.importorskip("torch")
pytest.importorskip("matplotlib")
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks" / "speed"))

import peers  # noqa: E402


def tiny_model() -> peers.Model:
    def data():
        from hpcopt.torch import TensorData

        g = torch.Generator().manual_seed(0)
        return TensorData(torch.randn(peers.SAMPLES, 6, generator=g),
                          torch.randint(0, 3, (peers.SAMPLES,), generator=g))

    def module():
        return torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.ReLU(), torch.nn.Linear(5, 3))

    return peers.Model(module, data, torch.nn.CrossEntropyLoss(), 8, "tiny MLP 6-5-3")


def test_page_from_a_tiny_measured_run(tmp_path: Path):
    args = peers.parser().parse_args(["--rounds", "1", "--budget", "1", "--sizes", "64K",
                                      "--growth-rounds", "1"])
    data = peers.measure(args, suite={"tiny": tiny_model()})
    data["run"] = {"torch": torch.__version__, "lr": args.lr, "momentum": args.momentum, "gamma": args.gamma,
                   "rounds": 1, "budget": 1.0, "growth_rounds": 1, "quick": True, "load_before": "0.0",
                   "load_after": "0.0", "seconds": 1.0}
    (result,) = data["models"]
    assert result["rounds"] == 1
    assert result["parameters"] == 6 * 5 + 5 + 5 * 3 + 3
    variants = result["variants"]
    assert set(variants) == set(peers.VARIANTS)
    assert all(v["step_ms"] > 0 for v in variants.values())
    assert variants["prsgd8"]["bytes"] == 4 * result["parameters"]  # one average of x a round
    assert variants["averager"]["bytes"] == 4 * result["parameters"]
    ceiling, note = peers.memory_ceiling("64K", script=tmp_path / "missing.py")
    assert ceiling is None and "no memory ceiling is drawn" in note
    text = peers.write(data, ceiling, note, tmp_path / "peers.md")
    assert (tmp_path / "peers.md").read_text() == text
    assert (tmp_path / "peers" / "growth.png").stat().st_size > 1000
    assert note in text and "](peers/growth.png)" in text
    rows = [line for line in text.splitlines() if line.startswith("| tiny MLP 6-5-3 (")]
    assert len(rows) == len(peers.PAIRS)
    for row, (ours, peer) in zip(rows, peers.PAIRS):
        speed = variants[peer]["step_ms"] / variants[ours]["step_ms"]
        assert f"| {speed:.3f}x |" in row and peers.VARIANTS[peer] in row
    behind = sum(variants[peer]["step_ms"] < variants[ours]["step_ms"] for ours, peer in peers.PAIRS)
    assert len(peers.verdicts(data["models"])) == behind
    (growth,) = data["growth"]
    assert growth["bytes"] == 64 << 10 and growth["hpcopt_average_ms"] > 0


def test_a_ceiling_is_drawn_as_d_over_its_rate():
    ceiling = [{"bytes": 1 << 20, "ceiling_gbps": 2.0, "hpcopt_gbps": 1.0, "mpi_gbps": 0.5}]
    assert peers.ceiling_ms(ceiling) == {1 << 20: pytest.approx(1e3 * (1 << 20) / 2e9)}
    growth = [{"bytes": 1 << 20, "torch_ms": 1.0, "hpcopt_ms": 1.5, "hpcopt_average_ms": 2.0,
               "torch_average_ms": 3.0}]
    assert peers.growth_table(growth, ceiling)[-1] == "| 1 MB | 1.00 | 1.50 | +0.50 | 2.00 | 3.00 | 0.52 |"
