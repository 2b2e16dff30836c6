"""Conv2d kernels against their float64 references and finite differences."""

from __future__ import annotations

import numpy as np
import pytest

from kernels import conv2d
from kernels.conv_shape import ConvShape
from kernels.launch import run
from kernels.reference import conv2d as ref
from tests.kernels.conftest import FD_RTOL, assert_close, numeric_grad
from tests.kernels.conv_cases import CONV_WINDOWS, Window, as_f32, random_shape

ACTIVATIONS = [None, "relu", "relu6"]


def _weights(rng, shape: ConvShape) -> tuple[np.ndarray, np.ndarray]:
    fan_in = shape.c * shape.r * shape.s
    w = as_f32(rng, (shape.k, shape.c, shape.r, shape.s), 2.0 / np.sqrt(fan_in))
    return w, as_f32(rng, (shape.k,))


def _dy(rng, shape: ConvShape) -> np.ndarray:
    return as_f32(rng, (shape.n, shape.k, shape.out_h, shape.out_w))


def test_reference_forward_matches_direct_sum(rng):
    """The reference itself, against the definition written out as loops."""
    shape = ConvShape(n=2, c=3, h=5, w=7, k=2, r=3, s=2, stride_h=2, stride_w=1, pad_h=1, pad_w=2)
    x = rng.normal(size=(2, 3, 5, 7))
    w, b = rng.normal(size=(2, 3, 3, 2)), rng.normal(size=2)
    expected = np.zeros((2, 2, shape.out_h, shape.out_w))
    for n, k, oh, ow, c, r, s in np.ndindex(2, 2, shape.out_h, shape.out_w, 3, 3, 2):
        ih, iw = oh * 2 - 1 + r, ow - 2 + s
        if 0 <= ih < 5 and 0 <= iw < 7:
            expected[n, k, oh, ow] += x[n, c, ih, iw] * w[k, c, r, s]
    expected += b[None, :, None, None]
    np.testing.assert_allclose(ref.conv2d_forward(x, w, b, shape), expected, rtol=1e-12)


@pytest.mark.parametrize("win", CONV_WINDOWS, ids=str)
def test_forward_matches_reference(device, lib, bufs, rng, win: Window):
    for activation in ACTIVATIONS:
        shape = random_shape(rng, win, same_channels=False)
        x = as_f32(rng, (shape.n, shape.c, shape.h, shape.w), 3.0)
        w, b = _weights(rng, shape)
        with_bias = activation != "relu"  # one activation runs without a bias
        by = bufs.empty(shape.y_size)
        run(device.queue, conv2d.conv2d_forward(
            lib, bufs.up(x), bufs.up(w), bufs.up(b) if with_bias else None, by,
            shape=shape, activation=activation,
        ))
        expected = ref.conv2d_forward(x, w, b if with_bias else None, shape, activation)
        assert_close(bufs.down(by, expected.shape), expected)


def test_fused_relu6_clamps_both_ends(device, lib, bufs, rng):
    shape = ConvShape(n=1, c=3, h=7, w=9, k=5, r=3, s=3, pad_h=1, pad_w=1)
    x = as_f32(rng, (1, 3, 7, 9), 6.0)
    w, b = _weights(rng, shape)
    by = bufs.empty(shape.y_size)
    run(device.queue, conv2d.conv2d_forward(
        lib, bufs.up(x), bufs.up(w), bufs.up(b), by, shape=shape, activation="relu6"
    ))
    y = bufs.down(by, (1, 5, shape.out_h, shape.out_w))
    assert np.any(y == 0.0) and np.any(y == 6.0) and np.any((y > 0) & (y < 6))
    assert_close(y, ref.conv2d_forward(x, w, b, shape, "relu6"))


@pytest.mark.parametrize("win", CONV_WINDOWS, ids=str)
def test_backward_data_matches_reference(device, lib, bufs, rng, win: Window):
    shape = random_shape(rng, win, same_channels=False)
    w, _ = _weights(rng, shape)
    dy = _dy(rng, shape)
    bdx = bufs.empty(shape.x_size)
    run(device.queue, conv2d.conv2d_backward_data(lib, bufs.up(dy), bufs.up(w), bdx, shape=shape))
    expected = ref.conv2d_backward_data(dy, w, shape)
    assert_close(bufs.down(bdx, expected.shape), expected)


@pytest.mark.parametrize("win", CONV_WINDOWS, ids=str)
def test_backward_weight_matches_reference(device, lib, bufs, rng, win: Window):
    shape = random_shape(rng, win, same_channels=False)
    x = as_f32(rng, (shape.n, shape.c, shape.h, shape.w))
    dy = _dy(rng, shape)
    w_shape = (shape.k, shape.c, shape.r, shape.s)
    bdw, bdb = bufs.empty(int(np.prod(w_shape))), bufs.empty(shape.k)
    run(device.queue, conv2d.conv2d_backward_weight(
        lib, bufs.up(x), bufs.up(dy), bdw, bdb, shape=shape
    ))
    dw, db = ref.conv2d_backward_weight(x, dy, shape)
    assert_close(bufs.down(bdw, w_shape), dw)
    assert_close(bufs.down(bdb, shape.k), db)


@pytest.mark.parametrize("with_bias", [True, False], ids=["bias", "no-bias"])
def test_backward_weight_accumulates_micro_batches(device, lib, bufs, rng, with_bias: bool):
    shape = random_shape(rng, Window(3, 3, 2, 1, 1, 1), same_channels=False)
    x = as_f32(rng, (shape.n, shape.c, shape.h, shape.w))
    w_shape = (shape.k, shape.c, shape.r, shape.s)
    dw0, db0 = as_f32(rng, w_shape), as_f32(rng, (shape.k,))
    bdw, bdb = bufs.up(dw0), bufs.up(db0)
    dy = _dy(rng, shape)
    run(device.queue, conv2d.conv2d_backward_weight(
        lib, bufs.up(x), bufs.up(dy), bdw, bdb if with_bias else None, shape=shape,
        accumulate=True,
    ))
    dw, db = ref.conv2d_backward_weight(x, dy, shape)
    assert_close(bufs.down(bdw, w_shape), dw0 + dw)
    # Without a bias the bias gradient is left alone.
    assert_close(bufs.down(bdb, shape.k), db0 + db if with_bias else db0)


@pytest.mark.parametrize(
    "shape",
    [
        ConvShape(n=2, c=3, h=5, w=6, k=2, r=3, s=3, stride_h=2, stride_w=2, pad_h=1, pad_w=1),
        ConvShape(n=1, c=2, h=1, w=9, k=3, r=1, s=5, stride_w=2, pad_w=2),
        ConvShape(n=1, c=2, h=7, w=4, k=3, r=5, s=2, stride_h=2, pad_h=2),
    ],
    ids=["3x3-stride2-pad1", "1d-1x5", "5x2"],
)
def test_backward_matches_finite_differences(device, lib, bufs, rng, shape: ConvShape):
    x = rng.normal(size=(shape.n, shape.c, shape.h, shape.w))
    w, b = _weights(rng, shape)
    g = rng.normal(size=(shape.n, shape.k, shape.out_h, shape.out_w))

    def loss(x_, w_, b_):
        return float(np.sum(ref.conv2d_forward(x_, w_, b_, shape) * g))

    x32 = x.astype(np.float32).astype(np.float64)
    bdx = bufs.empty(shape.x_size)
    bdw, bdb = bufs.empty(w.size), bufs.empty(shape.k)
    bg = bufs.up(g)
    run(device.queue, [
        *conv2d.conv2d_backward_data(lib, bg, bufs.up(w), bdx, shape=shape),
        *conv2d.conv2d_backward_weight(lib, bufs.up(x32), bg, bdw, bdb, shape=shape),
    ])
    assert_close(bufs.down(bdx, x.shape), numeric_grad(lambda v: loss(v, w, b), x32), FD_RTOL)
    assert_close(bufs.down(bdw, w.shape), numeric_grad(lambda v: loss(x32, v, b), w), FD_RTOL)
    assert_close(bufs.down(bdb, b.shape), numeric_grad(lambda v: loss(x32, w, v), b), FD_RTOL)


def test_tuning_defines_change_the_blocking_not_the_result(device, lib, bufs, rng):
    tuning = {"FWD_KB": 3, "FWD_PB": 5, "FWD_WG_P": 8, "FWD_WG_K": 2, "BWD_CB": 2, "BWD_PB": 3,
              "BWD_WG_P": 32, "BWD_WG_C": 1, "BWW_KB": 2, "BWW_CB": 5, "BWW_WG": 24, "BIAS_WG": 32}
    shape = random_shape(rng, Window(3, 3, 2, 1, 1, 1), same_channels=False)
    x = as_f32(rng, (shape.n, shape.c, shape.h, shape.w))
    w, b = _weights(rng, shape)
    dy = _dy(rng, shape)
    by, bdx = bufs.empty(shape.y_size), bufs.empty(shape.x_size)
    bdw, bdb = bufs.empty(w.size), bufs.empty(shape.k)
    bx, bw, bdy = bufs.up(x), bufs.up(w), bufs.up(dy)
    run(device.queue, [
        *conv2d.conv2d_forward(lib, bx, bw, bufs.up(b), by, shape=shape, tuning=tuning),
        *conv2d.conv2d_backward_data(lib, bdy, bw, bdx, shape=shape, tuning=tuning),
        *conv2d.conv2d_backward_weight(lib, bx, bdy, bdw, bdb, shape=shape, tuning=tuning),
    ])
    y = ref.conv2d_forward(x, w, b, shape)
    assert_close(bufs.down(by, y.shape), y)
    assert_close(bufs.down(bdx, x.shape), ref.conv2d_backward_data(dy, w, shape))
    dw, db = ref.conv2d_backward_weight(x, dy, shape)
    assert_close(bufs.down(bdw, w.shape), dw)
    assert_close(bufs.down(bdb, db.shape), db)


def test_launches_report_work_and_keep_their_buffers(lib, bufs):
    shape = ConvShape(n=2, c=3, h=8, w=8, k=4, r=3, s=3, pad_h=1, pad_w=1)
    x, w, y = bufs.empty(shape.x_size), bufs.empty(4 * 3 * 9), bufs.empty(shape.y_size)
    (launch,) = conv2d.conv2d_forward(lib, x, w, None, y, shape=shape)
    assert launch.flops == 2 * (2 * 4 * 8 * 8) * (3 * 3 * 3)
    assert launch.bytes_moved == 4 * (shape.x_size + 4 * 3 * 9 + shape.y_size)
    assert launch.keep_alive == [x, w, y]
    launches = conv2d.conv2d_backward_weight(lib, x, y, w, bufs.empty(4), shape=shape)
    assert [item.name for item in launches] == ["conv2d_backward_weight", "channel_bias_backward"]


def test_bad_arguments_are_clear_errors(lib, bufs):
    with pytest.raises(ValueError, match="positive int"):
        ConvShape(n=1, c=0, h=4, w=4, k=1, r=1, s=1)
    with pytest.raises(ValueError, match="output would be empty"):
        ConvShape(n=1, c=1, h=2, w=9, k=1, r=3, s=3)
    shape = ConvShape(n=1, c=1, h=4, w=4, k=1, r=3, s=3)
    x, w, y = bufs.empty(16), bufs.empty(9), bufs.empty(4)
    with pytest.raises(ValueError, match="Unknown activation"):
        conv2d.conv2d_forward(lib, x, w, None, y, shape=shape, activation="gelu")
    with pytest.raises(ValueError, match="Unknown tuning define"):
        conv2d.conv2d_forward(lib, x, w, None, y, shape=shape, tuning={"TILE": 8})
    too_big = lib.device.max_work_group_size + 1
    with pytest.raises(ValueError, match="work-items"):
        conv2d.conv2d_forward(lib, x, w, None, y, shape=shape, tuning={"FWD_WG_P": too_big})
    with pytest.raises(ValueError, match="power of two"):
        conv2d.conv2d_backward_weight(
            lib, x, y, w, bufs.empty(1), shape=shape, tuning={"BIAS_WG": 48}
        )
    with pytest.raises(ValueError, match="local memory"):
        conv2d.conv2d_backward_weight(
            lib, x, y, w, None, shape=shape, tuning={"BWW_KB": 8, "BWW_CB": 8, "BWW_WG": 128}
        )
