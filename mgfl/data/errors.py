"""The error for a data set (or the library that reads it) that is not installed."""

from __future__ import annotations


class DatasetNotInstalledError(ValueError):
    """A data set or feature library is missing; the message says exactly how to install it."""

    def __init__(self, what: str, install_hint: str) -> None:
        self.what = what
        self.install_hint = install_hint
        super().__init__(f"{what} is not installed; install it with: {install_hint}")
