"""Partitions: every rank's shard, together exactly range(n); sizes within one; iid seeded."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hpcopt.data.partition import (
    PARTITION_KINDS,
    block_partition,
    dirichlet_partition,
    iid_partition,
    partition_indices,
    similarity_partition,
)
from hpcopt.errors import HpcoptError

BALANCED_KINDS = ("block", "iid")


def all_shards(kind, n, size, seed=0, **options):
    return [partition_indices(kind, n, rank, size, seed, **options) for rank in range(size)]


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 300), size=st.integers(1, 8), seed=st.integers(0, 2**32))
def test_shards_are_disjoint_cover_everything_and_balanced(n, size, seed):
    for kind in BALANCED_KINDS:
        if size > n:
            with pytest.raises(HpcoptError, match="every rank needs at least one"):
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
            for kind in BALANCED_KINDS:
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
    assert PARTITION_KINDS == ("block", "iid", "dirichlet", "similarity")
    valid = ", ".join(PARTITION_KINDS)
    with pytest.raises(HpcoptError, match=f"unknown partition 'pathological'.*{valid}"):
        partition_indices("pathological", 10, 0, 2, 0)


def test_more_ranks_than_samples_is_a_user_error():
    message = "^5 ranks but only 3 samples: every rank needs at least one"
    with pytest.raises(HpcoptError, match=message):
        partition_indices("block", 3, 0, 5, 0)


@pytest.mark.parametrize("rank, size", [(-1, 2), (2, 2), (0, 0)])
def test_rank_outside_the_communicator_is_rejected(rank, size):
    with pytest.raises(ValueError, match="rank"):
        block_partition(10, rank, size)


# -- label-skewed partitions ---------------------------------------------------------------------

labels_strategy = st.builds(
    lambda n, classes, seed: np.random.default_rng(seed).integers(0, classes, size=n),
    st.integers(1, 300), st.integers(1, 10), st.integers(0, 2**16))


def assert_exact_cover_non_empty(shards, n):
    assert all(shard.dtype == np.int64 and shard.size > 0 for shard in shards)
    assert all(np.all(np.diff(shard) > 0) for shard in shards)
    assert np.array_equal(np.sort(np.concatenate(shards)), np.arange(n))


@settings(max_examples=80, deadline=None)
@given(labels=labels_strategy, size=st.integers(1, 8), seed=st.integers(0, 2**32),
       alpha=st.sampled_from([1e-4, 0.01, 0.1, 0.5, 1.0, 100.0]))
def test_dirichlet_shards_cover_everything_once_and_none_is_empty(labels, size, seed, alpha):
    if size > labels.size:
        with pytest.raises(HpcoptError, match="every rank needs at least one"):
            partition_indices("dirichlet", labels.size, 0, size, seed, labels=labels, alpha=alpha)
        return
    shards = all_shards("dirichlet", labels.size, size, seed, labels=labels, alpha=alpha)
    assert_exact_cover_non_empty(shards, labels.size)


@settings(max_examples=80, deadline=None)
@given(labels=labels_strategy, size=st.integers(1, 8), seed=st.integers(0, 2**32),
       s=st.sampled_from([0.0, 0.1, 0.5, 0.9, 1.0]))
def test_similarity_shards_cover_everything_once_balanced_and_non_empty(labels, size, seed, s):
    if size > labels.size:
        return
    shards = all_shards("similarity", labels.size, size, seed, labels=labels, similarity=s)
    assert_exact_cover_non_empty(shards, labels.size)
    sizes = [shard.size for shard in shards]
    assert max(sizes) - min(sizes) <= 1


def class_counts(labels, shard, classes=10):
    return np.bincount(labels[shard], minlength=classes)


def test_small_alpha_gives_few_classes_per_rank_large_alpha_nearly_iid():
    labels = np.repeat(np.arange(10), 100)
    skewed = [class_counts(labels, dirichlet_partition(labels, r, 4, 0.01, seed=3))
              for r in range(4)]
    # each class goes (almost) entirely to one rank: the other ranks hold at most the dealt sample
    assert all(np.sort(column)[-2] <= 1 for column in np.array(skewed).T)
    even = np.array([class_counts(labels, dirichlet_partition(labels, r, 4, 1e4, seed=3))
                     for r in range(4)])
    assert np.all(np.abs(even - 25) <= 3)


def test_similarity_zero_is_label_sorted_and_one_is_iid():
    labels = np.repeat(np.arange(4), 25)  # 100 samples, 4 classes
    sorted_split = [similarity_partition(labels, r, 4, 0.0, seed=1) for r in range(4)]
    assert [np.unique(labels[shard]).tolist() for shard in sorted_split] == [[0], [1], [2], [3]]
    iid_split = [class_counts(labels, similarity_partition(labels, r, 4, 1.0, seed=1), 4)
                 for r in range(4)]
    assert all(np.count_nonzero(counts) >= 3 for counts in iid_split)
    half = [similarity_partition(labels, r, 4, 0.5, seed=1) for r in range(4)]
    # 52 samples (13 of each class) in the common pool: 13 per rank; 12 of its own class each
    own = [class_counts(labels, shard, 4)[r] for r, shard in enumerate(half)]
    assert all(count >= 12 for count in own)


def test_label_partitions_are_deterministic_and_depend_on_the_seed():
    labels = np.random.default_rng(0).integers(0, 5, size=300)
    for kind, option in (("dirichlet", {"alpha": 0.3}), ("similarity", {"similarity": 0.3})):
        first = all_shards(kind, 300, 3, 5, labels=labels, **option)
        again = all_shards(kind, 300, 3, 5, labels=labels, **option)
        other = all_shards(kind, 300, 3, 6, labels=labels, **option)
        assert all(np.array_equal(a, b) for a, b in zip(first, again))
        assert not all(np.array_equal(a, b) for a, b in zip(first, other))


@pytest.mark.parametrize("options, message", [
    ({"kind": "dirichlet", "alpha": 0.0}, "alpha must be a positive number"),
    ({"kind": "dirichlet", "alpha": -1.0}, "alpha must be a positive number"),
    ({"kind": "dirichlet", "alpha": float("nan")}, "alpha must be a positive number"),
    ({"kind": "dirichlet"}, "needs the training labels and a value for alpha"),
    ({"kind": "similarity", "similarity": 1.5}, r"similarity s must be in \[0, 1\]"),
    ({"kind": "similarity", "similarity": -0.1}, r"similarity s must be in \[0, 1\]"),
    ({"kind": "similarity"}, "needs the training labels and a value for similarity"),
    ({"kind": "similarity", "similarity": 0.5, "labels": np.zeros(3, dtype=int)},
     "3 labels for 10"),
    ({"kind": "dirichlet", "alpha": 1.0, "labels": np.zeros(10)}, "1-D integer array"),
])
def test_bad_label_partition_arguments_are_user_errors(options, message):
    options = dict(options)
    kind = options.pop("kind")
    options.setdefault("labels", np.arange(10) % 3)
    with pytest.raises(HpcoptError, match=message):
        partition_indices(kind, 10, 0, 2, 0, **options)


def test_unused_partition_options_are_ignored():
    labels = np.arange(10) % 2
    assert np.array_equal(partition_indices("iid", 10, 0, 2, 0, labels=labels, alpha=-1.0),
                          iid_partition(10, 0, 2, 0))
