"""Token streams per rank and the truncated-BPTT windows a language model trains on.

``rank_streams`` gives rank r of N the r-th contiguous block of the corpus, cut into B parallel
streams (the columns of an (L, B) array, as in AWD-LSTM's ``batchify``). ``corpus_shard``
gives the other partitions: the training text is cut into chunks of consecutive tokens, each
labelled by the document (play) it starts in, and ``partition_indices`` deals the chunks; a
rank's tokens are its chunks in corpus order (``iid``: a random equal share of chunks;
``dirichlet`` / ``similarity``: few documents per rank, heterogeneous data). ``BpttSampler`` walks
those streams in order in windows of ``bptt`` steps: inputs ``streams[i:i+T]``, targets
``streams[i+1:i+1+T]`` for i = 0, bptt, 2 bptt, ... (the last window of an epoch may be
shorter), so the hidden state at the end of one window is the right start for the next. Its
position is two integers, so a resumed run continues with exactly the same windows.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from hpcopt.data.partition import partition_indices
from hpcopt.errors import HpcoptError

Array = Any


CHUNK_TOKENS = 1000  # tokens per chunk that the non-block partitions of a corpus deal out


def rank_streams(tokens: np.ndarray, batch_size: int, rank: int = 0, size: int = 1) -> np.ndarray:
    """(L, B) int64 array: rank ``rank``'s block of ``tokens`` (the first ``len % size`` ranks
    one token longer), trimmed to a multiple of B, column b = the b-th contiguous piece."""
    return streams_of(_block(tokens, rank, size), batch_size, rank, size)


def _block(tokens: np.ndarray, rank: int, size: int) -> np.ndarray:
    """Rank ``rank``'s contiguous block of ``tokens``, the first ``len % size`` one longer."""
    if size < 1 or not 0 <= rank < size:
        raise ValueError(f"rank {rank} is not in a communicator of size {size}")
    base, extra = divmod(len(tokens), size)
    start = rank * base + min(rank, extra)
    return np.asarray(tokens[start:start + base + (1 if rank < extra else 0)], dtype=np.int64)


def chunk_length(tokens: int, size: int) -> int:
    """``CHUNK_TOKENS``, shortened on small corpora so that there are >= 8 chunks per rank."""
    return max(1, min(CHUNK_TOKENS, tokens // (8 * size)))


def corpus_shard(tokens: np.ndarray, documents: np.ndarray, kind: str, rank: int, size: int,
                 seed: int, *, alpha: float | None = None,
                 similarity: float | None = None) -> np.ndarray:
    """Rank ``rank``'s training tokens under partition ``kind`` (see ``partition_indices``).

    ``block`` is ``rank_streams``' contiguous block. Otherwise chunk k is
    ``tokens[k c:(k + 1) c]`` with c = ``chunk_length``, its label the index of the document
    it starts in (``documents``: ascending start offsets, the first 0); the rank's chunks are
    concatenated in corpus order. Every token lands on exactly one rank.
    """
    if size > len(tokens):
        raise HpcoptError(f"{size} ranks but only {len(tokens)} training tokens: "
                          "every rank needs at least one")
    if kind == "block":
        return _block(tokens, rank, size)
    chunk = chunk_length(len(tokens), size)
    starts = np.arange(0, len(tokens), chunk)
    labels = np.searchsorted(np.asarray(documents), starts, side="right") - 1
    chosen = partition_indices(kind, starts.size, rank, size, seed, labels=labels, alpha=alpha,
                               similarity=similarity)
    return np.concatenate([np.asarray(tokens[s:s + chunk], dtype=np.int64) for s in starts[chosen]])


def streams_of(block: np.ndarray, batch_size: int, rank: int = 0, size: int = 1) -> np.ndarray:
    """(L, B) int64 array of one rank's tokens ``block``, trimmed to a multiple of B, column b =
    the b-th contiguous piece; ``rank`` and ``size`` only name the rank in the error."""
    if batch_size < 1:
        raise HpcoptError(f"batch size must be at least 1, got {batch_size}")
    block = np.asarray(block, dtype=np.int64)
    length = block.size // batch_size
    if length < 2:
        raise HpcoptError(f"the corpus is too small for one batch: rank {rank} of {size} holds "
                          f"{block.size} tokens, {batch_size} streams need at least "
                          f"{2 * batch_size} (one input and one target each)")
    return np.ascontiguousarray(block[: length * batch_size].reshape(batch_size, length).T)


class BpttSampler:
    """Windows (inputs, targets) of shape (T, B), T <= ``bptt``, over an (L, B) stream array.

    ``epoch`` is the pass the next window comes from and ``position`` the number of its windows
    already served; ``windows_per_epoch = ceil((L - 1) / bptt)``. ``streams`` may live on any
    device (windows are slices of it).
    """

    def __init__(self, streams: Array, bptt: int, rank: int = 0) -> None:
        if bptt < 1:
            raise HpcoptError(f"sequence length bptt must be at least 1, got {bptt}")
        if streams.ndim != 2 or streams.shape[0] < 2:
            raise HpcoptError(f"token streams must be (L >= 2, B), got shape {streams.shape}")
        self.streams, self.bptt, self.rank = streams, bptt, rank
        self.windows_per_epoch = -(-(streams.shape[0] - 1) // bptt)
        self.epoch = 0
        self.position = 0

    @property
    def batch_size(self) -> int:
        return int(self.streams.shape[1])

    def next_window(self) -> tuple[Array, Array]:
        """The next (inputs, targets) pair; targets are the inputs shifted by one token."""
        start = self.position * self.bptt
        stop = min(start + self.bptt, self.streams.shape[0] - 1)
        window = self.streams[start:stop], self.streams[start + 1:stop + 1]
        self.position += 1
        if self.position == self.windows_per_epoch:
            self.epoch += 1
            self.position = 0
        return window

    def state(self) -> dict[str, int]:
        """Where the sampler stands, plus the settings a resumed sampler must share."""
        return {"epoch": self.epoch, "position": self.position, "bptt": self.bptt,
                "stream_length": int(self.streams.shape[0]), "batch_size": self.batch_size,
                "rank": self.rank}

    def restore(self, state: dict) -> None:
        """Continue from ``state()``; HpcoptError if it is malformed or from other settings."""
        expected = self.state()
        if set(state) != set(expected):
            raise HpcoptError(f"BPTT sampler state has keys {sorted(state)}, "
                              f"expected {sorted(expected)}")
        for key, value in state.items():
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
                raise HpcoptError(f"BPTT sampler state {key!r} must be an integer, got {value!r}")
        for key in ("bptt", "stream_length", "batch_size", "rank"):
            if state[key] != expected[key]:
                raise HpcoptError(f"BPTT sampler state was saved with {key} {state[key]}, "
                                  f"but this run has {key} {expected[key]}")
        if state["epoch"] < 0 or not 0 <= state["position"] < self.windows_per_epoch:
            raise HpcoptError(f"BPTT sampler state (epoch {state['epoch']}, position "
                              f"{state['position']}) is outside 0..{self.windows_per_epoch - 1}")
        self.epoch, self.position = int(state["epoch"]), int(state["position"])
