import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mgfl.data.partition import partition


def covers_once(parts, n):
    joined = np.concatenate(parts)
    return len(joined) == n and np.array_equal(np.sort(joined), np.arange(n))


@settings(max_examples=30, deadline=None)
@given(
    n=st.integers(10, 300),
    classes=st.integers(2, 8),
    clients=st.integers(1, 10),
    alpha=st.floats(0.01, 100),
    seed=st.integers(0, 2**31),
    scheme=st.sampled_from(["iid", "dirichlet"]),
)
def test_every_index_once_and_no_empty_client(n, classes, clients, alpha, seed, scheme):
    labels = np.random.default_rng(seed).integers(0, classes, n)
    parts = partition(
        labels, np.zeros(n), scheme=scheme, num_clients=clients, alpha=alpha, seed=seed
    )
    assert len(parts) == clients
    assert covers_once(parts, n)
    assert min(len(p) for p in parts) >= 1
    assert all(np.array_equal(p, np.sort(p)) for p in parts)


def test_natural_is_one_client_per_group():
    groups = np.array([2, 0, 2, 1, 0, 2])
    parts = partition(np.zeros(6), groups, scheme="natural")
    assert [p.tolist() for p in parts] == [[1, 4], [3], [0, 2, 5]]
    with pytest.raises(ValueError, match="one client per group"):
        partition(np.zeros(6), groups, scheme="natural", num_clients=2)


def test_iid_sizes_are_balanced():
    parts = partition(np.zeros(103), np.zeros(103), scheme="iid", num_clients=10, seed=1)
    assert sorted(len(p) for p in parts) == [10] * 7 + [11] * 3


def label_skew(parts, labels, classes):
    """Mean total-variation distance between each client's label mix and the overall one."""
    overall = np.bincount(labels, minlength=classes) / len(labels)
    return np.mean(
        [0.5 * np.abs(np.bincount(labels[p], minlength=classes) / len(p) - overall).sum()
         for p in parts]
    )


def test_dirichlet_skew_grows_as_alpha_shrinks():
    labels = np.repeat(np.arange(10), 200)
    skews = [
        np.mean([label_skew(partition(labels, labels, scheme="dirichlet", num_clients=8,
                                      alpha=alpha, seed=seed), labels, 10) for seed in range(5)])
        for alpha in (100.0, 1.0, 0.05)
    ]
    assert skews[0] < skews[1] < skews[2]
    assert skews[0] < 0.1 and skews[2] > 0.6


def test_partitions_are_reproducible_by_seed():
    labels = np.repeat(np.arange(5), 40)
    for scheme in ("iid", "dirichlet"):
        a = partition(labels, labels, scheme=scheme, num_clients=6, alpha=0.3, seed=9)
        b = partition(labels, labels, scheme=scheme, num_clients=6, alpha=0.3, seed=9)
        c = partition(labels, labels, scheme=scheme, num_clients=6, alpha=0.3, seed=10)
        assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
        assert not all(np.array_equal(x, y) for x, y in zip(a, c, strict=True))


def test_bad_arguments_are_explained():
    labels = np.zeros(5)
    with pytest.raises(ValueError, match="choose one of"):
        partition(labels, labels, scheme="round-robin", num_clients=2)
    with pytest.raises(ValueError, match="num_clients"):
        partition(labels, labels, scheme="iid", num_clients=None)
    with pytest.raises(ValueError, match="cannot each get one"):
        partition(labels, labels, scheme="dirichlet", num_clients=6)
    with pytest.raises(ValueError, match="alpha"):
        partition(labels, labels, scheme="dirichlet", num_clients=2, alpha=0)
    with pytest.raises(ValueError, match="labels but"):
        partition(labels, labels[:3], scheme="iid", num_clients=2)
