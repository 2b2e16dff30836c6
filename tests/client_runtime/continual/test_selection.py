"""Exemplar selection against plain NumPy restatements of herding and nearest-to-mean."""

from __future__ import annotations

import numpy as np
import pytest

from client_runtime.continual.selection import herding, nearest_to_mean, selector


def _herding_reference(features: np.ndarray, count: int) -> list[int]:
    """iCaRL's loop, written out sample by sample."""
    phi = [f / np.linalg.norm(f) for f in features.astype(np.float64)]
    mu = sum(phi) / len(phi)
    picked: list[int] = []
    for k in range(1, count + 1):
        best, best_distance = -1, np.inf
        for i, f in enumerate(phi):
            if i in picked:
                continue
            distance = np.linalg.norm(mu - (f + sum((phi[j] for j in picked), 0.0)) / k)
            if distance < best_distance:
                best, best_distance = i, distance
        picked.append(best)
    return picked


@pytest.mark.parametrize("n, dim, count", [(30, 5, 10), (12, 3, 12), (40, 16, 7), (5, 2, 9)])
def test_herding_matches_the_loop(rng, n, dim, count):
    features = rng.normal(size=(n, dim)) + rng.normal(size=dim)
    assert herding(features, count).tolist() == _herding_reference(features, min(count, n))


def test_herding_prefixes_approach_the_mean_faster_than_chance(rng):
    features = rng.normal(size=(200, 8)) * np.linspace(0.2, 3.0, 8) + 1.0
    phi = features / np.linalg.norm(features, axis=1, keepdims=True)
    mu = phi.mean(axis=0)
    order = herding(features, 20)
    herd = np.linalg.norm(phi[order].mean(axis=0) - mu)
    random = np.mean([np.linalg.norm(phi[rng.choice(200, 20, replace=False)].mean(0) - mu)
                      for _ in range(50)])  # fmt: skip
    assert herd < random / 3


def test_nearest_to_mean_sorts_by_distance(rng):
    features = rng.normal(size=(25, 4)) + 2.0
    phi = features / np.linalg.norm(features, axis=1, keepdims=True)
    distance = np.linalg.norm(phi - phi.mean(axis=0), axis=1)
    order = nearest_to_mean(features, 8)
    assert order.tolist() == np.argsort(distance)[:8].tolist()
    assert np.all(np.diff(distance[order]) >= 0)


def test_unknown_selection_is_refused():
    with pytest.raises(ValueError, match="herding"):
        selector("random")
