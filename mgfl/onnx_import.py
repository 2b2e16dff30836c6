"""Import an ONNX classifier (opset 13 or later) as an mgfl model description with its weights.

Models trained elsewhere travel as ONNX; mgfl fine-tunes them on the device. The importer reads
the graph back from its output: every node must lie on one chain from the input, except the
skip connections of residual blocks, which are an ``Add`` of a tensor and a chain that starts
from that same tensor (they become :class:`~mgfl.models.layers.Residual` blocks). Operators:
Conv (dense and depthwise), Gemm, MatMul (with a constant Add: a Linear with bias), Relu,
Clip(0, 6) as ReLU6, BatchNormalization, MaxPool, AveragePool, GlobalAveragePool, Add, Flatten,
Reshape to (batch, features) and Identity. Anything else, or a pattern mgfl cannot express, is an
:class:`OnnxImportError` naming the operator and its node (mgfl.onnx_graph reads the chain).

Layouts match without copying rules: NCHW activations, convolution weights ``(K, C, R, S)``;
a Gemm weight becomes ``(out, in)``. Padding must be symmetric, since mgfl pads symmetrically.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from math import prod
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from mgfl.models.init import check_seed
from mgfl.models.layers import (
    AvgPool2d,
    BatchNorm,
    Conv2d,
    DepthwiseConv2d,
    Flatten,
    GlobalAvgPool,
    Layer,
    Linear,
    MaxPool2d,
    ReLU,
    ReLU6,
    Residual,
    Shape,
)
from mgfl.models.model import Model
from mgfl.onnx_graph import (
    SUPPORTED_OPERATORS,
    OnnxGraph,
    OnnxImportError,
    Step,
    check_opset,
    node_label,
    require_onnx,
)

if TYPE_CHECKING:
    import onnx

__all__ = [
    "SUPPORTED_OPERATORS",
    "ImportedModel",
    "OnnxImportError",
    "build_or_import_model",
    "import_onnx",
    "is_onnx_path",
]


@dataclass(frozen=True)
class ImportedModel(Model):
    """A model whose initial state is the one it was imported with, whatever the seed: training,
    the federated server and every client start from the file's weights."""

    weights: dict[str, np.ndarray] = field(default_factory=dict, compare=False, repr=False)

    def init_state(self, seed: int) -> dict[str, np.ndarray]:
        """A float32 copy of the imported weights (``seed`` is checked, then unused)."""
        check_seed(seed)
        return {name: np.array(value, dtype=np.float32) for name, value in self.weights.items()}


def is_onnx_path(model: str) -> bool:
    """Whether a ``--model`` value names an ONNX file rather than a zoo model."""
    return str(model).lower().endswith(".onnx")


def import_onnx(
    source: str | Path | onnx.ModelProto, *, name: str | None = None
) -> tuple[ImportedModel, dict[str, np.ndarray]]:
    """The mgfl model described by ``source`` (a path or a loaded ModelProto) and its weights."""
    onnx = require_onnx()
    if isinstance(source, (str, Path)):
        path = Path(source)
        if not path.is_file():
            raise OnnxImportError(f"no ONNX file at {path}")
        proto = onnx.load(str(path))
        default_name = path.stem
    else:
        proto = source
        default_name = proto.graph.name or "onnx-model"
    check_opset(proto)
    model_name = name or proto.graph.name or default_name
    graph = OnnxGraph(proto.graph)
    steps = graph.steps()
    builder = _Builder(graph)
    layers, shape = builder.layers(steps, graph.input_shape, "layers")
    if len(shape) != 1:
        raise OnnxImportError(
            f"the model outputs shape {shape} per sample; mgfl trains classifiers whose output "
            "is flat (classes,) logits: end the graph with Flatten and Gemm"
        )
    model = ImportedModel(
        name=model_name, input_shape=graph.input_shape, layers=tuple(layers), weights={}
    )
    # the order of init_state: each layer's parameters, then its buffers, in execution order
    ordered = {n: builder.state[n] for r in model.resolve() for n in {**r.params, **r.buffers}}
    object.__setattr__(model, "weights", ordered)
    return model, model.init_state(0)


def build_or_import_model(
    spec: str, *, input_shape: Shape | None = None, num_classes: int | None = None, **options: Any
) -> Model:
    """A zoo model by name, or the model of an ``.onnx`` file, checked against the data's
    ``input_shape`` and ``num_classes`` (an imported model cannot be reshaped)."""
    from mgfl.models.zoo import build_model

    if not is_onnx_path(spec):
        return build_model(spec, input_shape=input_shape, num_classes=num_classes, **options)
    if options:
        raise ValueError(f"an imported model takes no options, got {', '.join(options)}")
    path = Path(spec).expanduser().resolve()
    if not path.is_file():
        raise OnnxImportError(f"no ONNX file at {spec}")
    stat = path.stat()
    model = _cached_import(str(path), stat.st_mtime_ns, stat.st_size)
    if input_shape is not None and tuple(input_shape) != model.input_shape:
        raise ValueError(
            f"{spec} takes inputs of shape {model.input_shape}, but the data has "
            f"{tuple(input_shape)}"
        )
    if num_classes is not None and num_classes != model.num_classes:
        raise ValueError(
            f"{spec} has {model.num_classes} outputs, but the data has {num_classes} classes"
        )
    return model


@functools.lru_cache(maxsize=4)
def _cached_import(path: str, mtime_ns: int, size: int) -> ImportedModel:
    """One import per file version: simulations build the model once per message."""
    return import_onnx(path)[0]


def _attributes(node: onnx.NodeProto) -> dict[str, Any]:
    from onnx import helper

    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


class _Builder:
    """Turns steps into mgfl layers, tracking shapes, and gathers the weights by parameter name."""

    def __init__(self, graph: OnnxGraph) -> None:
        self.graph = graph
        self.state: dict[str, np.ndarray] = {}

    def layers(self, steps: list[Step], shape: Shape, prefix: str) -> tuple[list[Layer], Shape]:
        layers: list[Layer] = []
        for step in steps:
            path = f"{prefix}.{len(layers)}"
            node = step.nodes[-1]
            if step.kind == "residual":
                body, body_shape = self.layers(step.body, shape, f"{path}.body")
                if not body:
                    raise OnnxImportError(f"{node_label(node)}: the residual body is empty")
                if body_shape != shape:
                    raise OnnxImportError(
                        f"{node_label(node)}: the residual body turns {shape} into {body_shape}; "
                        "the skip needs them equal"
                    )
                layer: Layer | None = Residual(tuple(body))
            elif step.kind == "linear":
                layer = self._matmul(step.nodes[0], step.nodes[1], shape, path)
            else:
                layer = self._layer(node, shape, path)
            if layer is None:
                continue
            try:
                shape = layer.output_shape(shape)
            except ValueError as error:
                raise OnnxImportError(f"{node_label(node)}: {error}") from None
            layers.append(layer)
        return layers, shape

    def _layer(self, node: onnx.NodeProto, shape: Shape, path: str) -> Layer | None:
        op = node.op_type
        attrs = _attributes(node)
        if op == "Identity":
            return None
        if op == "Relu":
            return ReLU()
        if op == "Clip":
            return self._clip(node)
        if op == "Conv":
            return self._conv(node, attrs, shape, path)
        if op == "Gemm":
            return self._gemm(node, attrs, shape, path)
        if op == "MatMul":
            return self._matmul(node, None, shape, path)
        if op == "BatchNormalization":
            return self._batch_norm(node, attrs, shape, path)
        if op in ("MaxPool", "AveragePool"):
            return self._pool(node, attrs, shape)
        if op == "GlobalAveragePool":
            return GlobalAvgPool()
        if op == "Flatten":
            if attrs.get("axis", 1) != 1:
                raise OnnxImportError(f"{node_label(node)}: only axis=1 is supported")
            return Flatten() if len(shape) > 1 else None
        if op == "Reshape":
            return self._reshape(node, attrs, shape)
        raise OnnxImportError(f"unsupported operator {op} in node {node.name!r}")

    def _store(self, path: str, **arrays: np.ndarray) -> None:
        for local, value in arrays.items():
            self.state[f"{path}.{local}"] = np.ascontiguousarray(value, dtype=np.float32)

    def _clip(self, node: onnx.NodeProto) -> Layer:
        low = _scalar(self.graph.constant(node, 1, "minimum"))
        high = _scalar(self.graph.constant(node, 2, "maximum"))
        if low == 0.0:
            if high is None or high == float("inf"):
                return ReLU()
            if high == 6.0:
                return ReLU6()
        raise OnnxImportError(
            f"{node_label(node)}: only Clip(0, 6) (ReLU6) and Clip(0, inf) (ReLU) are supported, "
            f"got min {low}, max {high}"
        )

    def _conv(self, node: onnx.NodeProto, attrs: dict, shape: Shape, path: str) -> Layer:
        weight = self.graph.constant(node, 1, "weight")
        bias = self.graph.constant(node, 2, "bias")
        if len(shape) != 3 or weight is None or weight.ndim != 4:
            raise OnnxImportError(
                f"{node_label(node)}: mgfl convolves 2-D (N, C, H, W) inputs with 4-D weights; "
                f"the input is {shape} per sample"
            )
        if any(d != 1 for d in attrs.get("dilations", [1, 1])):
            raise OnnxImportError(f"{node_label(node)}: dilated convolutions are not supported")
        kernel = tuple(int(k) for k in weight.shape[2:])
        if tuple(attrs.get("kernel_shape", kernel)) != kernel:
            raise OnnxImportError(f"{node_label(node)}: kernel_shape disagrees with the weight")
        stride = _pair(attrs.get("strides", [1, 1]))
        padding = _symmetric_padding(node, attrs, shape, kernel, stride)
        group, channels = int(attrs.get("group", 1)), shape[0]
        arrays = {"weight": weight} if bias is None else {"weight": weight, "bias": bias}
        self._store(path, **arrays)
        if group == 1:
            return Conv2d(weight.shape[0], kernel, stride, padding, bias=bias is not None)
        if group == channels and weight.shape[:2] == (channels, 1):
            return DepthwiseConv2d(kernel, stride, padding, bias=bias is not None)
        raise OnnxImportError(
            f"{node_label(node)}: grouped convolution with group={group} on {channels} channels "
            f"and weight {weight.shape}; mgfl supports group=1 and depthwise (group = channels, "
            "one filter per channel)"
        )

    def _gemm(self, node: onnx.NodeProto, attrs: dict, shape: Shape, path: str) -> Layer:
        if attrs.get("transA", 0):
            raise OnnxImportError(f"{node_label(node)}: transA=1 is not supported")
        weight = self.graph.constant(node, 1, "weight")
        if weight is None or weight.ndim != 2:
            raise OnnxImportError(f"{node_label(node)}: the weight must be a 2-D constant")
        weight = weight if attrs.get("transB", 0) else weight.T
        weight = weight * np.float32(attrs.get("alpha", 1.0))
        bias = self.graph.constant(node, 2, "bias")
        if bias is not None:
            bias = bias * np.float32(attrs.get("beta", 1.0))
        return self._linear(node, weight, bias, shape, path)

    def _matmul(
        self, matmul: onnx.NodeProto, add: onnx.NodeProto | None, shape: Shape, path: str
    ) -> Layer:
        weight = self.graph.constant(matmul, 1, "weight")
        if weight is None or weight.ndim != 2:
            raise OnnxImportError(f"{node_label(matmul)}: the weight must be a 2-D constant")
        bias = None
        if add is not None:
            constant = [i for i in add.input if i in self.graph.constants][0]
            bias = self.graph.constants[constant]
        return self._linear(add or matmul, weight.T, bias, shape, path)

    def _linear(
        self,
        node: onnx.NodeProto,
        weight: np.ndarray,
        bias: np.ndarray | None,
        shape: Shape,
        path: str,
    ) -> Layer:
        """A Linear from an ``(out, in)`` weight; the bias is broadcast to ``(out,)``."""
        if len(shape) != 1 or weight.shape[1] != shape[0]:
            raise OnnxImportError(
                f"{node_label(node)}: a weight of {weight.shape[1]} inputs on an input of "
                f"{shape} per sample; a fully connected layer needs a flat (features,) input"
            )
        out = weight.shape[0]
        arrays = {"weight": weight}
        if bias is not None:
            if (
                bias.size not in (1, out)
                or (bias.ndim == 2 and bias.shape[0] != 1)
                or bias.ndim > 2
            ):
                raise OnnxImportError(
                    f"{node_label(node)}: a bias of shape {bias.shape} does not broadcast to "
                    f"({out},) per sample"
                )
            arrays["bias"] = np.broadcast_to(bias.reshape(-1), (out,))
        self._store(path, **arrays)
        return Linear(out, bias=bias is not None)

    def _batch_norm(self, node: onnx.NodeProto, attrs: dict, shape: Shape, path: str) -> Layer:
        if attrs.get("training_mode", 0):
            raise OnnxImportError(f"{node_label(node)}: training_mode=1 is not supported")
        names = ("scale", "bias", "running mean", "running variance")
        scale, bias, mean, var = (self.graph.constant(node, i + 1, w) for i, w in enumerate(names))
        channels = shape[0]
        for what, value in zip(names, (scale, bias, mean, var), strict=True):
            if value is None or value.shape != (channels,):
                raise OnnxImportError(
                    f"{node_label(node)}: its {what} must have shape ({channels},)"
                )
        self._store(path, weight=scale, bias=bias, running_mean=mean, running_var=var)
        momentum = _float32_value(1.0 - _float32_value(attrs.get("momentum", 0.9)))
        return BatchNorm(momentum=momentum, eps=_float32_value(attrs.get("epsilon", 1e-5)))

    def _pool(self, node: onnx.NodeProto, attrs: dict, shape: Shape) -> Layer:
        if len(shape) != 3:
            raise OnnxImportError(f"{node_label(node)}: needs a (N, C, H, W) input")
        if attrs.get("ceil_mode", 0):
            raise OnnxImportError(f"{node_label(node)}: ceil_mode=1 is not supported")
        if any(d != 1 for d in attrs.get("dilations", [1, 1])):
            raise OnnxImportError(f"{node_label(node)}: dilated pooling is not supported")
        if attrs.get("storage_order", 0):
            raise OnnxImportError(f"{node_label(node)}: storage_order=1 is not supported")
        kernel = _pair(attrs["kernel_shape"])
        stride = _pair(attrs.get("strides", [1, 1]))
        padding = _symmetric_padding(node, attrs, shape, kernel, stride)
        if node.op_type == "MaxPool":
            return MaxPool2d(kernel, stride, padding)
        if any(padding) and not attrs.get("count_include_pad", 0):
            raise OnnxImportError(
                f"{node_label(node)}: padded average pooling must count the padding "
                "(count_include_pad=1), as mgfl's AvgPool2d does"
            )
        return AvgPool2d(kernel, stride, padding)

    def _reshape(self, node: onnx.NodeProto, attrs: dict, shape: Shape) -> Layer | None:
        target = self.graph.constant(node, 1, "shape")
        features = prod(shape)
        batch = self.graph.batch
        firsts = {0, batch} if not attrs.get("allowzero", 0) else {batch}
        ok = target is not None and target.ndim == 1 and len(target) == 2
        if ok:
            first, second = (int(v) for v in target)
            ok = (second == features and first in firsts | {-1}) or (
                second == -1 and first in firsts
            )
        if not ok:
            raise OnnxImportError(
                f"{node_label(node)}: only reshapes to (batch, features) are supported; target "
                f"{None if target is None else target.tolist()} on an input of {shape} per sample"
            )
        return Flatten() if len(shape) > 1 else None


def _float32_value(value: float) -> float:
    """The shortest decimal of a float attribute (ONNX stores float32): 0.1, not 0.100000001."""
    return float(str(np.float32(value)))


def _scalar(value: np.ndarray | None) -> float | None:
    return None if value is None else float(np.asarray(value).reshape(-1)[0])


def _pair(values: Any) -> tuple[int, int]:
    values = [int(v) for v in values]
    if len(values) != 2:
        raise OnnxImportError(f"expected two spatial values, got {values}")
    return values[0], values[1]


def _symmetric_padding(
    node: onnx.NodeProto,
    attrs: dict,
    shape: Shape,
    kernel: tuple[int, int],
    stride: tuple[int, int],
) -> tuple[int, int]:
    """``(pad_h, pad_w)`` from ``pads`` or ``auto_pad``; asymmetric padding is refused."""
    auto_pad = attrs.get("auto_pad", b"NOTSET")
    auto_pad = auto_pad.decode() if isinstance(auto_pad, bytes) else str(auto_pad)
    if auto_pad == "VALID":
        pads = [0, 0, 0, 0]
    elif auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        totals = [
            max((-(-size // s) - 1) * s + k - size, 0)
            for size, k, s in zip(shape[1:], kernel, stride, strict=True)
        ]
        pads = [
            totals[0] // 2,
            totals[1] // 2,
            totals[0] - totals[0] // 2,
            totals[1] - totals[1] // 2,
        ]
    else:
        pads = [int(p) for p in attrs.get("pads", [0, 0, 0, 0])]
    if len(pads) != 4 or pads[0] != pads[2] or pads[1] != pads[3]:
        raise OnnxImportError(
            f"{node_label(node)}: asymmetric padding {pads} (top, left, bottom, right); mgfl pads "
            "symmetrically: pad the input explicitly or re-export with symmetric pads"
        )
    return pads[0], pads[1]
