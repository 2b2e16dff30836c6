"""ONNX files written with onnx.helper import as mgfl models that compute what onnxruntime does;
what mgfl cannot express is refused with the operator and node named."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from mgfl.models import (
    AvgPool2d,
    BatchNorm,
    Conv2d,
    DepthwiseConv2d,
    Flatten,
    GlobalAvgPool,
    Linear,
    MaxPool2d,
    ReferenceTrainer,
    ReLU,
    ReLU6,
    Residual,
)
from mgfl.onnx_import import OnnxImportError, build_or_import_model, import_onnx
from tests.mgfl.onnx_graphs import GraphBuilder, assert_relative, run_onnxruntime


def conv_pool_gemm(rng) -> GraphBuilder:
    """Conv (stride 2, padded, bias), Relu, padded MaxPool, Flatten, Gemm with transB=1."""
    g = GraphBuilder(rng, (3, 9, 8))
    g.node("Conv", "conv", g.weight("w", 4, 3, 3, 3), g.weight("b", 4),
           pads=[1, 1, 1, 1], strides=[2, 2], kernel_shape=[3, 3])  # fmt: skip
    g.node("Relu", "relu")
    g.node("MaxPool", "pool", kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    g.node("Flatten", "flat", axis=1)
    g.node("Gemm", "fc", g.weight("fw", 5, 24), g.weight("fb", 5), transB=1)
    return g


def depthwise_bn_clip_avgpool_matmul(rng) -> GraphBuilder:
    """Depthwise Conv, BatchNorm, Clip(0, 6) with Constant bounds, padded AveragePool counting
    the padding, GlobalAveragePool, Reshape to (batch, -1), MatMul + Add."""
    g = GraphBuilder(rng, (4, 7, 6))
    g.node("Conv", "dw", g.weight("w", 4, 1, 3, 3, scale=1.5), group=4, pads=[1, 1, 1, 1])
    g.batch_norm("bn", 4)
    for name, value in (("lo", 0.0), ("hi", 6.0)):
        g.nodes.append(
            helper.make_node("Constant", [], [name], value=helper.make_tensor(name, 1, [], [value]))
        )
    g.node("Clip", "relu6", "lo", "hi")
    g.node("AveragePool", "avg", kernel_shape=[3, 2], strides=[1, 2], pads=[1, 1, 1, 1],
           count_include_pad=1)  # fmt: skip
    g.node("Conv", "pw", g.weight("pw.w", 6, 4, 1, 1))
    g.node("GlobalAveragePool", "gap")
    g.node("Reshape", "reshape", g.const("shape", np.array([0, -1], np.int64)))
    g.node("MatMul", "mm", g.weight("mw", 6, 3))
    g.node("Add", "bias", g.weight("mb", 3))
    return g


def residual_blocks(rng) -> GraphBuilder:
    """Stem, then two residual blocks (skip first in one Add, second in the other), Gemm with
    transB=0, alpha and beta."""
    g = GraphBuilder(rng, (2, 6, 6))
    g.node("Conv", "stem", g.weight("stem.w", 4, 2, 3, 3), pads=[1, 1, 1, 1])
    skip = g.node("Relu", "stem.relu")
    g.node("Conv", "b1.conv1", g.weight("b1.w1", 4, 4, 3, 3, scale=0.3), pads=[1, 1, 1, 1])
    g.batch_norm("b1.bn", 4)
    g.node("Relu", "b1.relu")
    body = g.node("Conv", "b1.conv2", g.weight("b1.w2", 4, 4, 1, 1, scale=0.3))
    skip = g.node("Add", "b1.add", body, source=skip)
    body = g.node("Conv", "b2.dw", g.weight("b2.w", 4, 1, 3, 3), group=4, pads=[1, 1, 1, 1])
    g.node("Add", "b2.add", skip, source=body)
    g.node("Relu", "out.relu")
    g.node("GlobalAveragePool", "gap")
    g.node("Flatten", "flat")
    g.node("Gemm", "fc", g.weight("fw", 4, 3), g.weight("fb", 1, 3), alpha=0.5, beta=2.0)
    return g


def dense_mlp(rng) -> GraphBuilder:
    """A flat (N, F) input: Gemm, BatchNorm on features, Relu as Clip(0, inf), MatMul, Gemm."""
    g = GraphBuilder(rng, (10,))
    g.node("Gemm", "fc1", g.weight("w1", 8, 10), g.weight("b1", 8), transB=1)
    g.batch_norm("bn", 8)
    g.node("Clip", "relu", g.const("zero", np.float32(0.0)))
    g.node("MatMul", "fc2", g.weight("w2", 8, 6))
    g.node("Identity", "same")
    g.node("Gemm", "fc3", g.weight("w3", 4, 6), transB=1)
    return g


BUILDERS = [conv_pool_gemm, depthwise_bn_clip_avgpool_matmul, residual_blocks, dense_mlp]


@pytest.mark.parametrize("build", BUILDERS, ids=lambda b: b.__name__)
def test_imported_model_computes_what_onnxruntime_does(build, rng):
    proto = build(rng).model(_classes(build))
    model, state = import_onnx(proto)
    x = rng.normal(size=(3, *model.input_shape)).astype(np.float32)
    expected = run_onnxruntime(proto, x)
    actual = ReferenceTrainer(model, state).forward(x, training=False)
    assert_relative(actual, expected)


def _classes(build) -> int:
    return {conv_pool_gemm: 5, dense_mlp: 4}.get(build, 3)


def test_layers_and_weights_come_through_in_mgfl_layouts(rng):
    g = residual_blocks(rng)
    model, state = import_onnx(g.model(3))
    (stem, relu, first, second, out_relu, gap, fc) = model.layers
    assert stem == Conv2d(4, 3, padding=1, bias=False) and relu == ReLU()
    assert isinstance(first, Residual) and isinstance(second, Residual)
    assert first.body == (Conv2d(4, 3, padding=1, bias=False), BatchNorm(eps=1e-3), ReLU(),
                          Conv2d(4, 1, bias=False))  # fmt: skip
    assert second.body == (DepthwiseConv2d(3, padding=1, bias=False),)
    assert (out_relu, gap, fc) == (ReLU(), GlobalAvgPool(), Linear(3))  # Flatten of (C,) dropped
    weights = {t.name: t for t in g.initializers}
    from onnx import numpy_helper

    fw = numpy_helper.to_array(weights["fw"])
    np.testing.assert_array_equal(state["layers.6.weight"], 0.5 * fw.T)  # (in, out) -> (out, in)
    assert state["layers.6.bias"].shape == (3,)
    assert state["layers.2.body.1.running_var"].shape == (4,)
    assert model.init_state(7).keys() == state.keys()


def test_the_other_builders_give_the_expected_layer_kinds(rng):
    model, _ = import_onnx(conv_pool_gemm(rng).model(5))
    assert [type(layer) for layer in model.layers] == [Conv2d, ReLU, MaxPool2d, Flatten, Linear]
    assert model.layers[2] == MaxPool2d(3, 2, 1)
    model, _ = import_onnx(depthwise_bn_clip_avgpool_matmul(rng).model(3))
    kinds = [type(layer) for layer in model.layers]
    assert kinds == [DepthwiseConv2d, BatchNorm, ReLU6, AvgPool2d, Conv2d, GlobalAvgPool, Linear]
    assert model.layers[3] == AvgPool2d((3, 2), (1, 2), 1)


def test_the_engine_forward_matches_onnxruntime(device, rng):
    from client_runtime.step import CompiledStep

    for build in (residual_blocks, depthwise_bn_clip_avgpool_matmul):
        proto = build(rng).model(3)
        model, state = import_onnx(proto)
        x = rng.normal(size=(5, *model.input_shape)).astype(np.float32)
        step = CompiledStep(device, model, 4, state, profile=False)
        assert_relative(step.predict(x), run_onnxruntime(proto, x))


def _single_node_model(rng, op: str, name: str, **attrs):
    g = GraphBuilder(rng, (2, 4, 4))
    g.node(op, name, **attrs)
    g.node("Flatten", "flat")
    g.node("Gemm", "fc", g.weight("fw", 3, 32), transB=1)
    return g.model(3)


def test_an_unsupported_operator_is_named_with_its_node(rng):
    with pytest.raises(OnnxImportError, match=r"unsupported operator Sigmoid in node 'gate7'"):
        import_onnx(_single_node_model(rng, "Sigmoid", "gate7"))


def test_asymmetric_padding_is_refused(rng):
    g = GraphBuilder(rng, (2, 4, 4))
    g.node("Conv", "conv3", g.weight("w", 2, 2, 2, 2), pads=[0, 0, 1, 1])
    g.node("Flatten", "flat")
    g.node("Gemm", "fc", g.weight("fw", 3, 32), transB=1)
    with pytest.raises(OnnxImportError, match=r"Conv node 'conv3': asymmetric padding"):
        import_onnx(g.model(3))


def test_patterns_mgfl_cannot_express_are_refused(rng):
    g = GraphBuilder(rng, (4, 4, 4))
    g.node("Conv", "grouped", g.weight("w", 4, 2, 1, 1), group=2)
    g.node("Flatten", "flat")
    g.node("Gemm", "fc", g.weight("fw", 3, 64), transB=1)
    with pytest.raises(OnnxImportError, match="grouped.*group=2"):
        import_onnx(g.model(3))

    g = GraphBuilder(rng, (2, 4, 4))
    left = g.node("Relu", "left", source="x")
    right = g.node("Conv", "right", g.weight("w", 2, 2, 1, 1), source="x")
    g.node("Add", "join", left, source=right)
    g.node("Flatten", "flat")
    g.node("Gemm", "fc", g.weight("fw", 3, 32), transB=1)
    with pytest.raises(OnnxImportError, match="Add node 'join'.*neither"):
        import_onnx(g.model(3))

    with pytest.raises(OnnxImportError, match="AveragePool node 'avg'.*count_include_pad"):
        import_onnx(_single_node_model(rng, "AveragePool", "avg", kernel_shape=[3, 3],
                                       pads=[1, 1, 1, 1]))  # fmt: skip
    with pytest.raises(OnnxImportError, match="opset 12"):
        import_onnx(conv_pool_gemm(rng).model(5, opset=12))


def test_clip_other_than_relu6_is_refused(rng):
    g = GraphBuilder(rng, (6,))
    g.node("Clip", "clip", g.const("lo", np.float32(-1.0)), g.const("hi", np.float32(1.0)))
    g.node("Gemm", "fc", g.weight("fw", 3, 6), transB=1)
    with pytest.raises(OnnxImportError, match="Clip node 'clip'.*min -1.0, max 1.0"):
        import_onnx(g.model(3))


def test_a_file_model_must_fit_the_data(rng, tmp_path):
    import onnx

    path = tmp_path / "net.onnx"
    onnx.save(conv_pool_gemm(rng).model(5), str(path))
    model = build_or_import_model(str(path), input_shape=(3, 9, 8), num_classes=5)
    assert model.name == "built" and model.num_classes == 5
    with pytest.raises(ValueError, match=r"takes inputs of shape \(3, 9, 8\)"):
        build_or_import_model(str(path), input_shape=(1, 9, 8), num_classes=5)
    with pytest.raises(ValueError, match="has 5 outputs"):
        build_or_import_model(str(path), input_shape=(3, 9, 8), num_classes=10)


def test_same_auto_padding_becomes_symmetric_padding_or_is_refused(rng):
    g = GraphBuilder(rng, (2, 5, 5))
    g.node("Conv", "same", g.weight("w", 3, 2, 3, 3), auto_pad="SAME_UPPER")
    g.node("Flatten", "flat")
    g.node("Gemm", "fc", g.weight("fw", 3, 75), transB=1)
    proto = g.model(3)
    model, state = import_onnx(proto)
    assert model.layers[0] == Conv2d(3, 3, padding=1, bias=False)
    x = rng.normal(size=(2, 2, 5, 5)).astype(np.float32)
    assert_relative(ReferenceTrainer(model, state).forward(x, training=False),
                    run_onnxruntime(proto, x))  # fmt: skip

    g = GraphBuilder(rng, (2, 5, 5))
    g.node("Conv", "even", g.weight("w", 3, 2, 2, 2), auto_pad="SAME_UPPER")
    g.node("Flatten", "flat")
    g.node("Gemm", "fc", g.weight("fw", 3, 75), transB=1)
    with pytest.raises(OnnxImportError, match="Conv node 'even': asymmetric padding"):
        import_onnx(g.model(3))
