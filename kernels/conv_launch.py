"""What the conv2d, depthwise and pooling launches share: tuning defines merged with defaults and
checked against the device before anything is built, and a ConvShape as kernel arguments."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from kernels.conv_shape import ConvShape
from kernels.library import KernelLibrary, as_int

LOCAL_MEMORY_LIMIT = 16 * 1024  # bytes per work-group: what a phone GPU can give without stalling

ACTIVATION_CODES = {None: 0, "relu": 1, "relu6": 2}


def resolve_defines(
    defaults: Mapping[str, int], tuning: Mapping[str, int] | None
) -> dict[str, int]:
    """The defaults overridden by ``tuning``; unknown names and non-positive values are errors, so
    a tuner's typo cannot silently fall back to a default."""
    defines = dict(defaults)
    for name, value in (tuning or {}).items():
        if name not in defaults:
            raise ValueError(f"Unknown tuning define {name!r}; expected some of {sorted(defaults)}")
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise ValueError(f"Tuning define {name} must be a positive int, got {value!r}")
        defines[name] = int(value)
    return defines


def check_group(
    lib: KernelLibrary,
    kernel_name: str,
    local_size: tuple[int, ...],
    local_floats: int = 0,
    power_of_two: bool = False,
) -> None:
    """Refuse a work-group the device cannot run, or local memory above the phone budget."""
    items = int(np.prod(local_size))
    limit = int(lib.device.max_work_group_size)
    if items > limit:
        raise ValueError(
            f"{kernel_name}: work-group {local_size} has {items} work-items, more than the "
            f"{limit} this device allows; choose smaller group defines"
        )
    if power_of_two and items & (items - 1):
        raise ValueError(f"{kernel_name}: the reduction group size {items} must be a power of two")
    budget = min(LOCAL_MEMORY_LIMIT, int(lib.device.local_mem_size))
    if 4 * local_floats > budget:
        raise ValueError(
            f"{kernel_name}: needs {4 * local_floats} bytes of local memory, above the "
            f"{budget}-byte budget; choose smaller block or group defines"
        )


def activation_code(activation: str | None) -> np.int32:
    if activation not in ACTIVATION_CODES:
        raise ValueError(
            f"Unknown activation {activation!r}; expected None, 'relu' or 'relu6'"
        )
    return np.int32(ACTIVATION_CODES[activation])


def window_args(shape: ConvShape) -> tuple[np.int32, ...]:
    """``R, S, stride_h, stride_w, pad_h, pad_w, OH, OW`` as 32-bit kernel arguments."""
    return tuple(
        as_int(v)
        for v in (
            shape.r, shape.s, shape.stride_h, shape.stride_w,
            shape.pad_h, shape.pad_w, shape.out_h, shape.out_w,
        )
    )


def check_index_range(shape: ConvShape, *extra_sizes: int) -> None:
    """Kernels index with 32-bit ints: every tensor they touch must have fewer than 2**31
    elements."""
    for size in (shape.x_size, shape.y_size, *extra_sizes):
        as_int(size)


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)
