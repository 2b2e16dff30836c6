"""Launches of the distillation loss from a previous model's logits (iCaRL / LwF style).

The loss covers the first ``c_old`` classes of each row (the classes the previous model knew), is
added to the cross-entropy gradient already in ``dlogits``, and its sum to ``stats[0]``.
"""

from __future__ import annotations

import numpy as np
import pyopencl as cl

from kernels.launch import Launch
from kernels.library import Defines, KernelLibrary, as_int
from kernels.softmax_xent import row_defines

GROUP_DEFINE = "DISTILL_GROUP"
PROGRAM = "distill"


def distill_xent(
    lib: KernelLibrary,
    logits: cl.Buffer,
    old_logits: cl.Buffer,
    dlogits: cl.Buffer,
    stats: cl.Buffer,
    *,
    n: int,
    c_old: int,
    c: int,
    temperature: float,
    weight: float,
    grad_scale: float,
    defines: Defines | None = None,
) -> list[Launch]:
    """Per row, ``weight * T^2 * KL(softmax(old/T) || softmax(logits[:, :c_old]/T))``: adds
    ``grad_scale`` times its gradient to ``dlogits[:, :c_old]`` and the loss sum to ``stats[0]``.

    ``logits``/``dlogits`` rows hold ``c`` entries, ``old_logits`` rows ``c_old``."""
    if n < 1 or not 1 <= c_old <= c:
        raise ValueError(f"distillation needs n >= 1 and 1 <= c_old <= c, got n={n}, "
                         f"c_old={c_old}, c={c}")
    if temperature <= 0:
        raise ValueError(f"distillation temperature must be positive, got {temperature}")
    as_int(n * c)
    defines = row_defines(lib, c_old, defines, prefix="DISTILL")
    kernel = lib.group_kernel(PROGRAM, "distill_xent", defines, GROUP_DEFINE)
    buffers = [logits, old_logits, dlogits, stats]
    kernel.set_args(
        *buffers, as_int(n), as_int(c_old), as_int(c), np.float32(1.0 / temperature),
        np.float32(weight * temperature**2), np.float32(grad_scale * weight * temperature),
    )
    group = defines["DISTILL_GROUP"]
    elements = n * c_old
    return [
        Launch(
            "distill_xent",
            kernel,
            (group,),
            (group,),
            flops=24 * elements + 8 * n,
            bytes_moved=32 * elements + 8,
            keep_alive=buffers,
        )
    ]
