"""The ``step`` suite: full training steps (SGD with momentum) of the zoo models on the OpenCL
engine against PyTorch on the same hardware (same architecture, same initial weights, same batch)
and tinygrad on the same OpenCL device when it is installed.

mgfl's steps are timed by the wall clock on the device opened again without profiling events:
nothing reads them here, and a profiling queue costs every enqueue about twice the host time on
NVIDIA's driver, which the other references do not pay."""

from __future__ import annotations

import numpy as np

from mgfl.bench.report import BenchRow, median_wall_seconds
from mgfl.bench.tinygrad_reference import (
    TinygradBudgetExceeded,
    TinygradFailed,
    measure_in_child,
    tinygrad_or_none,
)
from mgfl.bench.torch_reference import build_torch_model, torch_device, torch_or_none

# (name, batch, build options): the paper MLP, LeNet-5, DS-CNN and MobileNetV2-0.35.
MODELS = (
    ("mlp", 32, {}),
    ("lenet5", 64, {}),
    ("dscnn", 64, {"input_shape": (1, 49, 10), "num_classes": 12}),
    ("mobilenetv2", 32, {"width": 0.35}),
)
QUICK_MODELS = (("mlp", 8, {}),)
LR, MOMENTUM = 0.01, 0.9
# Seconds tinygrad may take per model (importing, compiling its kernels, warm-up and timing):
# a compilation cannot be interrupted, so the measurement runs in a child process that is ended.
TINYGRAD_BUDGET_S = 600.0
# The first step's loss of a reference must equal mgfl's within this, or its row is left out.
FIRST_LOSS_TOLERANCE = 1e-3


def _batch(model, batch: int, rng) -> tuple[np.ndarray, np.ndarray]:
    x = rng.standard_normal((batch, *model.input_shape)).astype(np.float32)
    y = rng.integers(0, model.num_classes, batch).astype(np.int32)
    return x, y


def timing_device(device):
    """``device`` when its queue records no profiling events, else the same OpenCL device opened
    again (a context of its own) with ``profiling=False``."""
    if not device.profiling:
        return device
    from client_runtime.device import Device

    return Device(device.info, profiling=False)


def ours_step_seconds(device, model, batch: int, state, x, y,
                      repeats: int) -> tuple[float, float]:
    """(median step seconds, the first step's loss) of mgfl's engine."""
    from client_runtime.graph import OptimizerConfig
    from client_runtime.step import CompiledStep

    step = CompiledStep(device, model, batch, state, profile=False,
                        optimizer=OptimizerConfig(name="sgd", lr=LR, momentum=MOMENTUM))

    def one() -> None:
        step.train_step(x, y)
        device.queue.finish()

    one()
    first_loss = step.read_train_stats()["loss"]
    return median_wall_seconds(one, repeats, warmup=2), first_loss


def torch_step_seconds(torch, model, state, x, y, repeats: int) -> tuple[float, str]:
    where = torch_device(torch)
    net = build_torch_model(torch, model, state).to(where).train()
    opt = torch.optim.SGD(net.parameters(), lr=LR, momentum=MOMENTUM)
    tx, ty = torch.from_numpy(x).to(where), torch.from_numpy(y.astype(np.int64)).to(where)
    loss_fn = torch.nn.CrossEntropyLoss()

    def one() -> None:
        opt.zero_grad(set_to_none=True)
        loss_fn(net(tx), ty).backward()
        opt.step()
        if where == "cuda":
            torch.cuda.synchronize()

    return median_wall_seconds(one, repeats, warmup=3), where


def tinygrad_row(device, model, case: str, state, x, y, repeats: int, ours: float,
                 ours_first_loss: float, budget_s: float) -> tuple[BenchRow | None, str | None]:
    """tinygrad's row on mgfl's OpenCL device, or None and a note saying why there is none
    (budget exceeded, failure, or a first loss that differs from mgfl's)."""
    try:
        timing = measure_in_child(device.info, model, state, x, y, repeats, LR, MOMENTUM,
                                  budget_s)
    except TinygradBudgetExceeded as err:
        return None, f"{case}: no tinygrad row: {err}"
    except TinygradFailed as err:
        return None, f"{case}: no tinygrad row: {err}"
    difference = abs(timing.first_loss - ours_first_loss)
    if not difference <= FIRST_LOSS_TOLERANCE:
        return None, (f"{case}: no tinygrad row: its first loss {timing.first_loss:.6f} differs "
                      f"from mgfl's {ours_first_loss:.6f} by more than {FIRST_LOSS_TOLERANCE}")
    name = device.info.name
    extra = {"device": timing.device, "first_loss_diff": difference,
             "tinygrad_warmup_s": timing.warmup_s}
    return BenchRow("step", case, ours, f"tinygrad {name}", timing.step_s, extra=extra), None


def run(device, repeats: int = 10, quick: bool = False, with_tinygrad: bool = True,
        tinygrad_budget_s: float = TINYGRAD_BUDGET_S) -> tuple[list[BenchRow], list[str]]:
    """Rows, and notes on references that were not available or were left out."""
    from mgfl.models import build_model

    torch = torch_or_none()
    notes = []
    if torch is None:
        notes.append("PyTorch is not installed (pip install 'mgfl[bench]'): no torch rows")
    tinygrad = tinygrad_or_none() if with_tinygrad else None
    if with_tinygrad and tinygrad is None:
        notes.append("tinygrad is not installed (pip install 'mgfl[bench]'): no tinygrad rows")
    rows = []
    rng = np.random.default_rng(0)
    plain = timing_device(device)
    for name, batch, options in (QUICK_MODELS if quick else MODELS):
        model = build_model(name, **options)
        state = model.init_state(0)
        x, y = _batch(model, batch, rng)
        ours, first_loss = ours_step_seconds(plain, model, batch, state, x, y, repeats)
        case = f"{name} batch {batch}"
        if torch is not None:
            ref, where = torch_step_seconds(torch, model, state, x, y, repeats)
            rows.append(BenchRow("step", case, ours, f"torch {where} eager", ref))
        else:
            rows.append(BenchRow("step", case, ours, "none", None))
        if tinygrad is not None:
            row, note = tinygrad_row(device, model, case, state, x, y, repeats, ours,
                                     first_loss, tinygrad_budget_s)
            rows += [row] if row else []
            notes += [note] if note else []
    return rows, notes
