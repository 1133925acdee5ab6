"""CIFAR-10 binary batches: small files written by the test, strict checks, NCHW images."""

import numpy as np
import pytest

from hpcopt.data.cifar import RECORD_BYTES, TEST_FILE, TRAIN_FILES, read_cifar10_batch
from hpcopt.data.datasets import as_images, load_dataset
from hpcopt.errors import HpcoptError


def records(n, seed):
    """n random records, and the images (n, 3, 32, 32) and labels they encode."""
    rng = np.random.default_rng(seed)
    labels = (np.arange(n) + seed) % 10
    images = rng.integers(0, 256, size=(n, 3, 32, 32), dtype=np.uint8)
    raw = np.concatenate([labels[:, None].astype(np.uint8), images.reshape(n, -1)], axis=1)
    return raw.tobytes(), images, labels


def write_cifar(directory, sizes=(2, 3, 1, 2, 2), test=3):
    written = {}
    for seed, (name, n) in enumerate(zip((*TRAIN_FILES, TEST_FILE), (*sizes, test))):
        raw, images, labels = records(n, seed)
        (directory / name).write_bytes(raw)
        written[name] = images, labels
    return written


def test_record_layout_is_label_then_red_green_blue_planes(tmp_path):
    record = np.zeros(RECORD_BYTES, dtype=np.uint8)
    record[0] = 7
    record[1 + 5] = 11                  # red, row 0, column 5
    record[1 + 1024 + 32 * 2 + 1] = 22  # green, row 2, column 1
    record[1 + 2048 + 32 * 31 + 31] = 33  # blue, last pixel
    path = tmp_path / "one.bin"
    path.write_bytes(record.tobytes())
    images, labels = read_cifar10_batch(path)
    assert images.shape == (1, 3, 32, 32) and images.dtype == np.uint8
    assert labels.tolist() == [7] and labels.dtype == np.int64
    assert images[0, 0, 0, 5] == 11 and images[0, 1, 2, 1] == 22 and images[0, 2, 31, 31] == 33
    assert int(images.sum()) == 66


def test_load_dataset_cifar10_keeps_the_file_split_and_order(tmp_path):
    written = write_cifar(tmp_path)
    data = load_dataset("cifar10", path=str(tmp_path))
    assert data.image_shape == (3, 32, 32) and data.num_classes == 10
    assert data.x_train.shape == (10, 3072) and data.x_test.shape == (3, 3072)
    train_images = np.concatenate([written[name][0] for name in TRAIN_FILES])
    np.testing.assert_array_equal(as_images(data.x_train, data.image_shape), train_images / 255.0)
    np.testing.assert_array_equal(data.y_train,
                                  np.concatenate([written[name][1] for name in TRAIN_FILES]))
    np.testing.assert_array_equal(data.y_test, written[TEST_FILE][1])
    assert data.x_train.dtype == np.float64 and not data.x_train.flags.writeable


def test_as_images_adds_the_channel_axis_of_grey_images():
    x = np.arange(2 * 12.0).reshape(2, 12)
    assert as_images(x, (3, 4)).shape == (2, 1, 3, 4)
    assert as_images(x, (3, 2, 2)).shape == (2, 3, 2, 2)
    assert np.shares_memory(as_images(x, (3, 4)), x)
    with pytest.raises(ValueError, match="image_shape"):
        as_images(x, (12,))


@pytest.mark.parametrize("size,message", [
    (0, "0 bytes is not a whole, non-zero number of 3073-byte records"),
    (RECORD_BYTES + 1, "3074 bytes"),
    (2 * RECORD_BYTES - 1, "binary version"),
])
def test_truncated_or_padded_files_are_user_errors(tmp_path, size, message):
    path = tmp_path / "bad.bin"
    path.write_bytes(bytes(size))
    with pytest.raises(HpcoptError, match=message):
        read_cifar10_batch(path)


def test_label_outside_0_to_9_is_a_user_error(tmp_path):
    raw = bytearray(records(3, 0)[0])
    raw[2 * RECORD_BYTES] = 10
    path = tmp_path / "bad.bin"
    path.write_bytes(bytes(raw))
    with pytest.raises(HpcoptError, match="record 2 has label 10"):
        read_cifar10_batch(path)


def test_missing_files_path_and_python_version_are_user_errors(tmp_path):
    with pytest.raises(HpcoptError, match="needs a path"):
        load_dataset("cifar10")
    with pytest.raises(HpcoptError, match="does not exist"):
        load_dataset("cifar10", path=str(tmp_path / "nowhere"))
    write_cifar(tmp_path)
    (tmp_path / "data_batch_3.bin").unlink()
    with pytest.raises(HpcoptError, match="lacks data_batch_3.bin"):
        load_dataset("cifar10", path=str(tmp_path))
    pickled = tmp_path / "python"
    pickled.mkdir()
    (pickled / "data_batch_1").write_bytes(b"\x80\x04 not to be unpickled")
    with pytest.raises(HpcoptError, match="never unpickles"):
        load_dataset("cifar10", path=str(pickled))
    with pytest.raises(HpcoptError, match="does not exist"):
        read_cifar10_batch(tmp_path / "data_batch_3.bin")
