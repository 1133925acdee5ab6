"""Distributed optimization algorithms: hyper-parameters, state, and one step at a time.

The authoring kit (docs/python.md, "Adding an algorithm"), in one place: ``option`` and
``context`` (an algorithm's fields) and ``option_fields`` (a class's options), the state field
kinds (``model``, ``vector``, ``shared``, ``counter``, ``scalar``, ``flag``, ``scratch``: what
a checkpoint holds; the per-rank ones with a rescale policy, ``SAME``, ``AVERAGE``, ``RESET`` or
``REFUSE``), ``DataParallelState``, the data-parallel building blocks to subclass
(``ScheduledSGD``, ``Rounds``, ``RestartedSGD``: PR-SGD's rounds without the outer options,
``OuterOptions``, ``LocalSGD``), ``DataParallelAlgorithm`` (what the runner calls),
``DATA_PARALLEL`` and ``PIPELINE`` (an algorithm's ``parallelism``), and the registry:
``register(cls)`` for an algorithm of your own (or an entry point of the group
``ENTRY_POINT_GROUP``, ``hpcopt.algorithms``), ``registry()`` the classes by name
(``hpcopt.algorithms.registration``).

The pieces of a round: their protocols (``Inner``, ``Outer``, ``Reducer``, ``Timing`` and
``RoundCalls``, what a timing calls in the round), their registries (``inner_optimizers``,
``outer_optimizers``, ``reducers``: ``hpcopt.algorithms.kinds``) with ``Piece``,
``PieceOptions`` and the checks ``positive`` and ``fraction``, ``WHOLE`` (a reducer's part: the
whole model), the labels of a round's communication (``AVERAGE_LABEL``, ``GROUP_LABEL``,
``NODE_LABEL``, ``FRAGMENT_LABEL``, ``MOMENTUM_LABEL``, ``SECOND_MOMENT_LABEL``,
``BUFFERS_LABEL``), ``HpcoptError`` (what a check raises: one line for the user) and
``array_module`` (NumPy or CuPy, the module of an array: GPU code).
"""

from ..backend import array_module
from ..comm.core import GROUP_LABEL
from ..comm.wire_nodes import NODE_LABEL
from ..errors import HpcoptError
from .base import DATA_PARALLEL, PIPELINE, DataParallelAlgorithm, Oracle, context, option, option_fields
from .buffers import BUFFERS_LABEL
from .data_parallel import AVERAGE_LABEL, DataParallelState, OuterOptions, Rounds, ScheduledSGD
from .inner import Inner
from .kinds import inner_optimizers, outer_optimizers, reducers
from .local_sgd import LocalSGD, RestartedSGD
from .momentum import MOMENTUM_LABEL, SECOND_MOMENT_LABEL
from .outer import Outer
from .pieces import Piece, PieceOptions, fraction, positive
from .reducers import WHOLE, Reducer
from .registration import ENTRY_POINT_GROUP, register, registry
from .state import AVERAGE, REFUSE, RESET, SAME, counter, flag, model, scalar, scratch, shared, vector
from .streaming import FRAGMENT_LABEL
from .when import RoundCalls, Timing

__all__ = ["option", "context", "option_fields", "model", "vector", "shared", "counter", "scalar", "flag",
           "scratch", "SAME", "AVERAGE", "RESET", "REFUSE",
           "DataParallelState", "ScheduledSGD", "Rounds", "OuterOptions", "LocalSGD", "AVERAGE_LABEL",
           "DataParallelAlgorithm", "DATA_PARALLEL", "PIPELINE", "Oracle",
           "register", "registry", "ENTRY_POINT_GROUP", "RestartedSGD",
           "Inner", "Outer", "Reducer", "Timing", "RoundCalls", "Piece", "PieceOptions", "positive",
           "fraction", "inner_optimizers", "outer_optimizers", "reducers", "WHOLE",
           "GROUP_LABEL", "NODE_LABEL", "FRAGMENT_LABEL", "MOMENTUM_LABEL", "SECOND_MOMENT_LABEL",
           "BUFFERS_LABEL", "HpcoptError", "array_module"]
