"""Where the host's time goes in one training step: per-launch enqueue cost on a profiling and a
plain command queue, and a step split into batch upload, kernel enqueues and the final wait.

    MGFL_DEVICE=gpu python3 examples/gpu/launch_overhead.py --json launch.json

Small models on a fast GPU are bound by the host (tens of launches of microseconds each), so these
figures decide what to optimise: the launches' count, their enqueue cost, or the upload.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np
import pyopencl as cl

from client_runtime.device import Device
from client_runtime.step import CompiledStep
from kernels import elementwise
from mgfl.bench.report import median_wall_seconds
from mgfl.models import build_model

MODELS = {"mlp": 32, "lenet5": 64, "dscnn": 64, "mobilenetv2": 32}


def per_launch_us(queue: cl.CommandQueue, launch, count: int) -> float:
    queue.finish()
    start = time.perf_counter()
    for _ in range(count):
        launch.enqueue(queue)
    queue.finish()
    return (time.perf_counter() - start) / count * 1e6


def median_us(fn, repeats: int) -> float:
    return median_wall_seconds(fn, repeats) * 1e6


def step_phases(device: Device, name: str, batch: int, repeats: int) -> dict:
    model = build_model(name)
    step = CompiledStep(device, model, batch, model.init_state(0), profile=False)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(batch, *model.input_shape)).astype(np.float32)
    y = rng.integers(0, model.num_classes, batch).astype(np.int32)
    queue = device.queue

    def upload() -> None:
        step._upload_batch(x, y)
        queue.finish()

    def launches() -> None:
        for launch in step.train_launches:
            launch.enqueue(queue)
        queue.finish()

    def enqueue_only() -> None:
        for launch in step.train_launches:
            launch.enqueue(queue)

    def whole() -> None:
        step.train_step(x, y)
        queue.finish()

    row = {"model": name, "batch": batch, "launches": len(step.train_launches),
           "whole_us": median_us(whole, repeats), "upload_us": median_us(upload, repeats),
           "launches_us": median_us(launches, repeats),
           "enqueue_only_us": median_us(enqueue_only, repeats),
           "finish_us": median_us(queue.finish, repeats)}
    queue.finish()
    step.close()
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", required=True)
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--models", default=",".join(MODELS))
    args = parser.parse_args()
    device = Device.open()
    profiling_queue = device.queue
    plain_queue = cl.CommandQueue(device.context, device.cl_device)
    buf = cl.Buffer(device.context, cl.mem_flags.READ_WRITE, 4 * 1024)
    tiny = elementwise.fill(device.kernels, buf, 0.0, 1024)
    result = {"device": device.info.to_dict(),
              "tiny_launch_us": {"profiling_queue": per_launch_us(profiling_queue, tiny, 2000),
                                 "plain_queue": per_launch_us(plain_queue, tiny, 2000)},
              "steps": []}
    print(f"{device.info.describe()}\ntiny launch: {result['tiny_launch_us']}")
    for queue_name, queue in (("profiling", profiling_queue), ("plain", plain_queue)):
        device.queue = queue
        for name in args.models.split(","):
            row = {"queue": queue_name, **step_phases(device, name, MODELS[name], args.repeats)}
            result["steps"].append(row)
            print(" ".join(f"{k}={v:.1f}" if isinstance(v, float) else f"{k}={v}"
                           for k, v in row.items()), flush=True)
    device.queue = profiling_queue
    with open(args.json, "w") as f:
        json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
    from client_runtime.device import crash_prone_driver_opened

    if crash_prone_driver_opened():  # NVIDIA's driver crashes in the interpreter's teardown
        sys.stdout.flush()
        os._exit(0)
