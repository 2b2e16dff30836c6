"""Launches of the pooling kernels: max pooling (padding never wins; the gradient goes to the first
maximum of each window), average pooling (divides by the whole window, zero padding counted) and
global average pooling, forward and backward.

``flops`` counts comparisons and additions as one operation; ``bytes_moved`` counts each tensor a
kernel reads or writes once.
"""

from __future__ import annotations

from collections.abc import Mapping

import pyopencl as cl

from kernels.conv_launch import check_group, check_index_range, resolve_defines, window_args
from kernels.conv_shape import ConvShape
from kernels.launch import Launch, round_up
from kernels.library import KernelLibrary, as_int

PROGRAM = "pool"

DEFAULTS: dict[str, int] = {"POOL_WG": 64, "GAP_WG": 64}


def _check_pool(shape: ConvShape) -> None:
    if shape.k != shape.c:
        raise ValueError(
            f"Pooling keeps the channel count: shape.k must equal shape.c, got k={shape.k}, "
            f"c={shape.c}"
        )
    check_index_range(shape)


def _check_max_padding(shape: ConvShape) -> None:
    if shape.pad_h >= shape.r or shape.pad_w >= shape.s:
        raise ValueError(
            f"Max pooling padding ({shape.pad_h}, {shape.pad_w}) must be smaller than the "
            f"{shape.r}x{shape.s} window, or a window could hold nothing but padding"
        )


def _windowed(
    lib: KernelLibrary,
    kernel_name: str,
    buffers: tuple[cl.Buffer, ...],
    items: int,
    shape: ConvShape,
    tuning: Mapping[str, int] | None,
    flops: int,
    nbytes: int,
) -> list[Launch]:
    defines = resolve_defines(DEFAULTS, tuning)
    group = defines["POOL_WG"]
    check_group(lib, kernel_name, (group,))
    kernel = lib.kernel(PROGRAM, kernel_name, defines)
    sizes = (as_int(shape.n * shape.c), as_int(shape.h), as_int(shape.w))
    kernel.set_args(*buffers, *sizes, *window_args(shape))
    return [
        Launch(
            kernel_name, kernel, (round_up(items, group),), (group,), flops, nbytes,
            keep_alive=list(buffers),
        )
    ]


def maxpool_forward(
    lib: KernelLibrary,
    x: cl.Buffer,
    y: cl.Buffer,
    *,
    shape: ConvShape,
    tuning: Mapping[str, int] | None = None,
) -> list[Launch]:
    """``y`` = the maximum of each window of ``x``."""
    _check_pool(shape)
    _check_max_padding(shape)
    flops = shape.y_size * shape.r * shape.s
    nbytes = 4 * (shape.x_size + shape.y_size)
    return _windowed(
        lib, "maxpool_forward", (x, y), shape.y_size, shape, tuning, flops, nbytes
    )


def maxpool_backward(
    lib: KernelLibrary,
    x: cl.Buffer,
    dy: cl.Buffer,
    dx: cl.Buffer,
    *,
    shape: ConvShape,
    tuning: Mapping[str, int] | None = None,
) -> list[Launch]:
    """``dx`` (overwritten): each input element gathers ``dy`` of the windows whose first maximum
    (recomputed from ``x``) it is."""
    _check_pool(shape)
    _check_max_padding(shape)
    windows_per_input = -(-shape.r // shape.stride_h) * -(-shape.s // shape.stride_w)
    flops = shape.x_size * windows_per_input * (shape.r * shape.s + 1)
    nbytes = 4 * (2 * shape.x_size + shape.y_size)
    return _windowed(
        lib, "maxpool_backward", (x, dy, dx), shape.x_size, shape, tuning, flops, nbytes
    )


def avgpool_forward(
    lib: KernelLibrary,
    x: cl.Buffer,
    y: cl.Buffer,
    *,
    shape: ConvShape,
    tuning: Mapping[str, int] | None = None,
) -> list[Launch]:
    """``y`` = the sum of each window of ``x`` over ``r * s``."""
    _check_pool(shape)
    flops = shape.y_size * (shape.r * shape.s + 1)
    nbytes = 4 * (shape.x_size + shape.y_size)
    return _windowed(
        lib, "avgpool_forward", (x, y), shape.y_size, shape, tuning, flops, nbytes
    )


def avgpool_backward(
    lib: KernelLibrary,
    dy: cl.Buffer,
    dx: cl.Buffer,
    *,
    shape: ConvShape,
    tuning: Mapping[str, int] | None = None,
) -> list[Launch]:
    """``dx`` (overwritten): each input element gathers ``dy / (r * s)`` of the windows that
    cover it."""
    _check_pool(shape)
    windows_per_input = -(-shape.r // shape.stride_h) * -(-shape.s // shape.stride_w)
    flops = shape.x_size * (windows_per_input + 1)
    nbytes = 4 * (shape.x_size + shape.y_size)
    return _windowed(
        lib, "avgpool_backward", (dy, dx), shape.x_size, shape, tuning, flops, nbytes
    )


def _check_global(n: int, c: int, hw: int) -> None:
    for name, value in (("n", n), ("c", c), ("hw", hw)):
        if value < 1:
            raise ValueError(f"global average pooling needs a positive {name}, got {value}")
    as_int(n * c * hw)


def global_avgpool_forward(
    lib: KernelLibrary,
    x: cl.Buffer,
    y: cl.Buffer,
    *,
    n: int,
    c: int,
    hw: int,
    tuning: Mapping[str, int] | None = None,
) -> list[Launch]:
    """``y (n, c)`` = the mean of ``x (n, c, hw)`` over its ``hw`` spatial positions: one
    work-group per (n, c) row."""
    _check_global(n, c, hw)
    defines = resolve_defines(DEFAULTS, tuning)
    group = defines["GAP_WG"]
    check_group(lib, "global_avgpool_forward", (group,), group, power_of_two=True)
    kernel = lib.kernel(PROGRAM, "global_avgpool_forward", defines)
    kernel.set_args(x, y, as_int(hw))
    return [
        Launch(
            "global_avgpool_forward", kernel, (n * c * group,), (group,), n * c * (hw + 1),
            4 * n * c * (hw + 1), keep_alive=[x, y],
        )
    ]


def global_avgpool_backward(
    lib: KernelLibrary,
    dy: cl.Buffer,
    dx: cl.Buffer,
    *,
    n: int,
    c: int,
    hw: int,
    tuning: Mapping[str, int] | None = None,
) -> list[Launch]:
    """``dx (n, c, hw)`` (overwritten) = ``dy (n, c) / hw`` at every position."""
    _check_global(n, c, hw)
    defines = resolve_defines(DEFAULTS, tuning)
    group = defines["POOL_WG"]
    check_group(lib, "global_avgpool_backward", (group,))
    kernel = lib.kernel(PROGRAM, "global_avgpool_backward", defines)
    kernel.set_args(dy, dx, as_int(n * c), as_int(hw))
    size = n * c * hw
    return [
        Launch(
            "global_avgpool_backward", kernel, (round_up(size, group),), (group,), size,
            4 * (size + n * c), keep_alive=[dy, dx],
        )
    ]
