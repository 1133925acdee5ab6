"""Distributed optimization algorithms: hyper-parameters, state, and one step at a time.

The authoring kit (docs/python.md, "Adding an algorithm"), in one place: ``option`` and
``context`` (an algorithm's fields) and ``option_fields`` (a class's options), the state field
kinds (``model``, ``vector``, ``shared``, ``counter``, ``scalar``, ``flag``, ``scratch``: what
a checkpoint holds; the per-rank ones with a rescale policy, ``SAME``, ``AVERAGE``, ``RESET`` or
``REFUSE``), ``DataParallelState``, the data-parallel building blocks to subclass
(``ScheduledSGD``, ``Rounds``, ``OuterOptions``, ``LocalSGD``), ``DataParallelAlgorithm`` (what
the runner calls), ``DATA_PARALLEL`` and ``PIPELINE`` (an algorithm's ``parallelism``), and the
registry: ``register(cls)`` for an algorithm of your own (or an entry point of the group
``ENTRY_POINT_GROUP``, ``hpcopt.algorithms``), ``registry()`` the classes by name
(``hpcopt.algorithms.registration``).
"""

from .base import DATA_PARALLEL, PIPELINE, DataParallelAlgorithm, Oracle, context, option, option_fields
from .data_parallel import AVERAGE_LABEL, DataParallelState, OuterOptions, Rounds, ScheduledSGD
from .local_sgd import LocalSGD
from .registration import ENTRY_POINT_GROUP, register, registry
from .state import AVERAGE, REFUSE, RESET, SAME, counter, flag, model, scalar, scratch, shared, vector

__all__ = ["option", "context", "option_fields", "model", "vector", "shared", "counter", "scalar", "flag",
           "scratch", "SAME", "AVERAGE", "RESET", "REFUSE",
           "DataParallelState", "ScheduledSGD", "Rounds", "OuterOptions", "LocalSGD", "AVERAGE_LABEL",
           "DataParallelAlgorithm", "DATA_PARALLEL", "PIPELINE", "Oracle",
           "register", "registry", "ENTRY_POINT_GROUP"]
