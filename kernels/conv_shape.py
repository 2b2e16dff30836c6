"""The geometry of a 2-D convolution or pooling window, shared by conv2d, depthwise and pooling."""

from __future__ import annotations

from dataclasses import dataclass
from numbers import Integral


@dataclass(frozen=True)
class ConvShape:
    """Input ``(n, c, h, w)`` in NCHW, ``k`` output channels (``== c`` for depthwise and pooling),
    an ``r x s`` window moved by ``(stride_h, stride_w)`` over the input padded symmetrically with
    ``(pad_h, pad_w)`` zeros."""

    n: int
    c: int
    h: int
    w: int
    k: int
    r: int
    s: int
    stride_h: int = 1
    stride_w: int = 1
    pad_h: int = 0
    pad_w: int = 0

    def __post_init__(self) -> None:
        for name in ("n", "c", "h", "w", "k", "r", "s", "stride_h", "stride_w"):
            value = getattr(self, name)
            if not _is_int(value) or value < 1:
                raise ValueError(f"ConvShape.{name} must be a positive int, got {value!r}")
        for name in ("pad_h", "pad_w"):
            value = getattr(self, name)
            if not _is_int(value) or value < 0:
                raise ValueError(f"ConvShape.{name} must be a non-negative int, got {value!r}")
        if self.h + 2 * self.pad_h < self.r or self.w + 2 * self.pad_w < self.s:
            raise ValueError(
                f"The {self.r}x{self.s} window does not fit the {self.h}x{self.w} input padded by "
                f"({self.pad_h}, {self.pad_w}): the output would be empty. Use a smaller window or "
                "more padding."
            )

    @property
    def out_h(self) -> int:
        return (self.h + 2 * self.pad_h - self.r) // self.stride_h + 1

    @property
    def out_w(self) -> int:
        return (self.w + 2 * self.pad_w - self.s) // self.stride_w + 1

    @property
    def x_size(self) -> int:
        """Elements of the input tensor ``(n, c, h, w)``."""
        return self.n * self.c * self.h * self.w

    @property
    def y_size(self) -> int:
        """Elements of the output tensor ``(n, k, out_h, out_w)``."""
        return self.n * self.k * self.out_h * self.out_w


def _is_int(value: object) -> bool:
    return isinstance(value, Integral) and not isinstance(value, bool)
