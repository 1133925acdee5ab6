"""Two-level averaging periods: averages within groups of ranks between the global rounds.

With ``group_size`` G and ``group_interval`` I1 (I1 divides the round's I = ``interval`` and is
smaller), the N ranks form N / G groups of G consecutive ranks (rank r in group r // G; G must
divide N, else the run is refused), or with ``group_size = "node"`` one group per node (the
ranks of a shared-memory split, wherever the launcher placed them), and within a round, after
local step s of it::

    s % I == 0:   x_i <- (1/N) sum_j x_j                 (the global round, label "average")
    s % I1 == 0:  x_i <- (1/G) sum_{j in g(i)} x_j       (a group round, label "group_average")

as torch's ``HierarchicalModelAverager`` with periods {I1: G, I: N} and its step counter started
at 1, not its 0 (which averages after local step k when k - 1, not k, is a multiple of a period:
docs/algorithms.md). A group with the ranks of
one node is a node: its average takes the shared-memory path under ``--averaging shm`` (or
auto), as the global one does (``Comm.group``, ``Comm.node_group``); with ``group_size =
"node"``, where the model lives in the run's node-shared window (``Comm.shared_like``), in
place there (``Comm.node_average_``: no copy into a window of the node's and back, the same
bits). Consecutive ranks are a
node's only under block placement: where a numeric group spans nodes, or on several nodes a
node's ranks fall in several groups, rank 0 prints one warning line when the groups are made,
and training goes on. A group round is a plain average of x only: the momentum policies, the batch-norm buffer
policy and the outer optimizer's step are the global round's (the outer step's pseudo-gradient
is anchor - the global mean, which group rounds leave unchanged). With streaming fragments
(``hpcopt.algorithms.streaming``) the group rounds come at the same steps, before the
fragments' turn. It keeps no state: whether a round is due follows from the state's
``steps_in_round``, so checkpoints are those of PR-SGD.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..comm.core import GROUP_LABEL, NODE, node_indices
from ..errors import HpcoptError
from .base import option

if TYPE_CHECKING:
    from ..comm import Comm

Array = Any

@dataclass(frozen=True, kw_only=True)
class GroupRounds:
    """The two-level options (module docstring), for an algorithm with rounds of I steps."""

    group_size: int | str = option(1, "G: ranks per group (consecutive ranks), or 'node' (each "
                                      "node's ranks), averaged every group_interval steps")
    group_interval: int = option(0, "I1: local steps between group averages (divides interval "
                                    "and is smaller); 0 = none")

    def check_groups(self, interval: int, local_steps: tuple[int, ...]) -> None:
        """HpcoptError for options that do not make a two-level schedule with rounds of
        ``interval`` steps (and the rounds' per-rank ``local_steps``)."""
        if isinstance(self.group_size, str):
            if self.group_size != NODE:
                raise HpcoptError(f"group_size must be a number of ranks or {NODE!r}, "
                                  f"got {self.group_size!r}")
        elif self.group_size < 1:
            raise HpcoptError(f"group_size must be >= 1, got {self.group_size}")
        if self.group_interval < 0:
            raise HpcoptError(f"group_interval must be >= 0 (0 = no group averages), got "
                              f"{self.group_interval}")
        if not self.group_interval:
            if self.group_size != 1:
                raise HpcoptError("group_size (--group-size) needs group_interval > 0 (--group-interval "
                                  "I1: the local steps between group averages)")
            return
        if self.group_interval >= interval or interval % self.group_interval:
            raise HpcoptError(f"group_interval {self.group_interval} must divide interval "
                              f"{interval} and be smaller")
        if local_steps:
            raise HpcoptError("group_interval applies only when every rank runs interval steps "
                              "per round (not with local_steps)")

    def check_world(self, size: int) -> None:
        """HpcoptError unless the groups divide the ``size`` ranks (nodes always do)."""
        if self.group_interval and isinstance(self.group_size, int) and size % self.group_size:
            raise HpcoptError(f"group_size {self.group_size} does not divide the run's {size} rank(s) "
                              f"(groups are {self.group_size} consecutive ranks)")

    def group_comm(self, comm: Comm) -> Comm | None:
        """This rank's group's Comm (made on the first call: collective), or None without groups."""
        if not self.group_interval:
            return None
        if isinstance(self.group_size, str):
            return comm.node_group(GROUP_LABEL)
        return comm.group(self.group_size, GROUP_LABEL)

    def open_groups(self, comm: Comm) -> None:
        """Make the groups' Comm (collective); rank 0 prints one warning line where numeric
        groups do not match the nodes (``layout_mismatch``)."""
        if self.group_comm(comm) is None or isinstance(self.group_size, str):
            return
        mismatch = layout_mismatch(self.group_size, node_indices(comm.mpi))
        if mismatch and comm.rank == 0:
            print(f"hpcopt: warning: group_size {self.group_size}: {mismatch}; its group averages "
                  f"cross nodes or leave a node's ranks apart (group_size '{NODE}' makes one group "
                  "per node)", file=sys.stderr, flush=True)

    def group_round(self, x: Array, steps_in_round: int, comm: Comm) -> None:
        """After a local step that is not a global round's: x <- its group's mean when a group
        round is due (``steps_in_round`` local steps into the round)."""
        if self.group_interval and steps_in_round % self.group_interval == 0:
            if isinstance(self.group_size, str):  # a node: in place where x is node-shared
                comm.node_average_(x, GROUP_LABEL)
                return
            group = self.group_comm(comm)
            assert group is not None
            group.average_(x, label=GROUP_LABEL)

    def describe_groups(self) -> str:
        """The schedule, for the run's header (empty without groups)."""
        if not self.group_interval:
            return ""
        groups = "node groups" if isinstance(self.group_size, str) else f"groups of {self.group_size}"
        return f", {groups} every {self.group_interval} steps"


def layout_mismatch(group_size: int, nodes: Sequence[int]) -> str:
    """How groups of ``group_size`` consecutive ranks miss the nodes (``nodes``: each rank's
    node, ``node_indices``): the first group that spans nodes, else, on several nodes, the first
    node whose ranks fall in several groups; '' when every group is a node or lies within one,
    and on one node (where groups within it are the only two-level schedule there is)."""
    groups: dict[int, list[int]] = {}
    for rank, node in enumerate(nodes):
        groups.setdefault(rank // group_size, []).append(node)
    for index, members in groups.items():
        if len(set(members)) > 1:
            first = index * group_size
            return (f"group {index} (ranks {first}-{first + group_size - 1}) spans "
                    f"{len(set(members))} nodes")
    if len(set(nodes)) == 1:
        return ""
    split: dict[int, set[int]] = {}
    for rank, node in enumerate(nodes):
        split.setdefault(node, set()).add(rank // group_size)
    for node, held in split.items():
        if len(held) > 1:
            return f"node {node}'s {nodes.count(node)} ranks are split over {len(held)} groups"
    return ""
