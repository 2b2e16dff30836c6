"""Computed features kept on disk, keyed by everything that changes them, so that a second run
(or a second client on the same machine) does not redo the signal processing."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np

CACHE_ENV = "MGFL_CACHE_DIR"


def default_cache_dir() -> Path:
    """``$MGFL_CACHE_DIR`` or the user's cache directory (the same root the kernel cache uses)."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    from platformdirs import user_cache_dir

    return Path(user_cache_dir("mgfl"))


def cache_key(parameters: dict[str, object], files: list[Path]) -> str:
    """A digest of the parameters and of each file's name, size and modification time."""
    listing = []
    for path in files:
        stat = path.stat()
        listing.append([path.name, stat.st_size, stat.st_mtime_ns])
    text = json.dumps({"parameters": parameters, "files": listing}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


def feature_cache_path(cache_dir: Path | None, prefix: str, key: str) -> Path:
    return (cache_dir or default_cache_dir()) / "features" / f"{prefix}-{key[:24]}.npz"


def load_cached(path: Path) -> dict[str, np.ndarray] | None:
    """The stored arrays, or None when there is no usable entry (absent or unreadable)."""
    if not path.is_file():
        return None
    try:
        with np.load(path, allow_pickle=False) as stored:
            return {name: stored[name] for name in stored.files}
    except (OSError, ValueError):
        return None


def store(path: Path, **arrays: np.ndarray) -> None:
    """Writes to a temporary name first, so that a reader never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f"{path.stem}.{os.getpid()}.partial.npz")
    np.savez(partial, **arrays)
    os.replace(partial, path)
