"""Launches of the Conv2d kernels (NCHW, weights (K, C, R, S)): forward with fused bias and
activation, backward to the input, backward to the weights and the bias.

``flops`` counts multiply-adds as two operations; ``bytes_moved`` counts each tensor a kernel reads
or writes once (reuse through caches is the device's business, not extra traffic).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pyopencl as cl

from kernels.conv_launch import (
    activation_code,
    ceil_div,
    check_group,
    check_index_range,
    resolve_defines,
    window_args,
)
from kernels.conv_shape import ConvShape
from kernels.launch import Launch, round_up
from kernels.library import KernelLibrary, as_int

PROGRAM = "conv2d"

DEFAULTS: dict[str, int] = {
    "FWD_KB": 4,
    "FWD_PB": 4,
    "FWD_WG_P": 16,
    "FWD_WG_K": 4,
    "BWD_CB": 4,
    "BWD_PB": 4,
    "BWD_WG_P": 16,
    "BWD_WG_C": 4,
    "BWW_KB": 4,
    "BWW_CB": 4,
    "BWW_WG": 64,
    "BIAS_WG": 64,
}


def _sizes(shape: ConvShape) -> tuple[np.int32, ...]:
    return tuple(as_int(v) for v in (shape.n, shape.c, shape.h, shape.w, shape.k))


def _weight_size(shape: ConvShape) -> int:
    return shape.k * shape.c * shape.r * shape.s


def conv2d_forward(
    lib: KernelLibrary,
    x: cl.Buffer,
    w: cl.Buffer,
    b: cl.Buffer | None,
    y: cl.Buffer,
    *,
    shape: ConvShape,
    activation: str | None = None,
    tuning: Mapping[str, int] | None = None,
) -> list[Launch]:
    """``y = act(conv(x, w) + b)``; ``b`` may be None (no bias)."""
    defines = resolve_defines(DEFAULTS, tuning)
    act = activation_code(activation)
    check_index_range(shape, _weight_size(shape))
    local = (defines["FWD_WG_P"], defines["FWD_WG_K"])
    check_group(lib, "conv2d_forward", local)
    kernel = lib.kernel(PROGRAM, "conv2d_forward", defines)
    kernel.set_args(
        x, w, b, y, *_sizes(shape), *window_args(shape), as_int(b is not None), act
    )
    pixel_blocks = shape.n * shape.out_h * ceil_div(shape.out_w, defines["FWD_PB"])
    channel_blocks = ceil_div(shape.k, defines["FWD_KB"])
    global_size = (round_up(pixel_blocks, local[0]), round_up(channel_blocks, local[1]))
    epilogue = (int(b is not None) + int(activation is not None)) * shape.y_size
    flops = 2 * shape.y_size * shape.c * shape.r * shape.s + epilogue
    bias_size = shape.k if b is not None else 0
    nbytes = 4 * (shape.x_size + _weight_size(shape) + shape.y_size + bias_size)
    keep = [buf for buf in (x, w, b, y) if buf is not None]
    return [Launch("conv2d_forward", kernel, global_size, local, flops, nbytes, keep_alive=keep)]


def conv2d_backward_data(
    lib: KernelLibrary,
    dy: cl.Buffer,
    w: cl.Buffer,
    dx: cl.Buffer,
    *,
    shape: ConvShape,
    tuning: Mapping[str, int] | None = None,
) -> list[Launch]:
    """``dx`` (overwritten) from ``dy``, the gradient at the convolution's output before any
    activation: a transposed convolution gathered per input pixel."""
    defines = resolve_defines(DEFAULTS, tuning)
    check_index_range(shape, _weight_size(shape))
    local = (defines["BWD_WG_P"], defines["BWD_WG_C"])
    check_group(lib, "conv2d_backward_data", local)
    kernel = lib.kernel(PROGRAM, "conv2d_backward_data", defines)
    kernel.set_args(dy, w, dx, *_sizes(shape), *window_args(shape))
    pixel_blocks = shape.n * shape.h * ceil_div(shape.w, defines["BWD_PB"])
    channel_blocks = ceil_div(shape.c, defines["BWD_CB"])
    global_size = (round_up(pixel_blocks, local[0]), round_up(channel_blocks, local[1]))
    flops = 2 * shape.y_size * shape.c * shape.r * shape.s
    nbytes = 4 * (shape.y_size + _weight_size(shape) + shape.x_size)
    return [
        Launch(
            "conv2d_backward_data", kernel, global_size, local, flops, nbytes,
            keep_alive=[dy, w, dx],
        )
    ]


def conv2d_backward_weight(
    lib: KernelLibrary,
    x: cl.Buffer,
    dy: cl.Buffer,
    dw: cl.Buffer,
    db: cl.Buffer | None,
    *,
    shape: ConvShape,
    accumulate: bool = False,
    tuning: Mapping[str, int] | None = None,
) -> list[Launch]:
    """``dw (+)= sum over n, oh, ow of dy x window(x)`` and, unless ``db`` is None,
    ``db[k] (+)= sum of dy[:, k]``; ``accumulate`` adds to the gradients already there."""
    defines = resolve_defines(DEFAULTS, tuning)
    check_index_range(shape, _weight_size(shape))
    group = defines["BWW_WG"]
    block_floats = defines["BWW_KB"] * defines["BWW_CB"] * group
    check_group(lib, "conv2d_backward_weight", (group,), block_floats)
    kernel = lib.kernel(PROGRAM, "conv2d_backward_weight", defines)
    kernel.set_args(
        x, dy, dw, *_sizes(shape), *window_args(shape), as_int(int(bool(accumulate)))
    )
    crs = shape.c * shape.r * shape.s
    global_size = (ceil_div(crs, defines["BWW_CB"]) * group, ceil_div(shape.k, defines["BWW_KB"]))
    flops = 2 * shape.y_size * crs + (_weight_size(shape) if accumulate else 0)
    nbytes = 4 * (shape.x_size + shape.y_size + _weight_size(shape) * (2 if accumulate else 1))
    launches = [
        Launch(
            "conv2d_backward_weight", kernel, global_size, (group, 1), flops, nbytes,
            keep_alive=[x, dy, dw],
        )
    ]
    if db is not None:
        launches.append(
            bias_backward(
                lib, dy, db, n=shape.n, k=shape.k, hw=shape.out_h * shape.out_w,
                accumulate=accumulate, tuning=tuning,
            )
        )
    return launches


def bias_backward(
    lib: KernelLibrary,
    dy: cl.Buffer,
    db: cl.Buffer,
    *,
    n: int,
    k: int,
    hw: int,
    accumulate: bool = False,
    tuning: Mapping[str, int] | None = None,
) -> Launch:
    """``db[k] (+)= sum over n and the hw positions of dy (n, k, hw)``: the bias gradient of a
    convolution (depthwise too), one work-group per channel."""
    defines = resolve_defines(DEFAULTS, tuning)
    as_int(n * k * hw)
    group = defines["BIAS_WG"]
    check_group(lib, "channel_bias_backward", (group,), group, power_of_two=True)
    kernel = lib.kernel(PROGRAM, "channel_bias_backward", defines)
    kernel.set_args(dy, db, as_int(n), as_int(k), as_int(hw), as_int(int(bool(accumulate))))
    flops = n * k * hw + (k if accumulate else 0)
    nbytes = 4 * (n * k * hw + k * (2 if accumulate else 1))
    return Launch(
        "channel_bias_backward", kernel, (k * group,), (group,), flops, nbytes,
        keep_alive=[dy, db],
    )
