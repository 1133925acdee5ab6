"""Bad input for clipping, partitions and language models: one line from rank 0, exit 2 on
every rank (``mpiexec -n 2 python -m hpcopt train ...``)."""

from __future__ import annotations

import pytest

from tests.command_line import assert_one_line_error, launch
from tests.mpi.lm_corpus import write_tiny_ptb

LM = ["--dataset", "shakespeare", "--model", "lstm", "--hidden", "8"]


@pytest.mark.parametrize("args,fragments", [
    (["--algorithm", "celgc", "--gamma", "0"], ["gamma must be > 0"]),
    (["--algorithm", "naive_clip", "--gamma", "-2"], ["gamma must be > 0"]),
    (["--algorithm", "celgc", "--gamma", "1", "--lr", "0"], ["lr"]),
    (["--algorithm", "naive_clip", "--gamma", "1", "--lr", "-3"], ["lr"]),
    (["--partition", "dirichlet", "--alpha", "0"], ["alpha > 0"]),
    (["--partition", "dirichlet", "--alpha", "-0.5"], ["alpha > 0"]),
    (["--algorithm", "celgc", "--participation", "0"], ["participation fraction must be in (0, 1]"]),
    (["--algorithm", "celgc", "--participation", "1.5"], ["participation fraction must be in (0, 1]"]),
    ([*LM, "--bptt", "0"], ["bptt must be >= 1"]),
    ([*LM, "--bptt", "-4"], ["bptt must be >= 1"]),
    ([*LM, "--corpus-fraction", "0"], ["corpus_fraction must be in (0, 1]"]),
    ([*LM, "--corpus-fraction", "1.5"], ["corpus_fraction must be in (0, 1]"]),
    (["--corpus-fraction", "0.5"], ["corpus_fraction applies only to the text corpora"]),
])
def test_bad_clipping_partition_and_sequence_input(args, fragments):
    assert_one_line_error(launch(["train", *args]), *fragments)


@pytest.mark.parametrize("partition", [[], ["--partition", "dirichlet", "--alpha", "0.1"]])
def test_a_corpus_smaller_than_one_batch(tmp_path, partition):
    directory = write_tiny_ptb(tmp_path / "ptb", train_words=300, test_words=50)
    result = launch(["train", "--dataset", "ptb", "--path", str(directory), "--model", "lstm",
                     "--hidden", "8", "--batch-size", "200", *partition])
    assert_one_line_error(result, "too small for one batch")
