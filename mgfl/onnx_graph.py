"""Read an ONNX graph as mgfl sees it: one input, one output, constants by name, and the nodes
as a single chain from input to output whose only branches are residual skips.

The chain is read backwards from the output. An ``Add`` of two computed tensors is a residual
join when one input is computed from the other (the skip): the body is the chain between them.
Any node left off the chain, or a join of two unrelated branches, is an error naming the node.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import ModuleType
from typing import TYPE_CHECKING, Any

import numpy as np

from mgfl.models.layers import Shape

if TYPE_CHECKING:
    import onnx

MIN_OPSET = 13
SUPPORTED_OPERATORS = (
    "Conv", "Gemm", "MatMul", "Add", "Relu", "Clip", "BatchNormalization", "MaxPool",
    "AveragePool", "GlobalAveragePool", "Flatten", "Reshape", "Identity",
)  # fmt: skip


class OnnxImportError(ValueError):
    """An ONNX model that mgfl cannot express; the message names the node and what to change."""


def require_onnx() -> ModuleType:
    """The onnx package, imported only when used: it is an optional extra."""
    try:
        import onnx
    except ImportError:
        raise OnnxImportError(
            "ONNX import and export need the onnx package: pip install 'mgfl[onnx]'"
        ) from None
    return onnx


def check_opset(proto: onnx.ModelProto) -> None:
    """Refuse opsets before 13, whose operators (Clip's attributes, Reshape) read differently."""
    versions = [o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")]
    if not versions:
        raise OnnxImportError("the model declares no ONNX opset")
    if versions[0] < MIN_OPSET:
        raise OnnxImportError(
            f"the model uses opset {versions[0]}; mgfl imports opset {MIN_OPSET} or later "
            "(re-export it, or convert it with onnx.version_converter)"
        )


def node_label(node: onnx.NodeProto) -> str:
    """How an error names a node: its operator and its name (or first output)."""
    return f"{node.op_type} node {node.name or node.output[0]!r}"


@dataclass
class Step:
    """One part of the chain: a node, a MatMul with its bias Add, or a residual block."""

    kind: str  # "node" | "linear" | "residual"
    nodes: tuple[Any, ...]
    body: list[Step] = field(default_factory=list)


class OnnxGraph:
    """The graph's constants, producers and consumers, and its single input and output."""

    def __init__(self, graph: onnx.GraphProto) -> None:
        from onnx import numpy_helper

        self.constants: dict[str, np.ndarray] = {
            t.name: numpy_helper.to_array(t) for t in graph.initializer
        }
        self.nodes = []
        for node in graph.node:
            if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
                self.constants[node.output[0]] = _constant_value(node)
            else:
                self.nodes.append(node)
        self.producer = {out: n for n in self.nodes for out in n.output if out}
        self.consumers: dict[str, list] = {}
        for node in self.nodes:
            for name in node.input:
                self.consumers.setdefault(name, []).append(node)
        inputs = [i for i in graph.input if i.name not in self.constants]
        if len(inputs) != 1:
            raise OnnxImportError(
                f"mgfl models take one input; the graph has {len(inputs)}: "
                f"{[i.name for i in inputs]}"
            )
        if len(graph.output) != 1:
            raise OnnxImportError(
                f"mgfl models give one output; the graph has {len(graph.output)}: "
                f"{[o.name for o in graph.output]}"
            )
        self.input_name = inputs[0].name
        self.output_name = graph.output[0].name
        self.input_shape, self.batch = _input_shape(inputs[0])
        self.visited: set[int] = set()

    def steps(self) -> list[Step]:
        """The whole graph as a chain of steps; every node must be on it."""
        steps = self._chain(self.output_name, self.input_name, None)
        unused = [n for n in self.nodes if id(n) not in self.visited]
        if unused:
            raise OnnxImportError(
                f"{node_label(unused[0])} is not on the chain from input to output: mgfl models "
                "are a single chain of layers with residual skips, without other branches"
            )
        return steps

    def constant(self, node: onnx.NodeProto, index: int, what: str) -> np.ndarray | None:
        """Input ``index`` of ``node`` as an array (None when absent); it must be constant."""
        if index >= len(node.input) or not node.input[index]:
            return None
        name = node.input[index]
        if name not in self.constants:
            raise OnnxImportError(
                f"{node_label(node)}: its {what} ({name!r}) must be an initializer or a Constant"
            )
        return self.constants[name]

    def _visit(self, node: onnx.NodeProto) -> None:
        if node.domain not in ("", "ai.onnx") or node.op_type not in SUPPORTED_OPERATORS:
            op = f"{node.domain}.{node.op_type}" if node.domain else node.op_type
            raise OnnxImportError(
                f"unsupported operator {op} in node {node.name or node.output[0]!r}; mgfl "
                f"imports {', '.join(SUPPORTED_OPERATORS)}"
            )
        if id(node) in self.visited:
            raise OnnxImportError(f"{node_label(node)} is reached twice: branches are unsupported")
        self.visited.add(id(node))
        used_outputs = [o for o in node.output[1:] if o and self.consumers.get(o)]
        if used_outputs:
            raise OnnxImportError(
                f"{node_label(node)}: its extra outputs {used_outputs} are used; mgfl layers "
                "have one output"
            )

    def _dynamic_inputs(self, node: onnx.NodeProto) -> list[str]:
        return [i for i in node.input if i and i not in self.constants]

    def _chain(self, end: str, start: str, join: onnx.NodeProto | None) -> list[Step]:
        """The steps that turn tensor ``start`` into tensor ``end``, read backwards."""
        steps: list[Step] = []
        tensor = end
        while tensor != start:
            node = self.producer.get(tensor)
            if node is None:
                where = f"the skip of {node_label(join)}" if join else "the graph's input"
                raise OnnxImportError(
                    f"tensor {tensor!r} does not lead back to {where} ({start!r}): mgfl models "
                    "are a single chain of layers with residual skips"
                )
            self._visit(node)
            dynamic = self._dynamic_inputs(node)
            if node.op_type == "Add" and len(dynamic) == 2:
                skip, body_end = self._skip_and_body(node, dynamic)
                steps.append(Step("residual", (node,), self._chain(body_end, skip, node)))
                tensor = skip
            elif node.op_type == "Add":
                matmul = self.producer.get(dynamic[0]) if len(dynamic) == 1 else None
                if matmul is None or matmul.op_type != "MatMul":
                    raise OnnxImportError(
                        f"{node_label(node)}: an Add of a constant is imported only as the bias "
                        "of a MatMul; here it follows "
                        f"{node_label(matmul) if matmul else 'no node'}"
                    )
                if len(self.consumers.get(dynamic[0], [])) != 1:
                    raise OnnxImportError(f"{node_label(matmul)}: its output has other readers")
                self._visit(matmul)
                steps.append(Step("linear", (matmul, node)))
                tensor = self._data_input(matmul)
            else:
                steps.append(Step("node", (node,)))
                tensor = self._data_input(node)
        steps.reverse()
        return steps

    def _data_input(self, node: onnx.NodeProto) -> str:
        dynamic = self._dynamic_inputs(node)
        if len(dynamic) != 1 or node.input[0] != dynamic[0]:
            raise OnnxImportError(
                f"{node_label(node)}: mgfl needs its first input to be the data and the others "
                f"constant; its non-constant inputs are {dynamic}"
            )
        return dynamic[0]

    def _skip_and_body(self, node: onnx.NodeProto, inputs: list[str]) -> tuple[str, str]:
        first, second = inputs
        if first != second and self._leads_to(first, second):
            return first, second
        if first != second and self._leads_to(second, first):
            return second, first
        raise OnnxImportError(
            f"{node_label(node)} joins {first!r} and {second!r}, but neither is computed from "
            "the other: only residual skips (x + body(x)) are supported"
        )

    def _leads_to(self, source: str, target: str) -> bool:
        """Whether ``target`` is computed from ``source``."""
        pending, seen = [target], set()
        while pending:
            tensor = pending.pop()
            if tensor == source:
                return True
            node = self.producer.get(tensor)
            if node is None or tensor in seen:
                continue
            seen.add(tensor)
            pending.extend(self._dynamic_inputs(node))
        return False


def _constant_value(node: onnx.NodeProto) -> np.ndarray:
    from onnx import helper, numpy_helper

    for attribute in node.attribute:
        value = helper.get_attribute_value(attribute)
        if attribute.name == "value":
            return numpy_helper.to_array(value)
        if attribute.name in ("value_float", "value_floats"):
            return np.asarray(value, dtype=np.float32)
        if attribute.name in ("value_int", "value_ints"):
            return np.asarray(value, dtype=np.int64)
    raise OnnxImportError(f"{node_label(node)}: only numeric tensor constants are supported")


def _input_shape(value_info: onnx.ValueInfoProto) -> tuple[Shape, int | None]:
    """The per-sample shape of the graph input and its batch size when fixed."""
    tensor_type = value_info.type.tensor_type
    dims = [d.dim_value if d.HasField("dim_value") else None for d in tensor_type.shape.dim]
    sample = dims[1:]
    if len(dims) not in (2, 4) or any(d is None or d < 1 for d in sample):
        raise OnnxImportError(
            f"the input {value_info.name!r} has shape {dims}; mgfl needs (N, C, H, W) or (N, F) "
            "with every dimension but the batch fixed"
        )
    return tuple(int(d) for d in sample), dims[0]
