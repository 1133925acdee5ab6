"""MinibatchSampler: shard indices only, once per epoch, fixed batch count, exact resume."""

import numpy as np
import pytest

from hpcopt.data.partition import iid_partition
from hpcopt.data.sampler import MinibatchSampler
from hpcopt.errors import HpcoptError
from tests.conftest import host


@pytest.fixture
def shard():
    return iid_partition(103, rank=1, size=3, seed=5)  # 34 scattered global indices


def take(sampler, count):
    return [sampler.next_batch() for _ in range(count)]


@pytest.mark.parametrize("batch_size", [1, 5, 7, 34])
def test_epochs_use_shard_indices_at_most_once_and_drop_the_tail(shard, batch_size):
    sampler = MinibatchSampler(shard, batch_size, seed=3, rank=1)
    assert sampler.batches_per_epoch == shard.size // batch_size
    for epoch in range(3):
        assert (sampler.epoch, sampler.position) == (epoch, 0)
        batches = take(sampler, sampler.batches_per_epoch)
        served = np.concatenate(batches)
        assert all(b.dtype == np.int64 and b.shape == (batch_size,) for b in batches)
        assert np.isin(served, shard).all()
        assert np.unique(served).size == served.size == sampler.batches_per_epoch * batch_size
    assert (sampler.epoch, sampler.position) == (3, 0)


def test_epochs_are_reshuffled_and_deterministic(shard):
    a = MinibatchSampler(shard, 10, seed=3, rank=1)
    b = MinibatchSampler(shard, 10, seed=3, rank=1)
    other_rank = MinibatchSampler(shard, 10, seed=3, rank=2)
    epoch0, epoch1 = take(a, 3), take(a, 3)
    assert all(np.array_equal(x, y) for x, y in zip(epoch0 + epoch1, take(b, 6)))
    assert not np.array_equal(np.concatenate(epoch0), np.concatenate(epoch1))
    assert not np.array_equal(epoch0[0], other_rank.next_batch())


def test_position_counts_batches_within_the_epoch(shard):
    sampler = MinibatchSampler(shard, 10, seed=0, rank=1)
    take(sampler, 2)
    assert (sampler.epoch, sampler.position) == (0, 2)
    take(sampler, 1)
    assert (sampler.epoch, sampler.position) == (1, 0)


def test_returned_batches_do_not_alias_the_cached_order(shard):
    sampler = MinibatchSampler(shard, 10, seed=0, rank=1)
    first = sampler.next_batch()
    first[:] = -1
    sampler.restore({**sampler.state(), "position": 0})
    assert (sampler.next_batch() >= 0).all()


@pytest.mark.parametrize("stop_after", [0, 1, 3, 4, 7])
def test_restore_continues_exactly(shard, stop_after):
    reference = MinibatchSampler(shard, 8, seed=11, rank=1)
    expected = take(reference, 12)
    original = MinibatchSampler(shard, 8, seed=11, rank=1)
    take(original, stop_after)
    resumed = MinibatchSampler(shard, 8, seed=11, rank=1)
    resumed.restore({key: np.int64(value) for key, value in original.state().items()})
    continued = take(resumed, 12 - stop_after)
    assert all(np.array_equal(x, y) for x, y in zip(expected[stop_after:], continued))


@pytest.mark.parametrize("batch_size, message", [
    (0, "batch size must be at least 1, got 0"),
    (-3, "batch size must be at least 1"),
    (35, r"batch size 35 is larger than the shard of rank 1 \(34 samples\)"),
])
def test_bad_batch_sizes_are_user_errors(shard, batch_size, message):
    with pytest.raises(HpcoptError, match=message):
        MinibatchSampler(shard, batch_size, seed=0, rank=1)


@pytest.mark.parametrize("change, message", [
    ({"position": 3}, r"position 3 is outside 0..2"),
    ({"position": -1}, "position -1"),
    ({"epoch": -1}, "epoch must be non-negative"),
    ({"epoch": 1.5}, "'epoch' must be an integer"),
    ({"epoch": True}, "'epoch' must be an integer"),
    ({"batch_size": 16}, "saved with batch_size 16, but this run has batch_size 10"),
    ({"seed": 1}, "saved with seed 1"),
    ({"rank": 0}, "saved with rank 0"),
    ({"shard_size": 33}, "saved with shard_size 33"),
    ({"extra": 0}, "keys"),
])
def test_restore_rejects_bad_states(shard, change, message):
    sampler = MinibatchSampler(shard, 10, seed=0, rank=1)
    with pytest.raises(HpcoptError, match=message):
        sampler.restore({**sampler.state(), **change})
    assert (sampler.epoch, sampler.position) == (0, 0)


def test_restore_rejects_missing_keys(shard):
    sampler = MinibatchSampler(shard, 10, seed=0, rank=1)
    with pytest.raises(HpcoptError, match="keys"):
        sampler.restore({"epoch": 0})


def test_placed_batches_are_the_same_batches_with_one_copy_an_epoch(shard, xp):
    """``next_batch_placed`` (the GPU path: the epoch's order copied to the device once) serves
    exactly ``next_batch``'s batches, and keeps doing so across a restore."""
    host_side, placed = (MinibatchSampler(shard, 7, seed=3, rank=1) for _ in range(2))
    copies = []

    def place(order):
        copies.append(len(order))
        return xp.asarray(order)

    batches = placed.batches_per_epoch
    for _ in range(2 * batches + 3):
        np.testing.assert_array_equal(host(placed.next_batch_placed(place)), host_side.next_batch())
    assert len(copies) == 3  # epochs 0, 1 and 2
    placed.restore(host_side.state())  # the same epoch: the placed order is still right
    np.testing.assert_array_equal(host(placed.next_batch_placed(place)), host_side.next_batch())
    placed.restore({**host_side.state(), "epoch": 7, "position": 0})
    expected = MinibatchSampler(shard, 7, seed=3, rank=1)
    expected.restore({**host_side.state(), "epoch": 7, "position": 0})
    np.testing.assert_array_equal(host(placed.next_batch_placed(place)), expected.next_batch())
    assert len(copies) == 4
