"""hpcopt: distributed optimization over MPI (PR-SGD, CELGC, PPRS) on one engine.

Importing hpcopt is cheap: it loads neither MPI, CuPy, h5py nor matplotlib. The public
building blocks live in their own modules (``hpcopt.flat``, ``hpcopt.comm``, ...).
"""

__version__ = "0.1.0"
