"""Float64 references of the convolution kernels: Conv2d forward, backward to data and to weights.

``windows`` is shared with the depthwise and pooling references: every kernel of that family is a
reduction over the same sliding windows of the padded input.
"""

from __future__ import annotations

import numpy as np

from kernels.conv_shape import ConvShape
from kernels.reference.elementwise import activation_forward


def pad(x: np.ndarray, shape: ConvShape, value: float = 0.0) -> np.ndarray:
    """The input ``(n, c, h, w)`` framed by ``pad_h`` rows and ``pad_w`` columns of ``value``."""
    x = np.asarray(x, np.float64).reshape(shape.n, shape.c, shape.h, shape.w)
    widths = ((0, 0), (0, 0), (shape.pad_h, shape.pad_h), (shape.pad_w, shape.pad_w))
    return np.pad(x, widths, constant_values=value)


def windows(padded: np.ndarray, shape: ConvShape) -> np.ndarray:
    """A read-only view ``(n, c, out_h, out_w, r, s)``: the window behind each output pixel."""
    view = np.lib.stride_tricks.sliding_window_view(padded, (shape.r, shape.s), axis=(2, 3))
    return view[:, :, :: shape.stride_h, :: shape.stride_w][:, :, : shape.out_h, : shape.out_w]


def scatter_windows(contrib: np.ndarray, shape: ConvShape) -> np.ndarray:
    """The adjoint of :func:`windows` followed by cropping the padding: adds each window's
    ``(n, c, out_h, out_w, r, s)`` contribution back onto the input pixels it came from."""
    n, c = contrib.shape[:2]
    padded = np.zeros((n, c, shape.h + 2 * shape.pad_h, shape.w + 2 * shape.pad_w))
    rows = shape.stride_h * (shape.out_h - 1) + 1
    cols = shape.stride_w * (shape.out_w - 1) + 1
    for r in range(shape.r):
        for s in range(shape.s):
            padded[:, :, r : r + rows : shape.stride_h, s : s + cols : shape.stride_w] += contrib[
                ..., r, s
            ]
    return padded[:, :, shape.pad_h : shape.pad_h + shape.h, shape.pad_w : shape.pad_w + shape.w]


def conv2d_forward(
    x: np.ndarray,
    w: np.ndarray,
    b: np.ndarray | None,
    shape: ConvShape,
    activation: str | None = None,
) -> np.ndarray:
    """``y (n, k, out_h, out_w)`` of ``x (n, c, h, w)`` and ``w (k, c, r, s)``, plus bias, then the
    optional activation."""
    w = np.asarray(w, np.float64).reshape(shape.k, shape.c, shape.r, shape.s)
    y = np.einsum("ncpqrs,kcrs->nkpq", windows(pad(x, shape), shape), w)
    if b is not None:
        y = y + np.asarray(b, np.float64).reshape(1, shape.k, 1, 1)
    return activation_forward(activation, y) if activation else y


def conv2d_backward_data(dy: np.ndarray, w: np.ndarray, shape: ConvShape) -> np.ndarray:
    """``dx (n, c, h, w)``: the gradient of the convolution (before activation) to its input."""
    dy = np.asarray(dy, np.float64).reshape(shape.n, shape.k, shape.out_h, shape.out_w)
    w = np.asarray(w, np.float64).reshape(shape.k, shape.c, shape.r, shape.s)
    return scatter_windows(np.einsum("nkpq,kcrs->ncpqrs", dy, w), shape)


def conv2d_backward_weight(
    x: np.ndarray, dy: np.ndarray, shape: ConvShape
) -> tuple[np.ndarray, np.ndarray]:
    """``(dw (k, c, r, s), db (k,))``: the gradients to the weights and the bias."""
    dy = np.asarray(dy, np.float64).reshape(shape.n, shape.k, shape.out_h, shape.out_w)
    dw = np.einsum("ncpqrs,nkpq->kcrs", windows(pad(x, shape), shape), dy)
    return dw, dy.sum(axis=(0, 2, 3))
