"""Speed measurements: hpcopt's kernels, averaging paths, steps and overheads, timed."""
