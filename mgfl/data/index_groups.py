"""Groups for image sets that have no natural client (no writer or owner is recorded)."""

from __future__ import annotations

import numpy as np

INDEX_SHARDS = 10


def index_groups(count: int, shards: int = INDEX_SHARDS) -> tuple[np.ndarray, list[str]]:
    """Sample ``i`` belongs to shard ``i % shards``: with shuffled samples, a 'natural' partition of
    such a set is an IID split into ``shards`` clients, and the names say so."""
    return np.arange(count) % shards, [f"shard-{i}" for i in range(shards)]
