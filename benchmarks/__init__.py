"""The repository's benchmarks, by kind (benchmarks/README.md): ``speed/`` (how fast),
``reproduce/`` (papers' findings, written into docs/results/), ``faults/`` (how failures are
met), ``common/``, what their scripts share, and ``cluster/``, an emulated cluster of network
namespaces for the cluster tests (docs/clusters.md)."""
