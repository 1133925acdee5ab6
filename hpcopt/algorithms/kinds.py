"""The three kinds of piece, each a registry of its own (``hpcopt.algorithms.pieces.Pieces``):
the inner optimizers (``--inner-optimizer``), the outer optimizers (``--outer-optimizer``) and
the reducers (``--wire``), built in here, then the entry points of their groups, then those
registered by call. This module imports every built-in piece; the pieces import none of it.
"""

from __future__ import annotations

from ..comm.codec import WIRES
from .fedopt import FEDADAM, FEDYOGI
from .inner import ADAMW, INNER_OPTIONS, SGD, Inner
from .muon import MUON
from .outer import AVERAGE, NESTEROV, OUTER_OPTIONS, SLOWMO, Outer
from .outer import SGD as OUTER_SGD
from .pieces import Pieces
from .reducers import Reducer, wire_piece

#: By name: built in, entry points of the group ``hpcopt.inner_optimizers``,
#: ``inner_optimizers.register(name, piece)``.
inner_optimizers: Pieces[Inner] = Pieces("inner_optimizer", "hpcopt.inner_optimizers", INNER_OPTIONS,
                                         {"sgd": SGD, "adamw": ADAMW, "muon": MUON})
#: By name: built in, entry points of the group ``hpcopt.outer_optimizers``,
#: ``outer_optimizers.register(name, piece)``.
outer_optimizers: Pieces[Outer] = Pieces(
    "outer_optimizer", "hpcopt.outer_optimizers", OUTER_OPTIONS,
    {"average": AVERAGE, "sgd": OUTER_SGD, "nesterov": NESTEROV, "slowmo": SLOWMO,
     "fedadam": FEDADAM, "fedyogi": FEDYOGI})
#: The reducers a ``wire`` names (they read no option): the wires built in, entry points of the
#: group ``hpcopt.reducers``, ``reducers.register(name, piece)``.
reducers: Pieces[Reducer] = Pieces("wire", "hpcopt.reducers", {},
                                   {name: wire_piece(name) for name in WIRES})
