"""Distributed optimization algorithms: hyper-parameters, state, and one step at a time."""
