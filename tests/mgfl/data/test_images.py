import gzip

import numpy as np
import pytest

from mgfl.data.errors import DatasetNotInstalledError
from mgfl.data.fashion_mnist import FASHION_DIR, load_fashion_mnist, read_idx
from mgfl.data.mnist import load_mnist, stratified_split
from tests.mgfl.data.conftest import optional


def test_stratified_split_keeps_class_proportions():
    labels = np.repeat(np.arange(4), [10, 20, 30, 40])
    train, test = stratified_split(labels, 0.2, seed=5)
    assert np.bincount(labels[test]).tolist() == [2, 4, 6, 8]
    assert sorted(np.concatenate([train, test]).tolist()) == list(range(100))
    again, _ = stratified_split(labels, 0.2, seed=5)
    assert np.array_equal(train, again)


def test_mnist_subset():
    data = optional(load_mnist)
    assert data.input_shape == (1, 28, 28)
    assert len(data.y_train) == 4000 and len(data.y_test) == 1000
    assert np.bincount(data.y_test).tolist() == [100] * 10
    assert data.x_train.min() == 0 and data.x_train.max() == 1
    assert data.group_names[0] == "shard-0" and set(data.groups_train) == set(range(10))
    other = optional(load_mnist, seed=1)
    assert not np.array_equal(data.y_train, other.y_train)


def write_idx(path, array, type_code):
    header = bytes([0, 0, type_code, array.ndim]) + np.array(array.shape, ">i4").tobytes()
    with gzip.open(path, "wb") as f:
        f.write(header + array.tobytes())


def test_read_idx_parses_header_and_values(tmp_path):
    images = np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4)
    write_idx(tmp_path / "a.gz", images, 0x08)
    assert np.array_equal(read_idx(tmp_path / "a.gz"), images)
    ints = np.array([1, -2, 300], dtype=">i4")
    write_idx(tmp_path / "b.gz", ints, 0x0C)
    assert read_idx(tmp_path / "b.gz").tolist() == [1, -2, 300]
    (tmp_path / "c").write_bytes(b"\x01\x02\x03\x04")
    with pytest.raises(ValueError, match="not an IDX"):
        read_idx(tmp_path / "c")


def test_fashion_mnist_from_a_directory_of_idx_files(tmp_path):
    rng = np.random.default_rng(0)
    for prefix, count in (("train", 12), ("t10k", 5)):
        write_idx(tmp_path / f"{prefix}-images-idx3-ubyte.gz",
                  rng.integers(0, 256, (count, 28, 28), dtype=np.uint8), 0x08)
        write_idx(tmp_path / f"{prefix}-labels-idx1-ubyte.gz",
                  (np.arange(count) % 10).astype(np.uint8), 0x08)
    data = load_fashion_mnist(tmp_path)
    assert data.input_shape == (1, 28, 28)
    assert len(data.y_train) == 12 and len(data.y_test) == 5
    assert data.classes[9] == "Ankle boot"


def test_missing_fashion_mnist_names_the_debian_package(tmp_path):
    with pytest.raises(DatasetNotInstalledError, match="apt-get install dataset-fashion-mnist"):
        load_fashion_mnist(tmp_path)


def test_debian_fashion_mnist_official_split():
    if not (FASHION_DIR / "t10k-labels-idx1-ubyte.gz").is_file():
        pytest.skip("Fashion-MNIST is not installed: apt-get install dataset-fashion-mnist")
    data = load_fashion_mnist()
    assert len(data.y_train) == 60000 and len(data.y_test) == 10000
    assert np.bincount(data.y_test).tolist() == [1000] * 10
