"""Launches of the depthwise Conv2d kernels (channel multiplier 1, weights (C, 1, R, S)): forward
with fused bias and activation, backward to the input, backward to the weights and the bias.

``flops`` counts multiply-adds as two operations; ``bytes_moved`` counts each tensor a kernel reads
or writes once.
"""

from __future__ import annotations

from collections.abc import Mapping

import pyopencl as cl

from kernels.conv2d import bias_backward
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

PROGRAM = "depthwise"

DEFAULTS: dict[str, int] = {
    "DW_FWD_PB": 4,
    "DW_FWD_WG": 64,
    "DW_BWD_PB": 4,
    "DW_BWD_WG": 64,
    "DW_BWW_RSB": 9,
    "DW_BWW_WG": 64,
}


def _check_depthwise(shape: ConvShape) -> None:
    if shape.k != shape.c:
        raise ValueError(
            f"A depthwise convolution keeps the channel count (channel multiplier 1): shape.k must "
            f"equal shape.c, got k={shape.k}, c={shape.c}"
        )
    check_index_range(shape)


def _sizes(shape: ConvShape) -> tuple:
    return tuple(as_int(v) for v in (shape.n, shape.c, shape.h, shape.w))


def depthwise_forward(
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
    """``y = act(depthwise_conv(x, w) + b)``; ``b`` may be None (no bias)."""
    _check_depthwise(shape)
    defines = resolve_defines(DEFAULTS, tuning)
    act = activation_code(activation)
    group = defines["DW_FWD_WG"]
    check_group(lib, "depthwise_forward", (group,))
    kernel = lib.kernel(PROGRAM, "depthwise_forward", defines)
    kernel.set_args(x, w, b, y, *_sizes(shape), *window_args(shape), as_int(b is not None), act)
    blocks = shape.n * shape.c * shape.out_h * ceil_div(shape.out_w, defines["DW_FWD_PB"])
    taps = shape.c * shape.r * shape.s
    epilogue = (int(b is not None) + int(activation is not None)) * shape.y_size
    flops = 2 * shape.y_size * shape.r * shape.s + epilogue
    nbytes = 4 * (shape.x_size + taps + shape.y_size + (shape.c if b is not None else 0))
    keep = [buf for buf in (x, w, b, y) if buf is not None]
    return [
        Launch(
            "depthwise_forward", kernel, (round_up(blocks, group),), (group,), flops, nbytes,
            keep_alive=keep,
        )
    ]


def depthwise_backward_data(
    lib: KernelLibrary,
    dy: cl.Buffer,
    w: cl.Buffer,
    dx: cl.Buffer,
    *,
    shape: ConvShape,
    tuning: Mapping[str, int] | None = None,
) -> list[Launch]:
    """``dx`` (overwritten) from ``dy``, the gradient at the output before any activation."""
    _check_depthwise(shape)
    defines = resolve_defines(DEFAULTS, tuning)
    group = defines["DW_BWD_WG"]
    check_group(lib, "depthwise_backward_data", (group,))
    kernel = lib.kernel(PROGRAM, "depthwise_backward_data", defines)
    kernel.set_args(dy, w, dx, *_sizes(shape), *window_args(shape))
    blocks = shape.n * shape.c * shape.h * ceil_div(shape.w, defines["DW_BWD_PB"])
    flops = 2 * shape.y_size * shape.r * shape.s
    nbytes = 4 * (shape.y_size + shape.c * shape.r * shape.s + shape.x_size)
    return [
        Launch(
            "depthwise_backward_data", kernel, (round_up(blocks, group),), (group,), flops,
            nbytes, keep_alive=[dy, w, dx],
        )
    ]


def depthwise_backward_weight(
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
    """``dw[c] (+)= sum over n, oh, ow of dy[:, c] x window(x[:, c])`` and, unless ``db`` is None,
    ``db[c] (+)= sum of dy[:, c]``; ``accumulate`` adds to the gradients already there."""
    _check_depthwise(shape)
    defines = resolve_defines(DEFAULTS, tuning)
    group = defines["DW_BWW_WG"]
    taps_per_group = defines["DW_BWW_RSB"]
    check_group(
        lib, "depthwise_backward_weight", (group,), taps_per_group * group, power_of_two=True
    )
    kernel = lib.kernel(PROGRAM, "depthwise_backward_weight", defines)
    kernel.set_args(
        x, dy, dw, *_sizes(shape), *window_args(shape), as_int(int(bool(accumulate)))
    )
    taps = shape.c * shape.r * shape.s
    global_size = (ceil_div(shape.r * shape.s, taps_per_group) * group, shape.c)
    flops = 2 * shape.y_size * shape.r * shape.s + (taps if accumulate else 0)
    nbytes = 4 * (shape.x_size + shape.y_size + taps * (2 if accumulate else 1))
    launches = [
        Launch(
            "depthwise_backward_weight", kernel, global_size, (group, 1), flops, nbytes,
            keep_alive=[x, dy, dw],
        )
    ]
    if db is not None:
        launches.append(
            bias_backward(
                lib, dy, db, n=shape.n, k=shape.c, hw=shape.out_h * shape.out_w,
                accumulate=accumulate,
            )
        )
    return launches
