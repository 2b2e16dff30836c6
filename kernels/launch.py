"""A kernel launch with its arguments bound once.

Setting arguments on every call costs about 49 us per launch from Python, binding them once and
enqueueing costs about 3 us (ENGINE-NOTES). A training step is a fixed list of these.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import pyopencl as cl

from kernels.device_errors import DeviceError

if TYPE_CHECKING:
    from kernels.library import KernelLibrary


def round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


@dataclass
class Launch:
    """One enqueueable kernel with bound arguments, and the work it does (for profiling and the
    cost model): ``flops`` floating-point operations and ``bytes_moved`` global-memory bytes.

    ``keep_alive`` holds the buffers bound as arguments: OpenCL does not promise to retain them, and
    a buffer released while a launch still refers to it is a use-after-free on some drivers."""

    name: str
    kernel: cl.Kernel
    global_size: tuple[int, ...]
    local_size: tuple[int, ...] | None
    flops: int = 0
    bytes_moved: int = 0
    keep_alive: list = field(default_factory=list, repr=False)
    tensors: str = ""  # what the launch reads and writes, for error messages (set by the step)

    def enqueue(self, queue: cl.CommandQueue, wait_for=None) -> cl.Event:
        try:
            return cl.enqueue_nd_range_kernel(
                queue, self.kernel, self.global_size, self.local_size, wait_for=wait_for
            )
        except cl.Error as err:
            raise DeviceError(self.describe(), err) from err

    def describe(self) -> str:
        """The kernel, its sizes and (within a step) the tensors it touches."""
        where = f" of {self.tensors}" if self.tensors else ""
        return (f"kernel {self.name}{where} (global {self.global_size}, "
                f"local {self.local_size})")


def row_grid(
    lib: KernelLibrary, blocks: int, rows: int, planes: int, group: int
) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    """(global, local) sizes over (blocks of a row, rows, planes): a work-group of at most
    ``group`` items takes whole rows where it can, so few items fall past the edges, and stays
    within the device's limit per dimension."""
    limits = [int(v) for v in lib.device.max_work_item_sizes]
    l0 = min(blocks, group, limits[0])
    l1 = min(rows, group // l0, limits[1])
    l2 = min(planes, group // (l0 * l1), limits[2])
    local = (l0, l1, l2)
    return (round_up(blocks, l0), round_up(rows, l1), round_up(planes, l2)), local


def run(queue: cl.CommandQueue, launches: list[Launch]) -> None:
    """Enqueue launches in order and wait for them: for tests and one-off work."""
    for launch in launches:
        launch.enqueue(queue)
    queue.finish()
