"""Float64 references of the depthwise convolution kernels (channel multiplier 1)."""

from __future__ import annotations

import numpy as np

from kernels.conv_shape import ConvShape
from kernels.reference.conv2d import pad, scatter_windows, windows
from kernels.reference.elementwise import activation_forward


def _weights(w: np.ndarray, shape: ConvShape) -> np.ndarray:
    return np.asarray(w, np.float64).reshape(shape.c, shape.r, shape.s)


def depthwise_forward(
    x: np.ndarray,
    w: np.ndarray,
    b: np.ndarray | None,
    shape: ConvShape,
    activation: str | None = None,
) -> np.ndarray:
    """``y (n, c, out_h, out_w)``: each channel of ``x`` convolved with its own ``r x s`` filter
    ``w (c, 1, r, s)``, plus bias, then the optional activation."""
    y = np.einsum("ncpqrs,crs->ncpq", windows(pad(x, shape), shape), _weights(w, shape))
    if b is not None:
        y = y + np.asarray(b, np.float64).reshape(1, shape.c, 1, 1)
    return activation_forward(activation, y) if activation else y


def depthwise_backward_data(dy: np.ndarray, w: np.ndarray, shape: ConvShape) -> np.ndarray:
    """``dx (n, c, h, w)``."""
    dy = np.asarray(dy, np.float64).reshape(shape.n, shape.c, shape.out_h, shape.out_w)
    return scatter_windows(np.einsum("ncpq,crs->ncpqrs", dy, _weights(w, shape)), shape)


def depthwise_backward_weight(
    x: np.ndarray, dy: np.ndarray, shape: ConvShape
) -> tuple[np.ndarray, np.ndarray]:
    """``(dw (c, 1, r, s), db (c,))``."""
    dy = np.asarray(dy, np.float64).reshape(shape.n, shape.c, shape.out_h, shape.out_w)
    dw = np.einsum("ncpqrs,ncpq->crs", windows(pad(x, shape), shape), dy)
    return dw[:, None], dy.sum(axis=(0, 2, 3))
