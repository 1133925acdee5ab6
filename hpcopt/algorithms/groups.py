"""Two-level averaging periods: averages within groups of ranks between the global rounds.

With ``group_size`` G and ``group_interval`` I1 (I1 divides the round's I = ``interval`` and is
smaller), the N ranks form N / G groups of G consecutive ranks (rank r in group r // G; G must
divide N, else the run is refused), and within a round, after local step s of it::

    s % I == 0:   x_i <- (1/N) sum_j x_j                 (the global round, label "average")
    s % I1 == 0:  x_i <- (1/G) sum_{j in g(i)} x_j       (a group round, label "group_average")

as torch's ``HierarchicalModelAverager`` with periods {I1: G, I: N}. A group with the ranks of
one node (G = ranks per node) is a node: its average takes the shared-memory path under
``--averaging shm`` (or auto), as the global one does (``Comm.group``). A group round is a plain
average of x only: the momentum policies, the batch-norm buffer policy and the outer optimizer's
step are the global round's (the outer step's pseudo-gradient is anchor - the global mean, which
group rounds leave unchanged). It keeps no state: whether a round is due follows from the
state's ``steps_in_round``, so checkpoints are those of PR-SGD.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import HpcoptError
from .base import option

if TYPE_CHECKING:
    from ..comm import Comm

Array = Any

GROUP_LABEL = "group_average"


@dataclass(frozen=True, kw_only=True)
class GroupRounds:
    """The two-level options (module docstring), for an algorithm with rounds of I steps."""

    group_size: int = option(1, "G: ranks per group (consecutive ranks; a node's when G = ranks "
                                "per node) averaged every group_interval steps")
    group_interval: int = option(0, "I1: local steps between group averages (divides interval "
                                    "and is smaller); 0 = none")

    def check_groups(self, interval: int, local_steps: tuple[int, ...]) -> None:
        """HpcoptError for options that do not make a two-level schedule with rounds of
        ``interval`` steps (and the rounds' per-rank ``local_steps``)."""
        if self.group_size < 1:
            raise HpcoptError(f"group_size must be >= 1, got {self.group_size}")
        if self.group_interval < 0:
            raise HpcoptError(f"group_interval must be >= 0 (0 = no group averages), got "
                              f"{self.group_interval}")
        if not self.group_interval:
            if self.group_size != 1:
                raise HpcoptError("group_size needs group_interval > 0 (the steps between group averages)")
            return
        if self.group_interval >= interval or interval % self.group_interval:
            raise HpcoptError(f"group_interval {self.group_interval} must divide interval "
                              f"{interval} and be smaller")
        if local_steps:
            raise HpcoptError("group_interval applies only when every rank runs interval steps "
                              "per round (not with local_steps)")

    def check_world(self, size: int) -> None:
        """HpcoptError unless the groups divide the ``size`` ranks."""
        if self.group_interval and size % self.group_size:
            raise HpcoptError(f"group_size {self.group_size} does not divide the run's {size} rank(s) "
                              f"(groups are {self.group_size} consecutive ranks)")

    def group_comm(self, comm: Comm) -> Comm | None:
        """This rank's group's Comm (made on the first call: collective), or None without groups."""
        return comm.group(self.group_size, GROUP_LABEL) if self.group_interval else None

    def group_round(self, x: Array, steps_in_round: int, comm: Comm) -> None:
        """After a local step that is not a global round's: x <- its group's mean when a group
        round is due (``steps_in_round`` local steps into the round)."""
        if self.group_interval and steps_in_round % self.group_interval == 0:
            group = self.group_comm(comm)
            assert group is not None
            group.average_(x, label=GROUP_LABEL)

    def describe_groups(self) -> str:
        """The schedule, for the run's header (empty without groups)."""
        if not self.group_interval:
            return ""
        return f", groups of {self.group_size} every {self.group_interval} steps"
