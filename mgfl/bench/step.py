"""The ``step`` suite: full training steps (SGD with momentum) of the zoo models on the OpenCL
engine against PyTorch on the same hardware (same architecture, same initial weights, same batch)
and tinygrad on the same OpenCL device when it is installed."""

from __future__ import annotations

import numpy as np

from mgfl.bench.report import BenchRow, median_wall_seconds
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


def _batch(model, batch: int, rng) -> tuple[np.ndarray, np.ndarray]:
    x = rng.standard_normal((batch, *model.input_shape)).astype(np.float32)
    y = rng.integers(0, model.num_classes, batch).astype(np.int32)
    return x, y


def ours_step_seconds(device, model, batch: int, state, x, y, repeats: int) -> float:
    from client_runtime.graph import OptimizerConfig
    from client_runtime.step import CompiledStep

    step = CompiledStep(device, model, batch, state, profile=False,
                        optimizer=OptimizerConfig(name="sgd", lr=LR, momentum=MOMENTUM))

    def one() -> None:
        step.train_step(x, y)
        device.queue.finish()

    return median_wall_seconds(one, repeats, warmup=3)


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


def run(device, repeats: int = 10, quick: bool = False) -> tuple[list[BenchRow], list[str]]:
    """Rows, and notes on references that were not available."""
    from mgfl.models import build_model

    torch = torch_or_none()
    notes = []
    if torch is None:
        notes.append("PyTorch is not installed (pip install 'mgfl[bench]'): no torch rows")
    try:
        import tinygrad  # noqa: F401

        notes.append("tinygrad is installed but its training step is not measured by this "
                     "suite; compare with the engine notes' figures")
    except ImportError:
        notes.append("tinygrad is not installed: no tinygrad rows")
    rows = []
    rng = np.random.default_rng(0)
    for name, batch, options in (QUICK_MODELS if quick else MODELS):
        model = build_model(name, **options)
        state = model.init_state(0)
        x, y = _batch(model, batch, rng)
        ours = ours_step_seconds(device, model, batch, state, x, y, repeats)
        case = f"{name} batch {batch}"
        if torch is not None:
            ref, where = torch_step_seconds(torch, model, state, x, y, repeats)
            rows.append(BenchRow("step", case, ours, f"torch {where} eager", ref))
        else:
            rows.append(BenchRow("step", case, ours, "none", None))
    return rows, notes
