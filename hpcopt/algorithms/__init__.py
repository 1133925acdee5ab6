"""Distributed optimization algorithms: hyper-parameters, state, and one step at a time.

The authoring kit (docs/python.md, "Adding an algorithm"), in one place: ``option`` and
``context`` (an algorithm's fields), the state field kinds (``model``, ``vector``, ``shared``,
``counter``, ``scalar``, ``flag``, ``scratch``: what a checkpoint holds; the per-rank ones with
a rescale policy, ``SAME``, ``AVERAGE``, ``RESET`` or ``REFUSE``), ``DataParallelState``,
the data-parallel building blocks to subclass (``ScheduledSGD``, ``Rounds``, ``OuterOptions``,
``LocalSGD``), ``DATA_PARALLEL`` and ``PIPELINE`` (an algorithm's ``parallelism``) and
``registry()``. A module of this package holding a dataclass with a ``name`` is registered.
"""

from .base import DATA_PARALLEL, PIPELINE, Oracle, context, option, registry
from .data_parallel import AVERAGE_LABEL, DataParallelState, OuterOptions, Rounds, ScheduledSGD
from .local_sgd import LocalSGD
from .state import AVERAGE, REFUSE, RESET, SAME, counter, flag, model, scalar, scratch, shared, vector

__all__ = ["option", "context", "model", "vector", "shared", "counter", "scalar", "flag", "scratch",
           "SAME", "AVERAGE", "RESET", "REFUSE",
           "DataParallelState", "ScheduledSGD", "Rounds", "OuterOptions", "LocalSGD", "AVERAGE_LABEL",
           "DATA_PARALLEL", "PIPELINE", "Oracle", "registry"]
