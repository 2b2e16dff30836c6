"""How long one training step takes on a device that is not here, from the work the engine itself
counts: every launch of a compiled step knows its floating-point operations and the global-memory
bytes it moves (``kernels.launch.Launch.flops`` / ``bytes_moved``).

Per launch, a roofline: the launch takes as long as the slower of its arithmetic at the device's
sustained rate and its memory traffic at the sustained bandwidth, plus a fixed launch overhead.
A step adds the host-to-device copy of its batch. Kernels that are neither (poor occupancy,
divergence) are what the model misses; ``docs/deploy.md`` gives the error against measured steps.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

from mgfl.device_profiles import DeviceProfile


class CountedWork(Protocol):
    """What the model reads of a launch (``kernels.launch.Launch`` has both)."""

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


def kernel_seconds(flops: int, nbytes: int, profile: DeviceProfile) -> float:
    """The roofline time of one launch, without its launch overhead."""
    return max(flops / profile.sustained_flops, nbytes / profile.memory_bandwidth)


def predict(
    launches: Iterable[CountedWork], h2d_bytes: int, profile: DeviceProfile
) -> StepCost:
    """The cost of running ``launches`` once after copying ``h2d_bytes`` to the device."""
    compute = memory = 0.0
    count = flops = moved = 0
    for launch in launches:
        arithmetic = launch.flops / profile.sustained_flops
        traffic = launch.bytes_moved / profile.memory_bandwidth
        if arithmetic >= traffic:
            compute += arithmetic
        else:
            memory += traffic
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
