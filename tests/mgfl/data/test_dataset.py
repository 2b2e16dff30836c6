import numpy as np
import pytest

from mgfl.data.dataset import Dataset


def make(n_train=20, n_test=8, classes=4, groups=3):
    rng = np.random.default_rng(0)
    return Dataset(
        name="t",
        x_train=rng.standard_normal((n_train, 1, 2, 3)),
        y_train=np.arange(n_train) % classes,
        x_test=rng.standard_normal((n_test, 1, 2, 3)),
        y_test=np.arange(n_test) % classes,
        groups_train=np.arange(n_train) % groups,
        groups_test=np.arange(n_test) % groups,
        classes=[f"c{i}" for i in range(classes)],
        group_names=[f"g{i}" for i in range(groups)],
        attribution="none",
    )


def test_dtypes_and_shape_properties():
    d = make()
    assert d.x_train.dtype == np.float32 and d.y_train.dtype == np.int32
    assert d.groups_test.dtype == np.int32
    assert d.input_shape == (1, 2, 3)
    assert d.num_classes == 4


def test_subset_filters_classes_and_groups_and_limits():
    d = make()
    s = d.subset(classes=[1, 2], groups=[0], train=2, seed=3)
    assert len(s.y_train) == 2
    assert set(s.y_train) <= {1, 2} and set(s.groups_train) == {0}
    assert set(s.y_test) <= {1, 2} and set(s.groups_test) <= {0}
    assert s.num_classes == d.num_classes
    # the chosen rows are the same rows of the original
    rows = [np.flatnonzero((d.x_train == x).all(axis=(1, 2, 3)))[0] for x in s.x_train]
    assert np.array_equal(d.y_train[rows], s.y_train)
    assert rows == sorted(rows)


def test_subset_is_reproducible_by_seed():
    d = make(n_train=100)
    a, b = d.subset(train=10, seed=1), d.subset(train=10, seed=1)
    assert np.array_equal(a.x_train, b.x_train)
    assert not np.array_equal(a.x_train, d.subset(train=10, seed=2).x_train)


def test_mismatched_lengths_are_rejected():
    d = make()
    with pytest.raises(ValueError, match="differ in length"):
        Dataset(**{**d.__dict__, "y_train": d.y_train[:-1]})


def test_labels_and_groups_must_index_their_names():
    d = make()
    with pytest.raises(ValueError, match="label outside"):
        Dataset(**{**d.__dict__, "classes": ["only", "two"]})
    with pytest.raises(ValueError, match="group outside"):
        Dataset(**{**d.__dict__, "group_names": ["g0"]})
