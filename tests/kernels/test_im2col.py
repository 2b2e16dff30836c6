"""im2col, col2im and bias + activation against their float64 references, finite differences, and
Conv2d lowered to im2col + GEMM against the Conv2d reference."""

from __future__ import annotations

import numpy as np
import pytest

from kernels import gemm, im2col
from kernels.conv_shape import ConvShape
from kernels.launch import run
from kernels.reference import conv2d as conv_ref
from kernels.reference import im2col as ref
from tests.kernels.conftest import FD_RTOL, assert_close, numeric_grad, odd_sizes, scale
from tests.kernels.conv_cases import CONV_WINDOWS, Window, as_f32, random_shape

# Both default layouts run on whatever device the tests use: the GPU one (a column per work-item)
# and the CPU one (runs of columns per work-item).
STYLES = {"gpu": im2col.GPU_DEFAULTS, "cpu": im2col.CPU_DEFAULTS}
ACTIVATIONS = [None, "relu", "relu6"]
MAX_CHANNELS = 40


def _shape(rng, win: Window) -> ConvShape:
    return random_shape(rng, win, same_channels=False, max_channels=MAX_CHANNELS)


def _x(rng, shape: ConvShape) -> np.ndarray:
    return as_f32(rng, (shape.n, shape.c, shape.h, shape.w))


def _col(rng, shape: ConvShape) -> np.ndarray:
    return as_f32(rng, (shape.n, shape.c * shape.r * shape.s, shape.out_h * shape.out_w))


def test_reference_im2col_matches_definition(rng):
    """The reference itself, against the definition written out as loops."""
    shape = ConvShape(n=2, c=3, h=5, w=7, k=1, r=3, s=2, stride_h=2, stride_w=1, pad_h=1, pad_w=2)
    x = rng.normal(size=(2, 3, 5, 7))
    expected = np.zeros((2, 3 * 3 * 2, shape.out_h * shape.out_w))
    for n, c, r, s, oh, ow in np.ndindex(2, 3, 3, 2, shape.out_h, shape.out_w):
        ih, iw = oh * 2 - 1 + r, ow - 2 + s
        if 0 <= ih < 5 and 0 <= iw < 7:
            expected[n, (c * 3 + r) * 2 + s, oh * shape.out_w + ow] = x[n, c, ih, iw]
    np.testing.assert_array_equal(ref.im2col(x, shape), expected)


@pytest.mark.parametrize("win", CONV_WINDOWS, ids=str)
def test_reference_col2im_is_the_adjoint_of_im2col(rng, win: Window):
    """<im2col(x), g> == <x, col2im(g)> in float64."""
    shape = _shape(rng, win)
    x = rng.normal(size=(shape.n, shape.c, shape.h, shape.w))
    g = rng.normal(size=(shape.n, shape.c * shape.r * shape.s, shape.out_h * shape.out_w))
    lhs = float(np.sum(ref.im2col(x, shape) * g))
    rhs = float(np.sum(x * ref.col2im(g, shape)))
    assert abs(lhs - rhs) <= 1e-10 * max(1.0, abs(lhs))


@pytest.mark.parametrize("style", STYLES)
@pytest.mark.parametrize("win", CONV_WINDOWS, ids=str)
def test_im2col_matches_reference(device, lib, bufs, rng, win: Window, style: str):
    shape = _shape(rng, win)
    x = _x(rng, shape)
    bcol = bufs.empty(im2col.col_size(shape))
    run(device.queue, im2col.im2col(lib, bufs.up(x), bcol, shape=shape, tuning=STYLES[style]))
    expected = ref.im2col(x, shape)
    # A copy: exact, not merely close.
    np.testing.assert_array_equal(bufs.down(bcol, expected.shape), expected)


@pytest.mark.parametrize("style", STYLES)
@pytest.mark.parametrize("win", CONV_WINDOWS, ids=str)
def test_col2im_matches_reference(device, lib, bufs, rng, win: Window, style: str):
    shape = _shape(rng, win)
    col = _col(rng, shape)
    bdx = bufs.empty(shape.x_size)
    run(device.queue, im2col.col2im(lib, bufs.up(col), bdx, shape=shape, tuning=STYLES[style]))
    expected = ref.col2im(col, shape)
    assert_close(bufs.down(bdx, expected.shape), expected)


@pytest.mark.parametrize(
    "shape",
    [
        ConvShape(n=2, c=3, h=5, w=6, k=1, r=3, s=3, stride_h=2, stride_w=2, pad_h=1, pad_w=1),
        ConvShape(n=1, c=2, h=1, w=9, k=1, r=1, s=5, stride_w=2, pad_w=2),
        ConvShape(n=1, c=2, h=7, w=4, k=1, r=5, s=2, stride_h=2, pad_h=2),
    ],
    ids=["3x3-stride2-pad1", "1d-1x5", "5x2"],
)
def test_col2im_is_the_gradient_of_im2col(device, lib, bufs, rng, shape: ConvShape):
    """col2im(g) against finite differences of x -> <im2col(x), g> on the reference."""
    x = rng.normal(size=(shape.n, shape.c, shape.h, shape.w))
    g = _col(rng, shape)
    numeric = numeric_grad(lambda v: float(np.sum(ref.im2col(v, shape) * g)), x)
    bdx = bufs.empty(shape.x_size)
    run(device.queue, im2col.col2im(lib, bufs.up(g), bdx, shape=shape))
    assert_close(bufs.down(bdx, x.shape), numeric, FD_RTOL)


@pytest.mark.parametrize("style", STYLES)
@pytest.mark.parametrize(
    ("activation", "with_bias"),
    [(None, True), ("relu", True), ("relu6", True), ("relu", False), ("relu6", False)],
)
def test_bias_activation_matches_reference(
    device, lib, bufs, rng, activation: str | None, with_bias: bool, style: str
):
    n = odd_sizes(rng, 1, 1, scale(6, 3))[0]
    c, hw = odd_sizes(rng, 1, 1, scale(MAX_CHANNELS, 6))[0], odd_sizes(rng, 1, 1, scale(300, 20))[0]
    y = as_f32(rng, (n, c, hw), 5.0)  # wide enough that relu6 clamps at both ends
    b = as_f32(rng, (c,), 2.0)
    by = bufs.up(y)
    run(device.queue, im2col.bias_activation(
        lib, by, bufs.up(b) if with_bias else None, n=n, c=c, hw=hw, activation=activation,
        tuning=STYLES[style],
    ))
    expected = ref.bias_activation(
        y, b if with_bias else None, n=n, c=c, hw=hw, activation=activation
    )
    assert_close(bufs.down(by, y.shape), expected)


def test_bias_activation_without_either_is_no_work(lib, bufs):
    assert im2col.bias_activation(lib, bufs.empty(6), None, n=1, c=2, hw=3, activation=None) == []


@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("win", CONV_WINDOWS[::3], ids=str)
def test_conv_forward_is_im2col_then_gemm(device, lib, bufs, rng, win: Window, activation):
    """y[n] = W (K x CRS) @ col[n] for every image, then bias and activation per channel."""
    shape = _shape(rng, win)
    crs, p = shape.c * shape.r * shape.s, shape.out_h * shape.out_w
    x = _x(rng, shape)
    w = as_f32(rng, (shape.k, shape.c, shape.r, shape.s), 2.0 / np.sqrt(crs))
    b = as_f32(rng, (shape.k,))
    bcol, by = bufs.empty(im2col.col_size(shape)), bufs.empty(shape.y_size)
    run(device.queue, [
        *im2col.im2col(lib, bufs.up(x), bcol, shape=shape),
        gemm.gemm(lib, bufs.up(w), bcol, by, m=shape.k, n=p, k=crs, batch=shape.n,
                  stride_a=0, stride_b=crs * p, stride_c=shape.k * p),
        *im2col.bias_activation(lib, by, bufs.up(b), n=shape.n, c=shape.k, hw=p,
                                activation=activation),
    ])
    expected = conv_ref.conv2d_forward(x, w, b, shape, activation)
    assert_close(bufs.down(by, expected.shape), expected)


@pytest.mark.parametrize("win", CONV_WINDOWS, ids=str)
def test_conv_backward_data_is_gemm_then_col2im(device, lib, bufs, rng, win: Window):
    """dcol[n] = W^T (CRS x K) @ dy[n] for every image, then col2im."""
    shape = _shape(rng, win)
    crs, p = shape.c * shape.r * shape.s, shape.out_h * shape.out_w
    w = as_f32(rng, (shape.k, shape.c, shape.r, shape.s), 2.0 / np.sqrt(crs))
    dy = as_f32(rng, (shape.n, shape.k, shape.out_h, shape.out_w))
    bcol, bdx = bufs.empty(im2col.col_size(shape)), bufs.empty(shape.x_size)
    run(device.queue, [
        gemm.gemm(lib, bufs.up(w), bufs.up(dy), bcol, m=crs, n=p, k=shape.k, trans_a=True,
                  batch=shape.n, stride_a=0, stride_b=shape.k * p, stride_c=crs * p),
        *im2col.col2im(lib, bcol, bdx, shape=shape),
    ])
    expected = conv_ref.conv2d_backward_data(dy, w, shape)
    assert_close(bufs.down(bdx, expected.shape), expected)


@pytest.mark.parametrize("style", STYLES)
def test_kernels_write_nothing_past_their_tensors(device, lib, bufs, rng, style: str):
    """In training the tensors are sub-buffers of one arena: the element after each must stay."""
    shape = random_shape(rng, Window(3, 3, 2, 1, 1, 2), same_channels=False)
    tail, sentinel = 64, 7.25
    size = im2col.col_size(shape)

    def padded(count: int, values: np.ndarray | None = None):
        data = np.full(count + tail, sentinel, np.float32)
        data[:count] = np.nan if values is None else values.reshape(-1)
        return bufs.up(data)

    x, col = _x(rng, shape), _col(rng, shape)
    bcol, bdx, by = padded(size), padded(shape.x_size), padded(shape.x_size, x)
    tuning = STYLES[style]
    run(device.queue, [
        *im2col.im2col(lib, bufs.up(x), bcol, shape=shape, tuning=tuning),
        *im2col.col2im(lib, bufs.up(col), bdx, shape=shape, tuning=tuning),
        *im2col.bias_activation(lib, by, bufs.up(as_f32(rng, (shape.c,))), n=shape.n, c=shape.c,
                                hw=shape.h * shape.w, activation="relu", tuning=tuning),
    ])
    for buf, count in ((bcol, size), (bdx, shape.x_size), (by, shape.x_size)):
        values = bufs.down(buf, count + tail)
        assert np.all(np.isfinite(values[:count]))
        assert np.all(values[count:] == sentinel)


def test_tuning_defines_change_the_blocking_not_the_result(device, lib, bufs, rng):
    tuning = {"IM2COL_WG": 32, "IM2COL_ROWS": 3, "IM2COL_RUN": 5, "COL2IM_WG": 16,
              "COL2IM_PLANES": 3, "BIAS_ACT_WG": 32, "BIAS_ACT_PLANES": 5, "BIAS_ACT_RUN": 3}
    shape = _shape(rng, Window(3, 3, 2, 1, 1, 1))
    x, col = _x(rng, shape), _col(rng, shape)
    b = as_f32(rng, (shape.c,))
    bcol, bdx, by = bufs.empty(im2col.col_size(shape)), bufs.empty(shape.x_size), bufs.up(x)
    hw = shape.h * shape.w
    run(device.queue, [
        *im2col.im2col(lib, bufs.up(x), bcol, shape=shape, tuning=tuning),
        *im2col.col2im(lib, bufs.up(col), bdx, shape=shape, tuning=tuning),
        *im2col.bias_activation(lib, by, bufs.up(b), n=shape.n, c=shape.c, hw=hw,
                                activation="relu6", tuning=tuning),
    ])
    np.testing.assert_array_equal(bufs.down(bcol, col.shape), ref.im2col(x, shape))
    assert_close(bufs.down(bdx, x.shape), ref.col2im(col, shape))
    expected = ref.bias_activation(x, b, n=shape.n, c=shape.c, hw=hw, activation="relu6")
    assert_close(bufs.down(by, expected.shape), expected)


def test_launches_report_work_and_keep_their_buffers(lib, bufs):
    shape = ConvShape(n=2, c=3, h=3, w=3, k=1, r=3, s=3, pad_h=1, pad_w=1)
    # Each 3-long axis meets 7 of its 9 (offset, position) pairs inside the image.
    assert im2col.inside_taps(shape) == 2 * 3 * 7 * 7
    assert im2col.covered_inputs(shape) == shape.x_size
    x, col = bufs.empty(shape.x_size), bufs.empty(im2col.col_size(shape))
    (launch,) = im2col.im2col(lib, x, col, shape=shape)
    assert (launch.name, launch.flops) == ("im2col", 0)
    assert launch.bytes_moved == 4 * (shape.x_size + 2 * 27 * 9)
    assert launch.keep_alive == [x, col]
    (launch,) = im2col.col2im(lib, col, x, shape=shape)
    assert launch.flops == 2 * 3 * 49
    assert launch.bytes_moved == 4 * (2 * 3 * 49 + shape.x_size)
    assert launch.keep_alive == [col, x]
    (launch,) = im2col.bias_activation(lib, x, None, n=2, c=3, hw=9, activation="relu")
    assert (launch.flops, launch.bytes_moved, launch.keep_alive) == (54, 8 * 54, [x])


@pytest.mark.parametrize("win", CONV_WINDOWS, ids=str)
def test_work_counts_match_the_reference(rng, win: Window):
    """inside_taps counts the col elements that come from the image, covered_inputs the input
    elements some window reads: both read off im2col of an all-ones input."""
    shape = _shape(rng, win)
    col = ref.im2col(np.ones((shape.n, shape.c, shape.h, shape.w)), shape)
    assert im2col.inside_taps(shape) == np.count_nonzero(col)
    assert im2col.covered_inputs(shape) == np.count_nonzero(ref.col2im(col, shape))


def test_bad_arguments_are_clear_errors(lib, bufs):
    shape = ConvShape(n=1, c=1, h=4, w=4, k=1, r=3, s=3)
    x, col = bufs.empty(16), bufs.empty(36)
    with pytest.raises(ValueError, match="Unknown activation"):
        im2col.bias_activation(lib, x, None, n=1, c=1, hw=16, activation="gelu")
    with pytest.raises(ValueError, match="positive int"):
        im2col.bias_activation(lib, x, None, n=1, c=0, hw=16, activation="relu")
    with pytest.raises(ValueError, match="Unknown tuning define"):
        im2col.im2col(lib, x, col, shape=shape, tuning={"TILE": 8})
    with pytest.raises(ValueError, match="positive int"):
        im2col.col2im(lib, col, x, shape=shape, tuning={"COL2IM_PLANES": 0})
    too_big = lib.device.max_work_group_size + 1
    with pytest.raises(ValueError, match="work-items"):
        im2col.im2col(lib, x, col, shape=shape, tuning={"IM2COL_WG": too_big})
