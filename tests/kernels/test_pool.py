"""Pooling kernels against their float64 references and finite differences."""

from __future__ import annotations

import numpy as np
import pytest

from kernels import pool
from kernels.conv_shape import ConvShape
from kernels.launch import run
from kernels.reference import pool as ref
from tests.kernels.conftest import FD_RTOL, assert_close, numeric_grad, odd_sizes, scale
from tests.kernels.conv_cases import Window, as_f32, random_shape

POOL_WINDOWS = [
    Window(2, 2, 2, 2),
    Window(3, 3, 3, 3),
    Window(3, 2, 3, 2),
    Window(2, 1, 2, 1),
    Window(3, 3, 2, 2, 1, 1),
    Window(3, 3, 1, 1, 1, 1),
    Window(5, 5, 2, 2, 2, 2),
    Window(3, 2, 2, 1, 2, 1),
    Window(10, 4, 3, 2, 5, 1),
    Window(1, 2, 1, 2, one_row=True),
    Window(1, 3, 1, 2, 0, 1, one_row=True),
]


def _input(rng, shape: ConvShape, ties: bool = False) -> np.ndarray:
    x = as_f32(rng, (shape.n, shape.c, shape.h, shape.w))
    if ties:  # few distinct values, so windows hold equal maxima and "first" matters
        x = np.round(x * 1.5)
    return x


@pytest.mark.parametrize("win", POOL_WINDOWS, ids=str)
def test_maxpool_matches_reference(device, lib, bufs, rng, win: Window):
    for ties in (False, True):
        shape = random_shape(rng, win, same_channels=True)
        x = _input(rng, shape, ties)
        dy = as_f32(rng, (shape.n, shape.c, shape.out_h, shape.out_w))
        bx, by, bdx = bufs.up(x), bufs.empty(shape.y_size), bufs.empty(shape.x_size)
        run(device.queue, [
            *pool.maxpool_forward(lib, bx, by, shape=shape),
            *pool.maxpool_backward(lib, bx, bufs.up(dy), bdx, shape=shape),
        ])
        y = ref.maxpool_forward(x, shape)
        assert_close(bufs.down(by, y.shape), y)
        assert_close(bufs.down(bdx, x.shape), ref.maxpool_backward(x, dy, shape))


def test_maxpool_padding_never_wins_and_ties_go_to_the_first(device, lib, bufs):
    shape = ConvShape(n=1, c=1, h=2, w=3, k=1, r=2, s=2, stride_h=2, stride_w=2, pad_h=1, pad_w=1)
    x = np.array([[[[-5.0, -1.0, -1.0], [-1.0, -7.0, -2.0]]]])
    bx, by, bdx = bufs.up(x), bufs.empty(shape.y_size), bufs.empty(shape.x_size)
    dy = np.arange(1.0, 1.0 + shape.y_size).reshape(1, 1, shape.out_h, shape.out_w)
    run(device.queue, [
        *pool.maxpool_forward(lib, bx, by, shape=shape),
        *pool.maxpool_backward(lib, bx, bufs.up(dy), bdx, shape=shape),
    ])
    # Windows (rows, cols): (-1..0, -1..0) (-1..0, 1..2) (1..2, -1..0) (1..2, 1..2).
    np.testing.assert_array_equal(bufs.down(by, (2, 2)), [[-5.0, -1.0], [-1.0, -2.0]])
    # The window over (0, 1) and (0, 2) ties at -1 and pays the first.
    np.testing.assert_array_equal(bufs.down(bdx, (2, 3)), [[1.0, 2.0, 0.0], [3.0, 0.0, 4.0]])


@pytest.mark.parametrize("win", POOL_WINDOWS, ids=str)
def test_avgpool_matches_reference(device, lib, bufs, rng, win: Window):
    shape = random_shape(rng, win, same_channels=True)
    x = _input(rng, shape)
    dy = as_f32(rng, (shape.n, shape.c, shape.out_h, shape.out_w))
    by, bdx = bufs.empty(shape.y_size), bufs.empty(shape.x_size)
    run(device.queue, [
        *pool.avgpool_forward(lib, bufs.up(x), by, shape=shape),
        *pool.avgpool_backward(lib, bufs.up(dy), bdx, shape=shape),
    ])
    y = ref.avgpool_forward(x, shape)
    assert_close(bufs.down(by, y.shape), y)
    assert_close(bufs.down(bdx, x.shape), ref.avgpool_backward(dy, shape))


def test_avgpool_counts_zero_padding():
    shape = ConvShape(n=1, c=1, h=2, w=2, k=1, r=3, s=3, pad_h=1, pad_w=1)
    y = ref.avgpool_forward(np.ones((1, 1, 2, 2)), shape)
    np.testing.assert_allclose(y, np.full((1, 1, 2, 2), 4.0 / 9.0))


@pytest.mark.parametrize(
    "shape",
    [
        ConvShape(n=2, c=3, h=5, w=6, k=3, r=3, s=3, stride_h=2, stride_w=2, pad_h=1, pad_w=1),
        ConvShape(n=1, c=2, h=1, w=9, k=2, r=1, s=2, stride_w=2),
        ConvShape(n=1, c=2, h=7, w=5, k=2, r=3, s=2, stride_h=1, stride_w=2, pad_h=2, pad_w=1),
        ConvShape(n=2, c=2, h=5, w=9, k=2, r=2, s=2, stride_h=2, stride_w=2),
        ConvShape(n=1, c=3, h=7, w=8, k=3, r=3, s=3, stride_h=3, stride_w=3),
    ],
    ids=["3x3-stride2-pad1", "1d-1x2", "3x2-overlapping", "2x2-tiles", "3x3-tiles"],
)
def test_backward_matches_finite_differences(device, lib, bufs, rng, shape: ConvShape):
    # Distinct values spaced well apart: the maximum of each window is stable under eps.
    x = rng.permutation(shape.x_size).reshape(shape.n, shape.c, shape.h, shape.w) * 0.1
    g = rng.normal(size=(shape.n, shape.c, shape.out_h, shape.out_w))
    bx, bg = bufs.up(x), bufs.up(g)
    bmax, bavg = bufs.empty(shape.x_size), bufs.empty(shape.x_size)
    run(device.queue, [
        *pool.maxpool_backward(lib, bx, bg, bmax, shape=shape),
        *pool.avgpool_backward(lib, bg, bavg, shape=shape),
    ])
    x32 = x.astype(np.float32).astype(np.float64)
    max_grad = numeric_grad(lambda v: float(np.sum(ref.maxpool_forward(v, shape) * g)), x32)
    avg_grad = numeric_grad(lambda v: float(np.sum(ref.avgpool_forward(v, shape) * g)), x32)
    assert_close(bufs.down(bmax, x.shape), max_grad, FD_RTOL)
    assert_close(bufs.down(bavg, x.shape), avg_grad, FD_RTOL)


@pytest.mark.parametrize("hw", [1, 3, 4, 7, 49, 125, 257])
def test_global_avgpool_matches_reference(device, lib, bufs, rng, hw: int):
    hw = min(hw, scale(hw, 49))
    n, c = odd_sizes(rng, 2, 1, scale(40, 6))
    x = as_f32(rng, (n, c, hw))
    dy = as_f32(rng, (n, c))
    by, bdx = bufs.empty(n * c), bufs.empty(n * c * hw)
    run(device.queue, [
        *pool.global_avgpool_forward(lib, bufs.up(x), by, n=n, c=c, hw=hw),
        *pool.global_avgpool_backward(lib, bufs.up(dy), bdx, n=n, c=c, hw=hw),
    ])
    assert_close(bufs.down(by, (n, c)), ref.global_avgpool_forward(x, n, c, hw))
    assert_close(bufs.down(bdx, (n, c, hw)), ref.global_avgpool_backward(dy, n, c, hw))


def test_global_avgpool_backward_matches_finite_differences(device, lib, bufs, rng):
    n, c, hw = 2, 3, 7
    x, g = rng.normal(size=(n, c, hw)), rng.normal(size=(n, c))
    bdx = bufs.empty(n * c * hw)
    run(device.queue, pool.global_avgpool_backward(lib, bufs.up(g), bdx, n=n, c=c, hw=hw))
    numeric = numeric_grad(lambda v: float(np.sum(ref.global_avgpool_forward(v, n, c, hw) * g)), x)
    assert_close(bufs.down(bdx, x.shape), numeric, FD_RTOL)


def test_tuning_defines_change_the_grouping_not_the_result(device, lib, bufs, rng):
    tuning = {"POOL_WG": 16, "GAP_WG": 8}
    shape = random_shape(rng, Window(3, 3, 2, 2, 1, 1), same_channels=True)
    x = _input(rng, shape, ties=True)
    dy = as_f32(rng, (shape.n, shape.c, shape.out_h, shape.out_w))
    hw = shape.h * shape.w
    bx, bdy = bufs.up(x), bufs.up(dy)
    by, bdx = bufs.empty(shape.y_size), bufs.empty(shape.x_size)
    bgap = bufs.empty(shape.n * shape.c)
    run(device.queue, [
        *pool.maxpool_forward(lib, bx, by, shape=shape, tuning=tuning),
        *pool.maxpool_backward(lib, bx, bdy, bdx, shape=shape, tuning=tuning),
        *pool.global_avgpool_forward(lib, bx, bgap, n=shape.n, c=shape.c, hw=hw, tuning=tuning),
    ])
    assert_close(bufs.down(by, dy.shape), ref.maxpool_forward(x, shape))
    assert_close(bufs.down(bdx, x.shape), ref.maxpool_backward(x, dy, shape))
    gap = ref.global_avgpool_forward(x, shape.n, shape.c, hw)
    assert_close(bufs.down(bgap, gap.shape), gap)


TILED_WINDOWS = [
    Window(2, 2, 2, 2), Window(1, 2, 1, 2, one_row=True), Window(2, 1, 2, 1), Window(3, 3, 3, 3),
]


def _padded(bufs, count: int, tail: int, sentinel: float, values: np.ndarray | None = None):
    """A buffer of ``count`` elements (NaN, or ``values``) followed by ``tail`` sentinels: what a
    kernel writes past its tensor shows up."""
    data = np.full(count + tail, sentinel, np.float32)
    data[:count] = np.nan if values is None else values.reshape(-1)
    return bufs.up(data)


# (POOL_PB, POOL_RB): every vector width, one row or several (the GPU and the CPU defaults among
# them).
BLOCKS = [(1, 1), (2, 3), (4, 1), (8, 4), (16, 2)]


@pytest.mark.parametrize(("width", "rows"), BLOCKS, ids=lambda v: str(v))
@pytest.mark.parametrize("win", TILED_WINDOWS, ids=str)
def test_tiled_maxpool_at_every_vector_width(
    device, lib, bufs, rng, win: Window, width: int, rows: int
):
    """Windows that tile the input, at every block width: the maxima, dy at the first maximum,
    zeros under the rest and in the rows and columns no window covers, nothing past the tensors.
    Sizes that are not multiples of the window leave such rows and columns."""
    shape = random_shape(rng, win, same_channels=True)
    shape = ConvShape(
        n=shape.n, c=shape.c, h=shape.h if win.one_row else shape.h + win.r,
        w=shape.w + win.s + 1, k=shape.c, r=win.r, s=win.s, stride_h=win.r, stride_w=win.s,
    )
    assert pool.tiles(shape)
    x = _input(rng, shape, ties=True)
    dy = as_f32(rng, (shape.n, shape.c, shape.out_h, shape.out_w))
    tail, sentinel = 40, 7.25
    bx = _padded(bufs, shape.x_size, tail, sentinel, x)
    by = _padded(bufs, shape.y_size, tail, sentinel)
    bdx = _padded(bufs, shape.x_size, tail, sentinel)
    tuning = {"POOL_PB": width, "POOL_RB": rows}
    run(device.queue, [
        *pool.maxpool_forward(lib, bx, by, shape=shape, tuning=tuning),
        *pool.maxpool_backward(lib, bx, bufs.up(dy), bdx, shape=shape, tuning=tuning),
    ])
    y, dx = bufs.down(by, shape.y_size + tail), bufs.down(bdx, shape.x_size + tail)
    expected_y = ref.maxpool_forward(x, shape)
    np.testing.assert_array_equal(y[: shape.y_size].reshape(expected_y.shape), expected_y)
    expected_dx = ref.maxpool_backward(x, dy, shape)
    np.testing.assert_array_equal(dx[: shape.x_size].reshape(x.shape), expected_dx)
    assert np.all(y[shape.y_size:] == sentinel) and np.all(dx[shape.x_size:] == sentinel)


def test_tiling_windows_take_the_block_path(lib, bufs):
    """Tiling windows run one work-item per block of windows over a 3-D grid; overlapping or
    padded ones one work-item per element."""
    tiled = ConvShape(n=2, c=3, h=9, w=9, k=3, r=2, s=2, stride_h=2, stride_w=2)
    padded = ConvShape(n=2, c=3, h=9, w=9, k=3, r=2, s=2, stride_h=2, stride_w=2, pad_h=1)
    overlapping = ConvShape(n=2, c=3, h=9, w=9, k=3, r=3, s=3, stride_h=2, stride_w=2)
    assert pool.tiles(tiled) and not pool.tiles(padded) and not pool.tiles(overlapping)
    buf = bufs.empty(tiled.x_size)
    tuning = {"POOL_PB": 4, "POOL_RB": 2, "POOL_WG": 64}
    (launch,) = pool.maxpool_backward(lib, buf, buf, buf, shape=tiled, tuning=tuning)
    # 4 windows of a row in 1 block, 4 rows of windows in 2 blocks, 6 planes.
    assert launch.global_size == (1, 2, 6) and launch.local_size == (1, 2, 6)
    assert launch.flops == tiled.y_size * 4
    for shape in (padded, overlapping):
        (launch,) = pool.maxpool_backward(lib, buf, buf, buf, shape=shape, tuning=tuning)
        assert len(launch.global_size) == 1 and launch.global_size[0] >= shape.x_size


def test_bad_arguments_are_clear_errors(lib, bufs):
    buf = bufs.empty(64)
    with pytest.raises(ValueError, match="smaller than"):
        shape = ConvShape(n=1, c=1, h=4, w=4, k=1, r=2, s=2, pad_h=2)
        pool.maxpool_forward(lib, buf, buf, shape=shape)
    with pytest.raises(ValueError, match="channel count"):
        pool.avgpool_forward(lib, buf, buf, shape=ConvShape(n=1, c=1, h=4, w=4, k=2, r=2, s=2))
    with pytest.raises(ValueError, match="vector width"):
        shape = ConvShape(n=1, c=1, h=4, w=4, k=1, r=2, s=2, stride_h=2, stride_w=2)
        pool.maxpool_forward(lib, buf, buf, shape=shape, tuning={"POOL_PB": 3})
    with pytest.raises(ValueError, match="positive hw"):
        pool.global_avgpool_forward(lib, buf, buf, n=1, c=1, hw=0)
