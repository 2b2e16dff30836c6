"""Sweeps the blocked GEMM's tile configurations on one OpenCL device, next to the device's
default configuration and, where CUDA is present, cuBLAS float32 (TF32 off).

    python examples/gpu/gemm_sweep.py --json sweep.json                       # 4096, 2048, 1024
    python examples/gpu/gemm_sweep.py --sizes 256 --transposes nn --json /tmp/sweep.json
    python examples/gpu/gemm_sweep.py --extra 128x128x8/8x8,64x128x8/8x8 --json sweep.json

Every configuration runs square products of each size and transposition (``nn``: A @ B, ``nt``:
A @ B^T, ``tn``: A^T @ B, ``tt``), timed with OpenCL profiling events (median of ``--repeats``
runs after warm-up), its result checked against NumPy in float64 on sampled rows and columns.
The largest sizes run first, and no new configuration starts once ``--budget`` seconds have
passed, so the sweep ends in bounded time (about 1 s per program build on NVIDIA's driver).
Prints a table and writes every row, and the best configuration per case, as JSON.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import pyopencl as cl

from client_runtime.device import Device, crash_prone_driver_opened
from kernels.gemm import BLOCKED_TILES, GemmConfig, default_config, gemm
from kernels.library import KernelBuildError
from kernels.tuner import median_event_seconds, relative_error
from kernels.tuning_cache import tuned_config
from mgfl.bench.torch_reference import cuda_torch

TRANSPOSES = {"nn": (False, False), "nt": (False, True), "tn": (True, False), "tt": (True, True)}
TOLERANCE = 1e-4  # max |ours - float64| / max |float64| on the sampled entries
SAMPLES = 96  # rows and columns of C checked against NumPy


@dataclass
class Row:
    """One configuration on one product: its median time, or why it has none."""

    size: int
    transposes: str
    label: str
    config: dict
    seconds: float | None = None
    error: float | None = None
    cublas_seconds: float | None = None
    note: str = ""
    samples: list[float] = field(default_factory=list, repr=False)

    @property
    def tflops(self) -> float | None:
        return 2.0 * self.size**3 / self.seconds / 1e12 if self.seconds else None

    @property
    def correct(self) -> bool:
        return self.error is not None and self.error < TOLERANCE

    @property
    def of_cublas(self) -> float | None:
        """Our throughput as a share of cuBLAS's (cuBLAS time / our time)."""
        if self.seconds and self.cublas_seconds:
            return self.cublas_seconds / self.seconds
        return None

    def to_json(self) -> dict:
        return {"size": self.size, "transposes": self.transposes, "label": self.label,
                "config": self.config, "seconds": self.seconds, "tflops": self.tflops,
                "max_rel_error": self.error, "correct": self.correct,
                "cublas_seconds": self.cublas_seconds, "of_cublas": self.of_cublas,
                "runs_s": self.samples, "note": self.note}


def describe(config: GemmConfig) -> str:
    if config.blocked:
        return (f"blocked {config.tile_m}x{config.tile_n}x{config.tile_k} "
                f"{config.wpt_m}x{config.wpt_n}")
    if config.use_local_memory:
        return (f"local {config.tile_m}x{config.tile_n}x{config.tile_k} "
                f"{config.wpt_m}x{config.wpt_n}")
    return (f"register {config.rows_per_item}x{config.vector_width * config.vectors_per_row}"
            f" kc{config.k_block}")


def parse_extra(text: str) -> list[GemmConfig]:
    """``TMxTNxTK/WMxWN`` items, comma-separated, as blocked configurations."""
    found = []
    for item in filter(None, text.split(",")):
        try:
            tiles, work = item.split("/")
            tile_m, tile_n, tile_k = (int(v) for v in tiles.split("x"))
            wpt_m, wpt_n = (int(v) for v in work.split("x"))
        except ValueError:
            raise SystemExit(f"--extra items look like 128x128x16/8x8, got {item!r}") from None
        found.append(GemmConfig(style="gpu_blocked", tile_m=tile_m, tile_n=tile_n,
                                tile_k=tile_k, wpt_m=wpt_m, wpt_n=wpt_n))
    return found


def candidates(device: Device, extra: list[GemmConfig]) -> list[tuple[str, GemmConfig]]:
    """The device's default (and its tuned configuration for the largest size, where it was
    tuned and differs), then every blocked tile that fits the device, then ``extra``."""
    cl_device = device.cl_device
    default = default_config(cl_device)
    found = [(f"default: {describe(default)}", default)]
    blocked = [GemmConfig(style="gpu_blocked", tile_m=tm, tile_n=tn, tile_k=tk, wpt_m=wm,
                          wpt_n=wn) for tm, tn, tk, wm, wn in BLOCKED_TILES]
    for config in [*blocked, *extra]:
        width, height = config.local_group
        if (width * height <= int(cl_device.max_work_group_size)
                and config.local_memory_bytes <= int(cl_device.local_mem_size)
                and all(config != known for _, known in found)):
            found.append((describe(config), config))
    return found


def _tuned(device: Device, size: int) -> GemmConfig:
    return tuned_config(device.kernels, size, size, size)


class Operands:
    """A and B of one size on the host and the device, C on the device, and the sampled
    float64 reference of every transposition."""

    def __init__(self, device: Device, size: int, rng: np.random.Generator):
        self.size = size
        self.a = rng.standard_normal((size, size)).astype(np.float32)
        self.b = rng.standard_normal((size, size)).astype(np.float32)
        flags = cl.mem_flags.READ_ONLY | cl.mem_flags.COPY_HOST_PTR
        self.buf_a = cl.Buffer(device.context, flags, hostbuf=self.a)
        self.buf_b = cl.Buffer(device.context, flags, hostbuf=self.b)
        self.buf_c = cl.Buffer(device.context, cl.mem_flags.READ_WRITE, 4 * size * size)
        count = min(SAMPLES, size)
        self.rows = np.sort(rng.choice(size, count, replace=False))
        self.cols = np.sort(rng.choice(size, count, replace=False))
        self.host_c = np.empty((size, size), np.float32)

    def expected(self, trans_a: bool, trans_b: bool) -> np.ndarray:
        op_a = self.a.T if trans_a else self.a
        op_b = self.b.T if trans_b else self.b
        return op_a[self.rows].astype(np.float64) @ op_b[:, self.cols].astype(np.float64)

    def sampled_result(self, queue: cl.CommandQueue) -> np.ndarray:
        """C's sampled entries; all NaN when any entry of C was left unwritten."""
        cl.enqueue_copy(queue, self.host_c, self.buf_c)
        queue.finish()
        sample = self.host_c[np.ix_(self.rows, self.cols)]
        return sample if np.isfinite(self.host_c).all() else np.full_like(sample, np.nan)


def poison(queue: cl.CommandQueue, operands: Operands) -> None:
    """NaN into C, so that entries a configuration leaves unwritten fail the check."""
    cl.enqueue_fill_buffer(queue, operands.buf_c, np.float32(np.nan), 0, 4 * operands.size**2)
    queue.finish()


def measure(device: Device, operands: Operands, config: GemmConfig, transposes: str,
            repeats: int, expected: np.ndarray, row: Row) -> None:
    trans_a, trans_b = TRANSPOSES[transposes]
    size = operands.size
    try:
        launch = gemm(device.kernels, operands.buf_a, operands.buf_b, operands.buf_c, m=size,
                      n=size, k=size, trans_a=trans_a, trans_b=trans_b, config=config)
        poison(device.queue, operands)
        median_event_seconds(device.queue, [launch], 1)  # warm-up, and the checked result
        row.error = relative_error(operands.sampled_result(device.queue), expected)
        median_event_seconds(device.queue, [launch], 1)
        times = [median_event_seconds(device.queue, [launch], 1) for _ in range(repeats)]
    except (KernelBuildError, ValueError, cl.Error) as err:
        row.note = f"failed: {str(err).strip().splitlines()[0][:120]}"
        return
    row.samples = times
    row.seconds = statistics.median(times)
    if not row.correct:
        row.note = f"wrong: error {row.error:.2g}"


def cublas_seconds(torch, operands: Operands, transposes: str, repeats: int) -> float:
    """Median CUDA-event time of torch.matmul on the same operands (transposed views, as
    cuBLAS's own transposition flags), after warm-up."""
    trans_a, trans_b = TRANSPOSES[transposes]
    ta = torch.from_numpy(operands.a).cuda()
    tb = torch.from_numpy(operands.b).cuda()
    op_a, op_b = (ta.t() if trans_a else ta), (tb.t() if trans_b else tb)
    out = torch.empty((operands.size, operands.size), device="cuda")
    for _ in range(3):
        torch.matmul(op_a, op_b, out=out)
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        torch.matmul(op_a, op_b, out=out)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e-3)
    return statistics.median(times)


def best_rows(rows: list[Row]) -> list[Row]:
    """The fastest correct row of each (size, transposition)."""
    best: dict[tuple[int, str], Row] = {}
    for row in rows:
        if row.correct and row.seconds:
            key = (row.size, row.transposes)
            if key not in best or row.seconds < best[key].seconds:
                best[key] = row
    return [best[key] for key in sorted(best)]


def print_table(rows: list[Row], cublas: bool) -> None:
    header = f"{'size':>5} {'op':>3} {'configuration':<34} {'ms':>9} {'TFLOP/s':>8} {'error':>8}"
    header += f" {'of cuBLAS':>9}" if cublas else ""
    print(header)
    print("-" * len(header))
    for row in sorted(rows, key=lambda r: (r.size, r.transposes)):
        ms = f"{row.seconds * 1e3:9.3f}" if row.seconds else f"{'-':>9}"
        tflops = f"{row.tflops:8.3f}" if row.tflops else f"{'-':>8}"
        error = f"{row.error:8.1e}" if row.error is not None else f"{'-':>8}"
        line = f"{row.size:>5} {row.transposes:>3} {row.label:<34.34} {ms} {tflops} {error}"
        if cublas:
            line += f" {row.of_cublas:9.1%}" if row.of_cublas else f" {'-':>9}"
        print(line + (f"  {row.note}" if row.note else ""))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", required=True, type=Path, help="where the rows are written")
    parser.add_argument("--sizes", default="4096,2048,1024", help="square sizes, comma-separated")
    parser.add_argument("--transposes", default="nn,nt,tn,tt",
                        help=f"comma-separated, of {', '.join(TRANSPOSES)}")
    parser.add_argument("--repeats", type=int, default=10, help="timed runs per case (>= 10)")
    parser.add_argument("--budget", type=float, default=240.0,
                        help="seconds after which no new configuration starts")
    parser.add_argument("--extra", default="", help="more blocked tiles, e.g. 128x64x8/8x4")
    parser.add_argument("--device", default=None, help="device selection, as for mgfl")
    args = parser.parse_args(argv)
    if args.repeats < 10:
        parser.error("--repeats must be at least 10")
    sizes = sorted({int(s) for s in args.sizes.split(",")}, reverse=True)
    transposes = [t.strip() for t in args.transposes.split(",") if t.strip()]
    if unknown := [t for t in transposes if t not in TRANSPOSES]:
        parser.error(f"unknown transpositions {unknown}; choose from {list(TRANSPOSES)}")

    start = time.monotonic()
    device = Device.open(args.device)
    print(f"device: {device.info.describe()}", flush=True)
    torch = cuda_torch()  # sets allow_tf32 = False for matmul and cuDNN
    configs = candidates(device, parse_extra(args.extra))
    rng = np.random.default_rng(0)
    rows: list[Row] = []
    kept = []  # buffers live to the end: NVIDIA's driver has crashed releasing them mid-run
    for size in sizes:
        operands = Operands(device, size, rng)
        kept.append(operands)
        tuned = _tuned(device, size)
        sized = list(configs)
        if all(tuned != known for _, known in sized):
            sized.insert(1, (f"tuned: {describe(tuned)}", tuned))
        for transposition in transposes:
            reference = (cublas_seconds(torch, operands, transposition, args.repeats)
                         if torch is not None else None)
            expected = operands.expected(*TRANSPOSES[transposition])
            for label, config in sized:
                row = Row(size, transposition, label, asdict(config), cublas_seconds=reference)
                if time.monotonic() - start > args.budget:
                    row.note = "not run: budget spent"
                else:
                    measure(device, operands, config, transposition, args.repeats, expected,
                            row)
                rows.append(row)
                print(f"  {size} {transposition} {label}: "
                      + (f"{row.tflops:.3f} TFLOP/s" if row.tflops else row.note), flush=True)

    print()
    print_table(rows, cublas=torch is not None)
    best = best_rows(rows)
    print("\nbest per case:")
    for row in best:
        share = f", {row.of_cublas:.1%} of cuBLAS" if row.of_cublas else ""
        print(f"  {row.size} {row.transposes}: {row.label} {row.tflops:.3f} TFLOP/s{share}")
    report = {
        "date": datetime.date.today().isoformat(),
        "command": " ".join([os.path.basename(sys.executable), *sys.argv]),
        "device": device.info.to_dict(),
        "torch": None if torch is None else {
            "version": torch.__version__, "cuda_device": torch.cuda.get_device_name(),
            "allow_tf32": bool(torch.backends.cuda.matmul.allow_tf32)},
        "repeats": args.repeats, "tolerance": TOLERANCE, "sampled_rows_cols": SAMPLES,
        "wall_seconds": time.monotonic() - start,
        "rows": [row.to_json() for row in rows],
        "best": [row.to_json() for row in best],
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2))
    print(f"\nwrote {args.json} ({report['wall_seconds']:.0f} s)")
    return 0


if __name__ == "__main__":
    status = main()
    if crash_prone_driver_opened():  # NVIDIA's driver crashes when buffers are freed at exit
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)
    sys.exit(status)
