"""The repository's benchmarks, by kind (benchmarks/README.md): ``speed/`` (how fast),
``reproduce/`` (papers' findings, written into docs/results/), ``faults/`` (how failures are
met), and ``common/``, what their scripts share."""
