"""An emulated CuPy, for running hpcopt's GPU path on a machine without a GPU.

Put the folder above this package first on ``PYTHONPATH`` and ``import cupy`` finds it instead
of the real one: ``--device gpu``, the tests in tests/gpu and every test parametrized over
``xp`` then run here, in every process of an MPI job. It is a test double, never a result: its
"device" memory is host memory, and its numbers are NumPy's.

What it checks is what breaks first when NumPy code meets CuPy arrays:

- ``ndarray`` keeps its data out of reach of NumPy's implicit conversion (``__array__`` raises
  CuPy's TypeError), so ``np.asarray(device_array)``, h5py writing a device array, or a host
  array mixed into a device operation fails here as on a GPU;
- MPI sees only ``__cuda_array_interface__`` (no buffer protocol), like with CuPy, so Comm's
  device-buffer branches run; the pointer is host memory, which any MPI can read;
- every transfer between host and "device" is counted in ``transfers`` (``h2d``, ``d2h``,
  ``sync``), so a test can bound the host round-trips of a training step.

NumPy functions called on these arrays dispatch to NumPy through ``__array_function__`` and
``__array_ufunc__`` as they would to CuPy. Only what hpcopt and its tests use is emulated.
"""

from __future__ import annotations

import os
import sys
from collections import Counter
from typing import Any

import numpy as _np
from numpy.lib.mixins import NDArrayOperatorsMixin

__version__ = "0.0.0+emulated"
EMULATED = True

#: Host/device traffic since the last reset: copies each way and stream synchronizations.
transfers = {"h2d": 0, "d2h": 0, "sync": 0}
#: The same, by (kind, "file:line" of the caller outside this emulator and hpcopt.backend): where
#: the traffic comes from.
transfer_sites: Counter[tuple[str, str]] = Counter()

_HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_NUMPY_ONLY = frozenset({"tobytes", "tofile", "ctypes", "data", "__array_interface__",
                         "__array_struct__", "__buffer__", "dumps", "dump"})


def reset_transfers() -> None:
    for key in transfers:
        transfers[key] = 0
    transfer_sites.clear()


def _count(kind: str) -> None:
    transfers[kind] += 1
    frame = sys._getframe(1)
    while frame.f_code.co_filename.startswith(_HERE) or frame.f_code.co_filename.endswith(
            os.path.join("hpcopt", "backend.py")):  # hpcopt's backend only forwards
        frame = frame.f_back
    transfer_sites[kind, f"{frame.f_code.co_filename}:{frame.f_lineno}"] += 1


class ndarray(NDArrayOperatorsMixin):
    """A "device" array: a NumPy array NumPy itself is not allowed to convert implicitly."""

    __slots__ = ("_host",)

    def __init__(self, host: _np.ndarray) -> None:
        self._host = host

    # -- what MPI and NumPy see ---------------------------------------------------------------
    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        host = self._host
        return {"shape": host.shape, "typestr": host.dtype.str, "version": 3, "stream": None,
                "data": (host.ctypes.data, not host.flags.writeable),
                "strides": None if host.flags.c_contiguous else host.strides}

    def __array__(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError("Implicit conversion to a NumPy array is not allowed. "
                        "Please use `.get()` to construct a NumPy array explicitly.")

    def __array_ufunc__(self, ufunc: _np.ufunc, method: str, *inputs: Any, **kwargs: Any) -> Any:
        out = kwargs.get("out")
        if out is not None:
            kwargs["out"] = tuple(_device_operand(o) for o in out)
        result = getattr(ufunc, method)(*(_device_operand(i) for i in inputs), **kwargs)
        if out is not None and method != "at":  # the output arrays themselves (x /= n is x)
            return out[0] if len(out) == 1 else out
        return None if method == "at" else _wrap(result)

    def __array_function__(self, func: Any, types: Any, args: Any, kwargs: Any) -> Any:
        return _wrap(func(*_device_operands(args), **_device_operands(kwargs)))

    # -- the array API hpcopt uses -----------------------------------------------------------
    shape = property(lambda self: self._host.shape)
    dtype = property(lambda self: self._host.dtype)
    size = property(lambda self: self._host.size)
    ndim = property(lambda self: self._host.ndim)
    nbytes = property(lambda self: self._host.nbytes)
    itemsize = property(lambda self: self._host.itemsize)
    strides = property(lambda self: self._host.strides)
    flags = property(lambda self: self._host.flags)
    T = property(lambda self: ndarray(self._host.T))
    device = property(lambda self: cuda.Device())

    def __getitem__(self, key: Any) -> Any:
        return _wrap(self._host[_index(key)])

    def __setitem__(self, key: Any, value: Any) -> None:
        self._host[_index(key)] = _device_operand(value)

    def __len__(self) -> int:
        return len(self._host)

    def __iter__(self):
        return (ndarray(_np.asarray(row)) for row in self._host)

    def __getattr__(self, name: str) -> Any:
        if name in _NUMPY_ONLY or name.startswith("_"):
            raise AttributeError(f"'cupy.ndarray' has no attribute {name!r} (emulated)")
        attribute = getattr(self._host, name)
        if not callable(attribute):
            return _wrap(attribute)
        return lambda *args, **kwargs: _wrap(attribute(*_device_operands(args),
                                                       **_device_operands(kwargs)))

    # -- explicit and implicit copies to the host (each one counted) ---------------------------
    def get(self, stream: Any = None, out: _np.ndarray | None = None) -> _np.ndarray:
        return asnumpy(self, out=out)

    def set(self, array: _np.ndarray, stream: Any = None) -> None:
        _count("h2d")
        _np.copyto(self._host, array)

    def _scalar(self) -> Any:
        _count("d2h")
        return self._host

    def __float__(self) -> float:
        return float(self._scalar())

    def __int__(self) -> int:
        return int(self._scalar())

    def __bool__(self) -> bool:
        return bool(self._scalar())

    def __index__(self) -> int:
        return self._scalar().__index__()

    def item(self) -> Any:
        return self._scalar().item()

    def tolist(self) -> Any:
        return self._scalar().tolist()

    def __repr__(self) -> str:
        return f"emulated-device {self._host!r}"

    def __deepcopy__(self, memo: Any) -> ndarray:
        return ndarray(self._host.copy())


def _wrap(result: Any) -> Any:
    if isinstance(result, _np.ndarray):
        return ndarray(result)
    if isinstance(result, _np.generic):  # CuPy reductions give 0-d arrays, never scalars
        return ndarray(_np.asarray(result))
    if isinstance(result, tuple):
        return tuple(_wrap(r) for r in result)
    if isinstance(result, list):
        return [_wrap(r) for r in result]
    return result


def _device_operand(value: Any) -> Any:
    """The host array behind a device operand; a host array (not a scalar) is refused as CuPy
    refuses it."""
    if isinstance(value, ndarray):
        return value._host
    if isinstance(value, _np.ndarray) and value.ndim > 0:
        raise TypeError(f"Unsupported type {type(value)} (a host array in a device operation)")
    return value


def _device_operands(values: Any) -> Any:
    if isinstance(values, dict):
        return {key: _device_operands(value) for key, value in values.items()}
    if isinstance(values, (list, tuple)):
        return type(values)(_device_operands(value) for value in values)
    return _device_operand(values)


def _index(key: Any) -> Any:
    """An index into a device array: device arrays as they are, host index arrays copied over
    (as CuPy does, and counted)."""
    if isinstance(key, tuple):
        return tuple(_index(k) for k in key)
    if isinstance(key, ndarray):
        return key._host
    if isinstance(key, (_np.ndarray, list)):
        _count("h2d")
    return key


# -- module functions ---------------------------------------------------------------------------
def asarray(a: Any, dtype: Any = None, order: Any = None) -> ndarray:
    """A device array: ``a`` itself (or its cast) if it is one, else a copy from the host."""
    if isinstance(a, ndarray):
        return a if dtype is None or _np.dtype(dtype) == a.dtype else ndarray(a._host.astype(dtype))
    _count("h2d")
    return ndarray(_np.array(a, dtype=dtype, order=order or "K", copy=True))


def array(a: Any, dtype: Any = None, copy: bool = True, order: Any = "K") -> ndarray:
    if isinstance(a, ndarray):
        return ndarray(_np.array(a._host, dtype=dtype, copy=copy, order=order))
    return asarray(a, dtype=dtype, order=order)


def ascontiguousarray(a: Any, dtype: Any = None) -> ndarray:
    device = asarray(a, dtype=dtype)
    return ndarray(_np.ascontiguousarray(device._host))


def asnumpy(a: Any, stream: Any = None, out: _np.ndarray | None = None) -> _np.ndarray:
    """A host copy of ``a`` (into ``out`` when given); counted as a device-to-host copy."""
    if isinstance(a, ndarray):
        _count("d2h")
        if out is None:
            return a._host.copy()
        _np.copyto(out, a._host)
        return out
    return _np.asarray(a) if out is None else _np.copyto(out, a) or out


def get_array_module(*args: Any) -> Any:
    return sys.modules[__name__] if any(isinstance(a, ndarray) for a in args) else _np


class _DeviceFunction:
    """A NumPy function or ufunc taking and returning device arrays (host arrays refused)."""

    def __init__(self, function: Any) -> None:
        self._function = function

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return _wrap(self._function(*_device_operands(args), **_device_operands(kwargs)))

    def __getattr__(self, name: str) -> Any:  # ufunc methods: add.at, maximum.reduce, ...
        return _DeviceFunction(getattr(self._function, name))


class _Namespace:
    """A NumPy submodule (linalg, random, fft) whose functions work on device arrays."""

    def __init__(self, module: Any) -> None:
        self._module = module

    def __getattr__(self, name: str) -> Any:
        return _device_attribute(getattr(self._module, name))


def _device_attribute(attribute: Any) -> Any:
    if isinstance(attribute, type):  # dtypes and classes: float32, dtype, ...
        return attribute
    if callable(attribute):
        return _DeviceFunction(attribute)
    if type(attribute).__name__ == "module":
        return _Namespace(attribute)
    return attribute


from . import cuda  # noqa: E402  (cupy.cuda, which counts synchronizations in transfers)

linalg = _Namespace(_np.linalg)
random = _Namespace(_np.random)


def __getattr__(name: str) -> Any:
    if name.startswith("__"):
        raise AttributeError(name)
    return _device_attribute(getattr(_np, name))
