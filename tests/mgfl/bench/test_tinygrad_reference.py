"""tinygrad as the step suite's reference on the same OpenCL device: the model it builds from
mgfl's description computes mgfl's forward, it runs on mgfl's device, and the step suite gives
a tinygrad row beside the torch row. Skipped where tinygrad is not installed."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("tinygrad")

from mgfl.bench import step  # noqa: E402
from mgfl.bench.tinygrad_reference import (  # noqa: E402
    TinygradBudgetExceeded,
    build_tinygrad_model,
    measure_in_child,
    use_opencl_device,
)
from mgfl.models import build_model  # noqa: E402

MODELS = {
    "mlp": {},
    "lenet5": {},
    "dscnn": {"input_shape": (1, 49, 10), "num_classes": 12},
}


def _state_with_statistics(model, rng) -> dict:
    """Initial state with BatchNorm running statistics away from 0 and 1, so evaluation-mode
    normalisation is exercised."""
    state = model.init_state(1)
    for name, value in state.items():
        if name.endswith("running_mean"):
            state[name] = rng.standard_normal(value.shape).astype(np.float32) * 0.1
        elif name.endswith("running_var"):
            state[name] = rng.uniform(0.5, 2.0, value.shape).astype(np.float32)
    return state


def test_tinygrad_runs_on_mgfls_device(device):
    from tinygrad import Device

    description = use_opencl_device(device.cl_device)
    assert device.info.name in description and device.info.platform in description
    assert Device["CL"].device_name.strip() == device.info.name
    assert Device["CL"].driver_version.strip() == device.info.driver_version


@pytest.mark.parametrize("name", sorted(MODELS))
def test_tinygrad_forward_equals_mgfl_forward(device, rng, name):
    from tinygrad import Tensor

    from client_runtime.step import CompiledStep

    use_opencl_device(device.cl_device)
    model = build_model(name, **MODELS[name])
    state = _state_with_statistics(model, rng)
    x = rng.standard_normal((2, *model.input_shape)).astype(np.float32)
    ours = CompiledStep(device, model, 2, state, profile=False)
    try:
        expected = ours.predict(x)
    finally:
        ours.close()
    net = build_tinygrad_model(model, state)
    got = net(Tensor(x, device="CL")).numpy()
    assert got.shape == expected.shape
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)


def test_step_suite_gives_a_tinygrad_row(device):
    rows, notes = step.run(device, repeats=2, quick=True, with_tinygrad=True)
    tinygrad_rows = [r for r in rows if r.reference.startswith("tinygrad")]
    assert len(tinygrad_rows) == 1, notes
    row = tinygrad_rows[0]
    assert row.reference == f"tinygrad {device.info.name}"
    assert device.info.name in row.extra["device"]
    assert row.extra["first_loss_diff"] <= step.FIRST_LOSS_TOLERANCE
    assert row.ours_s > 0 and row.reference_s > 0 and row.ratio > 0


def test_child_is_ended_when_its_budget_runs_out(device, rng):
    model = build_model("mlp")
    x = rng.standard_normal((4, *model.input_shape)).astype(np.float32)
    y = np.arange(4, dtype=np.int32)
    with pytest.raises(TinygradBudgetExceeded):
        measure_in_child(device.info, model, model.init_state(0), x, y, repeats=1, lr=0.01,
                         momentum=0.9, budget_s=0.01)
