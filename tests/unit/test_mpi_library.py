"""The MPI library's name is stored in every trace and checkpoint and printed by ``info``."""

import h5py
import pytest
from mpi4py import MPI

from hpcopt.comm.mpi_support import mpi_library
from hpcopt.run.checkpointing import written_by

OPEN_MPI = ("Open MPI v5.0.11, package: Open MPI user@localhost Distribution, ident: 5.0.11, "
            "repo rev: v5.0.11rc1, Sep 16, 2026\x00")


@pytest.mark.parametrize("reported,expected", [
    (OPEN_MPI, OPEN_MPI[:-1]),
    ("MPICH Version:      5.0.2\nMPICH Release date: unreleased\n", "MPICH Version: 5.0.2"),  # padding collapsed
    ("\x00", "unknown MPI library"),
])
def test_the_library_line_is_printable(monkeypatch, reported, expected):
    monkeypatch.setattr(MPI, "Get_library_version", lambda: reported)
    assert mpi_library() == expected


def test_open_mpi_s_nul_byte_does_not_reach_hdf5(monkeypatch, tmp_path):
    # h5py refuses a string attribute with an embedded NUL: this killed every run on Open MPI
    monkeypatch.setattr(MPI, "Get_library_version", lambda: OPEN_MPI)
    with h5py.File(tmp_path / "f.h5", "w") as f:
        f.attrs.update(written_by())
    with h5py.File(tmp_path / "f.h5", "r") as f:
        assert f.attrs["mpi_library"] == OPEN_MPI[:-1]
