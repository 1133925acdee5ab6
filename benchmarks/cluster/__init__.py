"""Test and benchmark infrastructure: an emulated cluster of network namespaces (emulated.py)."""
