"""CIFAR-10 from its standard binary batches ("CIFAR-10 binary version", cifar-10-binary.tar.gz).

The "python version" of CIFAR-10 is pickle files; hpcopt never unpickles data and says so when
it finds them. A binary batch is a sequence of 3,073-byte records: one label byte (0..9), then
the 32x32 image as 1,024 red, 1,024 green and 1,024 blue bytes, each plane row by row; that is
already channels-first (C, H, W) order.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from hpcopt.errors import HpcoptError

IMAGE_SHAPE = (3, 32, 32)
RECORD_BYTES = 1 + 3 * 32 * 32
NUM_CLASSES = 10
TRAIN_FILES = tuple(f"data_batch_{i}.bin" for i in range(1, 6))
TEST_FILE = "test_batch.bin"


def read_cifar10_batch(path: str | Path) -> tuple[np.ndarray, np.ndarray]:
    """Images (n, 3, 32, 32) as uint8 and labels (n,) as int64 of one binary batch file.

    The file must hold a whole, non-zero number of 3,073-byte records and every label byte must
    be 0..9; anything else is a HpcoptError naming the file.
    """
    path = Path(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise HpcoptError(f"CIFAR-10 file {path} does not exist") from None
    except OSError as error:
        raise HpcoptError(f"CIFAR-10 file {path}: cannot read: {error.strerror}") from None
    if not raw or len(raw) % RECORD_BYTES:
        raise HpcoptError(
            f"CIFAR-10 file {path}: {len(raw)} bytes is not a whole, non-zero number of "
            f"{RECORD_BYTES}-byte records (1 label byte + 3072 pixel bytes); is it a batch of "
            "the CIFAR-10 binary version?"
        )
    records = np.frombuffer(raw, dtype=np.uint8).reshape(-1, RECORD_BYTES)
    labels = records[:, 0].astype(np.int64)
    bad = np.flatnonzero(labels >= NUM_CLASSES)
    if bad.size:
        raise HpcoptError(f"CIFAR-10 file {path}: record {bad[0]} has label {labels[bad[0]]}, "
                          f"outside 0..{NUM_CLASSES - 1}")
    return records[:, 1:].reshape(-1, *IMAGE_SHAPE), labels


def read_cifar10(path: str | None) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(train images, train labels, test images, test labels) from the directory ``path`` that
    holds ``data_batch_1.bin`` ... ``data_batch_5.bin`` and ``test_batch.bin``; images uint8."""
    if not path:
        raise HpcoptError("data set 'cifar10' needs a path: the directory of the binary batches "
                          "(cifar-10-batches-bin)")
    directory = Path(path)
    if not directory.is_dir():
        raise HpcoptError(f"CIFAR-10 directory {directory} does not exist")
    missing = [name for name in (*TRAIN_FILES, TEST_FILE) if not (directory / name).is_file()]
    if missing and (directory / "data_batch_1").is_file():
        raise HpcoptError(f"{directory} holds the 'python version' of CIFAR-10 (pickle files), "
                          "which hpcopt never unpickles: use the binary version "
                          "(cifar-10-binary.tar.gz, directory cifar-10-batches-bin)")
    if missing:
        raise HpcoptError(f"CIFAR-10 directory {directory} lacks {', '.join(missing)}")
    train = [read_cifar10_batch(directory / name) for name in TRAIN_FILES]
    x_test, y_test = read_cifar10_batch(directory / TEST_FILE)
    x_train = np.concatenate([images for images, _ in train])
    y_train = np.concatenate([labels for _, labels in train])
    return x_train, y_train, x_test, y_test
