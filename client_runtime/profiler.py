"""Per-kernel device time and host-device traffic, from OpenCL profiling events.

The seed study lost about 91% of training time to host-device copies; this is where mgfl measures
its own share. Events of a window of steps are collected when a report is due (after the queue has
finished), so profiling adds no synchronisation to the steps themselves.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import pyopencl as cl

from kernels.launch import Launch


def _seconds(event: cl.Event) -> float:
    return (event.profile.end - event.profile.start) * 1e-9


@dataclass
class KernelTime:
    launches: int = 0
    seconds: float = 0.0
    flops: int = 0
    bytes_moved: int = 0


@dataclass
class StepProfiler:
    """Accumulates kernel and copy times over steps; ``summary()`` reports per step."""

    enabled: bool = True
    steps: int = 0
    h2d_bytes: int = 0
    d2h_bytes: int = 0
    d2h_report_bytes: int = 0
    h2d_seconds: float = 0.0
    kernel_seconds: float = 0.0
    kernels: dict[str, KernelTime] = field(default_factory=lambda: defaultdict(KernelTime))
    _pending: list = field(default_factory=list)
    _pending_copies: list = field(default_factory=list)
    last_enqueued: Launch | None = None

    def run(self, queue: cl.CommandQueue, launches: list[Launch], count_step: bool = True) -> None:
        if launches:
            self.last_enqueued = launches[-1]
        if self.enabled:
            self._pending.extend((launch, launch.enqueue(queue)) for launch in launches)
        else:
            for launch in launches:
                launch.enqueue(queue)
        if count_step:
            self.steps += 1

    def count_h2d(self, nbytes: int, events: list | None = None) -> None:
        self.h2d_bytes += nbytes
        if self.enabled and events:
            self._pending_copies.extend(events)

    def count_d2h(self, nbytes: int, per_step: bool = True) -> None:
        if per_step:
            self.d2h_bytes += nbytes
        else:
            self.d2h_report_bytes += nbytes

    def collect(self) -> None:
        """Read the times of finished events (call after ``queue.finish()``)."""
        for launch, event in self._pending:
            t = _seconds(event)
            entry = self.kernels[launch.name]
            entry.launches += 1
            entry.seconds += t
            entry.flops += launch.flops
            entry.bytes_moved += launch.bytes_moved
            self.kernel_seconds += t
        for event in self._pending_copies:
            self.h2d_seconds += _seconds(event)
        self._pending.clear()
        self._pending_copies.clear()

    def summary(self) -> dict:
        self.collect()
        steps = max(self.steps, 1)
        device_time = self.kernel_seconds + self.h2d_seconds
        return {
            "steps": self.steps,
            "h2d_bytes_per_step": self.h2d_bytes / steps,
            "d2h_bytes_per_step": self.d2h_bytes / steps,
            "d2h_report_bytes": self.d2h_report_bytes,
            "h2d_seconds_per_step": self.h2d_seconds / steps,
            "kernel_seconds_per_step": self.kernel_seconds / steps,
            "data_movement_share": self.h2d_seconds / device_time if device_time else 0.0,
            "kernels": {
                name: {
                    "launches": k.launches,
                    "seconds": k.seconds,
                    "gflops": k.flops / k.seconds / 1e9 if k.seconds else 0.0,
                }
                for name, k in sorted(self.kernels.items(), key=lambda kv: -kv[1].seconds)
            },
        }
