"""Partitions: every rank's shard, together exactly range(n); sizes within one; iid seeded."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hpcopt.data.partition import (
    PARTITION_KINDS,
    block_partition,
    iid_partition,
    partition_indices,
)
from hpcopt.errors import UserError


def all_shards(kind, n, size, seed=0):
    return [partition_indices(kind, n, rank, size, seed) for rank in range(size)]


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 300), size=st.integers(1, 8), seed=st.integers(0, 2**32))
def test_shards_are_disjoint_cover_everything_and_balanced(n, size, seed):
    for kind in PARTITION_KINDS:
        if size > n:
            with pytest.raises(UserError, match="every rank needs at least one"):
                partition_indices(kind, n, 0, size, seed)
            continue
        shards = all_shards(kind, n, size, seed)
        assert all(shard.dtype == np.int64 for shard in shards)
        assert np.array_equal(np.sort(np.concatenate(shards)), np.arange(n))
        sizes = [shard.size for shard in shards]
        assert max(sizes) - min(sizes) <= 1
        assert sizes == sorted(sizes, reverse=True)  # the first n % size ranks get the extra
        assert sizes.count(n // size + 1) == n % size


def test_every_small_n_and_size_exhaustively():
    for n in range(1, 41):
        for size in range(1, min(n, 8) + 1):
            for kind in PARTITION_KINDS:
                shards = all_shards(kind, n, size, seed=n)
                assert np.array_equal(np.sort(np.concatenate(shards)), np.arange(n))
                assert max(map(len, shards)) - min(map(len, shards)) <= 1


@settings(max_examples=60, deadline=None)
@given(n=st.integers(0, 100), size=st.integers(1, 8))
def test_block_shards_are_contiguous_in_rank_order(n, size):
    shards = [block_partition(n, rank, size) for rank in range(size)]
    assert np.array_equal(np.concatenate(shards), np.arange(n))


def test_block_partition_example():
    assert [block_partition(10, rank, 4).tolist() for rank in range(4)] == [
        [0, 1, 2], [3, 4, 5], [6, 7], [8, 9],
    ]


def test_iid_is_deterministic_per_seed_sorted_and_not_blocks():
    first = [iid_partition(1000, rank, 4, seed=7) for rank in range(4)]
    again = [iid_partition(1000, rank, 4, seed=7) for rank in range(4)]
    other = [iid_partition(1000, rank, 4, seed=8) for rank in range(4)]
    assert all(np.array_equal(a, b) for a, b in zip(first, again))
    assert not any(np.array_equal(a, b) for a, b in zip(first, other))
    assert all(np.all(np.diff(shard) > 0) for shard in first)
    assert not np.array_equal(first[0], block_partition(1000, 0, 4))
    assert first[0].min() < 250 < first[0].max()  # spread over the whole range


def test_unknown_kind_lists_the_valid_ones():
    with pytest.raises(UserError, match="unknown partition 'dirichlet'.*block, iid"):
        partition_indices("dirichlet", 10, 0, 2, 0)


def test_more_ranks_than_samples_is_a_user_error():
    message = "^5 ranks but only 3 samples: every rank needs at least one"
    with pytest.raises(UserError, match=message):
        partition_indices("block", 3, 0, 5, 0)


@pytest.mark.parametrize("rank, size", [(-1, 2), (2, 2), (0, 0)])
def test_rank_outside_the_communicator_is_rejected(rank, size):
    with pytest.raises(ValueError, match="rank"):
        block_partition(10, rank, size)
