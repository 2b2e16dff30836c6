"""NumPy reference of the dropout kernels: the mask bit for bit, and float64 forward/backward."""

from __future__ import annotations

import math

import numpy as np

UINT32_MASK = 0xFFFFFFFF
GOLDEN = 0x9E3779B9


def hash32(x: np.ndarray) -> np.ndarray:
    """The kernel's 32-bit integer hash, computed in uint64 and wrapped to 32 bits."""
    x = np.asarray(x, np.uint64) & UINT32_MASK
    x ^= x >> np.uint64(16)
    x = (x * np.uint64(0x7FEB352D)) & UINT32_MASK
    x ^= x >> np.uint64(15)
    x = (x * np.uint64(0x846CA68B)) & UINT32_MASK
    x ^= x >> np.uint64(16)
    return x


def dropout_mask(n: int, p: float, seed: int, t: int, index_offset: int = 0) -> np.ndarray:
    """True where element i is kept at step t:
    ``hash32(hash32(seed + 0x9E3779B9 * t) ^ (i + index_offset)) >= floor(p * 2**32)``."""
    key = hash32(np.uint64(((seed % 2**32) + GOLDEN * (t % 2**32)) & UINT32_MASK))
    index = (np.arange(n, dtype=np.uint64) + np.uint64(index_offset % 2**32)) & UINT32_MASK
    return hash32(key ^ index) >= math.floor(p * 2**32)


def dropout_forward(x, p: float, seed: int, t: int, index_offset: int = 0) -> np.ndarray:
    x = np.asarray(x, np.float64)
    if p >= 1.0:
        return np.zeros_like(x)
    mask = dropout_mask(x.size, p, seed, t, index_offset).reshape(x.shape)
    return np.where(mask, x / (1.0 - p), 0.0)


def dropout_backward(dy, p: float, seed: int, t: int, index_offset: int = 0) -> np.ndarray:
    """The forward is linear in x with the same mask, so the backward is the same map."""
    return dropout_forward(dy, p, seed, t, index_offset)
