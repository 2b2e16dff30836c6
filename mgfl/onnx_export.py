"""Export an mgfl model and its state to ONNX, so a model trained or personalised with mgfl runs
wherever ONNX does (onnxruntime, mobile runtimes) and can be imported back.

The file describes inference: BatchNorm with its running statistics, Dropout left out, a Residual
as an ``Add`` of the block's input and its body's output. Initializers carry the mgfl parameter
names (``layers.3.weight``), nodes the layer paths. Linear is a Gemm with ``transB=1``, since
mgfl stores ``(out, in)``; GlobalAvgPool is GlobalAveragePool followed by Flatten, since mgfl's
gives ``(C,)`` where ONNX's gives ``(C, 1, 1)``.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from mgfl.models.layers import (
    AvgPool2d,
    BatchNorm,
    Conv2d,
    DepthwiseConv2d,
    Dropout,
    Flatten,
    GlobalAvgPool,
    Linear,
    MaxPool2d,
    ReLU,
    ReLU6,
    Residual,
    ResidualEnd,
)
from mgfl.models.model import Model, ResolvedLayer

if TYPE_CHECKING:
    import onnx

EXPORT_OPSET = 13
INPUT_NAME = "input"
OUTPUT_NAME = "logits"
RELU6_BOUNDS = ("relu6.min", "relu6.max")


def export_onnx(
    model: Model, state: dict[str, np.ndarray], path: str | Path | None = None
) -> onnx.ModelProto:
    """The ONNX model of ``model`` with the weights of ``state``, written to ``path`` if given."""
    from mgfl.onnx_graph import require_onnx

    onnx = require_onnx()
    from onnx import TensorProto, helper

    writer = _GraphWriter(model, state)
    for entry in model.resolve():
        writer.add(entry)
    writer.finish()
    batch = "batch"
    graph = helper.make_graph(
        writer.nodes,
        model.name,
        [helper.make_tensor_value_info(INPUT_NAME, TensorProto.FLOAT, [batch, *model.input_shape])],
        [
            helper.make_tensor_value_info(
                OUTPUT_NAME, TensorProto.FLOAT, [batch, *model.output_shape]
            )
        ],
        initializer=writer.initializers,
    )
    proto = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", EXPORT_OPSET)],
        producer_name="mgfl",
    )
    proto.ir_version = min(proto.ir_version, 8)  # readable by onnxruntime releases of 2022 on
    onnx.checker.check_model(proto)
    if path is not None:
        onnx.save(proto, str(path))
    return proto


class _GraphWriter:
    """Appends the nodes of one resolved layer at a time, following the current tensor."""

    def __init__(self, model: Model, state: dict[str, np.ndarray]) -> None:
        expected = {**model.parameter_shapes(), **model.buffer_shapes()}
        missing = sorted(set(expected) - set(state))
        if missing:
            raise ValueError(f"the state lacks {', '.join(missing[:5])} of {model.name!r}")
        for name, shape in expected.items():
            if tuple(np.shape(state[name])) != shape:
                raise ValueError(
                    f"state {name!r} has shape {np.shape(state[name])}, the model needs {shape}"
                )
        self.state = state
        self.nodes: list = []
        self.initializers: list = []
        self.current = INPUT_NAME
        self.skips: list[str] = []
        self._relu6_bounds_added = False

    def _initializer(self, name: str, value: np.ndarray) -> str:
        from onnx import numpy_helper

        array = np.ascontiguousarray(value, dtype=np.float32)
        self.initializers.append(numpy_helper.from_array(array, name))
        return name

    def _param(self, entry: ResolvedLayer, local: str) -> str:
        name = f"{entry.path}.{local}"
        return self._initializer(name, self.state[name])

    def _node(self, op: str, name: str, inputs: list[str], **attributes) -> None:
        from onnx import helper

        output = f"{name}.out"
        self.nodes.append(helper.make_node(op, inputs, [output], name=name, **attributes))
        self.current = output

    def add(self, entry: ResolvedLayer) -> None:
        layer, path, x = entry.layer, entry.path, self.current
        if isinstance(layer, Residual):
            self.skips.append(x)
        elif isinstance(layer, ResidualEnd):
            self._node("Add", f"{path}.add", [x, self.skips.pop()])
        elif isinstance(layer, (Conv2d, DepthwiseConv2d)):
            inputs = [x, self._param(entry, "weight")]
            if layer.bias:
                inputs.append(self._param(entry, "bias"))
            group = entry.input_shape[0] if isinstance(layer, DepthwiseConv2d) else 1
            self._node(
                "Conv", path, inputs, kernel_shape=list(layer.kernel_size),
                strides=list(layer.stride), pads=[*layer.padding, *layer.padding], group=group,
            )  # fmt: skip
        elif isinstance(layer, Linear):
            inputs = [x, self._param(entry, "weight")]
            if layer.bias:
                inputs.append(self._param(entry, "bias"))
            self._node("Gemm", path, inputs, transB=1)
        elif isinstance(layer, BatchNorm):
            inputs = [x] + [
                self._param(entry, local)
                for local in ("weight", "bias", "running_mean", "running_var")
            ]
            self._node(
                "BatchNormalization", path, inputs, epsilon=float(layer.eps),
                momentum=float(1.0 - layer.momentum),
            )  # fmt: skip
        elif isinstance(layer, ReLU):
            self._node("Relu", path, [x])
        elif isinstance(layer, ReLU6):
            self._node("Clip", path, [x, *self._relu6_bounds()])
        elif isinstance(layer, (MaxPool2d, AvgPool2d)):
            attributes = {
                "kernel_shape": list(layer.kernel_size),
                "strides": list(layer.stride),
                "pads": [*layer.padding, *layer.padding],
            }
            if isinstance(layer, AvgPool2d):
                self._node("AveragePool", path, [x], count_include_pad=1, **attributes)
            else:
                self._node("MaxPool", path, [x], **attributes)
        elif isinstance(layer, GlobalAvgPool):
            self._node("GlobalAveragePool", path, [x])
            self._node("Flatten", f"{path}.flatten", [self.current], axis=1)
        elif isinstance(layer, Flatten):
            self._node("Flatten", path, [x], axis=1)
        elif isinstance(layer, Dropout):
            return  # inference: the identity
        else:
            raise ValueError(f"{path}: no ONNX form for {type(layer).__name__}")

    def _relu6_bounds(self) -> tuple[str, str]:
        if not self._relu6_bounds_added:
            for name, value in zip(RELU6_BOUNDS, (0.0, 6.0), strict=True):
                self._initializer(name, np.array(value, np.float32))
            self._relu6_bounds_added = True
        return RELU6_BOUNDS

    def finish(self) -> None:
        """Name the last tensor ``logits`` (an Identity when the model has no node at all)."""
        from onnx import helper

        if not self.nodes:
            self.nodes.append(helper.make_node("Identity", [INPUT_NAME], [OUTPUT_NAME]))
            return
        last = self.nodes[-1]
        last.output[0] = OUTPUT_NAME
        self.current = OUTPUT_NAME
