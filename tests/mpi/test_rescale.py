"""Resuming a data-parallel run on another number of ranks (``resume --ranks-changed``), for
every data-parallel algorithm in the registry, N -> M in 4 -> 2, 2 -> 4 and 3 -> 4 (sub-communicators
of a 4-rank job), from a mid-round checkpoint; Streaming DiLoCo's fragments 4 -> 2 and 2 -> 3 from a
checkpoint with no reduction in flight (one with a reduction in flight is refused).

The reference, stated exactly: the carried-over run is bitwise an ordinary resume on M ranks of
an M-rank checkpoint that holds the N-rank checkpoint's averaged model, every per-rank field as its
declared policy gives it (``average``: the mean of the old ranks' values; ``reset``: a new run's;
``same``: rank 0's), the shared fields and communication counters as they were, the trace window
averaged, and every sampler at the first batch of epoch E + 1 of the new partition (E: the newest
epoch of any old rank)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from mpi4py import MPI

from hpcopt.algorithms import state as fields
from hpcopt.algorithms.base import DATA_PARALLEL
from hpcopt.algorithms.registration import names
from hpcopt.algorithms.streaming import FragmentSchedule
from hpcopt.comm import Comm
from hpcopt.config import Config, build_config
from hpcopt.errors import HpcoptError
from hpcopt.io.data_parallel_checkpoint import (
    SAMPLER_COLUMNS,
    Checkpoint,
    read_checkpoint,
    write_checkpoint,
)
from hpcopt.io.trace import read_trace
from hpcopt.run import train
from hpcopt.run.data_parallel import DataParallelSessionBuilder
from hpcopt.run.directory import checkpoint_path
from tests.conftest import host
from tests.runs import assert_same_state

pytestmark = pytest.mark.mpi

STEPS, TICK = 8, 6  # I = 4: the checkpoint at step 6 is mid-round, with a trace window open
BASE = {"dataset": "digits", "hidden": "16", "batch_size": "8", "dtype": "float64", "seed": "3",
        "steps": str(STEPS), "checkpoint_every": str(TICK), "keep_checkpoints": "10",
        "trace_every": "4", "progress": "false"}
CHANGES = [(4, 2), (2, 4), (3, 4)]
#: Streaming runs whose checkpoint at step TICK has no reduction in flight: DiLoCo (AdamW inner,
#: Nesterov outer per fragment) with overlap 0; overlap 1 with I = 5 (fragments sent after steps
#: 0 and 2 mod 5: none after step 6), sgd momentum averaged, FedAdam's moments per fragment; a
#: compressed wire (its error feedback per rank, reset; overlap 0 only).
STREAMING = {
    "diloco-fragments": {"algorithm": "diloco", "fragments": "2", "interval": "4"},
    "fedadam-overlap": {"algorithm": "prsgd", "outer_optimizer": "fedadam", "momentum": "0.9",
                        "fragments": "2", "overlap": "1", "interval": "5"},
    "int8-wire": {"algorithm": "prsgd", "momentum": "0.9", "fragments": "2", "wire": "int8",
                  "interval": "4"},
}
#: One whose checkpoint at step TICK has fragment 1's reduction in flight (sent after step 6).
IN_FLIGHT = {"algorithm": "diloco", "fragments": "2", "overlap": "1", "interval": "4"}


def algorithm_config(name: str, out: Path) -> Config:
    """A run of ``name`` (``algorithm+outer``: with that outer optimizer; a key of ``STREAMING``:
    those options): momentum 0.9 and I = 4 where it takes them (DiLoCo's AdamW takes no momentum,
    naive_clip averages every step)."""
    if name in STREAMING:
        return build_config(None, {**BASE, **STREAMING[name], "out": str(out)})
    name, _, outer = name.partition("+")
    chosen = {"algorithm": name, "out": str(out), **({"outer_optimizer": outer} if outer else {})}
    for extra in ({"momentum": "0.9", "interval": "4"}, {"interval": "4"}, {}):
        try:
            return build_config(None, {**BASE, **extra, **chosen})
        except HpcoptError:
            continue
    raise AssertionError(f"no small run of {name}")


def on_ranks(comm: Comm, size: int, work: Callable[[Comm], Any]) -> Any:
    """``work`` on a new Comm over ranks 0..size-1 (None on the others), then a barrier."""
    sub = comm.mpi.Split(0 if comm.rank < size else MPI.UNDEFINED, comm.rank)
    result = None
    if sub != MPI.COMM_NULL:
        inner = Comm(sub)
        try:
            result = work(inner)
        finally:
            inner.free()
            sub.Free()
    comm.mpi.Barrier()
    return result


def carried_over(ckpt: Checkpoint, policies: dict[str, str], fresh: dict[str, Any]) -> dict[str, Any]:
    """Each per-rank field of ``ckpt`` (read for every rank) as its policy carries it over:
    name -> the value every new rank holds."""
    tables = {**ckpt.counters, **ckpt.scalars,
              **{n: v for n, v in ckpt.rows.items() if n in policies}}
    values = {}
    for name, old in tables.items():
        if policies[name] == fields.AVERAGE:
            mean = np.mean(old, axis=0)
            values[name] = np.rint(mean) if old.dtype.kind == "i" else mean
        elif policies[name] == fields.RESET:
            values[name] = fresh[name]
        else:
            assert (old == old[0]).all(), name
            values[name] = old[0]
    return values


def reference_checkpoint(ckpt: Checkpoint, size: int, values: dict[str, Any],
                         samplers: list[dict[str, int]]) -> Checkpoint:
    """The M-rank checkpoint the module's docstring states."""
    def tiled(name: str, table: dict[str, np.ndarray]) -> np.ndarray:
        return np.repeat(np.asarray(values[name], dtype=table[name].dtype)[None], size, axis=0)

    epoch = int(ckpt.sampler[:, SAMPLER_COLUMNS.index("epoch")].max()) + 1
    sampler = np.array([[{**s, "epoch": epoch, "position": 0}[k] for k in SAMPLER_COLUMNS]
                        for s in samplers], dtype=np.int64)
    window = np.repeat(np.mean(ckpt.window, axis=0)[None], size, axis=0)
    window[:, 1:] = np.rint(window[:, 1:])
    return Checkpoint(config=ckpt.config, world_size=size, tick=ckpt.tick, run_id=ckpt.run_id,
                      trace_rows=ckpt.trace_rows, wall_seconds=ckpt.wall_seconds, layout=ckpt.layout,
                      model=ckpt.model, counters={n: tiled(n, ckpt.counters) for n in ckpt.counters},
                      sampler=sampler, window=window, comm=ckpt.comm,
                      rows={n: tiled(n, ckpt.rows) for n in ckpt.rows if n != "x"},
                      ranks=tuple(range(size)),
                      scalars={n: tiled(n, ckpt.scalars) for n in ckpt.scalars}, shared=ckpt.shared)


@pytest.mark.parametrize("old, new", CHANGES)
@pytest.mark.parametrize("algorithm", [*names(DATA_PARALLEL), "prsgd+fedadam"])  # an outer's moments
def test_a_run_resumed_on_another_number_of_ranks_is_the_stated_reference(comm, shared_dir, algorithm,
                                                                           old, new):
    if comm.size != 4:
        pytest.skip("needs 4 ranks (sub-communicators of 2, 3 and 4)")
    trained = shared_dir / "first"
    config = algorithm_config(algorithm, trained)
    on_ranks(comm, old, lambda c: train(config, c, verbose=False))
    assert read_checkpoint(checkpoint_path(trained, TICK)).world_size == old  # naive_clip: not mid-round
    assert_carried_over_as_the_reference(comm, shared_dir, algorithm, new)


@pytest.mark.parametrize("old, new", [(4, 2), (2, 3)])
@pytest.mark.parametrize("algorithm", list(STREAMING))
def test_a_streaming_run_with_nothing_in_flight_resumed_on_another_number_of_ranks_is_the_reference(
        comm, shared_dir, algorithm, old, new):
    if comm.size != 4:
        pytest.skip("needs 4 ranks (sub-communicators of 2, 3 and 4)")
    trained = shared_dir / "first"
    config = algorithm_config(algorithm, trained)
    on_ranks(comm, old, lambda c: train(config, c, verbose=False))
    ckpt = read_checkpoint(checkpoint_path(trained, TICK))
    options = config.algorithm  # the case stated: nothing in flight after step TICK
    fragments = tuple((p, p + 1) for p in range(options.fragments))
    assert not FragmentSchedule(fragments, options.interval, options.overlap, 1.0).in_flight(TICK)
    assert "in_flight" in ckpt.rows and ckpt.rows["in_flight"].any()  # what the ranks sent: reset
    assert not (ckpt.rows["x"] == ckpt.rows["x"][0]).all()  # the ranks' models differ
    assert_carried_over_as_the_reference(comm, shared_dir, algorithm, new)


@pytest.mark.parametrize("old, new", [(4, 2), (2, 3)])
def test_a_streaming_checkpoint_with_a_reduction_in_flight_is_refused(comm, shared_dir, old, new):
    if comm.size != 4:
        pytest.skip("needs 4 ranks (sub-communicators of 2, 3 and 4)")
    config = build_config(None, {**BASE, **IN_FLIGHT, "out": str(shared_dir / "first")})
    on_ranks(comm, old, lambda c: train(config, c, verbose=False))
    assert FragmentSchedule(((0, 1), (1, 2)), 4, 1, 1.0).in_flight(TICK) == [(1, TICK)]  # as stated
    path = checkpoint_path(shared_dir / "first", TICK)

    def refused(c: Comm) -> None:
        with pytest.raises(HpcoptError, match=f"a reduction was in flight at its step {TICK} .* resume it "
                                              f"on {old} \\(mpiexec -n {old}"):
            train(config, c, verbose=False, resume=path, ranks_changed=True)

    on_ranks(comm, new, refused)


def assert_carried_over_as_the_reference(comm: Comm, shared_dir: Path, algorithm: str, new: int) -> None:
    """The checkpoint at TICK of the run in ``shared_dir``/first, resumed on ``new`` ranks, is
    bitwise the module docstring's reference, and starts from the values it states."""
    first, reference = shared_dir / "first", shared_dir / "reference"
    config = algorithm_config(algorithm, first)
    path = checkpoint_path(first, TICK)
    ckpt = read_checkpoint(path)

    def restored(c: Comm) -> tuple[dict[str, Any], dict[str, int]]:
        """The policies' effect right after the restore, checked; (carried values, sampler)."""
        builder = DataParallelSessionBuilder(ranks_changed=True)
        part = builder.read_checkpoint(path, c)
        session = builder.build(ckpt.config, c, part)
        session.start(c)
        state = session.state
        policies = fields.rescale_policies(state)
        fresh = {n: host(getattr(state, n)).copy() for n in policies if getattr(state, n) is not None}
        session.restore(part)
        values = carried_over(ckpt, policies, fresh)
        np.testing.assert_array_equal(host(state.x), ckpt.model)  # the averaged model, exactly
        for name, value in values.items():
            np.testing.assert_array_equal(host(getattr(state, name)), value, err_msg=name)
        for name, value in ckpt.shared.items():
            np.testing.assert_array_equal(host(getattr(state, name)), value, err_msg=name)
        sampler = session.workload.problem.sampler.state()
        assert (sampler["epoch"], sampler["position"], sampler["rank"]) == \
            (ckpt.sampler[:, 0].max() + 1, 0, c.rank)
        return values, sampler

    def carried(c: Comm) -> Any:
        values, sampler = restored(c)
        samplers = c.mpi.allgather(sampler)
        if c.rank == 0:
            (reference / "checkpoints").mkdir(parents=True)
            write_checkpoint(checkpoint_path(reference, TICK),
                             reference_checkpoint(ckpt, c.size, values, samplers))
        c.mpi.Barrier()
        return train(config, c, verbose=False, resume=path, ranks_changed=True)

    def ordinary(c: Comm) -> Any:
        return train(algorithm_config(algorithm, reference), c, verbose=False,
                     resume=checkpoint_path(reference, TICK))

    done = on_ranks(comm, new, carried)
    expected = on_ranks(comm, new, ordinary)
    if comm.rank >= new:
        return
    (summary, state), (reference_summary, reference_state) = done, expected
    assert summary.steps == STEPS and not summary.stopped
    assert_same_state(state, reference_state)
    assert summary.final.loss == reference_summary.final.loss
    if comm.rank == 0:
        a, b = read_trace(first / "trace.h5"), read_trace(reference / "trace.h5")
        after = a.columns["step"] > TICK
        assert after.sum() == (b.columns["step"] > TICK).sum() > 0
        for name in set(a.columns) - {"wall"}:
            np.testing.assert_array_equal(a.columns[name][after], b.columns[name][b.columns["step"] > TICK],
                                          err_msg=name)
