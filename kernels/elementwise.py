"""Launches of the element-wise kernels: ReLU, ReLU6, residual add, accumulate, copy and fill."""

from __future__ import annotations

import numpy as np
import pyopencl as cl

from kernels.launch import Launch, round_up
from kernels.library import KernelLibrary, as_int

GROUP = 64
ACTIVATIONS = ("relu", "relu6")


def _launch(lib: KernelLibrary, kernel_name: str, n: int, *args, flops: int, nbytes: int) -> Launch:
    kernel = lib.kernel("elementwise", kernel_name)
    kernel.set_args(*args, as_int(n))
    return Launch(
        kernel_name, kernel, (round_up(n, GROUP),), (GROUP,), flops, nbytes, keep_alive=list(args)
    )


def activation_forward(lib: KernelLibrary, kind: str, x: cl.Buffer, y: cl.Buffer, n: int) -> Launch:
    """``y = relu(x)`` or ``relu6(x)``; ``x`` and ``y`` may be the same buffer."""
    _check_kind(kind)
    return _launch(lib, f"{kind}_forward", n, x, y, flops=n, nbytes=8 * n)


def activation_backward(
    lib: KernelLibrary, kind: str, y: cl.Buffer, dy: cl.Buffer, dx: cl.Buffer, n: int
) -> Launch:
    """``dx = dy * act'(.)`` read from the forward output ``y``; ``dx`` may alias ``dy``."""
    _check_kind(kind)
    return _launch(lib, f"{kind}_backward", n, y, dy, dx, flops=n, nbytes=12 * n)


def add(lib: KernelLibrary, a: cl.Buffer, b: cl.Buffer, out: cl.Buffer, n: int) -> Launch:
    """``out = a + b`` for a residual connection."""
    return _launch(lib, "add_forward", n, a, b, out, flops=n, nbytes=12 * n)


def accumulate(lib: KernelLibrary, acc: cl.Buffer, g: cl.Buffer, n: int) -> Launch:
    """``acc += g``: gradients that meet at a residual fork, or micro-batch accumulation."""
    return _launch(lib, "accumulate", n, acc, g, flops=n, nbytes=12 * n)


def copy(lib: KernelLibrary, src: cl.Buffer, dst: cl.Buffer, n: int) -> Launch:
    return _launch(lib, "copy", n, src, dst, flops=0, nbytes=8 * n)


def fill(lib: KernelLibrary, dst: cl.Buffer, value: float, n: int) -> Launch:
    return _launch(lib, "fill", n, dst, np.float32(value), flops=0, nbytes=4 * n)


def _check_kind(kind: str) -> None:
    if kind not in ACTIVATIONS:
        raise ValueError(f"Unknown activation {kind!r}; expected one of {ACTIVATIONS}")
