"""Partitions of a corpus: chunks labelled by document, dealt by ``partition_indices``; every
token on exactly one rank, no rank empty; and ``corpus_fraction`` keeping each document's head."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hpcopt.data.bptt import chunk_length, corpus_shard, rank_streams, streams_of
from hpcopt.data.text import Corpus, shrink_train
from hpcopt.errors import HpcoptError

KINDS = [("iid", {}), ("block", {}), ("dirichlet", {"alpha": 1e-3}), ("dirichlet", {"alpha": 0.1}),
         ("dirichlet", {"alpha": 10.0}), ("similarity", {"similarity": 0.0}),
         ("similarity", {"similarity": 0.3}), ("similarity", {"similarity": 1.0})]


def positions(n, documents, kind, size, seed, options):
    """Each rank's shard of the corpus 0..n-1 (token value = its position)."""
    tokens = np.arange(n)
    return [corpus_shard(tokens, documents, kind, r, size, seed, **options) for r in range(size)]


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 5000), size=st.integers(1, 8), documents=st.integers(1, 12),
       seed=st.integers(0, 2**16), kind=st.sampled_from(KINDS))
def test_every_token_lands_on_exactly_one_rank_and_no_shard_is_empty(n, size, documents, seed,
                                                                     kind):
    starts = np.unique(np.linspace(0, n, documents, endpoint=False).astype(np.int64))
    name, options = kind
    if size > n:
        with pytest.raises(HpcoptError, match="every rank needs at least one"):
            positions(n, starts, name, size, seed, options)
        return
    shards = positions(n, starts, name, size, seed, options)
    assert all(shard.size > 0 for shard in shards)
    assert np.array_equal(np.sort(np.concatenate(shards)), np.arange(n))
    assert all(np.all(np.diff(shard) > 0) for shard in shards)  # corpus order kept


def test_block_is_the_contiguous_block_of_rank_streams():
    tokens = np.arange(1003)
    for rank in range(3):
        expected = rank_streams(tokens, 4, rank, 3)
        got = streams_of(corpus_shard(tokens, np.array([0]), "block", rank, 3, 0), 4, rank, 3)
        assert np.array_equal(got, expected)


def test_chunks_are_whole_runs_and_small_alpha_gives_few_documents_per_rank():
    n, size = 200_000, 4
    starts = np.arange(0, n, 10_000)  # 20 documents of 10 chunks
    chunk = chunk_length(n, size)
    assert chunk == 1000
    iid_docs, skew_docs = [], []
    for kind, options, docs in (("iid", {}, iid_docs), ("dirichlet", {"alpha": 0.01}, skew_docs)):
        for shard in positions(n, starts, kind, size, 0, options):
            assert np.all(shard.reshape(-1, chunk)[:, 0] % chunk == 0)  # whole, aligned chunks
            docs.append(np.unique(np.searchsorted(starts, shard, side="right")).size)
    assert min(iid_docs) >= 18 and np.mean(skew_docs) < 8


def test_shrink_train_keeps_the_head_of_every_document():
    train = np.arange(100)
    corpus = Corpus("c", "char", ("a",), train, train[:5], train[:5], (0, 10, 60))
    small = shrink_train(corpus, 0.25)
    assert small.train.tolist() == [*range(0, 3), *range(10, 23), *range(60, 70)]
    assert small.documents == (0, 3, 16)
    assert small.valid is corpus.valid and not small.train.flags.writeable


def test_a_corpus_smaller_than_one_batch_is_a_user_error():
    with pytest.raises(HpcoptError, match="too small for one batch: rank 2 of 3 holds 5 tokens"):
        streams_of(np.arange(5), 3, 2, 3)
