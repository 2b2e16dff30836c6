"""Float64 NumPy forward and backward of each layer kind, on batched ``(N, C, H, W)`` arrays.

These are the definitions the OpenCL engine is held to, so they are written for clarity first
and vectorised (im2col through ``sliding_window_view`` and one matrix product per convolution)
so that a few dozen steps of a small CNN take seconds. Every ``*_forward`` returns the output
and what its ``*_backward`` needs; no function changes its arguments in place.
"""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

Pair = tuple[int, int]


def _pad(x: np.ndarray, padding: Pair, value: float = 0.0) -> np.ndarray:
    ph, pw = padding
    if ph == 0 and pw == 0:
        return x
    return np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)), constant_values=value)


def _output_size(padded: tuple[int, int], kernel: Pair, stride: Pair) -> tuple[int, int]:
    return (
        (padded[0] - kernel[0]) // stride[0] + 1,
        (padded[1] - kernel[1]) // stride[1] + 1,
    )


def _windows(xp: np.ndarray, kernel: Pair, stride: Pair) -> np.ndarray:
    """View ``(N, C, OH, OW, R, S)`` of every window of the padded input ``xp``."""
    view = sliding_window_view(xp, kernel, axis=(2, 3))
    return view[:, :, :: stride[0], :: stride[1]]


def _tap(offset: int, size: int, step: int) -> slice:
    """Rows (or columns) of the padded input that kernel tap ``offset`` reads, one per output."""
    return slice(offset, offset + step * (size - 1) + 1, step)


def _crop(xp: np.ndarray, padding: Pair, height: int, width: int) -> np.ndarray:
    ph, pw = padding
    return xp[:, :, ph : ph + height, pw : pw + width]


# --- Linear ------------------------------------------------------------------------------------


def linear_forward(x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None) -> np.ndarray:
    y = x @ weight.T
    return y + bias if bias is not None else y


def linear_backward(
    x: np.ndarray, weight: np.ndarray, dy: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(dx, dweight, dbias)``."""
    return dy @ weight, dy.T @ x, dy.sum(axis=0)


# --- Conv2d ------------------------------------------------------------------------------------


def _is_pointwise(kernel: Pair, stride: Pair, padding: Pair) -> bool:
    return kernel == (1, 1) and stride == (1, 1) and padding == (0, 0)


def conv2d_forward(
    x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None, stride: Pair, padding: Pair
) -> tuple[np.ndarray, np.ndarray]:
    """``(y, cols)``: ``cols`` is the im2col array ``(N, C*R*S, OH*OW)`` the backward reuses
    (for a 1x1 stride-1 convolution, the input itself seen as ``(N, C, H*W)``)."""
    n, c = x.shape[:2]
    k, _, r, s = weight.shape
    if _is_pointwise((r, s), stride, padding):
        oh, ow = x.shape[2:]
        cols = x.reshape(n, c, oh * ow)
    else:
        windows = _windows(_pad(x, padding), (r, s), stride)
        oh, ow = windows.shape[2:4]
        cols = windows.transpose(0, 1, 4, 5, 2, 3).reshape(n, c * r * s, oh * ow)
    y = weight.reshape(k, -1) @ cols
    if bias is not None:
        y += bias[:, None]
    return y.reshape(n, k, oh, ow), cols


def conv2d_backward(
    cols: np.ndarray,
    input_shape: tuple[int, ...],
    weight: np.ndarray,
    dy: np.ndarray,
    stride: Pair,
    padding: Pair,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(dx, dweight, dbias)``; col2im scatters each kernel tap back with one strided add."""
    n, c, height, width = input_shape
    k, _, r, s = weight.shape
    oh, ow = dy.shape[2:]
    dy_cols = dy.reshape(n, k, oh * ow)
    dweight = np.tensordot(dy_cols, cols, axes=([0, 2], [0, 2])).reshape(weight.shape)
    dcols = weight.reshape(k, -1).T @ dy_cols
    dbias = dy_cols.sum(axis=(0, 2))
    if _is_pointwise((r, s), stride, padding):
        return dcols.reshape(input_shape), dweight, dbias
    dcols = dcols.reshape(n, c, r, s, oh, ow)
    dxp = np.zeros((n, c, height + 2 * padding[0], width + 2 * padding[1]))
    for i in range(r):
        for j in range(s):
            dxp[:, :, _tap(i, oh, stride[0]), _tap(j, ow, stride[1])] += dcols[:, :, i, j]
    return _crop(dxp, padding, height, width), dweight, dbias


# --- DepthwiseConv2d ---------------------------------------------------------------------------


def depthwise_forward(
    x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None, stride: Pair, padding: Pair
) -> tuple[np.ndarray, np.ndarray]:
    """``(y, padded x)``; one ``(R, S)`` filter per channel, applied tap by tap."""
    xp = _pad(x, padding)
    _, _, r, s = weight.shape
    oh, ow = _output_size(xp.shape[2:], (r, s), stride)
    y = np.zeros((x.shape[0], x.shape[1], oh, ow))
    product = np.empty_like(y)
    for i in range(r):
        for j in range(s):
            taps = xp[:, :, _tap(i, oh, stride[0]), _tap(j, ow, stride[1])]
            y += np.multiply(taps, weight[:, 0, i, j][:, None, None], out=product)
    if bias is not None:
        y += bias[:, None, None]
    return y, xp


def depthwise_backward(
    xp: np.ndarray,
    input_shape: tuple[int, ...],
    weight: np.ndarray,
    dy: np.ndarray,
    stride: Pair,
    padding: Pair,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(dx, dweight, dbias)``."""
    _, _, height, width = input_shape
    _, _, r, s = weight.shape
    oh, ow = dy.shape[2:]
    dweight = np.zeros(weight.shape)
    dxp = np.zeros(xp.shape)
    product = np.empty_like(dy)
    for i in range(r):
        for j in range(s):
            rows, cols = _tap(i, oh, stride[0]), _tap(j, ow, stride[1])
            dweight[:, 0, i, j] = np.einsum("ncij,ncij->c", dy, xp[:, :, rows, cols])
            dxp[:, :, rows, cols] += np.multiply(dy, weight[:, 0, i, j][:, None, None], out=product)
    return _crop(dxp, padding, height, width), dweight, dy.sum(axis=(0, 2, 3))


# --- Pooling -----------------------------------------------------------------------------------


def maxpool_forward(
    x: np.ndarray, kernel: Pair, stride: Pair, padding: Pair
) -> tuple[np.ndarray, np.ndarray]:
    """``(y, argmax)``: padding is -inf; ``argmax`` is the first maximum, row-major in the
    window, as a flat index ``r * S + s``."""
    windows = _windows(_pad(x, padding, -np.inf), kernel, stride)
    flat = windows.reshape(*windows.shape[:4], -1)
    argmax = flat.argmax(axis=-1)
    return np.take_along_axis(flat, argmax[..., None], axis=-1)[..., 0], argmax


def maxpool_backward(
    argmax: np.ndarray,
    input_shape: tuple[int, ...],
    dy: np.ndarray,
    kernel: Pair,
    stride: Pair,
    padding: Pair,
) -> np.ndarray:
    """Each window's gradient lands on its first maximum; overlapping windows add up."""
    n, c, height, width = input_shape
    hp, wp = height + 2 * padding[0], width + 2 * padding[1]
    oh, ow = dy.shape[2:]
    rows = np.arange(oh)[:, None] * stride[0] + argmax // kernel[1]
    cols = np.arange(ow)[None, :] * stride[1] + argmax % kernel[1]
    planes = np.arange(n * c).reshape(n, c, 1, 1)
    target = (planes * hp + rows) * wp + cols
    dxp = np.bincount(target.ravel(), weights=dy.ravel(), minlength=n * c * hp * wp)
    return _crop(dxp.reshape(n, c, hp, wp), padding, height, width)


def avgpool_forward(x: np.ndarray, kernel: Pair, stride: Pair, padding: Pair) -> np.ndarray:
    """Window sum divided by ``R*S``, zero padding included."""
    windows = _windows(_pad(x, padding), kernel, stride)
    return windows.sum(axis=(-2, -1)) / (kernel[0] * kernel[1])


def avgpool_backward(
    input_shape: tuple[int, ...], dy: np.ndarray, kernel: Pair, stride: Pair, padding: Pair
) -> np.ndarray:
    n, c, height, width = input_shape
    oh, ow = dy.shape[2:]
    share = dy / (kernel[0] * kernel[1])
    dxp = np.zeros((n, c, height + 2 * padding[0], width + 2 * padding[1]))
    for i in range(kernel[0]):
        for j in range(kernel[1]):
            dxp[:, :, _tap(i, oh, stride[0]), _tap(j, ow, stride[1])] += share
    return _crop(dxp, padding, height, width)


def global_avgpool_forward(x: np.ndarray) -> np.ndarray:
    return x.mean(axis=(2, 3))


def global_avgpool_backward(input_shape: tuple[int, ...], dy: np.ndarray) -> np.ndarray:
    n, c, height, width = input_shape
    return np.broadcast_to((dy / (height * width))[:, :, None, None], (n, c, height, width)).copy()


# --- BatchNorm ---------------------------------------------------------------------------------


def _channel_view(x: np.ndarray) -> tuple[str, tuple[int, ...]]:
    """Einsum subscripts of ``(N, C[, H, W])`` and the broadcast shape of a per-channel vector."""
    if x.ndim == 2:
        return "nc", (1, x.shape[1])
    return "nchw", (1, x.shape[1], 1, 1)


def _channel_sum(a: np.ndarray, b: np.ndarray | None = None) -> np.ndarray:
    """Per-channel sum of ``a`` (or of ``a * b``) without a temporary array."""
    subscripts, _ = _channel_view(a)
    if b is None:
        return np.einsum(f"{subscripts}->c", a)
    return np.einsum(f"{subscripts},{subscripts}->c", a, b)


def batchnorm_train_forward(
    x: np.ndarray, weight: np.ndarray, bias: np.ndarray, eps: float
) -> tuple[np.ndarray, tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]:
    """``(y, (xhat, inv_std, mean, var))`` with the batch mean and biased variance."""
    _, shape = _channel_view(x)
    count = x.size // x.shape[1]
    mean = _channel_sum(x) / count
    xhat = x - mean.reshape(shape)
    var = _channel_sum(xhat, xhat) / count
    inv_std = 1.0 / np.sqrt(var + eps)
    xhat *= inv_std.reshape(shape)
    y = xhat * weight.reshape(shape)
    y += bias.reshape(shape)
    return y, (xhat, inv_std, mean, var)


def batchnorm_eval_forward(
    x: np.ndarray,
    weight: np.ndarray,
    bias: np.ndarray,
    running_mean: np.ndarray,
    running_var: np.ndarray,
    eps: float,
) -> np.ndarray:
    _, shape = _channel_view(x)
    scale = (weight / np.sqrt(running_var + eps)).reshape(shape)
    return (x - running_mean.reshape(shape)) * scale + bias.reshape(shape)


def batchnorm_train_backward(
    xhat: np.ndarray, inv_std: np.ndarray, weight: np.ndarray, dy: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(dx, dweight, dbias)`` through the batch statistics:
    ``dx = w * inv_std * (dy - dbias/count - xhat * dweight/count)``."""
    _, shape = _channel_view(dy)
    count = dy.size // dy.shape[1]
    dbias = _channel_sum(dy)
    dweight = _channel_sum(dy, xhat)
    dx = xhat * (-dweight / count).reshape(shape)
    dx += dy
    dx -= (dbias / count).reshape(shape)
    dx *= (weight * inv_std).reshape(shape)
    return dx, dweight, dbias


def batchnorm_frozen_saved(
    x: np.ndarray, running_mean: np.ndarray, running_var: np.ndarray, eps: float
) -> tuple[np.ndarray, np.ndarray]:
    """``(xhat, inv_std)`` over the running statistics: what the frozen backward reads."""
    _, shape = _channel_view(x)
    inv_std = 1.0 / np.sqrt(running_var + eps)
    return (x - running_mean.reshape(shape)) * inv_std.reshape(shape), inv_std


def batchnorm_frozen_backward(
    xhat: np.ndarray, inv_std: np.ndarray, weight: np.ndarray, dy: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(dx, dweight, dbias)`` of the affine map over frozen statistics:
    ``dx = w * inv_std * dy``, no term through the statistics."""
    _, shape = _channel_view(dy)
    return dy * (weight * inv_std).reshape(shape), _channel_sum(dy, xhat), _channel_sum(dy)


# --- Activations and loss ----------------------------------------------------------------------


def relu_forward(x: np.ndarray, cap: float | None) -> np.ndarray:
    y = np.maximum(x, 0.0)
    return np.minimum(y, cap, out=y) if cap is not None else y


def relu_backward(y: np.ndarray, dy: np.ndarray, cap: float | None) -> np.ndarray:
    """Gradient passes where the output is strictly inside ``(0, cap)``, read from ``y``."""
    mask = (y > 0) & (y < cap) if cap is not None else y > 0
    return np.where(mask, dy, 0.0)


def softmax_cross_entropy(logits: np.ndarray, labels: np.ndarray) -> tuple[float, np.ndarray]:
    """Mean cross-entropy over the batch and its gradient with respect to ``logits``."""
    shifted = logits - logits.max(axis=1, keepdims=True)
    log_sum = np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    log_probs = shifted - log_sum
    rows = np.arange(logits.shape[0])
    loss = float(-log_probs[rows, labels].mean())
    grad = np.exp(log_probs)
    grad[rows, labels] -= 1.0
    return loss, grad / logits.shape[0]
