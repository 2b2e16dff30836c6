"""Float64 references of im2col, col2im and the per-channel bias + activation.

im2col is the convolution's sliding windows laid out as a matrix, and col2im is its exact adjoint:
both reuse the windows of the Conv2d reference, so the three stay consistent by construction.
"""

from __future__ import annotations

import numpy as np

from kernels.conv_shape import ConvShape
from kernels.reference.conv2d import pad, scatter_windows, windows
from kernels.reference.elementwise import activation_forward


def im2col(x: np.ndarray, shape: ConvShape) -> np.ndarray:
    """``col (n, c*r*s, out_h*out_w)`` of ``x (n, c, h, w)``; zeros where windows cover padding."""
    view = windows(pad(x, shape), shape)  # (n, c, oh, ow, r, s)
    col = view.transpose(0, 1, 4, 5, 2, 3)
    return col.reshape(shape.n, shape.c * shape.r * shape.s, shape.out_h * shape.out_w)


def col2im(col: np.ndarray, shape: ConvShape) -> np.ndarray:
    """``dx (n, c, h, w)``: each ``col`` element added onto the input pixel it was copied from
    (dropped where it came from padding), the adjoint of :func:`im2col`."""
    col = np.asarray(col, np.float64).reshape(
        shape.n, shape.c, shape.r, shape.s, shape.out_h, shape.out_w
    )
    return scatter_windows(col.transpose(0, 1, 4, 5, 2, 3), shape)


def bias_activation(
    y: np.ndarray, b: np.ndarray | None, *, n: int, c: int, hw: int, activation: str | None
) -> np.ndarray:
    """``act(y + b[c])`` on ``y (n, c, hw)``; no bias when ``b`` is None."""
    y = np.asarray(y, np.float64).reshape(n, c, hw)
    if b is not None:
        y = y + np.asarray(b, np.float64).reshape(1, c, 1)
    return activation_forward(activation, y) if activation else y
