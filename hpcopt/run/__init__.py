"""Running a workload on every rank: ``train`` picks the data-parallel or the pipeline session
(by the algorithm's parallelism) and hands it to the runner (``hpcopt.run.runner``)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..comm import Comm
    from ..config import Config
    from ..problems.staged import StagedProblem
    from ..workload import Workload
    from .faults import FaultPlan


def train(config: Config | None = None, comm: Comm | None = None, verbose: bool = True,
          resume: str | Path | None = None, faults: FaultPlan | None = None,
          workload: Workload | StagedProblem | None = None,
          ranks_changed: bool = False) -> tuple[Any, Any]:
    """Train with ``config`` (default: ``Config()``, PR-SGD on MNIST-5k); the summary and this
    rank's final algorithm state.

    ``workload``: a data-parallel ``hpcopt.Workload`` (e.g. from ``hpcopt.torch``) or,
    for the pipeline algorithms, a ``StagedProblem``, in place of the one the config's [data]
    and [model] sections describe. ``resume``: a checkpoint to continue from bit for bit.
    Files go to ``config.run.out`` (empty, the default here: none; the command line defaults
    to ``runs/{time}``). ``faults``: a debug fault to inject (hpcopt.run.faults).
    ``ranks_changed``: ``resume`` may be a data-parallel checkpoint of another number of ranks
    (hpcopt.run.rescale); a pipeline run's stages are its ranks, so it refuses.

    Data-parallel algorithms (PR-SGD, CELGC, the naive clipping baseline, SlowMo or any other
    registered one) return (``data_parallel.Summary``, the state); pipeline algorithms (PPRS,
    pipelined GD and AGD: one rank per stage) return (``PipelineSummary``, the stage's state).
    At the end of a data-parallel run every rank holds the averaged model. Failure handling
    (docs/failures.md): checks before the first step (hpcopt.run.preflight), the stall watchdog
    (``stall_timeout``), NaN/Inf (``on_nonfinite``), SIGTERM (a checkpoint, then
    ``summary.stopped``; on the command line also SIGINT, ``hpcopt.run.signals``).
    """
    from ..comm import Comm
    from ..config import Config, pipeline_algorithms
    from ..errors import HpcoptError
    from ..problems.staged import StagedProblem
    from ..workload import Workload

    config = config or Config()
    comm = comm or Comm()
    pipeline = config.algorithm.algorithm in pipeline_algorithms()
    if pipeline and ranks_changed:  # every rank has the same config: all raise it
        raise HpcoptError(f"--ranks-changed: a pipeline run's stages are its ranks "
                          f"(--algorithm {config.algorithm.algorithm}): resume it on as many ranks "
                          "as wrote its checkpoint", everywhere=True)
    if pipeline and (workload is None or isinstance(workload, StagedProblem)):
        from .pipeline import train_pipeline

        return train_pipeline(config, comm, verbose, resume, problem=workload, faults=faults)
    if not pipeline and (workload is None or isinstance(workload, Workload)):
        from .data_parallel import train_data_parallel

        return train_data_parallel(config, comm, verbose, resume, faults, workload, ranks_changed)
    wanted = "a StagedProblem" if pipeline else "an hpcopt.Workload"
    raise HpcoptError(f"--algorithm {config.algorithm.algorithm} trains {wanted}, "
                      f"not a {type(workload).__name__}")
