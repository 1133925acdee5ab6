"""hpcopt.flat.ParamLayout: sizes, offsets, and zero-copy views that write through."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from hpcopt.backend import CPU, get_backend
from hpcopt.flat import ParamLayout
from tests.conftest import data_pointer, host


@pytest.fixture
def layout() -> ParamLayout:
    return ParamLayout.of(w1=(3, 4), b1=(4,), w2=(4, 2), b2=(2,))


def test_size_names_and_offsets(layout):
    assert layout.size == 12 + 4 + 8 + 2
    assert layout.names == ["w1", "b1", "w2", "b2"]
    assert layout.slices() == {
        "w1": slice(0, 12), "b1": slice(12, 16), "w2": slice(16, 24), "b2": slice(24, 26),
    }


def test_from_items_equals_of_and_normalises_shapes():
    a = ParamLayout.of(w=(2, 3), b=(3,))
    b = ParamLayout.from_items([("w", [np.int64(2), 3.0]), ("b", (3,))])
    assert a == b
    assert b.entries == (("w", (2, 3)), ("b", (3,)))
    assert all(type(n) is int for _, shape in b.entries for n in shape)


def test_scalar_and_empty_shapes():
    lay = ParamLayout.of(scale=(), empty=(0, 5), v=(3,))
    assert lay.size == 1 + 0 + 3
    assert lay.slices() == {"scale": slice(0, 1), "empty": slice(1, 1), "v": slice(1, 4)}
    flat = np.arange(4.0)
    views = lay.views(flat)
    assert views["scale"].shape == () and views["empty"].shape == (0, 5)
    views["scale"][...] = 42.0
    assert flat[0] == 42.0


def backend_of(xp):
    return CPU if xp is np else get_backend("gpu")


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_zeros(layout, dtype, xp):
    flat = layout.zeros(backend_of(xp), dtype)
    assert isinstance(flat, xp.ndarray)
    assert flat.shape == (layout.size,) and flat.dtype == dtype
    assert not bool(flat.any())


def test_views_are_zero_copy_at_the_right_offsets(layout, xp):
    flat = layout.zeros(backend_of(xp), np.float32)
    base = data_pointer(flat)
    views = layout.views(flat)
    assert list(views) == layout.names
    for (name, shape), s in zip(layout.entries, layout.slices().values()):
        v = views[name]
        assert isinstance(v, xp.ndarray) and v.shape == shape and v.dtype == flat.dtype
        assert xp.shares_memory(v, flat)
        assert data_pointer(v) == base + s.start * flat.itemsize
        assert not v.flags.owndata


def test_views_write_through_both_ways(layout, xp):
    flat = layout.zeros(backend_of(xp), np.float64)
    views = layout.views(flat)
    views["w2"][1, 0] = 7.0          # view -> flat
    views["b1"] += 1.0               # in-place update through the view
    xp.multiply(views["w1"], 0.0, out=views["w1"])
    assert float(flat[16 + 1 * 2 + 0]) == 7.0
    np.testing.assert_array_equal(host(flat[12:16]), 1.0)
    assert float(flat.sum()) == 7.0 + 4.0
    flat[24:26] = xp.asarray([3.0, 4.0])  # flat -> view
    np.testing.assert_array_equal(host(views["b2"]), [3.0, 4.0])
    flat *= 2.0                      # an in-place op on the flat buffer (e.g. average_)
    assert float(views["w2"][1, 0]) == 14.0


def test_duplicate_names_rejected():
    with pytest.raises(ValueError, match="duplicate"):
        ParamLayout.from_items([("w", (2,)), ("b", (1,)), ("w", (3,))])


def test_negative_dimension_rejected():
    with pytest.raises(ValueError, match="negative"):
        ParamLayout.of(w=(2, -1))


@pytest.mark.parametrize("make", [
    lambda n: np.zeros(n - 1),
    lambda n: np.zeros(n + 1),
    lambda n: np.zeros((1, n)),
    lambda n: np.zeros((n, 1)),
    lambda n: np.zeros(()),
])
def test_wrong_buffer_shape_rejected(layout, make):
    with pytest.raises(ValueError, match="layout needs"):
        layout.views(make(layout.size))


def test_layout_is_immutable(layout):
    with pytest.raises(dataclasses.FrozenInstanceError):
        layout.entries = ()
