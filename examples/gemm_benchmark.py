"""GFLOP/s of mgfl's GEMM on one OpenCL device, next to NumPy's on the host.

    python examples/gemm_benchmark.py --size 1024
    python examples/gemm_benchmark.py --device gpu --config use_local_memory=1,tile_m=128,wpt_m=8

Each transpose combination is checked against NumPy once, then timed with OpenCL profiling events;
the best of ``--repeats`` runs is reported for both, interleaved so that a busy machine slows
both alike.
"""

from __future__ import annotations

import argparse
import dataclasses
import time

import numpy as np
import pyopencl as cl

from client_runtime.device import Device
from kernels.gemm import GemmConfig, default_config, gemm

COMBINATIONS = {"nn": (False, False), "tn": (True, False), "nt": (False, True), "tt": (True, True)}


def parse_config(text: str, base: GemmConfig) -> GemmConfig:
    """``key=value,key=value`` over the device's default configuration."""
    if not text:
        return base
    fields = {f.name: f.type for f in dataclasses.fields(GemmConfig)}
    changes = {}
    for item in text.split(","):
        key, value = item.split("=")
        if key not in fields:
            raise SystemExit(f"Unknown GemmConfig field {key!r}; fields: {', '.join(fields)}")
        changes[key] = bool(int(value)) if fields[key] in (bool, "bool") else int(value)
    return dataclasses.replace(base, **changes)


def measure(device: Device, config: GemmConfig, size: int, trans_a: bool, trans_b: bool,
            repeats: int) -> tuple[float, float, float]:
    """(kernel GFLOP/s, NumPy GFLOP/s, relative error) for one square product."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((size, size)).astype(np.float32)
    b = rng.standard_normal((size, size)).astype(np.float32)
    flags = cl.mem_flags.READ_ONLY | cl.mem_flags.COPY_HOST_PTR
    buf_a = cl.Buffer(device.context, flags, hostbuf=a)
    buf_b = cl.Buffer(device.context, flags, hostbuf=b)
    buf_c = cl.Buffer(device.context, cl.mem_flags.READ_WRITE, 4 * size * size)
    launch = gemm(device.kernels, buf_a, buf_b, buf_c, m=size, n=size, k=size,
                  trans_a=trans_a, trans_b=trans_b, config=config)
    launch.enqueue(device.queue).wait()
    result = np.empty((size, size), np.float32)
    cl.enqueue_copy(device.queue, result, buf_c)
    op_a, op_b = (a.T if trans_a else a), (b.T if trans_b else b)
    expected = op_a.astype(np.float64) @ op_b
    error = float(np.abs(result - expected).max() / np.abs(expected).max())
    best_kernel = best_numpy = float("inf")
    for _ in range(repeats):
        event = launch.enqueue(device.queue)
        event.wait()
        best_kernel = min(best_kernel, (event.profile.end - event.profile.start) * 1e-9)
        start = time.perf_counter()
        np.matmul(op_a, op_b)
        best_numpy = min(best_numpy, time.perf_counter() - start)
    flops = 2.0 * size**3
    return flops / best_kernel / 1e9, flops / best_numpy / 1e9, error


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default=None, help="index, kind or part of a device name")
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--config", default="", help="GemmConfig changes, e.g. group_rows=16")
    parser.add_argument("--combinations", default="nn,tn,nt,tt")
    args = parser.parse_args()
    device = Device.open(args.device)
    config = parse_config(args.config, default_config(device.cl_device))
    print(f"{device.info.describe()}\n{config}")
    for name in args.combinations.split(","):
        kernel, numpy, error = measure(device, config, args.size, *COMBINATIONS[name],
                                       args.repeats)
        print(f"{name} n={args.size}: {kernel:7.1f} GFLOP/s   NumPy {numpy:7.1f} GFLOP/s   "
              f"({100 * kernel / numpy:3.0f}%)   max rel. error {error:.1e}", flush=True)


if __name__ == "__main__":
    main()
