"""Float64 references of the pooling kernels: max, average (zero padding counted) and global
average pooling, forward and backward."""

from __future__ import annotations

import numpy as np

from kernels.conv_shape import ConvShape
from kernels.reference.conv2d import pad, scatter_windows, windows


def maxpool_forward(x: np.ndarray, shape: ConvShape) -> np.ndarray:
    """``y (n, c, out_h, out_w)``: the maximum of each window; padding never wins."""
    return windows(pad(x, shape, -np.inf), shape).max(axis=(4, 5))


def maxpool_backward(x: np.ndarray, dy: np.ndarray, shape: ConvShape) -> np.ndarray:
    """``dx (n, c, h, w)``: each window's gradient goes to its first maximum in row-major order."""
    win = windows(pad(x, shape, -np.inf), shape)
    flat = win.reshape(*win.shape[:4], shape.r * shape.s)
    first = flat.argmax(axis=-1)  # argmax returns the first of equal maxima
    onehot = np.zeros(flat.shape)
    np.put_along_axis(onehot, first[..., None], 1.0, axis=-1)
    dy = np.asarray(dy, np.float64).reshape(win.shape[:4])
    return scatter_windows((onehot * dy[..., None]).reshape(win.shape), shape)


def avgpool_forward(x: np.ndarray, shape: ConvShape) -> np.ndarray:
    """``y (n, c, out_h, out_w)``: the sum of each window divided by ``r * s``."""
    return windows(pad(x, shape), shape).sum(axis=(4, 5)) / (shape.r * shape.s)


def avgpool_backward(dy: np.ndarray, shape: ConvShape) -> np.ndarray:
    """``dx (n, c, h, w)``."""
    dy = np.asarray(dy, np.float64).reshape(shape.n, shape.c, shape.out_h, shape.out_w)
    share = dy[..., None, None] / (shape.r * shape.s)
    spread = np.broadcast_to(share, (*dy.shape, shape.r, shape.s))
    return scatter_windows(spread, shape)


def global_avgpool_forward(x: np.ndarray, n: int, c: int, hw: int) -> np.ndarray:
    """``y (n, c)``: the mean over the ``hw`` spatial positions."""
    return np.asarray(x, np.float64).reshape(n, c, hw).mean(axis=2)


def global_avgpool_backward(dy: np.ndarray, n: int, c: int, hw: int) -> np.ndarray:
    """``dx (n, c, hw)``."""
    dy = np.asarray(dy, np.float64).reshape(n, c, 1)
    return np.broadcast_to(dy / hw, (n, c, hw)).copy()
