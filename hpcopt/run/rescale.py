"""A data-parallel checkpoint of N ranks carried over to M (``hpcopt resume --ranks-changed``).

Every new rank starts from the checkpoint's averaged model (``/model/flat``), exactly; a
mid-round checkpoint's per-rank models are dropped. The ``shared`` fields are the same on every
rank and carry over as they are. Each per-rank field of the algorithm's state follows the policy
its declaration names (``hpcopt.algorithms.state``):

- ``same``: equal on every old rank (the step and round counters at a checkpoint): every new
  rank takes it; a checkpoint where the old ranks differ is refused;
- ``average``: the mean over the old ranks (momentum, AdamW's moments, batch-norm statistics;
  computed in float64, rounded to the field's dtype, an integer to the nearest);
- ``reset``: the value a new run starts with (the wire's error feedback, the last step's
  clipping flag and norm);
- ``refuse``: meaningless on another count: the resume is refused.

A checkpoint taken with a reduction in flight (a streaming run's fragment, ``--overlap`` > 0:
the algorithm's ``in_flight`` at the checkpoint's counters) is refused: that reduction sums
what each old rank sent, which the new ranks cannot post again. With none in flight, what a
streaming run's ranks sent (``in_flight``) is never read again, and it is reset.

Outside the state: the data are partitioned anew for M ranks (the run is built for M), and the
samplers are re-seeded: every new rank r starts epoch E + 1, E the newest epoch of any old rank,
at its first batch, so its draws come from the fresh stream (seed, "sampler", r, E + 1). The
trace window in progress is averaged over the old ranks like a field (its row's mean loss over
ranks is kept), and rank 0's communication counters continue. A problem's per-rank state (an
LSTM's hidden state, a torch module's integer buffers) has no meaning for another partition: such
a checkpoint is refused.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np

from ..algorithms import state as fields
from ..errors import HpcoptError
from ..io.data_parallel_checkpoint import HIDDEN, SAMPLER_COLUMNS, Checkpoint

#: The policies in the order the resume's line names them, with the word it uses.
_SAID = ((fields.AVERAGE, "averaged"), (fields.RESET, "reset"), (fields.SAME, "kept"))


def rescaled(ckpt: Checkpoint, size: int, rank: int, state: Any, sampler: dict[str, int],
             to_host: Callable[[Any], np.ndarray] = np.asarray, *,
             in_flight: Callable[[Any], bool]) -> tuple[Checkpoint, str]:
    """``ckpt`` (read for every one of its ranks) as rank ``rank``'s part of a checkpoint of
    ``size`` ranks, and the line that says what became of each field. ``state`` is the new run's
    freshly built state (its fields' policies, and the values ``reset`` restores); ``sampler``
    this rank's sampler state (``Sampler.state()``: its shard of the new partition); ``to_host``
    copies a state array to a NumPy array (the backend's); ``in_flight`` the algorithm's: whether
    a reduction is in flight after a state's step. Raises
    HpcoptError (one line) where the checkpoint cannot be carried over."""
    path, old = ckpt.path, ckpt.world_size
    if len(ckpt.ranks) != old:
        raise ValueError("rescaled() needs the checkpoint read for every rank")
    if HIDDEN in ckpt.rows:
        raise HpcoptError(f"{path}: its ranks carry problem state (an LSTM's hidden state, a torch "
                          f"module's integer buffers) that has no meaning on {size} ranks: resume it "
                          f"on {old} (mpiexec -n {old} ...)")
    if tuple(SAMPLER_COLUMNS) != tuple(sampler):
        raise HpcoptError(f"{path}: only a minibatch sampler is re-seeded for {size} ranks")
    policies = fields.rescale_policies(state)
    refused = [name for name, policy in policies.items()
               if policy == fields.REFUSE and (name in ckpt.rows or name in ckpt.counters
                                                or name in ckpt.scalars)]
    if refused:
        raise HpcoptError(f"{path}: its {', '.join(refused)} cannot be carried over to {size} ranks "
                          f"(this algorithm's state there is per rank): resume it on {old} "
                          f"(mpiexec -n {old} ...)")
    model_fields = fields.fields_of(state, fields.MODEL)
    rows = {name: _vector(path, name, values, policies[name], to_host(getattr(state, name)))
            for name, values in ckpt.rows.items() if name not in model_fields}
    counters = {name: _number(path, name, values, policies[name], getattr(state, name), size)
                for name, values in ckpt.counters.items()}
    scalars = {name: _number(path, name, values, policies[name], getattr(state, name), size)
               for name, values in ckpt.scalars.items()}
    _refuse_in_flight(ckpt, size, in_flight(dataclasses.replace(
        state, **{name: int(values[0]) for name, values in counters.items()})))
    epoch = int(ckpt.sampler[:, SAMPLER_COLUMNS.index("epoch")].max()) + 1
    row = {**sampler, "epoch": epoch, "position": 0}
    reseeded = np.array([[r if key == "rank" else row[key] for key in SAMPLER_COLUMNS]
                         for r in range(size)], dtype=np.int64)
    window = np.repeat(ckpt.window.mean(axis=0, keepdims=True), size, axis=0)
    window[:, 1:] = np.rint(window[:, 1:])  # steps (equal on every rank) and clipped steps: counts
    carried = dataclasses.replace(ckpt, world_size=size, ranks=(rank,), rows=rows, counters=counters,
                                  scalars=scalars, sampler=reseeded, window=window)
    dropped = [name for name in model_fields if name in ckpt.rows]
    return carried, _line(ckpt, size, policies, [*rows, *counters, *scalars], dropped, epoch)


def _refuse_in_flight(ckpt: Checkpoint, size: int, busy: bool) -> None:
    """HpcoptError where a reduction was in flight at ``ckpt``'s step (``busy``)."""
    if busy:
        old = ckpt.world_size
        raise HpcoptError(f"{ckpt.path}: a reduction was in flight at its step {ckpt.tick} (a streaming "
                          f"fragment's, --overlap > 0), summing what each of its {old} ranks sent, which "
                          f"{size} ranks cannot send again: resume it on {old} (mpiexec -n {old} ...), "
                          "or carry over a checkpoint at a step with none in flight")


def _vector(path: Any, name: str, values: np.ndarray, policy: str, fresh: np.ndarray) -> np.ndarray:
    """One per-rank vector's new row (1, w) by its policy."""
    if policy == fields.AVERAGE:
        return values.mean(axis=0, dtype=np.float64, keepdims=True).astype(values.dtype)
    if policy == fields.RESET:
        return fresh.astype(values.dtype).reshape(1, -1)
    if not (values == values[0]).all():
        raise HpcoptError(f"{path}: its ranks' {name} differ, and {name} is carried over only "
                          "when it is the same on every rank")
    return values[:1]


def _number(path: Any, name: str, values: np.ndarray, policy: str, fresh: Any,
            size: int) -> np.ndarray:
    """One per-rank number's new column (size,) by its policy."""
    if policy == fields.AVERAGE:
        mean = values.mean(dtype=np.float64)
        value = np.rint(mean) if values.dtype.kind in "iu" else mean
    elif policy == fields.RESET:
        value = float(fresh)
    elif (values == values[0]).all():
        value = values[0]
    else:
        raise HpcoptError(f"{path}: its ranks' {name} differ ({', '.join(map(str, values))}), and "
                          f"{name} is carried over only when it is the same on every rank")
    return np.full(size, value, dtype=values.dtype)


def _line(ckpt: Checkpoint, size: int, policies: dict[str, str], names: list[str],
          dropped: list[str], epoch: int) -> str:
    """The one line a resume on another number of ranks prints."""
    said = [f"{word} {', '.join(n for n in names if policies[n] == policy)}"
            for policy, word in _SAID if any(policies[n] == policy for n in names)]
    said += [f"dropped the ranks' own {name} (mid-round)" for name in dropped]
    return (f"hpcopt: carrying a checkpoint of {ckpt.world_size} rank(s) over to {size}: the averaged "
            f"model as it is; {'; '.join(said)}; data partitioned for {size}, samplers re-seeded at "
            f"epoch {epoch}")
