"""One resolved layer's float64 forward and backward on a batch, reading its parameters by name.

Residual markers are not handled here: the trainer keeps and adds the skip itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from mgfl.models import reference_ops as ops
from mgfl.models.layers import (
    AvgPool2d,
    BatchNorm,
    Conv2d,
    DepthwiseConv2d,
    Dropout,
    Flatten,
    GlobalAvgPool,
    Linear,
    MaxPool2d,
    ReLU,
    ReLU6,
    dropout_seed,
)
from mgfl.models.model import ResolvedLayer

State = dict[str, np.ndarray]


@dataclass
class Tape:
    """What one layer's forward left for its backward."""

    input_shape: tuple[int, ...]
    saved: Any = None
    batch_stats: tuple[np.ndarray, np.ndarray, int] | None = None  # BatchNorm: mean, var, count


def dropout_keep(shape: tuple[int, ...], p: float, path: str, step: int) -> np.ndarray:
    """Boolean keep mask of a whole ``(N, ...)`` batch at training step ``step``.

    Drawn by ``kernels.reference.dropout.dropout_mask`` over the flattened batch, the same
    hash the OpenCL kernel evaluates."""
    from kernels.reference.dropout import dropout_mask

    count = int(np.prod(shape))
    keep = np.asarray(dropout_mask(count, p, dropout_seed(path), step, index_offset=0))
    if keep.shape != (count,):
        raise ValueError(f"dropout_mask gave shape {keep.shape}, expected ({count},)")
    return keep.astype(bool).reshape(shape)


def forward(
    entry: ResolvedLayer,
    x: np.ndarray,
    state: State,
    training: bool,
    step: int,
    frozen_statistics: bool = False,
) -> tuple[np.ndarray, Tape]:
    """Output of ``entry`` on batch ``x``; ``training`` selects batch statistics and dropout.
    A BatchNorm with ``frozen_statistics`` normalises with its running statistics in training
    too (``mgfl.models.frozen_statistics``)."""
    layer, tape = entry.layer, Tape(x.shape)
    weight = state.get(f"{entry.path}.weight")
    bias = state.get(f"{entry.path}.bias")
    if isinstance(layer, Linear):
        tape.saved = x
        return ops.linear_forward(x, weight, bias), tape
    if isinstance(layer, Conv2d):
        y, tape.saved = ops.conv2d_forward(x, weight, bias, layer.stride, layer.padding)
        return y, tape
    if isinstance(layer, DepthwiseConv2d):
        y, tape.saved = ops.depthwise_forward(x, weight, bias, layer.stride, layer.padding)
        return y, tape
    if isinstance(layer, BatchNorm):
        if not training or frozen_statistics:
            mean, var = state[f"{entry.path}.running_mean"], state[f"{entry.path}.running_var"]
            if training:
                tape.saved = ops.batchnorm_frozen_saved(x, mean, var, layer.eps)
            return ops.batchnorm_eval_forward(x, weight, bias, mean, var, layer.eps), tape
        count = x.size // x.shape[1]
        if count < 2:
            raise ValueError(
                f"{entry.path}: BatchNorm in training needs more than one value per channel, "
                f"got a batch of shape {x.shape}"
            )
        y, (xhat, inv_std, mean, var) = ops.batchnorm_train_forward(x, weight, bias, layer.eps)
        tape.saved, tape.batch_stats = (xhat, inv_std), (mean, var, count)
        return y, tape
    if isinstance(layer, (ReLU, ReLU6)):
        y = ops.relu_forward(x, 6.0 if isinstance(layer, ReLU6) else None)
        tape.saved = y
        return y, tape
    if isinstance(layer, MaxPool2d):
        y, tape.saved = ops.maxpool_forward(x, layer.kernel_size, layer.stride, layer.padding)
        return y, tape
    if isinstance(layer, AvgPool2d):
        return ops.avgpool_forward(x, layer.kernel_size, layer.stride, layer.padding), tape
    if isinstance(layer, GlobalAvgPool):
        return ops.global_avgpool_forward(x), tape
    if isinstance(layer, Flatten):
        return x.reshape(x.shape[0], -1), tape
    if isinstance(layer, Dropout):
        if not training or layer.p == 0.0:
            return x, tape
        tape.saved = dropout_keep(x.shape, layer.p, entry.path, step) / (1.0 - layer.p)
        return x * tape.saved, tape
    raise ValueError(f"{entry.path}: the reference trainer has no rule for {layer!r}")


def backward(
    entry: ResolvedLayer, tape: Tape, dy: np.ndarray, state: State
) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Gradient with respect to the layer's input, and its parameters' gradients by full name.

    Called only after a training-mode ``forward``."""
    layer, path = entry.layer, entry.path
    weight = state.get(f"{path}.weight")

    def named(dweight: np.ndarray, dbias: np.ndarray | None = None) -> dict[str, np.ndarray]:
        grads = {f"{path}.weight": dweight}
        if f"{path}.bias" in entry.params and dbias is not None:
            grads[f"{path}.bias"] = dbias
        return grads

    if isinstance(layer, Linear):
        dx, dw, db = ops.linear_backward(tape.saved, weight, dy)
        return dx, named(dw, db)
    if isinstance(layer, Conv2d):
        dx, dw, db = ops.conv2d_backward(
            tape.saved, tape.input_shape, weight, dy, layer.stride, layer.padding
        )
        return dx, named(dw, db)
    if isinstance(layer, DepthwiseConv2d):
        dx, dw, db = ops.depthwise_backward(
            tape.saved, tape.input_shape, weight, dy, layer.stride, layer.padding
        )
        return dx, named(dw, db)
    if isinstance(layer, BatchNorm):
        xhat, inv_std = tape.saved
        frozen = tape.batch_stats is None
        backward = ops.batchnorm_frozen_backward if frozen else ops.batchnorm_train_backward
        dx, dw, db = backward(xhat, inv_std, weight, dy)
        return dx, named(dw, db)
    if isinstance(layer, (ReLU, ReLU6)):
        return ops.relu_backward(tape.saved, dy, 6.0 if isinstance(layer, ReLU6) else None), {}
    if isinstance(layer, MaxPool2d):
        dx = ops.maxpool_backward(
            tape.saved, tape.input_shape, dy, layer.kernel_size, layer.stride, layer.padding
        )
        return dx, {}
    if isinstance(layer, AvgPool2d):
        dx = ops.avgpool_backward(
            tape.input_shape, dy, layer.kernel_size, layer.stride, layer.padding
        )
        return dx, {}
    if isinstance(layer, GlobalAvgPool):
        return ops.global_avgpool_backward(tape.input_shape, dy), {}
    if isinstance(layer, Flatten):
        return dy.reshape(tape.input_shape), {}
    if isinstance(layer, Dropout):
        return (dy if tape.saved is None else dy * tape.saved), {}
    raise ValueError(f"{path}: the reference trainer has no rule for {layer!r}")
