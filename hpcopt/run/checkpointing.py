"""The collective parts of a checkpoint: every rank's part meets on rank 0, which writes the
file (``hpcopt.io.data_parallel_checkpoint``, ``hpcopt.io.pipeline_checkpoint``: the formats,
host arrays in and out), and each rank takes its own part back from a file read for it.

Data-parallel (``save``, ``restore``): the small per-rank tables (counters, sampler rows,
scalars and flags, the trace window) are gathered, and per-rank vectors arrive one rank at a
time (rank 0 holds one model in memory, not N), as the algorithm's state declares them
(``hpcopt.algorithms.state``). Pipeline (``save_pipeline``, ``restore_pipeline``): each stage
sends its parameter block and state. Either way every message is on the label "checkpoint", and
the ranks then agree on whether the file was written (an allgather: a failed write ends every
rank with one line).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..algorithms import state as fields
from ..algorithms.pprs import PipelineState
from ..backend import Backend
from ..comm import Comm, OpCounter, agreed
from ..comm.mpi_support import library_versions
from ..config import Config
from ..errors import HpcoptError
from ..flat import ParamLayout
from ..io import pipeline_checkpoint as pipe_ckpt
from ..io import versions
from ..io.data_parallel_checkpoint import (
    HIDDEN,
    Checkpoint,
    CheckpointWriter,
    CommRow,
    sampler_columns,
)
from ..io.pipeline_checkpoint import NUMBER_TYPES, PipelineCheckpoint, StageRecord

LABEL = "checkpoint"
_TAG, _PIPELINE_TAG = 7301, 7401
#: The kinds of a pipeline stage's numbers (``pipe_ckpt.NUMBER_TYPES``).
NUMBER_KINDS = (fields.COUNTER, fields.SCALAR, fields.FLAG)


def written_by() -> dict[str, str]:
    """The software a run's files name as their writer: hpcopt's and its libraries' versions
    (``hpcopt.io.versions``) and its MPI's."""
    return {**versions(), **library_versions()}


@dataclass
class Position:
    """Where a run stands when a checkpoint is taken (the file's root attributes)."""

    config: Config
    layout: ParamLayout
    tick: int                 # the algorithm's clock
    run_id: str
    trace_rows: int           # rows of the run's trace on disk
    wall_seconds: float


@dataclass(frozen=True)
class RankNumbers:
    """A rank's numbers as a checkpoint stores them: its counters and sampler row (``ints``,
    int64) and its scalars and flags (``reals``, float64), in the order of their names."""

    counters: tuple[str, ...]
    scalars: tuple[str, ...]  # scalars and flags
    ints: np.ndarray
    reals: np.ndarray

    def unpacked(self, ints: np.ndarray, reals: np.ndarray | None
                 ) -> tuple[dict[str, np.ndarray], np.ndarray, dict[str, np.ndarray]]:
        """Every rank's ``ints`` and ``reals``, gathered (a row per rank), as a checkpoint holds
        them: the counters, the sampler rows, the scalars and flags (none when ``reals`` is None)."""
        scalars = {n: reals[:, i] for i, n in enumerate(self.scalars)} if reals is not None else {}
        return {n: ints[:, i] for i, n in enumerate(self.counters)}, ints[:, len(self.counters):], scalars


def rank_numbers(state: Any, sampler_state: dict[str, int], config: Config) -> RankNumbers:
    """This rank's counters, sampler position, scalars and flags (``RankNumbers``)."""
    counters = fields.numbers(state, fields.COUNTER)
    reals = {**fields.numbers(state, fields.SCALAR), **fields.numbers(state, fields.FLAG)}
    ints = np.array([*counters.values(), *(sampler_state[k] for k in sampler_columns(config))], np.int64)
    return RankNumbers(tuple(counters), tuple(reals), ints, np.array(list(reals.values()), np.float64))


def save(path: Path, comm: Comm, at: Position, state: Any, *, synchronized: bool, model: Any,
         sampler: Any, window: np.ndarray, hidden: Any = None,
         before_commit: Callable[[], None] | None = None) -> None:
    """Collective (every rank, at the same clock tick): rank 0 writes ``path`` atomically.

    ``state`` is saved as its class declares (``hpcopt.algorithms.state``); ``model`` is the
    averaged model (every rank holds it), and each rank's model field is stored only when the
    ranks' models differ (not ``synchronized``). ``hidden`` (an LSTM's state) is this rank's
    flat vector, stored for every rank when given. Rank 0's communication counters are stored
    after all of this checkpoint's traffic. ``before_commit`` runs on rank 0 just before the
    file is published (a debug fault, hpcopt.run.faults).
    """
    to_host = comm.backend.to_host
    numbers = rank_numbers(state, sampler.state(), at.config)
    all_ints = comm.gather(numbers.ints, LABEL)
    all_reals = comm.gather(numbers.reals, LABEL) if numbers.scalars else None
    all_window = comm.gather(window, LABEL)
    vectors = {name: getattr(state, name) for name in fields.present(state, fields.VECTOR)}
    if not synchronized:
        vectors = {name: getattr(state, name) for name in fields.fields_of(state, fields.MODEL)} | vectors
    if hidden is not None:
        vectors[HIDDEN] = hidden
    names = list(vectors)
    if comm.rank != 0:
        copies = [to_host(vectors[n]) for n in names]
        comm.waitall([comm.isend(c, 0, _TAG + i, LABEL) for i, c in enumerate(copies)], LABEL)
        agreed(lambda: None, comm, LABEL)
        return
    if all_ints is None or all_window is None:  # gathered to rank 0, where this runs
        raise RuntimeError("Comm.gather returned no rows on its root, rank 0")
    counters, sampler_rows, scalars = numbers.unpacked(all_ints, all_reals)
    ckpt = Checkpoint(config=at.config, world_size=comm.size, tick=at.tick, run_id=at.run_id,
                      trace_rows=at.trace_rows, wall_seconds=at.wall_seconds, layout=at.layout,
                      model=to_host(model), counters=counters, sampler=sampler_rows, window=all_window,
                      scalars=scalars,
                      shared={n: to_host(getattr(state, n)) for n in fields.present(state, fields.SHARED)})
    widths = {n: int(vectors[n].size) for n in names}
    failure: HpcoptError | None = None
    with CheckpointWriter(path, ckpt, names, widths, written_by()) as writer:
        for i, name in enumerate(names):  # received whole even after a failed write
            writer.row(name, 0, to_host(vectors[name]))
            buffer = np.empty(widths[name], dtype=ckpt.model.dtype)
            for source in range(1, comm.size):
                comm.waitall([comm.irecv_(buffer, source, _TAG + i, LABEL)], LABEL)
                writer.row(name, source, buffer)
        if before_commit is not None:
            before_commit()
        try:
            writer.commit(with_agreement(comm.stats.stored_rows(), comm.in_node))
        except HpcoptError as exc:
            failure = exc
    agreed(lambda: _raise(failure), comm, LABEL)


def with_agreement(rows: list[CommRow], in_node: bool) -> list[CommRow]:
    """Rank 0's communication counters as they stand once the checkpoint's last collective is
    done: the allgather (label "checkpoint", no payload; on a communicator within one node when
    ``in_node``) in which every rank learns whether the file was written, so that a failed
    write ends every rank with one line. A resumed run continues from these, as the
    uninterrupted run continues after that allgather."""
    counted = {(row[0], row[1]): row for row in rows}
    _, _, calls, nbytes, seconds, node_calls, node_bytes = counted.get(
        ("allgather", LABEL), ("allgather", LABEL, 0, 0, 0.0, 0, 0))
    counted[("allgather", LABEL)] = ("allgather", LABEL, calls + 1, nbytes, seconds,
                                     node_calls + int(in_node), node_bytes)
    return [counted[key] for key in sorted(counted)]


def _raise(failure: HpcoptError | None) -> None:
    if failure is not None:
        raise failure


def restore(ckpt: Checkpoint, rank: int, state: Any, sampler: Any, backend: Backend,
            load_hidden: Any = None) -> np.ndarray:
    """Put this rank's part of ``ckpt`` (read for ``rank``) into a fresh run's ``state`` (every
    field its class declares); returns the trace window to continue. Everything is checked
    before anything changes, so a refusal (HpcoptError) leaves the run as it was built."""
    path, row = ckpt.path, ckpt.ranks.index(rank)
    model_fields = fields.fields_of(state, fields.MODEL)
    wanted = {name: getattr(state, name) for name in fields.present(state, fields.VECTOR)}
    stored = {name: values for name, values in ckpt.rows.items() if name not in (HIDDEN, *model_fields)}
    for name in sorted(set(wanted) ^ set(stored)):
        raise HpcoptError(f"{path}: ranks/{name} is {'missing' if name in wanted else 'unexpected'}")
    shared = {name: getattr(state, name) for name in fields.present(state, fields.SHARED)}
    for name in sorted(set(shared) ^ set(ckpt.shared)):
        raise HpcoptError(f"{path}: shared/{name} is {'missing' if name in shared else 'unexpected'}")
    for name, values in [*stored.items(), *((n, v[None]) for n, v in ckpt.shared.items())]:
        target = wanted[name] if name in wanted else shared[name]  # one holds it: checked above
        if values.shape[1] != target.size:
            raise HpcoptError(f"{path}: its {name} has {values.shape[1]} values, "
                              f"this run needs {target.size}")
    for table, kinds in (("counters", (fields.COUNTER,)), ("scalars", (fields.SCALAR, fields.FLAG))):
        missing = set(fields.fields_of(state, *kinds)) - set(getattr(ckpt, table))
        if missing:
            raise HpcoptError(f"{path}: /ranks/{table} lacks {', '.join(sorted(missing))}")
    try:
        sampler.restore(dict(zip(sampler_columns(ckpt.config), (int(v) for v in ckpt.sampler[rank]))))
    except HpcoptError as exc:  # the sampler knows the numbers, not the file they came from
        raise HpcoptError(f"{path}: /ranks/sampler row {rank}: {exc}") from None
    if HIDDEN in ckpt.rows:  # checked before anything else changes: it can refuse too
        if load_hidden is None:
            raise HpcoptError(f"{path}: it holds per-rank problem state (ranks/hidden: an LSTM's "
                              "hidden state, a torch module's integer buffers) this run has no use for")
        load_hidden(ckpt.rows[HIDDEN][row])
    for name in model_fields:
        getattr(state, name)[...] = backend.asarray(ckpt.rows[name][row] if name in ckpt.rows else ckpt.model)
    for name, target in wanted.items():
        target[...] = backend.asarray(ckpt.rows[name][row])
    for name, target in shared.items():
        target[...] = backend.asarray(ckpt.shared[name])
    fields.load_numbers(state, fields.COUNTER, {n: v[rank] for n, v in ckpt.counters.items()})
    for kind in (fields.SCALAR, fields.FLAG):
        fields.load_numbers(state, kind, {n: v[rank] for n, v in ckpt.scalars.items()})
    return ckpt.window[rank].copy()


def restore_counters(rows: list[CommRow], comm: Comm) -> None:
    """Continue the communication counters from a checkpoint's ``rows`` (rank 0's, on every rank), so
    the trace's cumulative columns go on as in the uninterrupted run. Called just before the
    first step: the resumed process's own start-up traffic is not part of them."""
    comm.stats.reset()
    for op, label, calls, nbytes, seconds, node_calls, node_bytes in rows:
        comm.stats.counters[(op, label)] = OpCounter(calls, nbytes, seconds, node_calls, node_bytes)


def _stage_numbers(state: PipelineState) -> dict[str, float]:
    return {name: value for kind in NUMBER_KINDS for name, value in fields.numbers(state, kind).items()}


def save_pipeline(path: Path, comm: Comm, config: Config, layout: ParamLayout, block: Any,
                  block_slice: slice, state: PipelineState, window: np.ndarray, tick: int, run_id: str,
                  trace_rows: int, wall_seconds: float,
                  before_commit: Callable[[], None] | None = None) -> None:
    """Collective: every stage sends its parameter block and state to rank 0, which writes
    ``path`` atomically. ``window`` is this rank's ``pipe_ckpt.WINDOW_COLUMNS``.
    ``before_commit`` runs on rank 0 just before the file is published (a debug fault's hook)."""
    to_host = comm.backend.to_host
    names = fields.present(state, fields.VECTOR)  # the same on every stage: one algorithm
    numbers = _stage_numbers(state)
    header = np.array([block_slice.start, block_slice.stop, state.x.size, *numbers.values(),
                       *window], dtype=np.float64)
    mine = [np.ascontiguousarray(to_host(block)),
            *(np.ascontiguousarray(to_host(getattr(state, n))) for n in names)]
    if comm.rank != 0:
        requests = [comm.isend(header, 0, _PIPELINE_TAG, LABEL)]
        requests += [comm.isend(v, 0, _PIPELINE_TAG + 1 + i, LABEL) for i, v in enumerate(mine)]
        comm.waitall(requests, LABEL)
        agreed(lambda: None, comm, LABEL)
        return
    headers, stages = [header], [mine]
    for source in range(1, comm.size):
        h = np.empty_like(header)
        comm.waitall([comm.irecv_(h, source, _PIPELINE_TAG, LABEL)], LABEL)
        sizes = [int(h[1] - h[0])] + [int(h[2])] * len(names)
        vectors = [np.empty(n, dtype=mine[0].dtype) for n in sizes]
        comm.waitall([comm.irecv_(v, source, _PIPELINE_TAG + 1 + i, LABEL) for i, v in enumerate(vectors)],
                     LABEL)
        headers.append(h)
        stages.append(vectors)
    model = np.empty(layout.size, dtype=mine[0].dtype)
    records = []
    for h, vectors in zip(headers, stages):
        start, stop = int(h[0]), int(h[1])
        model[start:stop] = vectors[0]
        records.append(StageRecord((start, stop), dict(zip(names, vectors[1:])),
                                   {name: NUMBER_TYPES[name](v) for name, v in zip(numbers, h[3:])}))
    ckpt = PipelineCheckpoint(config, comm.size, tick, run_id, trace_rows, wall_seconds, model,
                              records, np.stack([h[3 + len(numbers):] for h in headers]))
    agreed(lambda: pipe_ckpt.write(path, ckpt, layout, with_agreement(comm.stats.stored_rows(), comm.in_node),
                                   written_by(), before_commit), comm, LABEL)


def restore_pipeline(ckpt: PipelineCheckpoint, rank: int, block: Any, block_slice: slice,
                     state: PipelineState, backend: Any) -> np.ndarray:
    """Put stage ``rank``'s part of ``ckpt`` into a fresh run (its whole parameter block and
    its optimizer state); returns this rank's trace window row. HpcoptError when it does not fit."""
    record = ckpt.stages[rank]
    if record.block != (block_slice.start, block_slice.stop):
        raise HpcoptError(f"{ckpt.path}: stage {rank} holds parameters {list(record.block)}, this "
                          f"run's stage {rank} holds [{block_slice.start}, {block_slice.stop}]")
    names = fields.present(state, fields.VECTOR)
    if sorted(record.vectors) != sorted(names):
        raise HpcoptError(f"{ckpt.path}: stage {rank} holds {sorted(record.vectors)}, this "
                          f"algorithm needs {sorted(names)}")
    for name in names:
        target = getattr(state, name)
        if record.vectors[name].shape != target.shape:
            raise HpcoptError(f"{ckpt.path}: stage {rank}'s {name} has shape "
                              f"{record.vectors[name].shape}, expected {target.shape}")
    block[...] = backend.asarray(ckpt.model[block_slice])
    for name in names:
        getattr(state, name)[...] = backend.asarray(record.vectors[name])
    for kind in NUMBER_KINDS:
        fields.load_numbers(state, kind, record.numbers)
    return ckpt.window[rank].copy()
