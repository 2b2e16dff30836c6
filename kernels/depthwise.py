"""Launches of the depthwise Conv2d kernels (channel multiplier 1, weights (C, 1, R, S)): forward
with fused bias and activation, backward to the input, backward to the weights and the bias.

The window geometry is built into the program (one program per geometry), so the taps unroll into
vector code with constant offsets. Work-items own a vector of neighbouring outputs along a row; on
CPUs the vectors are as wide as the native float vector (8 with AVX) and an item takes several
rows, on GPUs they are 4 wide with one row per item, which keeps enough work-items in flight.

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
)
from kernels.conv_shape import ConvShape
from kernels.launch import Launch, row_grid
from kernels.library import KernelLibrary, as_int

PROGRAM = "depthwise"

VECTOR_WIDTHS = (1, 2, 4, 8, 16)
VECTOR_DEFINES = ("DW_FWD_PB", "DW_BWD_PB", "DW_BWW_PB")

GPU_DEFAULTS: dict[str, int] = {
    "DW_FWD_PB": 4,
    "DW_FWD_RB": 1,
    "DW_FWD_WG": 64,
    "DW_BWD_PB": 4,
    "DW_BWD_RB": 1,
    "DW_BWD_WG": 64,
    "DW_BWW_PB": 4,
    "DW_BWW_RSB": 9,
    "DW_BWW_WG": 64,
}
# Measured with PoCL on the DS-CNN shapes (32 x 64 x 20 x 20, 3 x 3): items that take 16 rows
# and backward-weight groups of 4 items, each walking its column block down every row, spend the
# least on per-item bookkeeping, which PoCL pays item by item.
CPU_DEFAULTS: dict[str, int] = {
    **GPU_DEFAULTS,
    "DW_FWD_PB": 8,
    "DW_FWD_RB": 16,
    "DW_BWD_PB": 8,
    "DW_BWD_RB": 16,
    "DW_BWW_PB": 8,
    "DW_BWW_RSB": 16,
    "DW_BWW_WG": 4,
}
DEFAULTS = GPU_DEFAULTS  # GPUs and other devices; default_tuning picks by device type


def default_tuning(device: cl.Device) -> dict[str, int]:
    """The defaults for the device type. A CPU driver runs a work-group's items one after another,
    so its items take several rows (fewer items, less bookkeeping) and vectors as wide as its SIMD
    unit; a GPU keeps one row of 4-wide vectors per item, for enough items in flight."""
    if not device.type & cl.device_type.CPU:
        return dict(GPU_DEFAULTS)
    native = int(device.native_vector_width_float)
    width = max(w for w in VECTOR_WIDTHS if w <= max(4, min(native, 16)))
    return {**CPU_DEFAULTS, "DW_FWD_PB": width, "DW_BWD_PB": width, "DW_BWW_PB": width}


def _check_depthwise(shape: ConvShape) -> None:
    if shape.k != shape.c:
        raise ValueError(
            f"A depthwise convolution keeps the channel count (channel multiplier 1): shape.k must "
            f"equal shape.c, got k={shape.k}, c={shape.c}"
        )
    check_index_range(shape)


def _defines(lib: KernelLibrary, shape: ConvShape, tuning: Mapping[str, int] | None) -> dict:
    """Tuning defines (checked) plus the window geometry the program is built for and whether
    the device fuses multiply-adds."""
    defines = resolve_defines(default_tuning(lib.device), tuning)
    for name in VECTOR_DEFINES:
        if defines[name] not in VECTOR_WIDTHS:
            raise ValueError(
                f"{name} is a vector width and must be one of {VECTOR_WIDTHS}, got {defines[name]}"
            )
    defines["DW_BWW_RSB"] = min(defines["DW_BWW_RSB"], shape.r * shape.s)
    defines.update(
        DW_R=shape.r, DW_S=shape.s, DW_SH=shape.stride_h, DW_SW=shape.stride_w,
        DW_PH=shape.pad_h, DW_PW=shape.pad_w,
        DW_FMA=int(bool(lib.device.single_fp_config & cl.device_fp_config.FMA)),
    )
    return defines


def _sizes(shape: ConvShape) -> tuple:
    return tuple(
        as_int(v) for v in (shape.n, shape.c, shape.h, shape.w, shape.out_h, shape.out_w)
    )


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
    defines = _defines(lib, shape, tuning)
    act = activation_code(activation)
    global_size, local = row_grid(
        lib,
        ceil_div(shape.out_w, defines["DW_FWD_PB"]), ceil_div(shape.out_h, defines["DW_FWD_RB"]),
        shape.n * shape.c,
        defines["DW_FWD_WG"],
    )
    check_group(lib, "depthwise_forward", local)
    kernel = lib.kernel(PROGRAM, "depthwise_forward", defines)
    kernel.set_args(x, w, b, y, *_sizes(shape), as_int(b is not None), act)
    taps = shape.c * shape.r * shape.s
    epilogue = (int(b is not None) + int(activation is not None)) * shape.y_size
    flops = 2 * shape.y_size * shape.r * shape.s + epilogue
    nbytes = 4 * (shape.x_size + taps + shape.y_size + (shape.c if b is not None else 0))
    keep = [buf for buf in (x, w, b, y) if buf is not None]
    return [
        Launch(
            "depthwise_forward", kernel, global_size, local, flops, nbytes, keep_alive=keep,
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
    defines = _defines(lib, shape, tuning)
    global_size, local = row_grid(
        lib,
        ceil_div(shape.w, defines["DW_BWD_PB"]), ceil_div(shape.h, defines["DW_BWD_RB"]),
        shape.n * shape.c,
        defines["DW_BWD_WG"],
    )
    check_group(lib, "depthwise_backward_data", local)
    kernel = lib.kernel(PROGRAM, "depthwise_backward_data", defines)
    kernel.set_args(dy, w, dx, *_sizes(shape))
    flops = 2 * shape.y_size * shape.r * shape.s
    nbytes = 4 * (shape.y_size + shape.c * shape.r * shape.s + shape.x_size)
    return [
        Launch(
            "depthwise_backward_data", kernel, global_size, local, flops, nbytes,
            keep_alive=[dy, w, dx],
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
    defines = _defines(lib, shape, tuning)
    group = defines["DW_BWW_WG"]
    taps_per_group = defines["DW_BWW_RSB"]
    check_group(
        lib, "depthwise_backward_weight", (group,), taps_per_group * group, power_of_two=True
    )
    kernel = lib.kernel(PROGRAM, "depthwise_backward_weight", defines)
    kernel.set_args(x, dy, dw, *_sizes(shape), as_int(int(bool(accumulate))))
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
