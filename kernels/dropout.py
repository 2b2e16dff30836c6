"""Launches of inverted dropout whose mask comes from a counter-based hash of (seed, step, index).

The mask is recomputed in the backward rather than stored, and :func:`kernels.reference.dropout.
dropout_mask` reproduces it on the host bit for bit (the engine's reference trainer relies on it).
The step number is read on the device from the same counter the optimizer uses, so bound launches
stay valid from step to step.
"""

from __future__ import annotations

import math

import numpy as np
import pyopencl as cl

from kernels.launch import Launch, round_up
from kernels.library import KernelLibrary, as_int

PROGRAM = "dropout"
GROUP = 64
VECTOR = 4
UINT32 = 2**32


def keep_threshold(p: float) -> int:
    """``floor(p * 2**32)``: an element is kept iff its hash is at least this (2**32 drops all)."""
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"dropout probability must lie in [0, 1], got {p}")
    return math.floor(p * UINT32)


def _launch(
    lib: KernelLibrary, name: str, src: cl.Buffer, dst: cl.Buffer, step: cl.Buffer,
    n: int, p: float, seed: int, index_offset: int,
) -> list[Launch]:
    if n < 1:
        raise ValueError(f"dropout needs n >= 1 elements, got {n}")
    threshold = keep_threshold(p)
    drop_all = threshold >= UINT32
    kernel = lib.kernel(PROGRAM, "dropout")
    kernel.set_args(
        src, dst, step, as_int(n), np.uint32(seed % UINT32), np.uint32(index_offset % UINT32),
        np.uint32(0 if drop_all else threshold), as_int(int(drop_all)),
        np.float32(0.0 if drop_all else 1.0 / (1.0 - p)),
    )
    global_size = round_up(-(-n // VECTOR), GROUP)
    return [
        Launch(name, kernel, (global_size,), (GROUP,), flops=12 * n, bytes_moved=8 * n + 4,
               keep_alive=[src, dst, step])
    ]


def dropout_forward(
    lib: KernelLibrary, x: cl.Buffer, y: cl.Buffer, step: cl.Buffer, *,
    n: int, p: float, seed: int, index_offset: int = 0,
) -> list[Launch]:
    """``y = mask * x / (1 - p)`` for the step number held in ``step``; ``y`` may alias ``x``.

    ``index_offset`` shifts the element indices, so tensors sharing a seed get distinct masks."""
    return _launch(lib, "dropout_forward", x, y, step, n, p, seed, index_offset)


def dropout_backward(
    lib: KernelLibrary, dy: cl.Buffer, dx: cl.Buffer, step: cl.Buffer, *,
    n: int, p: float, seed: int, index_offset: int = 0,
) -> list[Launch]:
    """``dx = mask * dy / (1 - p)`` with the mask of the forward of the same step."""
    return _launch(lib, "dropout_backward", dy, dx, step, n, p, seed, index_offset)
