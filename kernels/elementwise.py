"""Launches of the element-wise kernels: ReLU, ReLU6, residual add, accumulate, copy and fill.

An activation whose output only its own backward reads can keep a bit mask instead
(``activation_forward_mask`` / ``masked_backward``): 1 bit per element instead of 32, the saving
TinyTL-style training (frozen weights) lives on. Their items map the 8 elements of a mask byte.

Each work-item maps one vector of ``EW_VW`` elements: 8 wide on CPUs (a SIMD register), 4 wide
on GPUs (16-byte accesses with plenty of items in flight). ``defines`` overrides the width
(``EW_VW``: 1, 2, 4, 8 or 16) and the work-group size (``EW_WG``).
"""

from __future__ import annotations

import numpy as np
import pyopencl as cl

from kernels.launch import Launch, round_up
from kernels.library import Defines, KernelLibrary, as_int

GROUP = 64
ACTIVATIONS = ("relu", "relu6")
VECTOR_WIDTHS = (1, 2, 4, 8, 16)

GPU_DEFAULTS: dict[str, int] = {"EW_VW": 4, "EW_WG": GROUP}
# Measured with PoCL on 819,200 floats: 8-wide items in groups of 256.
CPU_DEFAULTS: dict[str, int] = {"EW_VW": 8, "EW_WG": 256}


def default_defines(device: cl.Device) -> dict[str, int]:
    """Vector width and group size for the device type, within its work-group limit."""
    if device.type & cl.device_type.CPU:
        native = int(device.native_vector_width_float)
        width = max(w for w in VECTOR_WIDTHS if w <= max(4, min(native, 16)))
        defines = {**CPU_DEFAULTS, "EW_VW": width}
    else:
        defines = dict(GPU_DEFAULTS)
    defines["EW_WG"] = min(defines["EW_WG"], int(device.max_work_group_size))
    return defines


def _resolve(lib: KernelLibrary, defines: Defines | None) -> tuple[int, int]:
    """(vector width, group size): the device defaults overridden by ``defines``, checked."""
    resolved = {**default_defines(lib.device), **(defines or {})}
    unknown = set(resolved) - set(GPU_DEFAULTS)
    if unknown:
        raise ValueError(f"Unknown element-wise defines {sorted(unknown)}; expected EW_VW, EW_WG")
    width, group = resolved["EW_VW"], resolved["EW_WG"]
    if width not in VECTOR_WIDTHS:
        raise ValueError(f"EW_VW must be one of {VECTOR_WIDTHS}, got {width}")
    if not 1 <= group <= lib.device.max_work_group_size:
        raise ValueError(
            f"EW_WG={group} must be between 1 and the device's max_work_group_size "
            f"{lib.device.max_work_group_size}"
        )
    return int(width), int(group)


def _launch(
    lib: KernelLibrary,
    kernel_name: str,
    n: int,
    *args,
    flops: int,
    nbytes: int,
    defines: Defines | None,
) -> Launch:
    width, group = _resolve(lib, defines)
    kernel = lib.kernel("elementwise", kernel_name, {"EW_VW": width})
    kernel.set_args(*args, as_int(n))
    items = round_up(-(-n // width), group)
    return Launch(
        kernel_name, kernel, (items,), (group,), flops, nbytes,
        keep_alive=[a for a in args if isinstance(a, cl.MemoryObject)],
    )


def activation_forward(
    lib: KernelLibrary,
    kind: str,
    x: cl.Buffer,
    y: cl.Buffer,
    n: int,
    *,
    defines: Defines | None = None,
) -> Launch:
    """``y = relu(x)`` or ``relu6(x)``; ``x`` and ``y`` may be the same buffer."""
    _check_kind(kind)
    return _launch(lib, f"{kind}_forward", n, x, y, flops=n, nbytes=8 * n, defines=defines)


def activation_backward(
    lib: KernelLibrary,
    kind: str,
    y: cl.Buffer,
    dy: cl.Buffer,
    dx: cl.Buffer,
    n: int,
    *,
    defines: Defines | None = None,
) -> Launch:
    """``dx = dy * act'(.)`` read from the forward output ``y``; ``dx`` may alias ``dy``."""
    _check_kind(kind)
    return _launch(
        lib, f"{kind}_backward", n, y, dy, dx, flops=n, nbytes=12 * n, defines=defines
    )


def mask_bytes(n: int) -> int:
    """Bytes of the bit mask of ``n`` elements."""
    return -(-n // 8)


def _bits_launch(
    lib: KernelLibrary, kernel_name: str, n: int, *args, nbytes: int, defines: Defines | None
) -> Launch:
    """One item per mask byte (8 elements), in groups of ``EW_WG``."""
    width, group = _resolve(lib, defines)
    kernel = lib.kernel("elementwise", kernel_name, {"EW_VW": width})
    kernel.set_args(*args, as_int(n))
    return Launch(
        kernel_name, kernel, (round_up(mask_bytes(n), group),), (group,), n, nbytes,
        keep_alive=[a for a in args if isinstance(a, cl.MemoryObject)],
    )


def activation_forward_mask(
    lib: KernelLibrary,
    kind: str,
    x: cl.Buffer,
    y: cl.Buffer,
    mask: cl.Buffer,
    n: int,
    *,
    defines: Defines | None = None,
) -> Launch:
    """``y = act(x)`` and the bit ``mask`` (``mask_bytes(n)`` bytes; bit j of byte k is element
    8k + j) of where the slope is one: ReLU ``x > 0``, ReLU6 ``0 < x < 6``. ``x`` and ``y`` may
    be the same buffer, also an already activated one."""
    _check_kind(kind)
    return _bits_launch(
        lib, f"{kind}_forward_mask", n, x, y, mask, nbytes=8 * n + mask_bytes(n), defines=defines
    )


def masked_backward(
    lib: KernelLibrary,
    mask: cl.Buffer,
    dy: cl.Buffer,
    dx: cl.Buffer,
    n: int,
    *,
    defines: Defines | None = None,
) -> Launch:
    """``dx = dy`` where the element's ``mask`` bit is set, else 0: the backward of either
    activation from its mask; ``dx`` may alias ``dy``."""
    return _bits_launch(
        lib, "masked_backward", n, mask, dy, dx, nbytes=8 * n + mask_bytes(n), defines=defines
    )


def add(
    lib: KernelLibrary,
    a: cl.Buffer,
    b: cl.Buffer,
    out: cl.Buffer,
    n: int,
    *,
    defines: Defines | None = None,
) -> Launch:
    """``out = a + b`` for a residual connection."""
    return _launch(lib, "add_forward", n, a, b, out, flops=n, nbytes=12 * n, defines=defines)


def accumulate(
    lib: KernelLibrary, acc: cl.Buffer, g: cl.Buffer, n: int, *, defines: Defines | None = None
) -> Launch:
    """``acc += g``: gradients that meet at a residual fork, or micro-batch accumulation."""
    return _launch(lib, "accumulate", n, acc, g, flops=n, nbytes=12 * n, defines=defines)


def copy(
    lib: KernelLibrary, src: cl.Buffer, dst: cl.Buffer, n: int, *, defines: Defines | None = None
) -> Launch:
    return _launch(lib, "copy", n, src, dst, flops=0, nbytes=8 * n, defines=defines)


def fill(
    lib: KernelLibrary, dst: cl.Buffer, value: float, n: int, *, defines: Defines | None = None
) -> Launch:
    return _launch(
        lib, "fill", n, dst, np.float32(value), flops=0, nbytes=4 * n, defines=defines
    )


def _check_kind(kind: str) -> None:
    if kind not in ACTIVATIONS:
        raise ValueError(f"Unknown activation {kind!r}; expected one of {ACTIVATIONS}")
