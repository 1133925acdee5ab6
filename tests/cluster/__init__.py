"""Tests on an emulated cluster of network namespaces (benchmarks/cluster/emulated.py)."""
