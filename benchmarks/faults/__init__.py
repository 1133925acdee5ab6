"""Fault timings: how long stopping, resuming and refusing take, and what failures cost."""
