"""Moves each batch to the device through host-allocated staging buffers, on one of two paths.

``map``: two slots alternate; the host maps a slot, writes the batch into it, unmaps it, and the
device copies it into the step's tensors. On phones and CPU drivers, where the device shares
memory with the host, a buffer allocated with ALLOC_HOST_PTR and mapped costs no extra copy (Arm's
Mali OpenCL guide).

``pinned``: for a discrete GPU. Each slot is allocated with ALLOC_HOST_PTR and mapped once, for
the ring's lifetime: its mapping is pinned host memory. A batch is written there and sent with
non-blocking writes from that pointer (the buffer object itself is never used in a command while
mapped), which spares the blocking map, the unmap and a flush per batch. When the step's input and
labels lie side by side in its arena, the slot mirrors their layout and one write fills both.

Either way a slot is rewritten only after its previous copies finished (double buffering), and
the bytes that reach the device are the same, so training is bitwise identical on both paths.
"""

from __future__ import annotations

import os
from math import prod

import numpy as np
import pyopencl as cl

from client_runtime.device import Device
from kernels.device_errors import naming

STAGING_ENV = "MGFL_STAGING"
STAGING_MODES = ("map", "pinned")


def resolve_staging_mode(device: Device, requested: str | None = None) -> str:
    """``requested`` (``map``, ``pinned``; ``None`` or ``auto``: the device's kind of memory
    decides: ``map`` where it is unified with the host's, ``pinned`` elsewhere)."""
    wanted = (requested or "auto").strip().lower()
    if wanted == "auto":
        return "map" if device.info.host_unified_memory else "pinned"
    if wanted not in STAGING_MODES:
        raise ValueError(
            f"Unknown staging path {requested!r}; expected one of {', '.join(STAGING_MODES)} "
            f"or auto (set by the staging argument or {STAGING_ENV})"
        )
    return wanted


def staging_mode_from_env() -> str | None:
    """The path ``MGFL_STAGING`` asks for, or ``None`` when it is unset or empty."""
    return os.environ.get(STAGING_ENV) or None


class StagingRing:
    """Double-buffered upload of (inputs, labels) into fixed device tensors.

    ``labels_at``: where the labels start after the input's first byte in the device buffer that
    holds both (see ``send``'s ``joint``); on the pinned path each slot then mirrors that layout
    so that one write uploads the whole batch.
    """

    def __init__(
        self,
        device: Device,
        x_shape: tuple[int, ...],
        y_shape: tuple[int, ...],
        slots: int = 2,
        mode: str | None = None,
        labels_at: int | None = None,
    ):
        self.device = device
        self.mode = resolve_staging_mode(device, mode)
        self.x_shape, self.y_shape = tuple(x_shape), tuple(y_shape)
        self.x_bytes = prod(x_shape) * 4
        self.y_bytes = prod(y_shape) * 4
        self.nbytes = self.x_bytes + self.y_bytes  # the batch's bytes (what is counted as h2d)
        joint = self.mode == "pinned" and labels_at is not None and labels_at >= self.x_bytes
        self.joint = joint  # one write per batch, into the buffer that holds both tensors
        self.labels_at = labels_at if joint else self.x_bytes
        self.slot_bytes = self.labels_at + self.y_bytes
        flags = cl.mem_flags.READ_WRITE | cl.mem_flags.ALLOC_HOST_PTR
        with naming(f"allocating {slots} staging buffers of {self.slot_bytes} bytes"):
            self.slots = [cl.Buffer(device.context, flags, self.slot_bytes) for _ in range(slots)]
        self.pending: list[list[cl.Event]] = [[] for _ in range(slots)]
        self.turn = 0
        if self.mode == "pinned":
            with naming(f"mapping {slots} staging buffers of {self.slot_bytes} bytes"):
                self._maps = [self._map_once(buf) for buf in self.slots]
        else:
            # Maps go on a queue of their own so that mapping the next slot need not wait for
            # the compute queued behind the previous copy.
            self.map_queue = cl.CommandQueue(device.context, device.cl_device)

    def _map_once(self, buf: cl.Buffer) -> tuple:
        """Map ``buf`` for writing for the ring's lifetime: (mapping, whole slot, x view, y view).
        The gap between input and labels is zeroed once, so every upload sends the same bytes."""
        host, _ = cl.enqueue_map_buffer(
            self.device.queue, buf, cl.map_flags.WRITE, 0, (self.slot_bytes,), np.uint8,
            is_blocking=True,
        )
        host[:] = 0
        x_view = host[: self.x_bytes].view(np.float32)
        y_view = host[self.labels_at :].view(np.int32)
        return host.base, host, x_view, y_view

    def close(self) -> None:
        """Wait for pending copies, unmap pinned slots, then release the staging buffers."""
        for events in self.pending:
            for event in events:
                event.wait()
        self.pending = [[] for _ in self.slots]
        if self.mode == "pinned":
            maps, self._maps = self._maps, []
            for mapping, *_ in maps:
                mapping.release(self.device.queue)
            self.device.queue.finish()
        for slot in self.slots:
            slot.release()
        self.slots = []

    def send(
        self,
        x: np.ndarray,
        y: np.ndarray,
        dst_x: cl.Buffer,
        dst_y: cl.Buffer,
        joint: tuple[cl.Buffer, int] | None = None,
    ) -> list:
        """Write one batch into the next slot and enqueue its copies on the device queue; returns
        the copy events (for profiling). Waits only for this slot's copies of two batches ago.
        ``joint`` (a buffer holding both tensors, the input's offset in it; the labels at
        ``labels_at`` after) lets the pinned path upload both with one write."""
        if tuple(x.shape) != self.x_shape or tuple(y.shape) != self.y_shape:
            raise ValueError(
                f"batch shapes {x.shape}, {y.shape}; expected {self.x_shape}, {self.y_shape}"
            )
        with naming(f"the upload of a batch ({self.nbytes} bytes) through {self.mode} staging "
                    f"buffer {self.turn} of {len(self.slots)}"):
            if self.mode == "pinned":
                return self._send_pinned(x, y, dst_x, dst_y, joint)
            return self._send_mapped(x, y, dst_x, dst_y)

    def _next_slot(self) -> int:
        slot = self.turn
        self.turn = (self.turn + 1) % len(self.slots)
        return slot

    def _send_pinned(self, x, y, dst_x, dst_y, joint) -> list:
        slot = self._next_slot()
        if self.pending[slot]:
            cl.wait_for_events(self.pending[slot])
        _, host, x_view, y_view = self._maps[slot]
        x_view[:] = np.asarray(x, np.float32).reshape(-1)
        y_view[:] = np.asarray(y, np.int32).reshape(-1)
        queue = self.device.queue
        if self.joint and joint is not None:
            buffer, offset = joint
            copies = [cl.enqueue_copy(queue, buffer, host, dst_offset=offset, is_blocking=False)]
        else:
            copies = [
                cl.enqueue_copy(queue, dst_x, x_view, is_blocking=False),
                cl.enqueue_copy(queue, dst_y, y_view, is_blocking=False),
            ]
        self.pending[slot] = copies
        return copies

    def _send_mapped(self, x, y, dst_x, dst_y) -> list:
        slot = self._next_slot()
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
