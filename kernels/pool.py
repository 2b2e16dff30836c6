"""Launches of the pooling kernels: max pooling (padding never wins; the gradient goes to the first
maximum of each window), average pooling (divides by the whole window, zero padding counted) and
global average pooling, forward and backward.

The window geometry is built into the program (one program per geometry, like the depthwise
kernels), so the loops over a window have constant bounds. Max pooling whose windows tile the input
(stride == window, no padding: LeNet-5's and the 1-D CNN's) takes a vector path: a work-item owns a
block of neighbouring windows, the forward writes their maxima and the backward every input
gradient under them. On CPUs the blocks are as wide as the native float vector and several rows
tall; on GPUs 4 wide and one row tall, which keeps enough work-items in flight.

``flops`` counts comparisons and additions as one operation; ``bytes_moved`` counts each tensor a
kernel reads or writes once.
"""

from __future__ import annotations

from collections.abc import Mapping

import pyopencl as cl

from kernels.conv_launch import ceil_div, check_group, check_index_range, resolve_defines
from kernels.conv_shape import ConvShape
from kernels.launch import Launch, round_up, row_grid
from kernels.library import KernelLibrary, as_int

PROGRAM = "pool"

VECTOR_WIDTHS = (1, 2, 4, 8, 16)

GPU_DEFAULTS: dict[str, int] = {"POOL_WG": 64, "POOL_PB": 4, "POOL_RB": 1, "GAP_WG": 64}
# A CPU driver runs a work-group's items one after another: items that take 8 windows of 4 rows
# pay the per-item bookkeeping once per 32 windows, and 8 lanes fill an AVX register.
CPU_DEFAULTS: dict[str, int] = {**GPU_DEFAULTS, "POOL_PB": 8, "POOL_RB": 4}
DEFAULTS = GPU_DEFAULTS  # GPUs and other devices; default_tuning picks by device type


def default_tuning(device: cl.Device) -> dict[str, int]:
    """The defaults for the device type; a CPU's blocks are as wide as its float vectors (at
    least 4, at most 16)."""
    if not device.type & cl.device_type.CPU:
        return dict(GPU_DEFAULTS)
    native = int(device.native_vector_width_float)
    width = max(w for w in VECTOR_WIDTHS if w <= max(4, min(native, 16)))
    return {**CPU_DEFAULTS, "POOL_PB": width}


def tiles(shape: ConvShape) -> bool:
    """Whether the windows tile the input (stride == window, no padding): no two windows share an
    input, so max pooling takes the vector path."""
    return (
        shape.stride_h == shape.r and shape.stride_w == shape.s
        and shape.pad_h == 0 and shape.pad_w == 0
    )


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


def _defines(lib: KernelLibrary, shape: ConvShape, tuning: Mapping[str, int] | None) -> dict:
    """Tuning defines (checked) plus the window geometry the program is built for. A block of
    2-wide windows is loaded as one vector of twice its width, so it is at most 8 windows."""
    defines = resolve_defines(default_tuning(lib.device), tuning)
    if defines["POOL_PB"] not in VECTOR_WIDTHS:
        raise ValueError(
            f"POOL_PB is a vector width and must be one of {VECTOR_WIDTHS}, "
            f"got {defines['POOL_PB']}"
        )
    if shape.s == 2:
        defines["POOL_PB"] = min(defines["POOL_PB"], 8)
    defines.update(
        POOL_R=shape.r, POOL_S=shape.s, POOL_SH=shape.stride_h, POOL_SW=shape.stride_w,
        POOL_PH=shape.pad_h, POOL_PW=shape.pad_w,
    )
    return defines


def _sizes(shape: ConvShape) -> tuple:
    return tuple(
        as_int(v) for v in (shape.n * shape.c, shape.h, shape.w, shape.out_h, shape.out_w)
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
    """A general-path launch: one output or input element per work-item."""
    defines = _defines(lib, shape, tuning)
    group = defines["POOL_WG"]
    check_group(lib, kernel_name, (group,))
    kernel = lib.kernel(PROGRAM, kernel_name, defines)
    kernel.set_args(*buffers, *_sizes(shape))
    return [
        Launch(
            kernel_name, kernel, (round_up(items, group),), (group,), flops, nbytes,
            keep_alive=list(buffers),
        )
    ]


def _tiled(
    lib: KernelLibrary,
    kernel_name: str,
    buffers: tuple[cl.Buffer, ...],
    shape: ConvShape,
    tuning: Mapping[str, int] | None,
    flops: int,
    nbytes: int,
) -> list[Launch]:
    """A tiled-path launch: one work-item per block of POOL_PB x POOL_RB windows."""
    defines = _defines(lib, shape, tuning)
    global_size, local = row_grid(
        lib,
        ceil_div(shape.out_w, defines["POOL_PB"]), ceil_div(shape.out_h, defines["POOL_RB"]),
        shape.n * shape.c,
        defines["POOL_WG"],
    )
    check_group(lib, kernel_name, local)
    kernel = lib.kernel(PROGRAM, kernel_name, defines)
    kernel.set_args(*buffers, *_sizes(shape))
    return [
        Launch(kernel_name, kernel, global_size, local, flops, nbytes, keep_alive=list(buffers))
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
    if tiles(shape):
        nbytes = 4 * (shape.y_size * shape.r * shape.s + shape.y_size)
        return _tiled(lib, "maxpool_forward", (x, y), shape, tuning, flops, nbytes)
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
    (recomputed from ``x``) it is. Tiling windows each write their own inputs' gradients
    instead (and zeros where no window reaches)."""
    _check_pool(shape)
    _check_max_padding(shape)
    if tiles(shape):
        covered = shape.y_size * shape.r * shape.s
        flops = covered
        nbytes = 4 * (covered + shape.y_size + shape.x_size)
        return _tiled(lib, "maxpool_backward", (x, dy, dx), shape, tuning, flops, nbytes)
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
    defines = resolve_defines(default_tuning(lib.device), tuning)
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
    defines = resolve_defines(default_tuning(lib.device), tuning)
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
