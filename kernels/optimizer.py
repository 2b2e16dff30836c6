"""Launches of the in-place optimizer updates (SGD with momentum/Nesterov, Adam) and of the
device's step counter, with PyTorch semantics.

The step number t lives in a device int32 buffer that ``increment_step`` advances at the end of each
training step; Adam and dropout read it there, so a step's launches are bound once and never
re-bound. A learning-rate schedule changes the rate on bound launches with ``set_learning_rate``.

The multi-tensor variants update every parameter of a step in one launch (launches, not their
arithmetic, are what an update costs on a phone): they take the one buffer all tensors live in and
a table of where each tensor lies in it (``update_table``), written into that buffer once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pyopencl as cl

from kernels.launch import Launch, round_up
from kernels.library import KernelLibrary, as_int

PROGRAM = "optimizer"
GROUP = 64
VECTOR = 4
LR_ARG_INDEX = 0  # every update kernel takes the learning rate first
MULTI_KERNELS = ("sgd_plain_multi", "sgd_momentum_multi", "adam_update_multi")
UPDATE_KERNELS = ("sgd_plain", "sgd_momentum", "adam_update", *MULTI_KERNELS)
TABLE_FIELDS = 5  # n, param, grad, state0, state1 per tensor (OPT_FIELDS in optimizer.cl)


def _global_size(n: int) -> tuple[int]:
    if n < 1:
        raise ValueError(f"an optimizer update needs n >= 1 elements, got {n}")
    as_int(n)
    return (round_up(-(-n // VECTOR), GROUP),)


def _check_sgd(momentum: float, nesterov: bool) -> None:
    if momentum < 0:
        raise ValueError(f"SGD momentum must be >= 0, got {momentum}")
    if momentum == 0 and nesterov:
        raise ValueError("Nesterov SGD needs a momentum > 0")


def _adam_constants(beta1: float, beta2: float, eps: float, weight_decay: float
                    ) -> tuple[np.float32, ...]:
    """Adam's scalar kernel arguments after the learning rate and the tensors: each beta with
    its complement and log (the kernel forms 1 - beta^t as -expm1(t log beta)), eps, weight
    decay."""
    for name, beta in (("beta1", beta1), ("beta2", beta2)):
        if not 0.0 < beta < 1.0:
            raise ValueError(f"Adam {name} must lie in (0, 1), got {beta}")
    return (np.float32(beta1), np.float32(1.0 - beta1), np.float32(math.log(beta1)),
            np.float32(beta2), np.float32(1.0 - beta2), np.float32(math.log(beta2)),
            np.float32(eps), np.float32(weight_decay))


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
    _check_sgd(momentum, nesterov)
    if momentum == 0:
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
    constants = _adam_constants(beta1, beta2, eps, weight_decay)
    kernel = lib.kernel(PROGRAM, "adam_update")
    kernel.set_args(np.float32(lr), param, grad, m, v, step, as_int(n), *constants)
    return [Launch("adam_update", kernel, global_size, (GROUP,), flops=16 * n, bytes_moved=28 * n,
                   keep_alive=[param, grad, m, v, step])]


@dataclass(frozen=True)
class ArenaTensor:
    """One parameter's tensors inside a shared buffer, as element (float) offsets: the parameter,
    its gradient and its optimizer states (none, velocity, or Adam's m and v)."""

    n: int
    param: int
    grad: int
    states: tuple[int, ...] = ()


def element_offset(byte_offset: int) -> int:
    """A tensor's byte offset in the arena as a float index; the kernels index the arena as an
    int-indexed float array, so the offset must be a whole, int-sized number of floats."""
    if byte_offset % 4:
        raise ValueError(f"a byte offset of {byte_offset} is not a whole number of floats")
    return int(as_int(byte_offset // 4))


def update_table(tensors: list[ArenaTensor]) -> np.ndarray:
    """The int32 table the multi-tensor kernels read: the prefix sums of each tensor's
    work-items (count + 1 entries), then ``TABLE_FIELDS`` ints per tensor."""
    if not tensors:
        raise ValueError("a multi-tensor update needs at least one tensor")
    starts = [0]
    fields = []
    for t in tensors:
        if t.n < 1 or len(t.states) > 2:
            raise ValueError(f"a tensor needs n >= 1 and at most two states, got {t}")
        starts.append(starts[-1] + -(-t.n // VECTOR))
        states = (*t.states, 0, 0)[:2]
        fields.extend((t.n, t.param, t.grad, *states))
    table = np.array(starts + fields, dtype=np.int64)
    for value in table:
        as_int(int(value))  # offsets and counts must fit the kernels' int
    return table.astype(np.int32)


def update_table_length(count: int) -> int:
    """Ints in the table of ``count`` tensors (to reserve its space before offsets are known)."""
    return count + 1 + TABLE_FIELDS * count


def _multi_launch(name: str, kernel, arena: cl.Buffer, tensors: list[ArenaTensor],
                  flops: int, bytes_per_element: int, zero_grads: bool) -> list[Launch]:
    items = int(update_table(tensors)[len(tensors)])
    elements = sum(t.n for t in tensors)
    return [Launch(name, kernel, (round_up(items, GROUP),), (GROUP,), flops=flops * elements,
                   bytes_moved=(bytes_per_element + 4 * zero_grads) * elements,
                   keep_alive=[arena])]


def _check_table(tensors: list[ArenaTensor], table_offset: int) -> None:
    if not tensors:
        raise ValueError("a multi-tensor update needs at least one tensor")
    if table_offset < 0:
        raise ValueError(f"the table offset must be >= 0, got {table_offset}")


def sgd_update_multi(
    lib: KernelLibrary,
    arena: cl.Buffer,
    tensors: list[ArenaTensor],
    *,
    table_offset: int,
    lr: float,
    momentum: float = 0.0,
    weight_decay: float = 0.0,
    nesterov: bool = False,
    zero_grads: bool = False,
) -> list[Launch]:
    """:func:`sgd_update` of every tensor in ``tensors`` (each with its velocity as its one state
    when ``momentum > 0``) in one launch. ``update_table(tensors)`` must already lie in ``arena``
    at element ``table_offset``. ``zero_grads`` zeroes each gradient after it is read."""
    _check_table(tensors, table_offset)
    _check_sgd(momentum, nesterov)
    count = as_int(len(tensors))
    if momentum == 0:
        kernel = lib.kernel(PROGRAM, "sgd_plain_multi")
        kernel.set_args(np.float32(lr), arena, as_int(table_offset), count,
                        np.float32(weight_decay), as_int(int(zero_grads)))
        return _multi_launch("sgd_plain_multi", kernel, arena, tensors, 4, 12, zero_grads)
    if any(len(t.states) != 1 for t in tensors):
        raise ValueError("SGD with momentum needs one velocity state per tensor")
    kernel = lib.kernel(PROGRAM, "sgd_momentum_multi")
    kernel.set_args(
        np.float32(lr), arena, as_int(table_offset), count, np.float32(momentum),
        np.float32(weight_decay), as_int(int(nesterov)), as_int(int(zero_grads)),
    )
    return _multi_launch("sgd_momentum_multi", kernel, arena, tensors, 8 if nesterov else 6, 20,
                         zero_grads)


def adam_update_multi(
    lib: KernelLibrary,
    arena: cl.Buffer,
    tensors: list[ArenaTensor],
    *,
    table_offset: int,
    step_offset: int,
    lr: float,
    beta1: float = 0.9,
    beta2: float = 0.999,
    eps: float = 1e-8,
    weight_decay: float = 0.0,
    zero_grads: bool = False,
) -> list[Launch]:
    """:func:`adam_update` of every tensor in ``tensors`` (states m and v each) in one launch;
    the step number is the int at element ``step_offset`` of ``arena``."""
    _check_table(tensors, table_offset)
    constants = _adam_constants(beta1, beta2, eps, weight_decay)
    if any(len(t.states) != 2 for t in tensors):
        raise ValueError("Adam needs two states (m, v) per tensor")
    kernel = lib.kernel(PROGRAM, "adam_update_multi")
    kernel.set_args(np.float32(lr), arena, as_int(table_offset), as_int(len(tensors)),
                    as_int(step_offset), *constants, as_int(int(zero_grads)))
    return _multi_launch("adam_update_multi", kernel, arena, tensors, 16, 28, zero_grads)


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
