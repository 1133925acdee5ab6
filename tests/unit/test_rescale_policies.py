"""Rescale policies are declared with every per-rank state field, and a checkpoint that cannot be
carried over to another number of ranks is refused in one line (hpcopt.run.rescale)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np
import pytest

from hpcopt.algorithms import state as fields
from hpcopt.algorithms.data_parallel import DataParallelState
from hpcopt.algorithms.inner import Sgd, declared
from hpcopt.errors import HpcoptError
from hpcopt.io.data_parallel_checkpoint import HIDDEN, read_checkpoint
from hpcopt.run.rescale import rescaled
from tests.checkpoints import small_checkpoint


def test_a_per_rank_field_must_declare_a_known_rescale_policy():
    with pytest.raises(TypeError, match="rescale"):
        fields.vector()  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="unknown rescale policy 'mean'"):
        fields.counter("mean")

    @dataclass
    class Undeclared:
        velocity: object = field(default=None, metadata={fields.KIND: fields.VECTOR})

    with pytest.raises(TypeError, match="Undeclared.velocity is per rank but declares no rescale policy"):
        fields.rescale_policies(Undeclared)
    assert fields.rescale_policies(SgdState)["momentum"] == fields.AVERAGE


@pytest.fixture
def two_ranks(tmp_path):
    """The small 1-rank checkpoint (momentum, mid-round) as if written by 2 ranks."""
    ckpt = read_checkpoint(small_checkpoint(tmp_path / "run"))

    def twice(table):
        return {name: np.concatenate([values, values]) for name, values in table.items()}

    return dataclasses.replace(ckpt, world_size=2, ranks=(0, 1), rows=twice(ckpt.rows),
                               counters=twice(ckpt.counters), scalars=twice(ckpt.scalars),
                               sampler=np.concatenate([ckpt.sampler, ckpt.sampler]),
                               window=np.concatenate([ckpt.window, ckpt.window]))


#: The state of a run with inner sgd: DataParallelState and sgd's momentum buffer it declares.
SgdState = fields.declaring(DataParallelState, declared(Sgd(momentum=0.9)))


def fresh_state(ckpt):
    return SgdState(x=np.zeros_like(ckpt.model), momentum=np.zeros_like(ckpt.model))


def idle(state):
    """An algorithm's ``in_flight`` with nothing ever in flight (blocking rounds)."""
    return False


def sampler_row(ckpt):
    return dict(zip(("epoch", "position", "batch_size", "shard_size", "seed", "rank"),
                    map(int, ckpt.sampler[0])))


def test_counters_that_differ_between_the_ranks_are_refused(two_ranks):
    two_ranks.counters["rounds"][1] += 1
    with pytest.raises(HpcoptError, match=r"ranks' rounds differ \(1, 2\)"):
        rescaled(two_ranks, 3, 0, fresh_state(two_ranks), sampler_row(two_ranks), in_flight=idle)


def test_per_rank_problem_state_is_refused(two_ranks):
    two_ranks.rows[HIDDEN] = np.zeros((2, 4), dtype=two_ranks.model.dtype)
    with pytest.raises(HpcoptError, match="problem state .* resume it on 2"):
        rescaled(two_ranks, 3, 0, fresh_state(two_ranks), sampler_row(two_ranks), in_flight=idle)


def test_the_line_says_what_became_of_each_field(two_ranks):
    two_ranks.rows["momentum"][1] += 1.0
    carried, line = rescaled(two_ranks, 3, 2, fresh_state(two_ranks), sampler_row(two_ranks),
                             in_flight=idle)
    assert line == ("hpcopt: carrying a checkpoint of 2 rank(s) over to 3: the averaged model as it is; "
                    "averaged momentum; kept step, rounds, steps_in_round; dropped the ranks' own x "
                    "(mid-round); data partitioned for 3, samplers re-seeded at epoch 1")
    assert carried.world_size == 3 and carried.ranks == (2,) and "x" not in carried.rows
    old = two_ranks.rows["momentum"].astype(np.float64)  # the mean in float64, rounded to the dtype
    np.testing.assert_array_equal(carried.rows["momentum"][0], ((old[0] + old[1]) / 2).astype(np.float32))
    assert carried.sampler[:, 0].tolist() == [1, 1, 1] and carried.sampler[:, -1].tolist() == [0, 1, 2]


def test_a_checkpoint_with_a_reduction_in_flight_is_refused_and_one_without_carries_over(two_ranks):
    """The algorithm's ``in_flight`` is asked at the checkpoint's counters (a streaming run with
    overlap: in flight after some steps, not others)."""
    tick = int(two_ranks.counters["step"][0])
    asked = []

    def in_flight_at(step):
        def in_flight(state):
            asked.append(state.step)
            return state.step == step
        return in_flight

    with pytest.raises(HpcoptError, match=rf"in flight at its step {tick} .*resume it on 2 \(mpiexec -n 2"):
        rescaled(two_ranks, 3, 0, fresh_state(two_ranks), sampler_row(two_ranks),
                 in_flight=in_flight_at(tick))
    carried, _ = rescaled(two_ranks, 3, 0, fresh_state(two_ranks), sampler_row(two_ranks),
                          in_flight=in_flight_at(tick + 1))
    assert asked == [tick, tick] and carried.world_size == 3


def test_a_field_declared_refuse_is_refused(two_ranks):
    RefusingState = fields.declaring(SgdState, (("sent", fields.VECTOR, fields.REFUSE),))
    two_ranks.rows["sent"] = np.zeros((2, 3), dtype=two_ranks.model.dtype)
    state = RefusingState(x=np.zeros_like(two_ranks.model), momentum=np.zeros_like(two_ranks.model),
                          sent=np.zeros(3))
    with pytest.raises(HpcoptError, match="its sent cannot be carried over to 3 ranks.*resume it on 2"):
        rescaled(two_ranks, 3, 0, state, sampler_row(two_ranks), in_flight=idle)
