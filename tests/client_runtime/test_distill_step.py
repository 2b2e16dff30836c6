"""The training step with a distillation term against a float64 NumPy step written out by hand."""

from __future__ import annotations

import numpy as np
import pytest

from client_runtime.graph import DistillConfig, OptimizerConfig
from client_runtime.step import CompiledStep, estimate_memory
from kernels.reference import distill as ref_distill
from kernels.reference import softmax_xent as ref_xent
from mgfl.models import Linear, Model, ReLU

HIDDEN, FEATURES, CLASSES, C_OLD, BATCH = 7, 6, 5, 3, 8
LR = 0.1


def _model() -> Model:
    return Model("two-layer", (FEATURES,), (Linear(HIDDEN), ReLU(), Linear(CLASSES)))


def _reference_step(state, x, y, old, cfg: DistillConfig):
    """One plain SGD step on cross-entropy + distillation, both averaged over the batch."""
    w0, b0 = state["layers.0.weight"], state["layers.0.bias"]
    w2, b2 = state["layers.2.weight"], state["layers.2.bias"]
    x = x.astype(np.float64)
    h = np.maximum(x @ w0.T + b0, 0.0)
    z = h @ w2.T + b2
    n = len(y)
    loss = ref_xent.softmax_xent(z, y)[0].mean() + ref_distill.distill_loss(
        z, old, c_old=cfg.c_old, temperature=cfg.temperature, weight=cfg.weight
    ).mean()
    dz = ref_xent.softmax_xent_grad(z, y, 1.0 / n) + ref_distill.distill_grad(
        z, old, c_old=cfg.c_old, temperature=cfg.temperature, weight=cfg.weight,
        grad_scale=1.0 / n,
    )  # fmt: skip
    dh = (dz @ w2) * (h > 0)
    new = {
        "layers.2.weight": w2 - LR * dz.T @ h,
        "layers.2.bias": b2 - LR * dz.sum(0),
        "layers.0.weight": w0 - LR * dh.T @ x,
        "layers.0.bias": b0 - LR * dh.sum(0),
    }
    return loss, new


@pytest.mark.parametrize("accumulation", [1, 2])
@pytest.mark.parametrize("cfg", [DistillConfig(C_OLD, 2.0, 1.0), DistillConfig(CLASSES, 1.0, 0.5)])
def test_distilling_step_matches_the_float64_step(device, rng, cfg, accumulation):
    model = _model()
    state = model.init_state(seed=1)
    opt = OptimizerConfig("sgd", lr=LR, momentum=0.0)
    step = CompiledStep(
        device, model, BATCH, state, optimizer=opt, distillation=cfg,
        accumulation_steps=accumulation, poison=True,
    )  # fmt: skip
    x = rng.normal(size=(BATCH, FEATURES)).astype(np.float32)
    y = rng.integers(0, CLASSES, BATCH).astype(np.int32)
    old = rng.normal(0, 2, (BATCH, cfg.c_old)).astype(np.float32)
    loss, expected = _reference_step(state, x, y, old, cfg)
    step.train_step(x, y, old)
    stats = step.read_train_stats()
    assert stats["loss"] == pytest.approx(loss, rel=1e-4)
    got = step.get_state()
    for name, value in expected.items():
        np.testing.assert_allclose(got[name], value, rtol=1e-4, atol=1e-5, err_msg=name)


def test_zero_weight_is_plain_cross_entropy(device, rng):
    model = _model()
    state = model.init_state(seed=2)
    opt = OptimizerConfig("sgd", lr=LR, momentum=0.0)
    plain = CompiledStep(device, model, BATCH, state, optimizer=opt)
    distilling = CompiledStep(
        device, model, BATCH, state, optimizer=opt, distillation=DistillConfig(C_OLD, 2.0, 0.0)
    )
    x = rng.normal(size=(BATCH, FEATURES)).astype(np.float32)
    y = rng.integers(0, CLASSES, BATCH).astype(np.int32)
    plain.train_step(x, y)
    distilling.train_step(x, y, rng.normal(size=(BATCH, C_OLD)).astype(np.float32))
    a, b = plain.get_state(), distilling.get_state()
    for name in a:
        np.testing.assert_allclose(a[name], b[name], rtol=1e-6, atol=1e-7)


def test_old_logits_count_as_uploaded_bytes_and_are_checked(device, rng):
    model = _model()
    state = model.init_state(seed=3)
    cfg = DistillConfig(C_OLD)
    plain = CompiledStep(device, model, BATCH, state)
    step = CompiledStep(device, model, BATCH, state, distillation=cfg)
    assert step.h2d_bytes_per_step == plain.h2d_bytes_per_step + BATCH * C_OLD * 4
    x = rng.normal(size=(BATCH, FEATURES)).astype(np.float32)
    y = rng.integers(0, CLASSES, BATCH).astype(np.int32)
    step.train_step(x, y, np.zeros((BATCH, C_OLD), np.float32))
    device.queue.finish()
    summary = step.profiler.summary()
    assert summary["h2d_bytes_per_step"] == step.h2d_bytes_per_step
    with pytest.raises(ValueError, match="old_logits"):
        step.train_step(x, y)
    with pytest.raises(ValueError, match="old_logits"):
        step.train_step(x, y, np.zeros((BATCH, C_OLD + 1), np.float32))
    with pytest.raises(ValueError, match="without distillation"):
        plain.train_step(x, y, np.zeros((BATCH, C_OLD), np.float32))
    extra = estimate_memory(model, BATCH, distillation=cfg).peak_bytes
    assert extra > estimate_memory(model, BATCH).peak_bytes


def test_more_old_classes_than_the_head_is_refused(device):
    with pytest.raises(ValueError, match="old classes"):
        CompiledStep(device, _model(), BATCH, _model().init_state(0),
                     distillation=DistillConfig(CLASSES + 1))  # fmt: skip


def test_predict_returns_evaluation_logits(device, rng):
    model = _model()
    state = model.init_state(seed=4)
    step = CompiledStep(device, model, BATCH, state)
    x = rng.normal(size=(BATCH * 2 + 3, FEATURES)).astype(np.float32)
    h = np.maximum(x @ state["layers.0.weight"].T + state["layers.0.bias"], 0.0)
    expected = h @ state["layers.2.weight"].T + state["layers.2.bias"]
    np.testing.assert_allclose(step.predict(x), expected, rtol=1e-4, atol=1e-5)
    features = CompiledStep(device, Model("cut", (FEATURES,), (Linear(HIDDEN), ReLU())), 4,
                            {k: v for k, v in state.items() if k.startswith("layers.0")})
    np.testing.assert_allclose(features.predict(x), h, rtol=1e-4, atol=1e-5)
