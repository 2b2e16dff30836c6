"""Float64 references of the element-wise kernels."""

from __future__ import annotations

import numpy as np


def activation_forward(kind: str, x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, np.float64)
    y = np.maximum(x, 0.0)
    return np.minimum(y, 6.0) if kind == "relu6" else y


def activation_backward(kind: str, y: np.ndarray, dy: np.ndarray) -> np.ndarray:
    y = np.asarray(y, np.float64)
    mask = (y > 0) & (y < 6) if kind == "relu6" else y > 0
    return np.where(mask, np.asarray(dy, np.float64), 0.0)


def activation_mask(kind: str, x: np.ndarray) -> np.ndarray:
    """uint8 mask, 0xFF where the activation's slope is one, else 0 (the same from the input or
    the output)."""
    x = np.asarray(x, np.float64)
    mask = (x > 0) & (x < 6) if kind == "relu6" else x > 0
    return np.where(mask, 0xFF, 0).astype(np.uint8)


def masked_backward(mask: np.ndarray, dy: np.ndarray) -> np.ndarray:
    return np.where(np.asarray(mask) != 0, np.asarray(dy, np.float64), 0.0)
