"""Communication: everything that moves bytes between ranks or models what it costs.

- ``core``: ``Comm``, the counted communicator every byte goes through, and ``agreed``;
- ``shm``: node-local shared-memory averaging (``--averaging shm``);
- ``staging``: device buffers to MPI, CUDA-aware or staged through host memory;
- ``mpi_support`` and ``gpu_selftest``: what this MPI can do, tested in a child process;
- ``costmodel``: the alpha-beta network model (``--network``, ``hpcopt bench``).
"""

from .core import (
    ALLREDUCE_SLICE_BYTES,
    AVERAGING_MODES,
    GROUP_LABEL,
    IN_FLIGHT,
    OWN,
    UNSPENT,
    Comm,
    CommStats,
    OpCounter,
    Reduction,
    agreed,
    node_layout,
)

__all__ = ["Comm", "CommStats", "OpCounter", "Reduction", "IN_FLIGHT", "OWN", "UNSPENT", "agreed",
           "node_layout", "AVERAGING_MODES", "ALLREDUCE_SLICE_BYTES", "GROUP_LABEL"]
