"""Random convolution and pooling shapes for the conv2d, depthwise and pooling kernel tests."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kernels.conv_shape import ConvShape
from tests.kernels.conftest import odd_sizes, scale


@dataclass(frozen=True)
class Window:
    """A window geometry to test; ``one_row`` draws 1-D inputs (h == 1), as the 1-D CNN uses."""

    r: int
    s: int
    stride_h: int = 1
    stride_w: int = 1
    pad_h: int = 0
    pad_w: int = 0
    one_row: bool = False

    def __str__(self) -> str:
        row = "-1d" if self.one_row else ""
        return (
            f"{self.r}x{self.s}-st{self.stride_h}{self.stride_w}-pad{self.pad_h}{self.pad_w}{row}"
        )


CONV_WINDOWS = [
    Window(3, 3, 1, 1, 1, 1),
    Window(3, 3, 2, 2, 1, 1),
    Window(1, 1),
    Window(1, 1, 2, 2),
    Window(5, 5, 1, 1, 2, 2),
    Window(5, 5, 2, 2, 2, 2),
    Window(3, 3, 1, 2, 0, 2),
    Window(10, 4, 2, 2, 5, 1),
    Window(1, 5, 1, 1, 0, 2, one_row=True),
    Window(1, 3, 1, 2, 0, 1, one_row=True),
]


def random_shape(
    rng: np.random.Generator, win: Window, *, same_channels: bool, max_channels: int = 20
) -> ConvShape:
    """A shape with odd sizes (not multiples of any tile) that fits ``win``; under oclgrind it
    stays tiny."""
    n = odd_sizes(rng, 1, 1, scale(6, 3))[0]
    c, k = odd_sizes(rng, 2, 1, scale(max_channels, 6))
    h = 1 if win.one_row else odd_sizes(rng, 1, max(1, win.r - 2 * win.pad_h), scale(24, 8))[0]
    w = odd_sizes(rng, 1, max(1, win.s - 2 * win.pad_w), scale(24, 8) + win.s)[0]
    return ConvShape(
        n=n, c=c, h=h, w=w, k=c if same_channels else k, r=win.r, s=win.s,
        stride_h=win.stride_h, stride_w=win.stride_w, pad_h=win.pad_h, pad_w=win.pad_w,
    )


def as_f32(rng: np.random.Generator, shape: tuple[int, ...], sigma: float = 1.0) -> np.ndarray:
    """Normal samples rounded to float32 (what the kernels see) and held as float64 (what the
    references compute in)."""
    return rng.normal(0.0, sigma, shape).astype(np.float32).astype(np.float64)
