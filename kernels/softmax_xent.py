"""Launches of the fused softmax cross-entropy: gradient, loss and accuracy in one pass.

Loss and accuracy accumulate on the device across steps (``stats`` = [loss sum, correct, counted])
and are read once per report. The reduction over rows runs in one work-group in a fixed order, so
the accumulated figures are reproducible without float atomics.
"""

from __future__ import annotations

import numpy as np
import pyopencl as cl

from kernels.launch import Launch
from kernels.library import Defines, KernelLibrary, as_int

GROUP_DEFINE = "XENT_GROUP"
PROGRAM = "softmax_xent"
DEFAULT_GROUP = 128
MAX_LANES = 32
STATS_LENGTH = 3


def _power_of_two(value: int) -> bool:
    return value >= 1 and value & (value - 1) == 0


def default_lanes(c: int) -> int:
    """Work-items per row: one for a few classes, up to MAX_LANES for thousands."""
    lanes = 1
    while lanes < MAX_LANES and lanes * 16 < c:
        lanes *= 2
    return lanes


def row_defines(lib: KernelLibrary, c: int, defines: Defines | None,
                prefix: str = "XENT") -> Defines:
    """``{prefix}_GROUP`` and ``{prefix}_LANES`` (work-items per group and per row) of a
    row-per-group kernel: those given, else defaults for ``c`` classes on this device."""
    defines = dict(defines or {})
    group_key, lanes_key = f"{prefix}_GROUP", f"{prefix}_LANES"
    group = int(defines.get(group_key, min(DEFAULT_GROUP, lib.device.max_work_group_size)))
    lanes = int(defines.get(lanes_key, min(default_lanes(c), group)))
    if not (_power_of_two(group) and _power_of_two(lanes)) or lanes > group:
        raise ValueError(f"{group_key}={group} and {lanes_key}={lanes} must be powers of two "
                         f"with {lanes_key} <= {group_key}")
    if group > lib.device.max_work_group_size:
        raise ValueError(f"{group_key}={group} exceeds the device's max_work_group_size "
                         f"{lib.device.max_work_group_size}")
    defines.update({group_key: group, lanes_key: lanes})
    return defines


def _check_shape(n: int, c: int) -> None:
    if n < 1 or c < 1:
        raise ValueError(f"softmax cross-entropy needs n >= 1 rows and c >= 1 classes, got n={n}, "
                         f"c={c}")
    as_int(n * c)


def softmax_xent(
    lib: KernelLibrary,
    logits: cl.Buffer,
    labels: cl.Buffer,
    dlogits: cl.Buffer,
    stats: cl.Buffer,
    *,
    n: int,
    c: int,
    grad_scale: float,
    defines: Defines | None = None,
) -> list[Launch]:
    """``dlogits = (softmax(logits) - onehot(labels)) * grad_scale`` (0 for rows labelled -1) and
    ``stats += [loss sum, correct predictions, counted rows]``. ``dlogits`` may alias ``logits``
    only if the logits are not needed afterwards; a label outside [0, c) other than -1 makes that
    row's loss and gradient NaN."""
    _check_shape(n, c)
    defines = row_defines(lib, c, defines)
    kernel = lib.group_kernel(PROGRAM, "softmax_xent", defines, GROUP_DEFINE)
    buffers = [logits, labels, dlogits, stats]
    kernel.set_args(*buffers, as_int(n), as_int(c), np.float32(grad_scale))
    group = defines["XENT_GROUP"]
    return [
        Launch(
            "softmax_xent",
            kernel,
            (group,),
            (group,),
            flops=10 * n * c + 6 * n,
            bytes_moved=16 * n * c + 4 * n + 8 * STATS_LENGTH,
            keep_alive=buffers,
        )
    ]


def softmax_xent_eval(
    lib: KernelLibrary,
    logits: cl.Buffer,
    labels: cl.Buffer,
    stats: cl.Buffer,
    *,
    n: int,
    c: int,
    defines: Defines | None = None,
) -> list[Launch]:
    """``stats += [loss sum, correct predictions, counted rows]`` without a gradient."""
    _check_shape(n, c)
    defines = row_defines(lib, c, defines)
    kernel = lib.group_kernel(PROGRAM, "softmax_xent_eval", defines, GROUP_DEFINE)
    buffers = [logits, labels, stats]
    kernel.set_args(*buffers, as_int(n), as_int(c))
    group = defines["XENT_GROUP"]
    return [
        Launch(
            "softmax_xent_eval",
            kernel,
            (group,),
            (group,),
            flops=4 * n * c + 6 * n,
            bytes_moved=8 * n * c + 4 * n + 8 * STATS_LENGTH,
            keep_alive=buffers,
        )
    ]
