"""Launches of im2col, col2im and the per-channel bias + activation: Conv2d lowered to a GEMM.

A convolution ``y = conv(x, w)`` is, per image, the matrix product ``W (K x CRS) @ col (CRS x P)``
of the weights with ``col = im2col(x)``, and its gradient to the input is
``col2im(W^T @ dy)``. The GEMM is much faster than direct convolution kernels, so the data
movement around it must stay cheap: each work-item here owns a small block of its output, laid out
per device type (see ``GPU_DEFAULTS``, ``CPU_DEFAULTS`` and ``cl/im2col.cl``). The window
geometry is built into im2col's and col2im's programs (one program per geometry), so their loops
have constant bounds and steps.

``col`` is ``(N, C*R*S, OH*OW)`` row-major: row ``(c*R + r)*S + s``, column ``oh*OW + ow``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np
import pyopencl as cl

from kernels.conv_launch import (
    activation_code,
    ceil_div,
    check_group,
    check_index_range,
    resolve_defines,
)
from kernels.conv_shape import ConvShape
from kernels.launch import Launch, round_up
from kernels.library import KernelLibrary, as_int

PROGRAM = "im2col"

# Defaults by device type. On a GPU each work-item writes one column of a few rows, so that
# neighbouring work-items write neighbouring addresses (coalesced). A CPU driver runs a work-group's
# items one after another, so there each work-item copies runs of consecutive columns, a loop the
# compiler vectorises, and pays for its index divisions once per block.
GPU_DEFAULTS: dict[str, int] = {
    "IM2COL_WG": 64,
    "IM2COL_ROWS": 4,
    "IM2COL_RUN": 1,
    "COL2IM_WG": 64,
    "COL2IM_PLANES": 4,
    "BIAS_ACT_WG": 64,
    "BIAS_ACT_PLANES": 4,
    "BIAS_ACT_RUN": 1,
}
CPU_DEFAULTS: dict[str, int] = {
    **GPU_DEFAULTS,
    "IM2COL_ROWS": 8,
    "IM2COL_RUN": 32,
    "COL2IM_PLANES": 8,
    "BIAS_ACT_PLANES": 2,
    "BIAS_ACT_RUN": 64,
}


def default_tuning(device: cl.Device) -> dict[str, int]:
    """The defines these kernels are built with unless ``tuning`` overrides some of them."""
    return dict(CPU_DEFAULTS if device.type & cl.device_type.CPU else GPU_DEFAULTS)


def col_size(shape: ConvShape) -> int:
    """Elements of ``col`` for ``shape``: ``N * C*R*S * OH*OW``."""
    return shape.n * shape.c * shape.r * shape.s * shape.out_h * shape.out_w


def inside_taps(shape: ConvShape) -> int:
    """How many elements of ``col`` come from inside the image rather than from the padding:
    the elements col2im reads and adds."""
    rows = _axis_taps(shape.h, shape.r, shape.stride_h, shape.pad_h, shape.out_h)
    cols = _axis_taps(shape.w, shape.s, shape.stride_w, shape.pad_w, shape.out_w)
    return shape.n * shape.c * int(np.count_nonzero(rows >= 0)) * int(np.count_nonzero(cols >= 0))


def covered_inputs(shape: ConvShape) -> int:
    """How many input elements some window covers (a stride wider than the window skips some):
    the elements im2col reads at least once."""
    rows = _axis_taps(shape.h, shape.r, shape.stride_h, shape.pad_h, shape.out_h)
    cols = _axis_taps(shape.w, shape.s, shape.stride_w, shape.pad_w, shape.out_w)
    distinct_rows, distinct_cols = np.unique(rows[rows >= 0]).size, np.unique(cols[cols >= 0]).size
    return shape.n * shape.c * distinct_rows * distinct_cols


def _axis_taps(size: int, window: int, stride: int, pad: int, out: int) -> np.ndarray:
    """Input coordinate of every (window offset, output position) along one axis; -1 where it
    falls into the padding."""
    taps = np.arange(window)[:, None] + stride * np.arange(out)[None, :] - pad
    return np.where((taps >= 0) & (taps < size), taps, -1)


def _launch(
    lib: KernelLibrary,
    kernel_name: str,
    prefix: str,
    tuning: Mapping[str, int] | None,
    work_items: Callable[[Mapping[str, int]], int],
    args: tuple,
    flops: int,
    nbytes: int,
    shape: ConvShape | None = None,
) -> Launch:
    """Build ``kernel_name`` with the device's defaults overridden by ``tuning`` (and the window
    geometry of ``shape``, if given), bind ``args`` and launch ``work_items(defines)`` work-items
    in groups of ``<prefix>_WG``."""
    defines = resolve_defines(default_tuning(lib.device), tuning)
    group = defines[f"{prefix}_WG"]
    check_group(lib, kernel_name, (group,))
    global_size = round_up(work_items(defines), group)
    as_int(global_size)
    if shape is not None:
        defines.update(
            IM_R=shape.r, IM_S=shape.s, IM_SH=shape.stride_h, IM_SW=shape.stride_w,
            IM_PH=shape.pad_h, IM_PW=shape.pad_w,
        )
    kernel = lib.kernel(PROGRAM, kernel_name, defines)
    kernel.set_args(*args)
    keep = [arg for arg in args if isinstance(arg, cl.Buffer)]
    return Launch(kernel_name, kernel, (global_size,), (group,), flops, nbytes, keep_alive=keep)


def im2col(
    lib: KernelLibrary,
    x: cl.Buffer,
    col: cl.Buffer,
    *,
    shape: ConvShape,
    tuning: Mapping[str, int] | None = None,
) -> list[Launch]:
    """``col[n, (c, r, s), (oh, ow)] = x[n, c, oh*sh - ph + r, ow*sw - pw + s]``, 0 in the
    padding; every element of ``col`` is written."""
    total = col_size(shape)
    check_index_range(shape, total)
    rows = shape.n * shape.c * shape.r * shape.s

    def work_items(d: Mapping[str, int]) -> int:
        runs = ceil_div(shape.out_w, d["IM2COL_RUN"])
        return ceil_div(rows, d["IM2COL_ROWS"]) * shape.out_h * runs

    args = (x, col, *_image_args(shape))
    nbytes = 4 * (covered_inputs(shape) + total)
    return [_launch(lib, "im2col", "IM2COL", tuning, work_items, args, 0, nbytes, shape)]


def col2im(
    lib: KernelLibrary,
    col: cl.Buffer,
    dx: cl.Buffer,
    *,
    shape: ConvShape,
    tuning: Mapping[str, int] | None = None,
) -> list[Launch]:
    """The adjoint of :func:`im2col`: ``dx[n, c, h, w]`` (overwritten) is the sum of the ``col``
    elements that im2col would fill from ``x[n, c, h, w]``, gathered per ``dx`` element in a fixed
    order, so the result is deterministic."""
    check_index_range(shape, col_size(shape))

    def work_items(d: Mapping[str, int]) -> int:
        return ceil_div(shape.n * shape.c, d["COL2IM_PLANES"]) * shape.h * shape.w

    args = (col, dx, *_image_args(shape))
    taps = inside_taps(shape)
    nbytes = 4 * (taps + shape.x_size)
    return [_launch(lib, "col2im", "COL2IM", tuning, work_items, args, taps, nbytes, shape)]


def bias_activation(
    lib: KernelLibrary,
    y: cl.Buffer,
    b: cl.Buffer | None,
    *,
    n: int,
    c: int,
    hw: int,
    activation: str | None,
    tuning: Mapping[str, int] | None = None,
) -> list[Launch]:
    """``y = act(y + b[c])`` in place on ``y (n, c, hw)``; without ``b`` only the activation.
    With neither there is nothing to do and the list is empty."""
    act = activation_code(activation)
    for name, value in (("n", n), ("c", c), ("hw", hw)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise ValueError(f"bias_activation: {name} must be a positive int, got {value!r}")
    if b is None and activation is None:
        return []
    total = n * c * hw
    as_int(total)

    def work_items(d: Mapping[str, int]) -> int:
        return ceil_div(n * c, d["BIAS_ACT_PLANES"]) * ceil_div(hw, d["BIAS_ACT_RUN"])

    args = (y, b, as_int(n), as_int(c), as_int(hw), as_int(int(b is not None)), act)
    flops = total * (int(b is not None) + int(activation is not None))
    nbytes = 4 * (2 * total + (c if b is not None else 0))
    return [_launch(lib, "bias_activation", "BIAS_ACT", tuning, work_items, args, flops, nbytes)]


def _image_args(shape: ConvShape) -> tuple[np.int32, ...]:
    return tuple(
        as_int(v) for v in (shape.n, shape.c, shape.h, shape.w, shape.out_h, shape.out_w)
    )
