"""A small learnable image set in MNIST's IDX layout, so the GPU tests and the GPU check need no
data-set package (``--dataset mnist_idx --path DIR``)."""

from __future__ import annotations

import gzip
import struct
import sys
from pathlib import Path

import numpy as np

FILES = ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz",
         "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz")


def write_idx(path: Path, array: np.ndarray) -> None:
    """``array`` as unsigned bytes in a gzipped IDX file (type 0x08: MNIST's layout)."""
    header = struct.pack(">BBBB", 0, 0, 0x08, array.ndim) + struct.pack(f">{array.ndim}I", *array.shape)
    with gzip.open(path, "wb") as handle:
        handle.write(header + array.astype(np.uint8).tobytes())


def write_tiny_mnist(directory: Path, train: int = 480, test: int = 120, side: int = 8) -> Path:
    """10 classes of ``side`` x ``side`` images: a fixed random template per class plus noise."""
    rng = np.random.default_rng(0)
    templates = rng.random((10, side, side))
    directory.mkdir(parents=True, exist_ok=True)
    for (images_name, labels_name), count in ((FILES[:2], train), (FILES[2:], test)):
        labels = np.arange(count) % 10
        images = 160 * templates[labels] + 95 * rng.random((count, side, side))
        write_idx(directory / images_name, np.clip(images, 0, 255))
        write_idx(directory / labels_name, labels)
    return directory


if __name__ == "__main__":
    print(write_tiny_mnist(Path(sys.argv[1])))
