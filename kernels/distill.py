"""Launches of the distillation loss from a previous model's logits (iCaRL / LwF style).

The loss covers the first ``c_old`` classes of each row (the classes the previous model knew), is
added to the cross-entropy gradient already in ``dlogits``, and its sum to ``stats[0]``.
"""

from __future__ import annotations

import numpy as np
import pyopencl as cl

from kernels.launch import Launch
from kernels.library import Defines, KernelLibrary, as_int
from kernels.softmax_xent import default_lanes

GROUP_DEFINE = "DISTILL_GROUP"
PROGRAM = "distill"
DEFAULT_GROUP = 128


def _power_of_two(value: int) -> bool:
    return value >= 1 and value & (value - 1) == 0


def row_defines(lib: KernelLibrary, c_old: int, defines: Defines | None) -> Defines:
    """DISTILL_GROUP and DISTILL_LANES: those given, else defaults for ``c_old`` classes."""
    defines = dict(defines or {})
    group = int(defines.get("DISTILL_GROUP", min(DEFAULT_GROUP, lib.device.max_work_group_size)))
    lanes = int(defines.get("DISTILL_LANES", min(default_lanes(c_old), group)))
    if not (_power_of_two(group) and _power_of_two(lanes)) or lanes > group:
        raise ValueError(f"DISTILL_GROUP={group} and DISTILL_LANES={lanes} must be powers of two "
                         "with DISTILL_LANES <= DISTILL_GROUP")
    if group > lib.device.max_work_group_size:
        raise ValueError(f"DISTILL_GROUP={group} exceeds the device's max_work_group_size "
                         f"{lib.device.max_work_group_size}")
    defines.update(DISTILL_GROUP=group, DISTILL_LANES=lanes)
    return defines


def _group_kernel(lib: KernelLibrary, name: str, defines: Defines, group: int) -> cl.Kernel:
    """The kernel, checked to run work-groups of ``group`` items on this device (a kernel's own
    limit can be below the device's when it needs many registers)."""
    kernel = lib.kernel(PROGRAM, name, defines)
    limit = kernel.get_work_group_info(cl.kernel_work_group_info.WORK_GROUP_SIZE, lib.device)
    if group > limit:
        raise ValueError(
            f"{name} runs at most {limit} work-items per group on {lib.device.name.strip()}; "
            f"build it with a smaller {GROUP_DEFINE} (got {group})"
        )
    return kernel


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
    defines = row_defines(lib, c_old, defines)
    kernel = _group_kernel(lib, "distill_xent", defines, defines["DISTILL_GROUP"])
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
