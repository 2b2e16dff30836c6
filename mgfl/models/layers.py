"""The layers a model is described with: frozen values that know their shapes and parameters.

Every shape here is per sample, without the batch dimension. Images and spectrograms are
``(C, H, W)``; a 1-D sensor window is ``(C, 1, T)`` and is convolved with kernels ``(1, k)``.
A layer checks its input shape and raises ``ValueError`` with a plain message; the model that
holds it adds the layer's path to that message.
"""

from __future__ import annotations

import zlib
from abc import ABC, abstractmethod
from dataclasses import dataclass
from math import prod

Shape = tuple[int, ...]
Pair = tuple[int, int]


def dropout_seed(path: str) -> int:
    """The seed of the dropout mask of the layer at ``path``: stable across runs and machines."""
    return zlib.crc32(path.encode())


def as_pair(value: int | tuple[int, int] | list[int], what: str) -> Pair:
    """``3`` -> ``(3, 3)``; ``(h, w)`` stays; anything else is an error naming ``what``."""
    if isinstance(value, bool):
        raise ValueError(f"{what} must be an int or an (h, w) pair, got {value!r}")
    if isinstance(value, int):
        return (value, value)
    if (
        isinstance(value, (tuple, list))
        and len(value) == 2
        and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
    ):
        return (int(value[0]), int(value[1]))
    raise ValueError(f"{what} must be an int or an (h, w) pair, got {value!r}")


def _set(obj: object, name: str, value: object) -> None:
    object.__setattr__(obj, name, value)


def _positive(value: int, what: str) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{what} must be a positive int, got {value!r}")


def _positive_pair(pair: Pair, what: str) -> None:
    if min(pair) < 1:
        raise ValueError(f"{what} must be positive, got {pair}")


def _non_negative_pair(pair: Pair, what: str) -> None:
    if min(pair) < 0:
        raise ValueError(f"{what} must not be negative, got {pair}")


def _require_image(input_shape: Shape, kind: str) -> None:
    if len(input_shape) != 3:
        raise ValueError(
            f"{kind} needs a (C, H, W) input, got shape {input_shape}; "
            "a 1-D signal is written (C, 1, T)"
        )


def _window_output(
    input_shape: Shape, kernel: Pair, stride: Pair, padding: Pair, kind: str
) -> tuple[int, int]:
    """Output height and width of a sliding window (floor mode, like PyTorch)."""
    _, height, width = input_shape
    padded = (height + 2 * padding[0], width + 2 * padding[1])
    if kernel[0] > padded[0] or kernel[1] > padded[1]:
        raise ValueError(
            f"{kind} kernel {kernel} is larger than its padded input {padded} "
            f"(input {input_shape[1:]}, padding {padding})"
        )
    return (
        (padded[0] - kernel[0]) // stride[0] + 1,
        (padded[1] - kernel[1]) // stride[1] + 1,
    )


class Layer(ABC):
    """One step of a model. Subclasses are frozen dataclasses, so a description is a value."""

    @abstractmethod
    def output_shape(self, input_shape: Shape) -> Shape:
        """The per-sample output shape; ``ValueError`` when ``input_shape`` does not fit."""

    def parameter_shapes(self, input_shape: Shape) -> dict[str, Shape]:
        """Trainable arrays by local name (``"weight"``, ``"bias"``)."""
        return {}

    def buffer_shapes(self, input_shape: Shape) -> dict[str, Shape]:
        """Non-trainable state by local name (BatchNorm's running statistics)."""
        return {}


@dataclass(frozen=True)
class Linear(Layer):
    """``y = x W^T + b`` on a flat ``(F,)`` input; ``W`` is ``(out, in)`` as in PyTorch."""

    out_features: int
    bias: bool = True

    def __post_init__(self) -> None:
        _positive(self.out_features, "Linear out_features")

    def output_shape(self, input_shape: Shape) -> Shape:
        if len(input_shape) != 1:
            raise ValueError(
                f"Linear needs a flat (F,) input, got shape {input_shape}; put Flatten() or "
                "GlobalAvgPool() before it"
            )
        return (self.out_features,)

    def parameter_shapes(self, input_shape: Shape) -> dict[str, Shape]:
        shapes = {"weight": (self.out_features, input_shape[0])}
        if self.bias:
            shapes["bias"] = (self.out_features,)
        return shapes


@dataclass(frozen=True)
class Conv2d(Layer):
    """Dense 2-D convolution (cross-correlation, like PyTorch); weight ``(K, C, R, S)``."""

    out_channels: int
    kernel_size: int | Pair
    stride: int | Pair = 1
    padding: int | Pair = 0
    bias: bool = True

    def __post_init__(self) -> None:
        _positive(self.out_channels, "Conv2d out_channels")
        _set(self, "kernel_size", as_pair(self.kernel_size, "Conv2d kernel_size"))
        _set(self, "stride", as_pair(self.stride, "Conv2d stride"))
        _set(self, "padding", as_pair(self.padding, "Conv2d padding"))
        _positive_pair(self.kernel_size, "Conv2d kernel_size")
        _positive_pair(self.stride, "Conv2d stride")
        _non_negative_pair(self.padding, "Conv2d padding")

    def output_shape(self, input_shape: Shape) -> Shape:
        _require_image(input_shape, "Conv2d")
        height, width = _window_output(
            input_shape, self.kernel_size, self.stride, self.padding, "Conv2d"
        )
        return (self.out_channels, height, width)

    def parameter_shapes(self, input_shape: Shape) -> dict[str, Shape]:
        shapes = {"weight": (self.out_channels, input_shape[0], *self.kernel_size)}
        if self.bias:
            shapes["bias"] = (self.out_channels,)
        return shapes


@dataclass(frozen=True)
class DepthwiseConv2d(Layer):
    """One filter per channel (channel multiplier 1); weight ``(C, 1, R, S)``."""

    kernel_size: int | Pair
    stride: int | Pair = 1
    padding: int | Pair = 0
    bias: bool = True

    def __post_init__(self) -> None:
        _set(self, "kernel_size", as_pair(self.kernel_size, "DepthwiseConv2d kernel_size"))
        _set(self, "stride", as_pair(self.stride, "DepthwiseConv2d stride"))
        _set(self, "padding", as_pair(self.padding, "DepthwiseConv2d padding"))
        _positive_pair(self.kernel_size, "DepthwiseConv2d kernel_size")
        _positive_pair(self.stride, "DepthwiseConv2d stride")
        _non_negative_pair(self.padding, "DepthwiseConv2d padding")

    def output_shape(self, input_shape: Shape) -> Shape:
        _require_image(input_shape, "DepthwiseConv2d")
        height, width = _window_output(
            input_shape, self.kernel_size, self.stride, self.padding, "DepthwiseConv2d"
        )
        return (input_shape[0], height, width)

    def parameter_shapes(self, input_shape: Shape) -> dict[str, Shape]:
        shapes = {"weight": (input_shape[0], 1, *self.kernel_size)}
        if self.bias:
            shapes["bias"] = (input_shape[0],)
        return shapes


@dataclass(frozen=True)
class BatchNorm(Layer):
    """Per-channel normalisation of ``(C, H, W)`` (over N, H, W) or ``(F,)`` (over N).

    ``momentum`` weighs the new batch statistic in the running one, as in PyTorch."""

    momentum: float = 0.1
    eps: float = 1e-5

    def __post_init__(self) -> None:
        if not 0.0 <= self.momentum <= 1.0:
            raise ValueError(f"BatchNorm momentum must lie in [0, 1], got {self.momentum}")
        if not self.eps > 0.0:
            raise ValueError(f"BatchNorm eps must be positive, got {self.eps}")

    def output_shape(self, input_shape: Shape) -> Shape:
        if len(input_shape) not in (1, 3):
            raise ValueError(f"BatchNorm needs a (C, H, W) or (F,) input, got shape {input_shape}")
        return input_shape

    def parameter_shapes(self, input_shape: Shape) -> dict[str, Shape]:
        return {"weight": (input_shape[0],), "bias": (input_shape[0],)}

    def buffer_shapes(self, input_shape: Shape) -> dict[str, Shape]:
        return {"running_mean": (input_shape[0],), "running_var": (input_shape[0],)}


@dataclass(frozen=True)
class ReLU(Layer):
    """``max(x, 0)``."""

    def output_shape(self, input_shape: Shape) -> Shape:
        return input_shape


@dataclass(frozen=True)
class ReLU6(Layer):
    """``min(max(x, 0), 6)``."""

    def output_shape(self, input_shape: Shape) -> Shape:
        return input_shape


def _pool_init(layer: MaxPool2d | AvgPool2d, kind: str) -> None:
    _set(layer, "kernel_size", as_pair(layer.kernel_size, f"{kind} kernel_size"))
    stride = layer.kernel_size if layer.stride is None else layer.stride
    _set(layer, "stride", as_pair(stride, f"{kind} stride"))
    _set(layer, "padding", as_pair(layer.padding, f"{kind} padding"))
    _positive_pair(layer.kernel_size, f"{kind} kernel_size")
    _positive_pair(layer.stride, f"{kind} stride")
    _non_negative_pair(layer.padding, f"{kind} padding")
    if any(2 * p > k for p, k in zip(layer.padding, layer.kernel_size, strict=True)):
        raise ValueError(
            f"{kind} padding {layer.padding} must be at most half the kernel "
            f"{layer.kernel_size}, or a window could lie wholly in the padding"
        )


@dataclass(frozen=True)
class MaxPool2d(Layer):
    """Window maximum; padding never wins (it counts as -inf). ``stride=None`` means the kernel.

    The gradient of a window goes to its first maximum in row-major order."""

    kernel_size: int | Pair
    stride: int | Pair | None = None
    padding: int | Pair = 0

    def __post_init__(self) -> None:
        _pool_init(self, "MaxPool2d")

    def output_shape(self, input_shape: Shape) -> Shape:
        _require_image(input_shape, "MaxPool2d")
        height, width = _window_output(
            input_shape, self.kernel_size, self.stride, self.padding, "MaxPool2d"
        )
        return (input_shape[0], height, width)


@dataclass(frozen=True)
class AvgPool2d(Layer):
    """Window mean that divides by the full window: zero padding counts (PyTorch's default)."""

    kernel_size: int | Pair
    stride: int | Pair | None = None
    padding: int | Pair = 0

    def __post_init__(self) -> None:
        _pool_init(self, "AvgPool2d")

    def output_shape(self, input_shape: Shape) -> Shape:
        _require_image(input_shape, "AvgPool2d")
        height, width = _window_output(
            input_shape, self.kernel_size, self.stride, self.padding, "AvgPool2d"
        )
        return (input_shape[0], height, width)


@dataclass(frozen=True)
class GlobalAvgPool(Layer):
    """``(C, H, W) -> (C,)``: the mean of each channel."""

    def output_shape(self, input_shape: Shape) -> Shape:
        _require_image(input_shape, "GlobalAvgPool")
        return (input_shape[0],)


@dataclass(frozen=True)
class Flatten(Layer):
    """``(C, H, W) -> (C*H*W,)`` in row-major order, so on memory it changes nothing."""

    def output_shape(self, input_shape: Shape) -> Shape:
        return (prod(input_shape),)


@dataclass(frozen=True)
class Dropout(Layer):
    """In training, zero each element with probability ``p`` and scale the rest by 1/(1-p).

    The mask comes from a counter-based hash of (``dropout_seed(path)``, step, element index),
    so the OpenCL engine and the reference draw the same one."""

    p: float

    def __post_init__(self) -> None:
        if not 0.0 <= self.p < 1.0:
            raise ValueError(f"Dropout p must lie in [0, 1), got {self.p}")

    def output_shape(self, input_shape: Shape) -> Shape:
        return input_shape


@dataclass(frozen=True)
class Residual(Layer):
    """``y = x + body(x)``; the body must give back the shape it was given."""

    body: tuple[Layer, ...]

    def __post_init__(self) -> None:
        body = tuple(self.body)
        if not body:
            raise ValueError("Residual needs at least one layer in its body")
        for layer in body:
            if not isinstance(layer, Layer) or isinstance(layer, ResidualEnd):
                raise ValueError(f"Residual body holds {layer!r}, which is not a layer")
        _set(self, "body", body)

    def output_shape(self, input_shape: Shape) -> Shape:
        shape = input_shape
        for layer in self.body:
            shape = layer.output_shape(shape)
        if shape != input_shape:
            raise ValueError(
                f"Residual body turns shape {input_shape} into {shape}; the skip connection "
                "needs them equal"
            )
        return input_shape


@dataclass(frozen=True)
class ResidualEnd(Layer):
    """Pseudo-layer that ``Model.resolve`` emits after a residual body: here the skip is added.

    It is never written in a model description; it only marks the join in the resolved list."""

    def output_shape(self, input_shape: Shape) -> Shape:
        return input_shape
