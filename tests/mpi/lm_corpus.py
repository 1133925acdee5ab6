"""A tiny word-level corpus in PTB's file layout, for fast language-model runs in tests."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def write_tiny_ptb(directory: Path, train_words: int = 3000, test_words: int = 400) -> Path:
    """ptb.{train,valid,test}.txt of a 30-word vocabulary with some structure (a word is
    often followed by the next one), 12 words a line."""
    rng = np.random.default_rng(0)
    directory.mkdir(parents=True, exist_ok=True)
    for split, count in (("train", train_words), ("valid", test_words), ("test", test_words)):
        ids = np.cumsum(rng.choice([1, 1, 1, 2, 7], size=count)) % 30
        words = [f"w{i}" for i in ids]
        lines = [" ".join(words[i:i + 12]) for i in range(0, count, 12)]
        (directory / f"ptb.{split}.txt").write_text("\n".join(lines) + "\n")
    return directory
