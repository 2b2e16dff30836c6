import numpy as np
import pytest

from mgfl.data.synthetic import load_synthetic, parse_synthetic_spec


def test_parse_spec():
    assert parse_synthetic_spec("3,32,32:10") == ((3, 32, 32), 10)
    assert parse_synthetic_spec("6,1,128:7") == ((6, 1, 128), 7)
    for bad in ("3,32,32", "a,b:2", "3,0,2:4", "1,2,2:1"):
        with pytest.raises(ValueError, match="synthetic"):
            parse_synthetic_spec(bad)


def test_shapes_counts_and_reproducibility():
    a = load_synthetic((2, 5, 5), 3, train=30, test=9, groups=2, seed=4)
    assert a.input_shape == (2, 5, 5) and a.num_classes == 3
    assert np.bincount(a.y_train).tolist() == [10, 10, 10]
    assert set(a.groups_train) == {0, 1}
    b = load_synthetic((2, 5, 5), 3, train=30, test=9, groups=2, seed=4)
    assert np.array_equal(a.x_train, b.x_train)


def test_classes_are_separable_by_their_patterns():
    data = load_synthetic((1, 8, 8), 4, train=200, test=100, noise=0.5, seed=0)
    flat = data.x_train.reshape(len(data.x_train), -1)
    means = np.stack([flat[data.y_train == c].mean(axis=0) for c in range(4)])
    test = data.x_test.reshape(len(data.x_test), -1)
    nearest = np.argmin(((test[:, None] - means[None]) ** 2).sum(axis=2), axis=1)
    assert (nearest == data.y_test).mean() > 0.9
