"""Launches of batch normalization over (N, C, HW) tensors, training and inference.

A Linear layer's output is the case HW = 1. Training statistics are reduced by one work-group per
channel, which also writes the normalized output: the forward and the backward are one launch each.
Work-items read a channel as vectors along HW; on CPUs the vectors are as wide as the SIMD unit and
each item takes one contiguous range, on GPUs they are 4 wide and interleave for coalescing.

With frozen statistics (transfer learning of biases and normalisation parameters, TinyTL) the
training forward is the inference one, and its backward (``batchnorm_backward_frozen``) reads the
forward input only for gamma's gradient.
"""

from __future__ import annotations

import numpy as np
import pyopencl as cl

from kernels.launch import Launch
from kernels.library import Defines, KernelLibrary, as_int

GROUP_DEFINE = "BN_GROUP"
PROGRAM = "batchnorm"
DEFAULT_GROUP = 128
VECTOR_WIDTHS = (1, 2, 4, 8, 16)

GPU_DEFAULTS: dict[str, int] = {"BN_GROUP": DEFAULT_GROUP, "BN_VW": 4, "BN_CONTIGUOUS": 0}
# Measured with PoCL on 32 x 64 x 400: few items per channel, each walking one contiguous range.
CPU_DEFAULTS: dict[str, int] = {"BN_GROUP": 8, "BN_VW": 8, "BN_CONTIGUOUS": 1}


def default_defines(device: cl.Device) -> dict[str, int]:
    """Group size, vector width and slot order for the device type, within its limits."""
    if device.type & cl.device_type.CPU:
        native = int(device.native_vector_width_float)
        width = max(w for w in VECTOR_WIDTHS if w <= max(4, min(native, 16)))
        defines = {**CPU_DEFAULTS, "BN_VW": width}
    else:
        defines = dict(GPU_DEFAULTS)
    defines["BN_GROUP"] = min(defines["BN_GROUP"], int(device.max_work_group_size))
    return defines


def _resolve(lib: KernelLibrary, defines: Defines | None) -> dict:
    """The device defaults overridden by ``defines``, checked."""
    resolved = {**default_defines(lib.device), **(defines or {})}
    group = int(resolved["BN_GROUP"])
    if group < 1 or group & (group - 1) or group > lib.device.max_work_group_size:
        raise ValueError(
            f"BN_GROUP={group} must be a power of two no larger than the device's "
            f"max_work_group_size {lib.device.max_work_group_size}"
        )
    if resolved["BN_VW"] not in VECTOR_WIDTHS:
        raise ValueError(f"BN_VW must be one of {VECTOR_WIDTHS}, got {resolved['BN_VW']}")
    return resolved


def _channel_launch(lib: KernelLibrary, name: str, defines: dict, c: int,
                    buffers: list[cl.Buffer | None], scalars: list, *, flops: int,
                    bytes_moved: int) -> list[Launch]:
    """``name`` as one work-group of ``BN_GROUP`` items per channel, over ``buffers`` (None
    where a gradient is not wanted) and then ``scalars``."""
    group = defines[GROUP_DEFINE]
    kernel = lib.group_kernel(PROGRAM, name, defines, GROUP_DEFINE)
    kernel.set_args(*buffers, *scalars)
    return [Launch(name, kernel, (c * group,), (group,), flops=flops, bytes_moved=bytes_moved,
                   keep_alive=[b for b in buffers if b is not None])]


def _gradient_defines(lib: KernelLibrary, defines: Defines | None, with_dx: bool,
                      dgamma: cl.Buffer | None, dbeta: cl.Buffer | None) -> dict:
    """The resolved defines of a backward that computes only the wanted gradients."""
    resolved = _resolve(lib, defines)
    resolved.update(WITH_DX=int(with_dx), WITH_DGAMMA=int(dgamma is not None),
                    WITH_DBETA=int(dbeta is not None))
    return resolved


def _check_shape(n: int, c: int, hw: int) -> None:
    if min(n, c, hw) < 1:
        raise ValueError(f"batch norm needs positive sizes, got n={n}, c={c}, hw={hw}")
    as_int(n * c * hw)


def batchnorm_forward_train(
    lib: KernelLibrary,
    x: cl.Buffer,
    gamma: cl.Buffer,
    beta: cl.Buffer,
    y: cl.Buffer,
    mean: cl.Buffer,
    invstd: cl.Buffer,
    running_mean: cl.Buffer,
    running_var: cl.Buffer,
    *,
    n: int,
    c: int,
    hw: int,
    momentum: float = 0.1,
    eps: float = 1e-5,
    defines: Defines | None = None,
) -> list[Launch]:
    """Normalize with the batch statistics, save ``mean``/``invstd`` for the backward and update
    the running statistics (the running variance is the unbiased one, as in PyTorch).

    ``y`` must not alias ``x``: the backward reads the forward input."""
    _check_shape(n, c, hw)
    if n * hw < 2:
        raise ValueError(
            f"batch norm in training needs more than one value per channel (n={n}, hw={hw}): "
            "use a larger batch or the evaluation forward"
        )
    total = n * c * hw
    return _channel_launch(
        lib, "batchnorm_forward_train", _resolve(lib, defines), c,
        [x, gamma, beta, y, mean, invstd, running_mean, running_var],
        [as_int(n), as_int(c), as_int(hw), np.float32(momentum), np.float32(eps)],
        flops=7 * total + 12 * c, bytes_moved=16 * total + 32 * c,
    )


def batchnorm_forward_eval(
    lib: KernelLibrary,
    x: cl.Buffer,
    gamma: cl.Buffer,
    beta: cl.Buffer,
    y: cl.Buffer,
    running_mean: cl.Buffer,
    running_var: cl.Buffer,
    *,
    n: int,
    c: int,
    hw: int,
    eps: float = 1e-5,
    defines: Defines | None = None,
) -> list[Launch]:
    """Normalize with the running statistics; ``y`` may alias ``x``."""
    _check_shape(n, c, hw)
    total = n * c * hw
    return _channel_launch(
        lib, "batchnorm_forward_eval", _resolve(lib, defines), c,
        [x, gamma, beta, y, running_mean, running_var],
        [as_int(n), as_int(c), as_int(hw), np.float32(eps)],
        flops=2 * total + 4 * c, bytes_moved=8 * total + 16 * c,
    )


def batchnorm_backward(
    lib: KernelLibrary,
    x: cl.Buffer,
    dy: cl.Buffer,
    gamma: cl.Buffer,
    mean: cl.Buffer,
    invstd: cl.Buffer,
    dx: cl.Buffer | None,
    dgamma: cl.Buffer | None,
    dbeta: cl.Buffer | None,
    *,
    n: int,
    c: int,
    hw: int,
    accumulate: bool = False,
    input_grad: bool = True,
    defines: Defines | None = None,
) -> list[Launch]:
    """Gradients of the training forward from its input ``x`` and saved ``mean``/``invstd``.

    ``dgamma``/``dbeta`` may be None (frozen parameters); ``input_grad=False`` skips ``dx`` (the
    first layer). ``accumulate`` adds the parameter gradients to what the buffers hold."""
    _check_shape(n, c, hw)
    if input_grad and dx is None:
        raise ValueError("input_grad=True needs a dx buffer")
    with_dx = input_grad
    if not (with_dx or dgamma is not None or dbeta is not None):
        return []
    total = n * c * hw
    return _channel_launch(
        lib, "batchnorm_backward", _gradient_defines(lib, defines, with_dx, dgamma, dbeta), c,
        [x, dy, gamma, mean, invstd, dx if with_dx else None, dgamma, dbeta],
        [as_int(n), as_int(c), as_int(hw), as_int(int(accumulate))],
        flops=(5 + (6 if with_dx else 0)) * total + 8 * c,
        bytes_moved=(8 + (12 if with_dx else 0)) * total + 32 * c,
    )


def batchnorm_backward_frozen(
    lib: KernelLibrary,
    x: cl.Buffer | None,
    dy: cl.Buffer,
    gamma: cl.Buffer,
    running_mean: cl.Buffer,
    running_var: cl.Buffer,
    dx: cl.Buffer | None,
    dgamma: cl.Buffer | None,
    dbeta: cl.Buffer | None,
    *,
    n: int,
    c: int,
    hw: int,
    eps: float = 1e-5,
    accumulate: bool = False,
    defines: Defines | None = None,
) -> list[Launch]:
    """Gradients of the affine forward over the running statistics (``batchnorm_forward_eval``
    used in training): ``dx = dy * gamma * invstd``, ``dbeta = sum(dy)``, ``dgamma = sum(dy *
    xhat)``. ``x`` (the forward input) is needed only with ``dgamma``; any of ``dx``, ``dgamma``,
    ``dbeta`` may be None. ``dx`` may alias ``dy``."""
    _check_shape(n, c, hw)
    if dgamma is not None and x is None:
        raise ValueError("gamma's gradient needs the forward input x")
    if dx is None and dgamma is None and dbeta is None:
        return []
    total = n * c * hw
    reads = (4 if dgamma is not None or dbeta is not None else 0) + (4 if dgamma is not None else 0)
    return _channel_launch(
        lib, "batchnorm_backward_frozen",
        _gradient_defines(lib, defines, dx is not None, dgamma, dbeta), c,
        [x, dy, gamma, running_mean, running_var, dx, dgamma, dbeta],
        [as_int(n), as_int(c), as_int(hw), np.float32(eps), as_int(int(accumulate))],
        flops=(3 if dgamma is not None else 1) * total + (total if dx is not None else 0),
        bytes_moved=(reads + (8 if dx is not None else 0)) * total + 32 * c,
    )
