"""Data layer: partitions across ranks, minibatch samplers, real and synthetic data sets."""
