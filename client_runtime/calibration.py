"""A device profile of the OpenCL device at hand, measured with the engine's own kernels, so that
the cost model can be checked against steps measured on the same device.

Four figures, each from a short microbenchmark: the sustained float32 rate of a square GEMM, the
memory bandwidth of a large copy kernel, the host-to-device copy bandwidth of ``enqueue_copy``,
and the launch overhead as the wall time per launch of many one-element launches queued back to
back (what a step's many small launches pay). Medians of a few repetitions resist a busy machine.
"""

from __future__ import annotations

import statistics
import time

import numpy as np
import pyopencl as cl

from client_runtime.device import Device
from kernels import elementwise
from kernels.gemm import gemm
from kernels.launch import Launch
from mgfl.device_profiles import DeviceProfile

GEMM_SIZE = 384
COPY_ELEMENTS = 4 * 2**20  # 16 MiB per buffer: well past any CPU cache of a laptop or phone
LAUNCHES = 200
REPEATS = 5


def _event_seconds(event: cl.Event) -> float:
    return (event.profile.end - event.profile.start) * 1e-9


def _median_kernel_seconds(queue: cl.CommandQueue, launch: Launch) -> float:
    launch.enqueue(queue)  # warm-up: first launches pay for lazy set-up in some drivers
    queue.finish()
    times = []
    for _ in range(REPEATS):
        event = launch.enqueue(queue)
        event.wait()
        times.append(_event_seconds(event))
    return statistics.median(times)


def _buffer(device: Device, elements: int) -> cl.Buffer:
    data = np.ones(elements, np.float32)
    flags = cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR
    return cl.Buffer(device.context, flags, hostbuf=data)


def measure_flops(device: Device, size: int = GEMM_SIZE) -> float:
    a, b, c = (_buffer(device, size * size) for _ in range(3))
    launch = gemm(device.kernels, a, b, c, m=size, n=size, k=size)
    return launch.flops / _median_kernel_seconds(device.queue, launch)


def measure_memory_bandwidth(device: Device, elements: int = COPY_ELEMENTS) -> float:
    src, dst = _buffer(device, elements), _buffer(device, elements)
    launch = elementwise.copy(device.kernels, src, dst, elements)
    return launch.bytes_moved / _median_kernel_seconds(device.queue, launch)


def measure_host_copy_bandwidth(device: Device, elements: int = COPY_ELEMENTS) -> float:
    host = np.ones(elements, np.float32)
    dst = _buffer(device, elements)
    times = []
    for _ in range(REPEATS):
        event = cl.enqueue_copy(device.queue, dst, host, is_blocking=False)
        event.wait()
        times.append(_event_seconds(event))
    return host.nbytes / statistics.median(times)


def measure_launch_overhead(device: Device, launches: int = LAUNCHES) -> float:
    target = _buffer(device, 1)
    launch = elementwise.fill(device.kernels, target, 0.0, 1)
    queue = device.queue
    times = []
    for _ in range(REPEATS):
        queue.finish()
        start = time.perf_counter()
        for _ in range(launches):
            launch.enqueue(queue)
        queue.finish()
        times.append((time.perf_counter() - start) / launches)
    return statistics.median(times)


def calibrate(device: Device) -> DeviceProfile:
    """A profile of ``device`` whose figures are all measured here (sustained fraction 1: the
    measured GEMM rate is what a compute-bound kernel reaches)."""
    flops = measure_flops(device, GEMM_SIZE)
    memory = measure_memory_bandwidth(device, COPY_ELEMENTS)
    return DeviceProfile(
        name=f"measured:{device.info.name}",
        soc=f"{device.info.platform} {device.info.driver_version}",
        peak_flops=flops,
        sustained_fraction=1.0,
        memory_bandwidth=memory,
        host_copy_bandwidth=measure_host_copy_bandwidth(device, COPY_ELEMENTS),
        launch_overhead_s=measure_launch_overhead(device, LAUNCHES),
        memory_budget_bytes=device.info.global_mem_bytes,
        sources=(),
        notes="measured by client_runtime.calibration",
    )
