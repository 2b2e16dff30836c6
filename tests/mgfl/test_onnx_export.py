"""Every zoo model exports to ONNX that onnxruntime runs like mgfl, and imports back unchanged."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from typer.testing import CliRunner

from mgfl.cli import app
from mgfl.models import ZOO, Model, ReferenceTrainer, ReLU6, Residual, build_model
from mgfl.onnx_export import export_onnx
from mgfl.onnx_import import import_onnx
from tests.mgfl.onnx_graphs import assert_relative, run_onnxruntime

# Small inputs keep the float64 reference quick; the layers are the zoo's.
SMALL_INPUTS = {
    "mlp": (1, 6, 6),
    "lenet5": (1, 28, 28),
    "dscnn": (1, 12, 8),
    "mobilenetv2": (3, 8, 8),
    "cnn1d": (6, 1, 24),
}


def trained_looking_state(model: Model, seed: int) -> dict[str, np.ndarray]:
    """Initial weights with BatchNorm statistics and affine parameters moved off 0 and 1, so
    that exporting them in the wrong place shows."""
    rng = np.random.default_rng(seed)
    state = model.init_state(seed)
    for name, value in state.items():
        if name.endswith("running_var"):
            state[name] = rng.uniform(0.5, 2.0, value.shape).astype(np.float32)
        elif name.endswith(("running_mean", ".bias")) or value.ndim == 1:
            state[name] = value + rng.normal(0, 0.2, value.shape).astype(np.float32)
    return state


def test_every_zoo_model_is_covered():
    assert set(SMALL_INPUTS) == set(ZOO)


@pytest.mark.parametrize("name", sorted(ZOO))
def test_zoo_model_round_trips_and_runs_like_onnxruntime(name, rng, tmp_path):
    model = build_model(name, input_shape=SMALL_INPUTS[name])
    state = trained_looking_state(model, 3)
    path = tmp_path / f"{name}.onnx"
    export_onnx(model, state, path)
    imported, imported_state = import_onnx(path)
    assert imported.layers == model.layers and imported.input_shape == model.input_shape
    assert list(imported_state) == list(state)
    for key, value in state.items():
        np.testing.assert_array_equal(imported_state[key], value, err_msg=key)
    x = rng.normal(size=(2, *model.input_shape)).astype(np.float32)
    expected = run_onnxruntime(onnx.load(str(path)), x)
    assert_relative(ReferenceTrainer(imported, imported_state).forward(x, training=False), expected)


def test_exported_lenet5_runs_on_the_engine_like_onnxruntime(device, rng):
    from client_runtime.step import CompiledStep

    model = build_model("lenet5")
    state = trained_looking_state(model, 5)
    proto = export_onnx(model, state)
    imported, imported_state = import_onnx(proto)
    x = rng.normal(size=(3, *model.input_shape)).astype(np.float32)
    step = CompiledStep(device, imported, 3, imported_state, profile=False)
    assert_relative(step.predict(x), run_onnxruntime(proto, x))


def test_inference_form_drops_dropout_and_keeps_batchnorm_statistics():
    model = build_model("dscnn", input_shape=(1, 12, 8), dropout=0.5)
    proto = export_onnx(model, trained_looking_state(model, 1))
    ops = [node.op_type for node in proto.graph.node]
    assert "Dropout" not in ops and ops.count("BatchNormalization") == 9
    mobilenet = build_model("mobilenetv2", input_shape=(3, 8, 8))
    ops = [node.op_type for node in export_onnx(mobilenet, mobilenet.init_state(0)).graph.node]
    kinds = [type(r.layer) for r in mobilenet.resolve()]
    assert ops.count("Add") == kinds.count(Residual) > 0
    assert ops.count("Clip") == kinds.count(ReLU6) > 0


def test_a_state_that_misses_arrays_is_refused():
    model = build_model("lenet5")
    state = model.init_state(0)
    del state["layers.0.bias"]
    with pytest.raises(ValueError, match="layers.0.bias"):
        export_onnx(model, state)


def test_mgfl_export_writes_saved_weights(tmp_path):
    model = build_model("cnn1d")
    state = trained_looking_state(model, 9)
    weights, out = tmp_path / "w.npz", tmp_path / "cnn1d.onnx"
    np.savez(weights, **state)
    result = CliRunner().invoke(
        app, ["export", "--model", "cnn1d", "--weights", str(weights), "--out", str(out)]
    )
    assert result.exit_code == 0, result.output
    _, imported_state = import_onnx(out)
    for key, value in state.items():
        np.testing.assert_array_equal(imported_state[key], value, err_msg=key)

    np.savez(weights, **{k: v for k, v in state.items() if "running" not in k})
    result = CliRunner().invoke(
        app, ["export", "--model", "cnn1d", "--weights", str(weights), "--out", str(out)]
    )
    assert result.exit_code == 2 and "running_mean" in result.output
