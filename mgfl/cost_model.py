"""How long one training step takes on a device that is not here, from the work the engine itself
counts: every launch of a compiled step knows its floating-point operations and the global-memory
bytes it moves (``kernels.launch.Launch.flops`` / ``bytes_moved``).

Per launch, a roofline: the launch takes as long as the slower of its arithmetic at the device's
sustained rate and its memory traffic at the sustained bandwidth, plus a fixed launch overhead.
Two corrections make it fit training steps, whose launches are mostly small and mostly not GEMMs:

- occupancy: a launch of W work-items cannot use more than W of the device's ``lanes``, so it runs
  at ``min(1, W / lanes)`` of the rate and bandwidth;
- kernel class: depthwise, pooling, normalisation and element-wise kernels reach a different
  fraction of the calibrated GEMM rate and copy bandwidth than the kernels that measured them; the
  profile's ``efficiency`` per class (``mgfl.kernel_classes``) scales both.

A step adds the host-to-device copy of its batch. ``docs/deploy.md`` gives the error against
measured steps.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

from mgfl.device_profiles import DeviceProfile
from mgfl.kernel_classes import kernel_class


class CountedWork(Protocol):
    """What the model reads of a launch (``kernels.launch.Launch`` has all four)."""

    name: str
    global_size: tuple[int, ...]
    flops: int
    bytes_moved: int


@dataclass(frozen=True)
class StepCost:
    """A predicted step, split into where its time goes (seconds)."""

    compute_s: float  # launches whose arithmetic bounds them
    memory_s: float  # launches whose memory traffic bounds them
    launch_s: float  # fixed overhead of every launch
    copy_s: float  # host-to-device copy of the batch
    launches: int
    flops: int
    bytes_moved: int

    @property
    def total_s(self) -> float:
        return self.compute_s + self.memory_s + self.launch_s + self.copy_s

    def to_dict(self) -> dict:
        return {
            "total_s": self.total_s,
            "compute_s": self.compute_s,
            "memory_s": self.memory_s,
            "launch_s": self.launch_s,
            "copy_s": self.copy_s,
            "launches": self.launches,
            "flops": self.flops,
            "bytes_moved": self.bytes_moved,
        }


def occupancy(work_items: int, lanes: int) -> float:
    """The share of the device a launch of ``work_items`` can keep busy."""
    return min(1.0, max(work_items, 1) / max(lanes, 1))


def kernel_seconds(
    flops: int, nbytes: int, profile: DeviceProfile, work_items: int | None = None,
    kind: str | None = None,
) -> float:
    """The roofline time of one launch, without its launch overhead: at the occupancy of
    ``work_items`` (full when not given) and the efficiency of the kernel class ``kind`` (1 when
    not given)."""
    share = occupancy(work_items, profile.lanes) if work_items is not None else 1.0
    share *= profile.class_efficiency(kind) if kind is not None else 1.0
    return max(flops / profile.sustained_flops, nbytes / profile.memory_bandwidth) / share


def launch_seconds(launch: CountedWork, profile: DeviceProfile) -> tuple[float, bool]:
    """The time of one launch without its overhead, and whether its arithmetic bounds it."""
    seconds = kernel_seconds(launch.flops, launch.bytes_moved, profile,
                             math.prod(launch.global_size), kernel_class(launch.name))
    compute_bound = launch.flops / profile.sustained_flops >= (
        launch.bytes_moved / profile.memory_bandwidth)
    return seconds, compute_bound


def predict(
    launches: Iterable[CountedWork], h2d_bytes: int, profile: DeviceProfile
) -> StepCost:
    """The cost of running ``launches`` once after copying ``h2d_bytes`` to the device."""
    compute = memory = 0.0
    count = flops = moved = 0
    for launch in launches:
        seconds, compute_bound = launch_seconds(launch, profile)
        if compute_bound:
            compute += seconds
        else:
            memory += seconds
        count += 1
        flops += launch.flops
        moved += launch.bytes_moved
    return StepCost(
        compute_s=compute,
        memory_s=memory,
        launch_s=count * profile.launch_overhead_s,
        copy_s=h2d_bytes / profile.host_copy_bandwidth,
        launches=count,
        flops=flops,
        bytes_moved=moved,
    )


def step_launches(step) -> list[CountedWork]:
    """Every launch of one optimizer step of a ``CompiledStep``: the micro-batch launches once per
    micro-batch, then the deferred updates of gradient accumulation."""
    launches = list(step.train_launches) * step.accumulation_steps
    if step.accumulation_steps > 1:
        launches += list(step.accumulated_update_launches)
    return launches


def predict_step(step, profile: DeviceProfile) -> StepCost:
    """The predicted time of one training step of a compiled step (``CompiledStep``) on
    ``profile``."""
    return predict(step_launches(step), step.h2d_bytes_per_step, profile)


def predict_training(step, profile: DeviceProfile, steps: int) -> float:
    """Seconds of ``steps`` training steps on ``profile``."""
    return steps * predict_step(step, profile).total_s


def uplink_seconds(nbytes: int, bits_per_second: float) -> float:
    """Time to send ``nbytes`` over a link of ``bits_per_second``."""
    if bits_per_second <= 0:
        raise ValueError(f"bandwidth must be positive, got {bits_per_second}")
    return 8 * nbytes / bits_per_second
