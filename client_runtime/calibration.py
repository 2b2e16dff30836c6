"""A device profile of the OpenCL device at hand, measured with the engine's own kernels, so that
the cost model can be checked against steps measured on the same device.

Four figures, each from a short microbenchmark: the sustained float32 rate of a square GEMM, the
memory bandwidth of a large copy kernel, the host-to-device copy bandwidth of ``enqueue_copy``,
and the launch overhead as the wall time per launch of many one-element launches queued back to
back (what a step's many small launches pay). Medians of a few repetitions resist a busy machine.

Two more for the cost model's corrections of the roofline:

- lanes: a kernel whose work-items each run a long chain of FMAs on registers (no memory traffic,
  so neither caches nor launch latency blur it) gains throughput with its global size W until it
  fills the device; under the model ``rate x min(1, W / lanes)`` it reaches half its best at
  ``W = lanes / 2``, so lanes is twice the global size where the throughput crosses half its best;
- class efficiencies: one training step of a small calibration network that has every kernel class
  (im2col + GEMM convolution, depthwise, pooling, BatchNorm, activations, global pooling, a linear
  head, SGD) is timed launch by launch with profiling events; a class's efficiency is its launches'
  occupancy-corrected roofline time at the calibrated rate and bandwidth over their measured time.
"""

from __future__ import annotations

import math
import statistics
import time
from collections import defaultdict
from dataclasses import replace

import numpy as np
import pyopencl as cl

from client_runtime.device import Device
from client_runtime.step import CompiledStep
from kernels import elementwise
from kernels.gemm import gemm
from kernels.launch import Launch
from mgfl.cost_model import kernel_seconds, occupancy
from mgfl.device_profiles import DeviceProfile
from mgfl.kernel_classes import kernel_class
from mgfl.models.layers import (
    BatchNorm,
    Conv2d,
    DepthwiseConv2d,
    GlobalAvgPool,
    Linear,
    MaxPool2d,
    ReLU,
    ReLU6,
)
from mgfl.models.model import Model

GEMM_SIZE = 384
COPY_ELEMENTS = 4 * 2**20  # 16 MiB per buffer: well past any CPU cache of a laptop or phone
LAUNCHES = 200
REPEATS = 5
# The occupancy sweep: global sizes 1, 2, 4, ... up to LANE_SWEEP_MAX, stopping once a launch
# takes LANE_SWEEP_STOP times the smallest one's time (the device is long full by then)
LANE_SWEEP_MAX = 2**20
LANE_SWEEP_STOP = 32
FMA_CHAIN_ITERATIONS = 1024
FMA_CHAIN_SOURCE = """
__kernel void fma_chain(__global float* out, const int iterations) {
    float a = (float)get_global_id(0) * 1e-7f, d = 0.5f;
    for (int i = 0; i < iterations; ++i) {
        a = fma(a, 0.999f, 1e-3f);
        d = fma(d, 0.999f, 1e-3f);
    }
    out[get_global_id(0)] = a + d;
}
"""
CALIBRATION_BATCH = 16


def calibration_model() -> Model:
    """A small network with every kernel class of the engine, none of the zoo's shapes."""
    return Model("calibration", (3, 24, 24), (
        Conv2d(16, 3, padding=1, bias=False), BatchNorm(), ReLU(), MaxPool2d(2),
        DepthwiseConv2d(3, padding=1, bias=False), BatchNorm(), ReLU6(),
        Conv2d(32, 1, bias=False), BatchNorm(), ReLU(),
        GlobalAvgPool(), Linear(10),
    ))  # fmt: skip


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


def _work_items(launch: Launch) -> int:
    return math.prod(launch.global_size)


def measure_flops(device: Device, size: int = GEMM_SIZE, lanes: int = 1) -> float:
    """The GEMM's rate with the device full: its measured rate over its own occupancy."""
    a, b, c = (_buffer(device, size * size) for _ in range(3))
    launch = gemm(device.kernels, a, b, c, m=size, n=size, k=size)
    rate = launch.flops / _median_kernel_seconds(device.queue, launch)
    return rate / occupancy(_work_items(launch), lanes)


def _fma_chain_seconds(device: Device, kernel: cl.Kernel, work_items: int) -> float:
    times = []
    for _ in range(REPEATS):
        event = cl.enqueue_nd_range_kernel(device.queue, kernel, (work_items,), None)
        event.wait()
        times.append(_event_seconds(event))
    return statistics.median(times)


def measure_lanes(device: Device, largest: int = LANE_SWEEP_MAX) -> int:
    """Twice the global size at which the FMA chain's throughput first reaches half its best
    (interpolated between the powers of two swept)."""
    program = cl.Program(device.context, FMA_CHAIN_SOURCE).build()
    out = cl.Buffer(device.context, cl.mem_flags.WRITE_ONLY, 4 * largest)
    kernel = program.fma_chain
    kernel.set_args(out, np.int32(FMA_CHAIN_ITERATIONS))
    _fma_chain_seconds(device, kernel, 1)  # warm-up
    points: list[tuple[int, float]] = []
    items = 1
    while items <= largest:
        seconds = _fma_chain_seconds(device, kernel, items)
        points.append((items, items / seconds))
        if seconds > LANE_SWEEP_STOP * (points[0][0] / points[0][1]):
            break
        items *= 2
    half = max(rate for _, rate in points) / 2
    previous_items, previous_rate = points[0]
    if previous_rate >= half:
        return 2 * previous_items
    for items, rate in points[1:]:
        if rate >= half:
            share = (half - previous_rate) / (rate - previous_rate)
            return round(2 * (previous_items + share * (items - previous_items)))
        previous_items, previous_rate = items, rate
    return 2 * points[-1][0]


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


def launch_event_seconds(device: Device, launches: list[Launch], repeats: int) -> list[float]:
    """Each launch's median device time over ``repeats`` runs of the whole list in order."""
    times: list[list[float]] = [[] for _ in launches]
    for _ in range(repeats):
        events = [launch.enqueue(device.queue) for launch in launches]
        device.queue.finish()
        for slot, event in zip(times, events, strict=True):
            slot.append(_event_seconds(event))
    return [statistics.median(slot) for slot in times]


def class_efficiencies(
    launches: list[Launch], seconds: list[float], profile: DeviceProfile
) -> dict[str, float]:
    """Per kernel class, the occupancy-corrected roofline time of its launches on ``profile``
    (efficiency 1) over the time they took."""
    modelled: dict[str, float] = defaultdict(float)
    measured: dict[str, float] = defaultdict(float)
    for launch, took in zip(launches, seconds, strict=True):
        kind = kernel_class(launch.name)
        modelled[kind] += kernel_seconds(launch.flops, launch.bytes_moved, profile,
                                         _work_items(launch))
        measured[kind] += took
    return {kind: modelled[kind] / measured[kind] for kind in measured if measured[kind] > 0}


def measure_class_efficiencies(device: Device, profile: DeviceProfile) -> dict[str, float]:
    """Class efficiencies from one step of :func:`calibration_model` on ``device``."""
    model = calibration_model()
    step = CompiledStep(device, model, CALIBRATION_BATCH, model.init_state(0), profile=False)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((CALIBRATION_BATCH, *model.input_shape)).astype(np.float32)
    y = rng.integers(0, model.num_classes, CALIBRATION_BATCH).astype(np.int32)
    step.train_step(x, y)  # warm-up, and the batch the timed launches read
    device.queue.finish()
    launches = list(step.train_launches)
    return class_efficiencies(launches, launch_event_seconds(device, launches, REPEATS), profile)


def calibrate(device: Device) -> DeviceProfile:
    """A profile of ``device`` whose figures are all measured here (sustained fraction 1: the
    measured GEMM rate, corrected for its occupancy, is what a compute-bound kernel reaches).
    Every figure is timed with profiling events: a device opened with ``profiling=False`` is
    refused before anything runs."""
    device.require_profiling("calibration")
    lanes = measure_lanes(device)
    flops = measure_flops(device, GEMM_SIZE, lanes)
    memory = measure_memory_bandwidth(device, COPY_ELEMENTS)
    base = DeviceProfile(
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
        lanes=lanes,
    )
    return replace(base, efficiency=measure_class_efficiencies(device, base))
