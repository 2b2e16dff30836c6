"""An imported model fine-tunes on the device with a frozen backbone, from the file's weights, in
mgfl train and in the federated apps alike."""

from __future__ import annotations

import numpy as np
import onnx
from typer.testing import CliRunner

from mgfl.cli import app
from mgfl.onnx_import import import_onnx
from mgfl.run_config import RunConfig
from tests.mgfl.onnx_graphs import GraphBuilder

CLASSES = 3


def small_classifier(rng) -> onnx.ModelProto:
    """Conv, BatchNorm, Relu, MaxPool, a residual 1x1 conv, GlobalAveragePool, Flatten, Gemm."""
    g = GraphBuilder(rng, (1, 8, 8))
    g.node("Conv", "conv", g.weight("w", 6, 1, 3, 3), g.weight("b", 6), pads=[1, 1, 1, 1])
    g.batch_norm("bn", 6)
    g.node("Relu", "relu")
    skip = g.node("MaxPool", "pool", kernel_shape=[2, 2], strides=[2, 2])
    body = g.node("Conv", "res", g.weight("rw", 6, 6, 1, 1, scale=0.2))
    g.node("Add", "add", skip, source=body)
    g.node("GlobalAveragePool", "gap")
    g.node("Flatten", "flat")
    g.node("Gemm", "fc", g.weight("fw", CLASSES, 6, scale=0.1), g.weight("fb", CLASSES), transB=1)
    return g.model(CLASSES)


def test_fine_tuning_the_head_of_an_imported_model_reduces_its_loss(device, rng):
    from client_runtime.freezing import resolve_trainable
    from client_runtime.graph import OptimizerConfig
    from client_runtime.step import CompiledStep

    model, state = import_onnx(small_classifier(rng))
    trainable = resolve_trainable(model, "head")
    assert trainable == {"layers.6.weight", "layers.6.bias"}
    x = rng.normal(size=(16, 1, 8, 8)).astype(np.float32)
    x[:, :, :4] += np.arange(16)[:, None, None, None] % CLASSES  # the class shows in the top half
    y = (np.arange(16) % CLASSES).astype(np.int32)
    step = CompiledStep(
        device, model, 16, state, trainable, OptimizerConfig("sgd", lr=0.2, momentum=0.9)
    )
    before = step.evaluate(x, y)["loss"]
    for _ in range(25):
        step.train_step(x, y)
    after = step.evaluate(x, y)["loss"]
    assert after < 0.7 * before, (before, after)
    tuned = step.get_state()
    for name, value in state.items():
        if name in trainable:
            assert not np.allclose(tuned[name], value), name
        elif "running" not in name:
            np.testing.assert_array_equal(tuned[name], value, err_msg=name)


def test_mgfl_train_starts_from_the_file_weights(device, rng, tmp_path):
    path, saved = tmp_path / "net.onnx", tmp_path / "tuned.npz"
    onnx.save(small_classifier(rng), str(path))
    args = ["train", "--model", str(path), "--data", "synthetic", "--freeze", "head"]
    args += ["--steps", "3", "--batch", "8", "--save", str(saved)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    _, state = import_onnx(path)
    with np.load(saved) as tuned:
        np.testing.assert_array_equal(tuned["layers.0.weight"], state["layers.0.weight"])
        np.testing.assert_array_equal(
            tuned["layers.4.body.0.weight"], state["layers.4.body.0.weight"]
        )
        assert not np.array_equal(tuned["layers.6.weight"], state["layers.6.weight"])


def test_the_federated_apps_build_an_imported_model_with_its_weights(rng, tmp_path):
    from client_runtime.federated import _model
    from server.run import prepare

    path = tmp_path / "net.onnx"
    onnx.save(small_classifier(rng), str(path))
    config = RunConfig(model=str(path), dataset=f"synthetic:1,8,8:{CLASSES}", freeze="head")
    _, model, layout, initial = prepare(config)
    _, state = import_onnx(path)
    assert _model(config) == model
    assert {"layers.6.weight", "layers.6.bias"} <= set(layout.travelling)
    assert "layers.0.weight" in layout.frozen
    assert initial.keys() == state.keys()
    for name, value in state.items():
        np.testing.assert_array_equal(initial[name], value, err_msg=name)
        np.testing.assert_array_equal(_model(config).init_state(3)[name], value, err_msg=name)
