"""The ``gemm`` suite: mgfl's GEMM against NumPy (OpenBLAS) on the host CPU and, where CUDA is
present, PyTorch's cuBLAS float32 with TF32 off; same operands, medians after warm-up."""

from __future__ import annotations

import numpy as np

from mgfl.bench.report import BenchRow, median_wall_seconds
from mgfl.bench.torch_reference import cuda_torch


def square_sizes(device, quick: bool) -> list[int]:
    """256..4096 on a GPU; a CPU device stops at 1024 (2048 takes seconds per product there)."""
    if quick:
        return [64]
    if device.info.kind == "cpu":
        return [256, 512, 1024]
    return [256, 512, 1024, 2048, 4096]


def cases(device, quick: bool) -> list:
    from kernels.tuner import GemmShape, square_shapes, training_shapes

    shapes = square_shapes(square_sizes(device, quick))
    return shapes + ([GemmShape("mlp fc1 forward", 32, 256, 784, trans_b=True)] if quick
                     else training_shapes())


def ours_seconds(device, shape, a: np.ndarray, b: np.ndarray, repeats: int) -> tuple[float, float]:
    """(median event seconds, relative error against float64) of mgfl's GEMM on the device."""
    import pyopencl as cl

    from kernels.gemm import gemm
    from kernels.tuner import median_event_seconds, relative_error

    flags = cl.mem_flags.READ_ONLY | cl.mem_flags.COPY_HOST_PTR
    buf_a = cl.Buffer(device.context, flags, hostbuf=a)
    buf_b = cl.Buffer(device.context, flags, hostbuf=b)
    out = np.empty((shape.m, shape.n), np.float32)
    buf_c = cl.Buffer(device.context, cl.mem_flags.READ_WRITE, out.nbytes)
    launch = gemm(device.kernels, buf_a, buf_b, buf_c, m=shape.m, n=shape.n, k=shape.k,
                  trans_a=shape.trans_a, trans_b=shape.trans_b)
    median_event_seconds(device.queue, [launch], 1)  # warm-up
    cl.enqueue_copy(device.queue, out, buf_c)
    device.queue.finish()
    expected = _op(a, shape.trans_a).astype(np.float64) @ _op(b, shape.trans_b)
    return median_event_seconds(device.queue, [launch], repeats), relative_error(out, expected)


def _op(x: np.ndarray, transposed: bool) -> np.ndarray:
    return x.T if transposed else x


def run(device, repeats: int = 10, quick: bool = False) -> list[BenchRow]:
    rng = np.random.default_rng(0)
    rows = []
    torch = cuda_torch()
    for shape in cases(device, quick):
        a = rng.standard_normal((shape.k, shape.m) if shape.trans_a else (shape.m, shape.k))
        b = rng.standard_normal((shape.n, shape.k) if shape.trans_b else (shape.k, shape.n))
        a, b = a.astype(np.float32), b.astype(np.float32)
        ours, error = ours_seconds(device, shape, a, b, repeats)
        flops = 2.0 * shape.m * shape.n * shape.k
        extra = {"m": shape.m, "n": shape.n, "k": shape.k, "gflops": flops / ours / 1e9,
                 "max_rel_error": error}
        op_a, op_b = _op(a, shape.trans_a), _op(b, shape.trans_b)
        out = np.empty((shape.m, shape.n), np.float32)
        numpy_s = median_wall_seconds(
            lambda x=op_a, y=op_b, o=out: np.matmul(x, y, out=o), repeats)
        rows.append(BenchRow("gemm", shape.label, ours, "numpy (host CPU)", numpy_s,
                             extra={**extra, "reference_gflops": flops / numpy_s / 1e9}))
        if torch is not None:
            ta, tb = torch.from_numpy(op_a.copy()).cuda(), torch.from_numpy(op_b.copy()).cuda()

            def cublas(ta=ta, tb=tb):
                torch.matmul(ta, tb)
                torch.cuda.synchronize()

            cuda_s = median_wall_seconds(cublas, repeats, warmup=3)
            rows.append(BenchRow("gemm", shape.label, ours, "torch cuda fp32 (tf32 off)", cuda_s,
                                 extra={**extra, "reference_gflops": flops / cuda_s / 1e9}))
    return rows
