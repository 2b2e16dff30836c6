"""The ``paper`` suite: the seed study's experiment (arXiv 2202.10100) on the device at hand:
GFLOP/s of the MLP 784-256-128-16's matrix products at batch 32 (forward, backward-data and
weight-gradient shapes) and the data-movement share of its training step, beside the paper's
figures (25-70 GFLOP/s, 91% of training time in data movement)."""

from __future__ import annotations

import numpy as np

from mgfl.bench.report import BenchRow

PAPER_GFLOPS = "25-70"
PAPER_DATA_MOVEMENT_SHARE = 0.91
LAYERS = ((784, 256), (256, 128), (128, 16))


def mlp_gemm_shapes(batch: int = 32) -> list:
    """Per Linear layer (in, out): forward x @ W^T, backward-data dy @ W, weight grad dy^T @ x."""
    from kernels.tuner import GemmShape

    shapes = []
    for index, (fan_in, fan_out) in enumerate(LAYERS):
        name = f"mlp fc{index + 1}"
        shapes += [
            GemmShape(f"{name} forward", batch, fan_out, fan_in, trans_b=True),
            GemmShape(f"{name} backward data", batch, fan_in, fan_out),
            GemmShape(f"{name} weight grad", fan_out, fan_in, batch, trans_a=True),
        ]
    return shapes


def run(device, repeats: int = 10, quick: bool = False) -> list[BenchRow]:
    from mgfl.bench.gemm import ours_seconds
    from mgfl.bench.report import median_wall_seconds

    rng = np.random.default_rng(0)
    rows = []
    for shape in mlp_gemm_shapes():
        a = rng.standard_normal((shape.k, shape.m) if shape.trans_a else (shape.m, shape.k))
        b = rng.standard_normal((shape.n, shape.k) if shape.trans_b else (shape.k, shape.n))
        a, b = a.astype(np.float32), b.astype(np.float32)
        ours, _ = ours_seconds(device, shape, a, b, repeats)
        op_a, op_b = (a.T if shape.trans_a else a), (b.T if shape.trans_b else b)
        numpy_s = median_wall_seconds(lambda x=op_a, y=op_b: np.matmul(x, y), repeats)
        flops = 2.0 * shape.m * shape.n * shape.k
        rows.append(BenchRow("paper", shape.label, ours, "numpy (host CPU)", numpy_s,
                             extra={"gflops": flops / ours / 1e9, "paper_gflops": PAPER_GFLOPS}))
    rows.append(data_movement_row(device, steps=5 if quick else 50))
    return rows


def data_movement_row(device, steps: int) -> BenchRow:
    """One MLP training step's host-to-device copy time and its share of device time, from the
    engine's event profiler; the reference is the seed paper's share."""
    from client_runtime.graph import OptimizerConfig
    from client_runtime.step import CompiledStep
    from mgfl.models import build_model

    model = build_model("mlp")
    rng = np.random.default_rng(1)
    x = rng.standard_normal((32, *model.input_shape)).astype(np.float32)
    y = rng.integers(0, model.num_classes, 32).astype(np.int32)
    step = CompiledStep(device, model, 32, model.init_state(0), profile=True,
                        optimizer=OptimizerConfig(name="sgd", lr=0.01, momentum=0.9))
    for _ in range(steps):
        step.train_step(x, y)
    device.queue.finish()
    summary = step.profiler.summary()
    device_s = summary["kernel_seconds_per_step"] + summary["h2d_seconds_per_step"]
    share = summary["data_movement_share"]
    return BenchRow(
        "paper", "mlp step data movement", summary["h2d_seconds_per_step"],
        "seed paper share", None, ratio=None,
        extra={"data_movement_share": share, "paper_share": PAPER_DATA_MOVEMENT_SHARE,
               "device_s_per_step": device_s,
               "h2d_bytes_per_step": summary["h2d_bytes_per_step"]},
    )
