"""The global model of every round on disk, as a plain ``.npz`` (no pickle): arrays by name,
float32, readable with ``np.load(path, allow_pickle=False)`` and loadable by ``mgfl train``'s
consumers without mgfl."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import numpy as np


def checkpoint_path(directory: Path, server_round: int) -> Path:
    return Path(directory) / f"round-{server_round:03d}.npz"


def save_checkpoint(directory: Path, server_round: int, state: Mapping[str, np.ndarray]) -> Path:
    """Writes the round's model atomically (a reader never sees half a file)."""
    path = checkpoint_path(directory, server_round)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".partial.npz")
    np.savez(partial, **{name: np.asarray(value, np.float32) for name, value in state.items()})
    os.replace(partial, path)
    return path


def load_checkpoint(path: Path) -> dict[str, np.ndarray]:
    with np.load(path, allow_pickle=False) as stored:
        return {name: stored[name] for name in stored.files}
