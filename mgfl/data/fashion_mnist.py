"""Fashion-MNIST from Debian's ``dataset-fashion-mnist`` package (IDX files), official split."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np

from mgfl.data.dataset import Dataset
from mgfl.data.errors import DatasetNotInstalledError
from mgfl.data.index_groups import index_groups

FASHION_DIR = Path("/usr/share/datasets/fashion-mnist")
FASHION_INSTALL_HINT = "apt-get install dataset-fashion-mnist"
FASHION_CLASSES = [
    "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
    "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot",
]
FASHION_ATTRIBUTION = (
    "Fashion-MNIST (Han Xiao, Kashif Rasul, Roland Vollgraf, Zalando Research, arXiv:1708.07747), "
    "MIT License, as packaged by Debian (dataset-fashion-mnist)."
)
_IDX_TYPES = {0x08: np.uint8, 0x09: np.int8, 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


def read_idx(path: Path) -> np.ndarray:
    """An IDX array (the MNIST file format), gzipped or not: two zero bytes, a type code, the
    number of dimensions, each dimension as a big-endian int32, then the values."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as f:
        data = f.read()
    if len(data) < 4 or data[0] != 0 or data[1] != 0 or data[2] not in _IDX_TYPES:
        raise ValueError(f"{path} is not an IDX file")
    ndim = data[3]
    shape = tuple(int(d) for d in np.frombuffer(data, dtype=">i4", count=ndim, offset=4))
    dtype = np.dtype(_IDX_TYPES[data[2]])
    values = np.frombuffer(data, dtype=dtype, offset=4 + 4 * ndim)
    if values.size != int(np.prod(shape)):
        raise ValueError(f"{path}: header says {shape}, file holds {values.size} values")
    return values.reshape(shape)


def load_fashion_mnist(directory: Path = FASHION_DIR) -> Dataset:
    """60,000 training and 10,000 test images ``(1, 28, 28)`` in [0, 1]; groups are index shards."""
    names = ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz",
             "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz")
    paths = [Path(directory) / name for name in names]
    if not all(p.is_file() for p in paths):
        what = f"Fashion-MNIST (expected in {directory})"
        raise DatasetNotInstalledError(what, FASHION_INSTALL_HINT)
    train_images, train_labels, test_images, test_labels = (read_idx(p) for p in paths)
    groups_train, group_names = index_groups(len(train_labels))
    groups_test, _ = index_groups(len(test_labels))
    return Dataset(
        name="fashion-mnist",
        x_train=(train_images.astype(np.float32) / 255.0)[:, None],
        y_train=train_labels,
        x_test=(test_images.astype(np.float32) / 255.0)[:, None],
        y_test=test_labels,
        groups_train=groups_train,
        groups_test=groups_test,
        classes=list(FASHION_CLASSES),
        group_names=group_names,
        attribution=FASHION_ATTRIBUTION,
    )
