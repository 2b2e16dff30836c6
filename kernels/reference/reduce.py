"""Float64 references of the bias-gradient reductions of ``kernels.reduce``."""

from __future__ import annotations

import numpy as np


def sum_rows(
    x: np.ndarray, *, rows: int, cols: int, out: np.ndarray | None = None,
    accumulate: bool = False,
) -> np.ndarray:
    """``out[j] (+)= sum_i x[i, j]``; ``out`` is read only when accumulating."""
    total = np.asarray(x, np.float64).reshape(rows, cols).sum(axis=0)
    return total + np.asarray(out, np.float64).reshape(cols) if accumulate else total


def sum_channels(
    x: np.ndarray, *, n: int, c: int, hw: int, out: np.ndarray | None = None,
    accumulate: bool = False,
) -> np.ndarray:
    """``out[ch] (+)= sum over n and hw of x[n, ch, hw]``; ``out`` is read only to accumulate."""
    total = np.asarray(x, np.float64).reshape(n, c, hw).sum(axis=(0, 2))
    return total + np.asarray(out, np.float64).reshape(c) if accumulate else total
