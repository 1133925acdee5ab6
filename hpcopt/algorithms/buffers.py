"""What happens to non-trained model state (batch-norm running statistics) at an averaging round.

The parameters are averaged; the running statistics live in a flat buffer of their own
(``Sequential.buffer_layout``) and follow an explicit policy, recorded with the run:

    local    each rank keeps its own statistics (no traffic)
    average  s_i <- (1/N) sum_j s_j      one allreduce of the buffer, label "buffers"
    rank0    s_i <- s_0                  one broadcast from rank 0, label "buffers"

"average" and "rank0" leave every rank with the same complete model (parameters and
statistics); "local" does not, so the averaged parameters are evaluated with each rank's own
statistics. The trade-off is discussed in docs/conv-and-batchnorm.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..errors import HpcoptError

if TYPE_CHECKING:
    from ..comm import Comm

Array = Any

BUFFER_POLICIES = ("local", "average", "rank0")

BUFFERS_LABEL = "buffers"


def check_buffer_policy(policy: str) -> str:
    """``policy`` if it is one of ``BUFFER_POLICIES``, else a HpcoptError naming them."""
    if policy not in BUFFER_POLICIES:
        raise HpcoptError(f"unknown buffer_policy {policy!r} "
                          f"(choose from {', '.join(BUFFER_POLICIES)})")
    return policy


def sync_buffers(buffers: Array, policy: str, comm: Comm, label: str = BUFFERS_LABEL) -> Array:
    """Apply ``policy`` to the flat buffer in place, on every rank at the same round.

    Every rank must call it with the same policy (it is collective for "average" and "rank0").
    An empty buffer (a model without batch norm) moves nothing under any policy.
    """
    check_buffer_policy(policy)
    if policy == "local" or buffers.size == 0:
        return buffers
    if policy == "average":
        return comm.average_(buffers, label=label)
    return comm.bcast_(buffers, root=0, label=label)
