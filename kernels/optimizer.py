"""Launches of the in-place optimizer updates (SGD with momentum/Nesterov, Adam) and of the
device's step counter, with PyTorch semantics.

The step number t lives in a device int32 buffer that ``increment_step`` advances at the end of each
training step; Adam and dropout read it there, so a step's launches are bound once and never
re-bound. A learning-rate schedule changes the rate on bound launches with ``set_learning_rate``.
"""

from __future__ import annotations

import math

import numpy as np
import pyopencl as cl

from kernels.launch import Launch, round_up
from kernels.library import KernelLibrary, as_int

PROGRAM = "optimizer"
GROUP = 64
VECTOR = 4
LR_ARG_INDEX = 0  # every update kernel takes the learning rate first
UPDATE_KERNELS = ("sgd_plain", "sgd_momentum", "adam_update")


def _global_size(n: int) -> tuple[int]:
    if n < 1:
        raise ValueError(f"an optimizer update needs n >= 1 elements, got {n}")
    as_int(n)
    return (round_up(-(-n // VECTOR), GROUP),)


def sgd_update(
    lib: KernelLibrary,
    param: cl.Buffer,
    grad: cl.Buffer,
    velocity: cl.Buffer | None,
    *,
    n: int,
    lr: float,
    momentum: float = 0.0,
    weight_decay: float = 0.0,
    nesterov: bool = False,
) -> list[Launch]:
    """``g = grad + wd*param``; with momentum ``v = momentum*v + g`` (``velocity`` starts at 0)
    and ``d = g + momentum*v`` (Nesterov) or ``v``; ``param -= lr*d``. ``velocity`` may be None
    when ``momentum == 0``."""
    global_size = _global_size(n)
    if momentum < 0:
        raise ValueError(f"SGD momentum must be >= 0, got {momentum}")
    if momentum == 0:
        if nesterov:
            raise ValueError("Nesterov SGD needs a momentum > 0")
        kernel = lib.kernel(PROGRAM, "sgd_plain")
        kernel.set_args(np.float32(lr), param, grad, as_int(n), np.float32(weight_decay))
        return [Launch("sgd_plain", kernel, global_size, (GROUP,), flops=4 * n,
                       bytes_moved=12 * n, keep_alive=[param, grad])]
    if velocity is None:
        raise ValueError("SGD with momentum needs a velocity buffer (zero-filled before step 1)")
    kernel = lib.kernel(PROGRAM, "sgd_momentum")
    kernel.set_args(
        np.float32(lr), param, grad, velocity, as_int(n), np.float32(momentum),
        np.float32(weight_decay), as_int(int(nesterov)),
    )
    return [Launch("sgd_momentum", kernel, global_size, (GROUP,), flops=(8 if nesterov else 6) * n,
                   bytes_moved=20 * n, keep_alive=[param, grad, velocity])]


def adam_update(
    lib: KernelLibrary,
    param: cl.Buffer,
    grad: cl.Buffer,
    m: cl.Buffer,
    v: cl.Buffer,
    step: cl.Buffer,
    *,
    n: int,
    lr: float,
    beta1: float = 0.9,
    beta2: float = 0.999,
    eps: float = 1e-8,
    weight_decay: float = 0.0,
) -> list[Launch]:
    """PyTorch Adam (L2 weight decay added to the gradient), with the bias corrections of the step
    number t >= 1 read from ``step``. ``m`` and ``v`` start zero-filled."""
    global_size = _global_size(n)
    for name, beta in (("beta1", beta1), ("beta2", beta2)):
        if not 0.0 < beta < 1.0:
            raise ValueError(f"Adam {name} must lie in (0, 1), got {beta}")
    kernel = lib.kernel(PROGRAM, "adam_update")
    kernel.set_args(
        np.float32(lr), param, grad, m, v, step, as_int(n),
        np.float32(beta1), np.float32(1.0 - beta1), np.float32(math.log(beta1)),
        np.float32(beta2), np.float32(1.0 - beta2), np.float32(math.log(beta2)),
        np.float32(eps), np.float32(weight_decay),
    )
    return [Launch("adam_update", kernel, global_size, (GROUP,), flops=16 * n, bytes_moved=28 * n,
                   keep_alive=[param, grad, m, v, step])]


def increment_step(lib: KernelLibrary, step: cl.Buffer) -> list[Launch]:
    """``step[0] += 1``: run once at the end of every training step."""
    kernel = lib.kernel(PROGRAM, "increment_step")
    kernel.set_args(step)
    return [Launch("increment_step", kernel, (1,), (1,), flops=1, bytes_moved=8,
                   keep_alive=[step])]


def set_learning_rate(launches: list[Launch], lr: float) -> None:
    """Set the learning rate of bound update launches (for schedules); takes effect from the next
    enqueue. Anything but an optimizer update is refused, since its argument 0 means something
    else."""
    others = [launch.name for launch in launches if launch.name not in UPDATE_KERNELS]
    if others:
        raise ValueError(
            f"set_learning_rate takes optimizer update launches {UPDATE_KERNELS}, got {others}"
        )
    for launch in launches:
        launch.kernel.set_arg(LR_ARG_INDEX, np.float32(lr))
