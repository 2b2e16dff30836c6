"""Splits a training set over federated clients: by natural group (speaker, subject), IID, or
label-skewed by a Dirichlet draw. Every split is a function of its seed alone."""

from __future__ import annotations

import numpy as np

SCHEMES = ("natural", "iid", "dirichlet")


def partition(
    labels: np.ndarray,
    groups: np.ndarray,
    *,
    scheme: str,
    num_clients: int | None = None,
    alpha: float = 0.5,
    seed: int = 0,
) -> list[np.ndarray]:
    """Sample indices per client (each array sorted); together they cover every index once.

    - ``natural``: one client per distinct group, in group order (``num_clients``, if given, must
      equal the number of groups).
    - ``iid``: a seeded shuffle dealt into ``num_clients`` near-equal parts.
    - ``dirichlet``: for each class, client shares drawn from Dirichlet(``alpha``); a small alpha
      gives each client few classes, a large one approaches IID. No client is left empty.
    """
    labels = np.asarray(labels)
    groups = np.asarray(groups)
    if len(labels) != len(groups):
        raise ValueError(f"{len(labels)} labels but {len(groups)} groups")
    if scheme == "natural":
        return _natural(groups, num_clients)
    if scheme not in SCHEMES:
        raise ValueError(f"partition scheme {scheme!r}: choose one of {', '.join(SCHEMES)}")
    if num_clients is None or num_clients < 1:
        raise ValueError(f"the {scheme} partition needs num_clients >= 1")
    if num_clients > len(labels):
        raise ValueError(f"{num_clients} clients cannot each get one of {len(labels)} samples")
    rng = np.random.default_rng(seed)
    if scheme == "iid":
        return [np.sort(part) for part in np.array_split(rng.permutation(len(labels)), num_clients)]
    if alpha <= 0:
        raise ValueError(f"the Dirichlet concentration alpha must be positive, got {alpha}")
    return _dirichlet(labels, num_clients, alpha, rng)


def _natural(groups: np.ndarray, num_clients: int | None) -> list[np.ndarray]:
    present = np.unique(groups)
    if num_clients is not None and num_clients != len(present):
        raise ValueError(
            f"the natural partition has one client per group: {len(present)} here, not "
            f"{num_clients} (leave the client count out, or use iid/dirichlet)"
        )
    return [np.flatnonzero(groups == g) for g in present]


def _dirichlet(
    labels: np.ndarray, num_clients: int, alpha: float, rng: np.random.Generator
) -> list[np.ndarray]:
    owner = np.empty(len(labels), dtype=np.int64)
    for label in np.unique(labels):
        members = rng.permutation(np.flatnonzero(labels == label))
        shares = rng.dirichlet(np.full(num_clients, alpha))
        cuts = np.round(np.cumsum(shares)[:-1] * len(members)).astype(np.int64)
        for client, part in enumerate(np.split(members, cuts)):
            owner[part] = client
    _fill_empty_clients(owner, num_clients, rng)
    return [np.flatnonzero(owner == client) for client in range(num_clients)]


def _fill_empty_clients(owner: np.ndarray, num_clients: int, rng: np.random.Generator) -> None:
    """Gives each empty client one random sample of the largest client; the largest always has
    two or more while some client is empty, since there are at least as many samples as clients."""
    for client in range(num_clients):
        counts = np.bincount(owner, minlength=num_clients)
        if counts[client] == 0:
            donor = int(np.argmax(counts))
            owner[rng.choice(np.flatnonzero(owner == donor))] = client
