"""Small ONNX classifiers written node by node with onnx.helper, and the comparison with
onnxruntime that the ONNX tests share."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime
from onnx import TensorProto, helper, numpy_helper


class GraphBuilder:
    """Collects nodes and random initializers; ``model()`` closes the graph at ``output``."""

    def __init__(self, rng: np.random.Generator, input_shape: tuple[int, ...]) -> None:
        self.rng = rng
        self.input_shape = input_shape
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self.current = "x"

    def const(self, name: str, value) -> str:
        self.initializers.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def weight(self, name: str, *shape: int, scale: float = 0.5) -> str:
        return self.const(name, self.rng.normal(0, scale, shape).astype(np.float32))

    def node(self, op: str, name: str, *extra_inputs: str, source: str | None = None, **attrs):
        inputs = [source or self.current, *extra_inputs]
        self.nodes.append(helper.make_node(op, inputs, [f"{name}_out"], name=name, **attrs))
        self.current = f"{name}_out"
        return self.current

    def batch_norm(self, name: str, channels: int) -> str:
        rng = self.rng
        return self.node(
            "BatchNormalization",
            name,
            self.const(f"{name}.s", rng.uniform(0.5, 1.5, channels).astype(np.float32)),
            self.const(f"{name}.b", rng.normal(0, 0.2, channels).astype(np.float32)),
            self.const(f"{name}.m", rng.normal(0, 0.2, channels).astype(np.float32)),
            self.const(f"{name}.v", rng.uniform(0.5, 2.0, channels).astype(np.float32)),
            epsilon=1e-3,
        )

    def model(self, classes: int, opset: int = 13) -> onnx.ModelProto:
        self.nodes[-1].output[0] = "y"
        graph = helper.make_graph(
            self.nodes,
            "built",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", *self.input_shape])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", classes])],
            initializer=self.initializers,
        )
        proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
        proto.ir_version = 8
        return proto


def run_onnxruntime(proto: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    session = onnxruntime.InferenceSession(
        proto.SerializeToString(), providers=["CPUExecutionProvider"]
    )
    name = session.get_inputs()[0].name
    return session.run(None, {name: x.astype(np.float32)})[0]


def assert_relative(actual: np.ndarray, expected: np.ndarray, rtol: float = 1e-4) -> None:
    """Largest difference within ``rtol`` of the largest expected magnitude."""
    assert actual.shape == expected.shape
    error = np.max(np.abs(actual - expected)) / max(np.max(np.abs(expected)), 1e-12)
    assert error <= rtol, f"relative error {error:.3g} > {rtol}"
