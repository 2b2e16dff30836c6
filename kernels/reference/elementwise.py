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
    """Bit mask of where the activation's slope is one (the same from its input or its output):
    bit j of byte k is element 8k + j."""
    x = np.asarray(x, np.float64).reshape(-1)
    mask = (x > 0) & (x < 6) if kind == "relu6" else x > 0
    return np.packbits(mask, bitorder="little")


def masked_backward(mask: np.ndarray, dy: np.ndarray) -> np.ndarray:
    dy = np.asarray(dy, np.float64)
    keep = np.unpackbits(np.asarray(mask, np.uint8), count=dy.size, bitorder="little")
    return np.where(keep.reshape(dy.shape) != 0, dy, 0.0)
