"""Launches of the bias-gradient reductions: column sums (Linear) and channel sums (conv, BN).

Both are one launch with one work-group per output element (or strip of columns) and a fixed-order
tree in local memory, so results are identical from run to run. Work-group shapes follow the
problem (few columns get more row lanes) and are build-time defines.
"""

from __future__ import annotations

import pyopencl as cl

from kernels.launch import Launch, round_up
from kernels.library import KernelLibrary, as_int

MAX_GROUP = 256
MAX_GROUP_COLS = 16


def _power_of_two_at_most(value: int) -> int:
    return 1 << (max(int(value), 1).bit_length() - 1)


def _power_of_two_at_least(value: int) -> int:
    return 1 << (max(int(value), 1) - 1).bit_length()


def _group_limit(lib: KernelLibrary) -> int:
    return _power_of_two_at_most(min(MAX_GROUP, int(lib.device.max_work_group_size)))


def sum_rows(
    lib: KernelLibrary, x: cl.Buffer, out: cl.Buffer, *, rows: int, cols: int,
    accumulate: bool = False,
) -> Launch:
    """``out[j] (+)= sum_i x[i, j]`` for x of shape (rows, cols): the Linear bias gradient."""
    _check_positive(rows=rows, cols=cols)
    limit = _group_limit(lib)
    group_cols = min(MAX_GROUP_COLS, _power_of_two_at_least(cols), limit)
    group_rows = min(limit // group_cols, _power_of_two_at_least(rows))
    kernel = lib.kernel("reduce", "sum_rows", {"GROUP_COLS": group_cols, "GROUP_ROWS": group_rows})
    kernel.set_args(x, out, as_int(rows), as_int(cols), as_int(int(accumulate)))
    return Launch(
        "sum_rows", kernel, (round_up(cols, group_cols), group_rows), (group_cols, group_rows),
        flops=rows * cols + (cols if accumulate else 0),
        bytes_moved=4 * (rows * cols + cols * (2 if accumulate else 1)),
        keep_alive=[x, out],
    )


def sum_channels(
    lib: KernelLibrary, x: cl.Buffer, out: cl.Buffer, *, n: int, c: int, hw: int,
    accumulate: bool = False,
) -> Launch:
    """``out[ch] (+)= sum over n and the hw positions of x`` for x of shape (n, c, hw): the
    convolution and batch-norm bias gradient."""
    _check_positive(n=n, c=c, hw=hw)
    group = min(_group_limit(lib), _power_of_two_at_least(n * hw))
    kernel = lib.kernel("reduce", "sum_channels", {"GROUP_SIZE": group})
    kernel.set_args(x, out, as_int(n), as_int(c), as_int(hw), as_int(int(accumulate)))
    return Launch(
        "sum_channels", kernel, (c * group,), (group,),
        flops=n * c * hw + (c if accumulate else 0),
        bytes_moved=4 * (n * c * hw + c * (2 if accumulate else 1)),
        keep_alive=[x, out],
    )


def _check_positive(**sizes: int) -> None:
    bad = {name: size for name, size in sizes.items() if size < 1}
    if bad:
        raise ValueError(f"Reductions need positive sizes, got {bad}")
