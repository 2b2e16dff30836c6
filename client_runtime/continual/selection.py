"""Which samples of a class become its exemplars, chosen on feature vectors (the network's
penultimate activations), in an order whose every prefix is itself a good exemplar set, so that
shrinking a class's share of the memory only drops its last exemplars.

- herding (iCaRL, Rebuffi et al. 2017): greedily pick the sample that brings the mean of the
  picked features closest to the class mean; quadratic in work;
- nearest to the class mean (FastICARL): sort the samples by distance to the class mean; one pass.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

Selector = Callable[[np.ndarray, int], np.ndarray]


def l2_normalize(features: np.ndarray) -> np.ndarray:
    """Rows scaled to unit length, as iCaRL compares features (zero rows stay zero)."""
    features = np.asarray(features, np.float64)
    norms = np.linalg.norm(features, axis=1, keepdims=True)
    return features / np.where(norms > 0, norms, 1.0)


def herding(features: np.ndarray, count: int) -> np.ndarray:
    """Indices of ``count`` samples in herding order (no sample twice)."""
    phi = l2_normalize(features)
    count = min(count, len(phi))
    mean = phi.mean(axis=0)
    chosen: list[int] = []
    running = np.zeros_like(mean)
    available = np.ones(len(phi), dtype=bool)
    for k in range(1, count + 1):
        candidates = (running + phi) / k
        distance = np.linalg.norm(mean - candidates, axis=1)
        distance[~available] = np.inf
        best = int(np.argmin(distance))
        chosen.append(best)
        available[best] = False
        running += phi[best]
    return np.array(chosen, dtype=np.int64)


def nearest_to_mean(features: np.ndarray, count: int) -> np.ndarray:
    """Indices of the ``count`` samples closest to the class mean, closest first."""
    phi = l2_normalize(features)
    distance = np.linalg.norm(phi - phi.mean(axis=0), axis=1)
    return np.argsort(distance, kind="stable")[: min(count, len(phi))].astype(np.int64)


SELECTORS: dict[str, Selector] = {"herding": herding, "nme": nearest_to_mean}


def selector(name: str) -> Selector:
    if name not in SELECTORS:
        raise ValueError(f"exemplar selection {name!r} unknown; use one of {sorted(SELECTORS)}")
    return SELECTORS[name]
