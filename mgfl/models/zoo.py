"""The models mgfl ships, by name: ``build_model("lenet5")``.

Convolutions that a BatchNorm follows carry no bias (the BatchNorm's own bias makes it
redundant), as in the reference implementations of DS-CNN and MobileNetV2.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from mgfl.models.layers import (
    BatchNorm,
    Conv2d,
    DepthwiseConv2d,
    Dropout,
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

LayerBuilder = Callable[..., tuple[Layer, ...]]


@dataclass(frozen=True)
class ZooEntry:
    """How to build one zoo model: its layers (from input shape, classes and options) and the
    defaults a caller may override."""

    summary: str
    default_input_shape: Shape
    default_num_classes: int
    options: dict[str, Any]
    build_layers: LayerBuilder


def build_model(
    name: str,
    *,
    input_shape: Shape | None = None,
    num_classes: int | None = None,
    **options: Any,
) -> Model:
    """The zoo model ``name``, with the entry's defaults for whatever is not given."""
    if name not in ZOO:
        raise ValueError(f"Unknown model {name!r}; the zoo holds {', '.join(sorted(ZOO))}")
    entry = ZOO[name]
    unknown = sorted(set(options) - set(entry.options))
    if unknown:
        allowed = ", ".join(entry.options) or "none"
        raise ValueError(f"Model {name!r} has no option {', '.join(unknown)}; options: {allowed}")
    shape = tuple(input_shape) if input_shape is not None else entry.default_input_shape
    classes = entry.default_num_classes if num_classes is None else num_classes
    if not isinstance(classes, int) or isinstance(classes, bool) or classes < 1:
        raise ValueError(f"num_classes must be a positive int, got {classes!r}")
    layers = entry.build_layers(shape, classes, **{**entry.options, **options})
    return Model(name=name, input_shape=shape, layers=layers)


def _with_dropout(p: float) -> tuple[Layer, ...]:
    return (Dropout(p),) if p > 0 else ()


def _mlp(shape: Shape, classes: int, *, hidden: tuple[int, ...]) -> tuple[Layer, ...]:
    layers: list[Layer] = [Flatten()]
    for width in hidden:
        layers += [Linear(width), ReLU()]
    return (*layers, Linear(classes))


def _lenet5(shape: Shape, classes: int) -> tuple[Layer, ...]:
    return (
        Conv2d(6, 5, padding=2), ReLU(), MaxPool2d(2),
        Conv2d(16, 5), ReLU(), MaxPool2d(2),
        Flatten(),
        Linear(120), ReLU(), Linear(84), ReLU(), Linear(classes),
    )  # fmt: skip


def _dscnn(shape: Shape, classes: int, *, channels: int, dropout: float) -> tuple[Layer, ...]:
    layers: list[Layer] = [
        Conv2d(channels, (10, 4), stride=(2, 2), padding=(5, 1), bias=False),
        BatchNorm(),
        ReLU(),
    ]
    for _ in range(4):
        layers += [
            DepthwiseConv2d(3, padding=1, bias=False), BatchNorm(), ReLU(),
            Conv2d(channels, 1, bias=False), BatchNorm(), ReLU(),
        ]  # fmt: skip
    return (*layers, GlobalAvgPool(), *_with_dropout(dropout), Linear(classes))


def make_divisible(value: float, divisor: int = 8) -> int:
    """Round channels to a multiple of ``divisor``, never more than 10% below ``value``
    (the rule of the MobileNet reference code)."""
    rounded = max(divisor, int(value + divisor / 2) // divisor * divisor)
    if rounded < 0.9 * value:
        rounded += divisor
    return rounded


# (expansion t, output channels c, repeats n, first stride s) of MobileNetV2.
MOBILENETV2_BLOCKS = (
    (1, 16, 1, 1),
    (6, 24, 2, 2),
    (6, 32, 3, 2),
    (6, 64, 4, 2),
    (6, 96, 3, 1),
    (6, 160, 3, 2),
    (6, 320, 1, 1),
)


def _inverted_residual(inp: int, out: int, stride: int, expansion: int) -> tuple[Layer, ...]:
    hidden = int(round(inp * expansion))
    body: list[Layer] = []
    if expansion != 1:
        body += [Conv2d(hidden, 1, bias=False), BatchNorm(), ReLU6()]
    body += [
        DepthwiseConv2d(3, stride=stride, padding=1, bias=False), BatchNorm(), ReLU6(),
        Conv2d(out, 1, bias=False), BatchNorm(),
    ]  # fmt: skip
    if stride == 1 and inp == out:
        return (Residual(tuple(body)),)
    return tuple(body)


def _mobilenetv2(
    shape: Shape, classes: int, *, width: float, small_input: bool, dropout: float
) -> tuple[Layer, ...]:
    """MobileNetV2 (Sandler et al. 2018). With ``small_input`` (for 32x32 images) the first
    convolution and the first two stride-2 stages (c=24, c=32) use stride 1, so the last
    feature map of a 32x32 input is 8x8 instead of 1x1; without it the strides are ImageNet's."""
    if not width > 0:
        raise ValueError(f"MobileNetV2 width must be positive, got {width}")
    channels = make_divisible(32 * width)
    layers: list[Layer] = [
        Conv2d(channels, 3, stride=1 if small_input else 2, padding=1, bias=False),
        BatchNorm(),
        ReLU6(),
    ]
    for stage, (expansion, c, repeats, first_stride) in enumerate(MOBILENETV2_BLOCKS):
        if small_input and stage in (1, 2):
            first_stride = 1
        out = make_divisible(c * width)
        for repeat in range(repeats):
            stride = first_stride if repeat == 0 else 1
            layers += _inverted_residual(channels, out, stride, expansion)
            channels = out
    last = make_divisible(1280 * max(1.0, width))
    layers += [Conv2d(last, 1, bias=False), BatchNorm(), ReLU6(), GlobalAvgPool()]
    return (*layers, *_with_dropout(dropout), Linear(classes))


def _cnn1d(shape: Shape, classes: int) -> tuple[Layer, ...]:
    return (
        Conv2d(32, (1, 5), padding=(0, 2), bias=False), BatchNorm(), ReLU(), MaxPool2d((1, 2)),
        Conv2d(64, (1, 5), padding=(0, 2), bias=False), BatchNorm(), ReLU(), MaxPool2d((1, 2)),
        Conv2d(64, (1, 3), padding=(0, 1), bias=False), BatchNorm(), ReLU(),
        GlobalAvgPool(),
        Linear(classes),
    )  # fmt: skip


ZOO: dict[str, ZooEntry] = {
    "mlp": ZooEntry(
        "MLP 784-256-128-16 of the seed paper (Flatten, two ReLU hidden layers)",
        (1, 28, 28), 16, {"hidden": (256, 128)}, _mlp,
    ),
    "lenet5": ZooEntry(
        "LeNet-5 with ReLU and max pooling, 61,706 parameters on 28x28",
        (1, 28, 28), 10, {}, _lenet5,
    ),
    "dscnn": ZooEntry(
        "DS-CNN for keyword spotting (Zhang et al. 2017) on 49x10 MFCC",
        (1, 49, 10), 12, {"channels": 64, "dropout": 0.0}, _dscnn,
    ),
    "mobilenetv2": ZooEntry(
        "MobileNetV2 with a width multiplier, strides adapted to 32x32 images",
        (3, 32, 32), 10, {"width": 0.35, "small_input": True, "dropout": 0.0}, _mobilenetv2,
    ),
    "cnn1d": ZooEntry(
        "1-D CNN for 6-axis sensor windows (activity recognition)",
        (6, 1, 128), 7, {}, _cnn1d,
    ),
}  # fmt: skip
