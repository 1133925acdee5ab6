"""Open MPI's launcher adds banners to a failed job's stderr; the suite's line counts skip them."""

from tests.launcher import rank_lines

OPEN_MPI_EXIT_2 = """hpcopt: error: lr must be > 0, got -1.0
--------------------------------------------------------------------------
prterun detected that one or more processes exited with non-zero status,
thus causing the job to be terminated. The first process to do so was:

   Process name: [prterun-vm-20938@1,0]
   Exit code:    2
--------------------------------------------------------------------------
[vm:20938] PMIX ERROR: PMIX_ERR_UNREACH in file pmix_server.c at line 3146
"""


def test_open_mpi_s_banners_are_not_the_ranks_lines():
    assert rank_lines(OPEN_MPI_EXIT_2) == ["hpcopt: error: lr must be > 0, got -1.0"]


def test_every_line_a_rank_printed_is_kept():
    text = "hpcopt: error: one\n\n[rank 1] Traceback (most recent call last):\n  line\n"
    assert rank_lines(text) == ["hpcopt: error: one", "[rank 1] Traceback (most recent call last):",
                                "  line"]
