"""Moves each batch to the device through mapped, host-allocated staging buffers.

Two staging slots alternate: while the device computes step i from one slot's copy, the host maps
the other slot and writes batch i+1 into it. On phones, where the GPU shares memory with the CPU,
a buffer allocated with ALLOC_HOST_PTR and mapped costs no extra copy (Arm's Mali OpenCL guide); on
a discrete GPU the map gives pinned memory, which copies faster than pageable memory.
"""

from __future__ import annotations

from math import prod

import numpy as np
import pyopencl as cl

from client_runtime.device import Device
from kernels.device_errors import naming


class StagingRing:
    """Double-buffered upload of (inputs, labels) into fixed device tensors."""

    def __init__(
        self, device: Device, x_shape: tuple[int, ...], y_shape: tuple[int, ...], slots: int = 2
    ):
        self.device = device
        self.x_shape, self.y_shape = tuple(x_shape), tuple(y_shape)
        self.x_bytes = prod(x_shape) * 4
        self.y_bytes = prod(y_shape) * 4
        self.nbytes = self.x_bytes + self.y_bytes
        flags = cl.mem_flags.READ_WRITE | cl.mem_flags.ALLOC_HOST_PTR
        with naming(f"allocating {slots} staging buffers of {self.nbytes} bytes"):
            self.slots = [cl.Buffer(device.context, flags, self.nbytes) for _ in range(slots)]
        self.pending: list[list[cl.Event]] = [[] for _ in range(slots)]
        # Maps go on a queue of their own so that mapping the next slot need not wait for the
        # compute queued behind the previous copy.
        self.map_queue = cl.CommandQueue(device.context, device.cl_device)
        self.turn = 0

    def close(self) -> None:
        """Wait for pending copies, then release the staging buffers."""
        for events in self.pending:
            for event in events:
                event.wait()
        self.pending = [[] for _ in self.slots]
        for slot in self.slots:
            slot.release()
        self.slots = []

    def send(self, x: np.ndarray, y: np.ndarray, dst_x: cl.Buffer, dst_y: cl.Buffer) -> list:
        """Write one batch into the next slot and enqueue its copies on the device queue; returns
        the copy events (for profiling). Waits only for this slot's copies of two batches ago."""
        if tuple(x.shape) != self.x_shape or tuple(y.shape) != self.y_shape:
            raise ValueError(
                f"batch shapes {x.shape}, {y.shape}; expected {self.x_shape}, {self.y_shape}"
            )
        with naming(f"the upload of a batch ({self.nbytes} bytes) through staging buffer "
                    f"{self.turn} of {len(self.slots)}"):
            return self._send(x, y, dst_x, dst_y)

    def _send(self, x: np.ndarray, y: np.ndarray, dst_x: cl.Buffer, dst_y: cl.Buffer) -> list:
        slot = self.turn
        self.turn = (self.turn + 1) % len(self.slots)
        buf = self.slots[slot]
        host, _ = cl.enqueue_map_buffer(
            self.map_queue,
            buf,
            cl.map_flags.WRITE_INVALIDATE_REGION,
            0,
            (self.nbytes,),
            np.uint8,
            wait_for=self.pending[slot] or None,
            is_blocking=True,
        )
        host[: self.x_bytes].view(np.float32)[:] = np.asarray(x, np.float32).reshape(-1)
        host[self.x_bytes :].view(np.int32)[:] = np.asarray(y, np.int32).reshape(-1)
        mapping = host.base  # pyopencl's MemoryMap: releasing it enqueues the unmap
        del host
        unmapped = mapping.release(self.map_queue)
        self.map_queue.flush()
        queue = self.device.queue
        copy_x = cl.enqueue_copy(
            queue,
            dst_x,
            buf,
            byte_count=self.x_bytes,
            src_offset=0,
            dst_offset=0,
            wait_for=[unmapped],
        )
        copy_y = cl.enqueue_copy(
            queue, dst_y, buf, byte_count=self.y_bytes, src_offset=self.x_bytes, dst_offset=0
        )
        self.pending[slot] = [copy_x, copy_y]
        return [copy_x, copy_y]
