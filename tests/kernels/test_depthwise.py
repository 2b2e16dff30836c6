"""Depthwise Conv2d kernels against their float64 references and finite differences."""

from __future__ import annotations

import numpy as np
import pytest

from kernels import depthwise
from kernels.conv_shape import ConvShape
from kernels.launch import run
from kernels.reference import depthwise as ref
from tests.kernels.conftest import FD_RTOL, assert_close, numeric_grad, scale
from tests.kernels.conv_cases import CONV_WINDOWS, Window, as_f32, random_shape

ACTIVATIONS = [None, "relu", "relu6"]


def _weights(rng, shape: ConvShape) -> tuple[np.ndarray, np.ndarray]:
    w = as_f32(rng, (shape.c, 1, shape.r, shape.s), 2.0 / np.sqrt(shape.r * shape.s))
    return w, as_f32(rng, (shape.c,))


def _dy(rng, shape: ConvShape) -> np.ndarray:
    return as_f32(rng, (shape.n, shape.c, shape.out_h, shape.out_w))


def test_reference_forward_matches_direct_sum(rng):
    """The reference itself, against the definition written out as loops."""
    shape = ConvShape(n=2, c=3, h=5, w=6, k=3, r=2, s=3, stride_h=1, stride_w=2, pad_h=1, pad_w=1)
    x = rng.normal(size=(2, 3, 5, 6))
    w, b = rng.normal(size=(3, 1, 2, 3)), rng.normal(size=3)
    expected = np.zeros((2, 3, shape.out_h, shape.out_w))
    for n, c, oh, ow, r, s in np.ndindex(2, 3, shape.out_h, shape.out_w, 2, 3):
        ih, iw = oh - 1 + r, ow * 2 - 1 + s
        if 0 <= ih < 5 and 0 <= iw < 6:
            expected[n, c, oh, ow] += x[n, c, ih, iw] * w[c, 0, r, s]
    expected += b[None, :, None, None]
    np.testing.assert_allclose(ref.depthwise_forward(x, w, b, shape), expected, rtol=1e-12)


@pytest.mark.parametrize("win", CONV_WINDOWS, ids=str)
def test_forward_matches_reference(device, lib, bufs, rng, win: Window):
    for activation in ACTIVATIONS:
        shape = random_shape(rng, win, same_channels=True)
        x = as_f32(rng, (shape.n, shape.c, shape.h, shape.w), 4.0)
        w, b = _weights(rng, shape)
        with_bias = activation != "relu"  # one activation runs without a bias
        by = bufs.empty(shape.y_size)
        run(device.queue, depthwise.depthwise_forward(
            lib, bufs.up(x), bufs.up(w), bufs.up(b) if with_bias else None, by,
            shape=shape, activation=activation,
        ))
        expected = ref.depthwise_forward(x, w, b if with_bias else None, shape, activation)
        assert_close(bufs.down(by, expected.shape), expected)


@pytest.mark.parametrize("win", CONV_WINDOWS, ids=str)
def test_backward_data_matches_reference(device, lib, bufs, rng, win: Window):
    shape = random_shape(rng, win, same_channels=True)
    w, _ = _weights(rng, shape)
    dy = _dy(rng, shape)
    bdx = bufs.empty(shape.x_size)
    run(device.queue, depthwise.depthwise_backward_data(
        lib, bufs.up(dy), bufs.up(w), bdx, shape=shape
    ))
    expected = ref.depthwise_backward_data(dy, w, shape)
    assert_close(bufs.down(bdx, expected.shape), expected)


@pytest.mark.parametrize("win", CONV_WINDOWS, ids=str)
def test_backward_weight_matches_reference(device, lib, bufs, rng, win: Window):
    shape = random_shape(rng, win, same_channels=True)
    x = as_f32(rng, (shape.n, shape.c, shape.h, shape.w))
    dy = _dy(rng, shape)
    w_shape = (shape.c, 1, shape.r, shape.s)
    bdw, bdb = bufs.empty(int(np.prod(w_shape))), bufs.empty(shape.c)
    run(device.queue, depthwise.depthwise_backward_weight(
        lib, bufs.up(x), bufs.up(dy), bdw, bdb, shape=shape
    ))
    dw, db = ref.depthwise_backward_weight(x, dy, shape)
    assert_close(bufs.down(bdw, w_shape), dw)
    assert_close(bufs.down(bdb, shape.c), db)


@pytest.mark.parametrize("with_bias", [True, False], ids=["bias", "no-bias"])
def test_backward_weight_accumulates_micro_batches(device, lib, bufs, rng, with_bias: bool):
    shape = random_shape(rng, Window(3, 3, 1, 2, 1, 1), same_channels=True)
    x = as_f32(rng, (shape.n, shape.c, shape.h, shape.w))
    w_shape = (shape.c, 1, shape.r, shape.s)
    dw0, db0 = as_f32(rng, w_shape), as_f32(rng, (shape.c,))
    bdw, bdb = bufs.up(dw0), bufs.up(db0)
    dy = _dy(rng, shape)
    run(device.queue, depthwise.depthwise_backward_weight(
        lib, bufs.up(x), bufs.up(dy), bdw, bdb if with_bias else None, shape=shape,
        accumulate=True,
    ))
    dw, db = ref.depthwise_backward_weight(x, dy, shape)
    assert_close(bufs.down(bdw, w_shape), dw0 + dw)
    # Without a bias the bias gradient is left alone.
    assert_close(bufs.down(bdb, shape.c), db0 + db if with_bias else db0)


@pytest.mark.parametrize(
    "shape",
    [
        ConvShape(n=2, c=3, h=5, w=6, k=3, r=3, s=3, stride_h=2, stride_w=2, pad_h=1, pad_w=1),
        ConvShape(n=1, c=2, h=1, w=9, k=2, r=1, s=5, stride_w=2, pad_w=2),
        ConvShape(n=1, c=2, h=7, w=5, k=2, r=5, s=2, stride_h=2, pad_h=2, pad_w=1),
    ],
    ids=["3x3-stride2-pad1", "1d-1x5", "5x2"],
)
def test_backward_matches_finite_differences(device, lib, bufs, rng, shape: ConvShape):
    x = rng.normal(size=(shape.n, shape.c, shape.h, shape.w))
    w, b = _weights(rng, shape)
    g = rng.normal(size=(shape.n, shape.c, shape.out_h, shape.out_w))

    def loss(x_, w_, b_):
        return float(np.sum(ref.depthwise_forward(x_, w_, b_, shape) * g))

    x32 = x.astype(np.float32).astype(np.float64)
    bdx, bdw, bdb = bufs.empty(shape.x_size), bufs.empty(w.size), bufs.empty(shape.c)
    bg = bufs.up(g)
    run(device.queue, [
        *depthwise.depthwise_backward_data(lib, bg, bufs.up(w), bdx, shape=shape),
        *depthwise.depthwise_backward_weight(lib, bufs.up(x32), bg, bdw, bdb, shape=shape),
    ])
    assert_close(bufs.down(bdx, x.shape), numeric_grad(lambda v: loss(v, w, b), x32), FD_RTOL)
    assert_close(bufs.down(bdw, w.shape), numeric_grad(lambda v: loss(x32, v, b), w), FD_RTOL)
    assert_close(bufs.down(bdb, b.shape), numeric_grad(lambda v: loss(x32, w, v), b), FD_RTOL)


TUNINGS = [
    {"DW_FWD_PB": 1, "DW_FWD_WG": 32, "DW_BWD_PB": 16, "DW_BWD_WG": 16, "DW_BWW_PB": 2,
     "DW_BWW_RSB": 4, "DW_BWW_WG": 32},
    {"DW_FWD_PB": 16, "DW_FWD_WG": 128, "DW_BWD_PB": 1, "DW_BWD_WG": 256, "DW_BWW_PB": 16,
     "DW_BWW_RSB": 2, "DW_BWW_WG": 16},
    {"DW_FWD_PB": 2, "DW_FWD_RB": 3, "DW_FWD_WG": 7, "DW_BWD_PB": 4, "DW_BWD_RB": 5,
     "DW_BWD_WG": 5, "DW_BWW_PB": 1, "DW_BWW_RSB": 9, "DW_BWW_WG": 2},
    depthwise.GPU_DEFAULTS,
    depthwise.CPU_DEFAULTS,
]


def _run_all(device, lib, bufs, rng, shape: ConvShape, tuning=None) -> None:
    """Forward, backward-data and backward-weight with ``tuning``, against the references."""
    x = as_f32(rng, (shape.n, shape.c, shape.h, shape.w))
    w, b = _weights(rng, shape)
    dy = _dy(rng, shape)
    by, bdx = bufs.empty(shape.y_size), bufs.empty(shape.x_size)
    bdw = bufs.empty(w.size)
    bx, bw, bdy = bufs.up(x), bufs.up(w), bufs.up(dy)
    run(device.queue, [
        *depthwise.depthwise_forward(
            lib, bx, bw, bufs.up(b), by, shape=shape, activation="relu6", tuning=tuning
        ),
        *depthwise.depthwise_backward_data(lib, bdy, bw, bdx, shape=shape, tuning=tuning),
        *depthwise.depthwise_backward_weight(lib, bx, bdy, bdw, None, shape=shape, tuning=tuning),
    ])
    y = ref.depthwise_forward(x, w, b, shape, "relu6")
    assert_close(bufs.down(by, y.shape), y)
    assert_close(bufs.down(bdx, x.shape), ref.depthwise_backward_data(dy, w, shape))
    assert_close(bufs.down(bdw, w.shape), ref.depthwise_backward_weight(x, dy, shape)[0])


@pytest.mark.parametrize("tuning", TUNINGS, ids=["narrow", "wide", "odd-groups", "gpu", "cpu"])
@pytest.mark.parametrize(
    "win", [Window(3, 3, 1, 1, 1, 1), Window(3, 3, 1, 2, 1, 1)], ids=["stride1", "stride2"]
)
def test_tuning_defines_change_the_blocking_not_the_result(
    device, lib, bufs, rng, tuning, win: Window
):
    _run_all(device, lib, bufs, rng, random_shape(rng, win, same_channels=True), tuning)


def test_windows_wider_than_the_unrolled_taps(device, lib, bufs, rng):
    """More than 16 taps per window row, and more taps per work-group than are unrolled."""
    shape = ConvShape(n=2, c=3, h=1, w=scale(41, 21), k=3, r=1, s=17, pad_w=8)
    _run_all(device, lib, bufs, rng, shape)
    _run_all(device, lib, bufs, rng, shape, {"DW_BWW_RSB": 17})


def test_wide_rows_mix_vector_and_edge_blocks(device, lib, bufs, rng):
    """Rows several vectors wide: blocks inside the row, at its edges and at the tensor's ends."""
    shape = ConvShape(n=3, c=5, h=scale(9, 3), w=scale(53, 19), k=5, r=3, s=3, pad_h=1, pad_w=1)
    _run_all(device, lib, bufs, rng, shape)
    _run_all(device, lib, bufs, rng, shape, {"DW_FWD_PB": 4, "DW_BWD_PB": 2, "DW_BWW_PB": 4})


@pytest.mark.parametrize(
    "shape",
    [
        ConvShape(n=2, c=3, h=scale(19, 9), w=scale(29, 13), k=3, r=3, s=3, stride_h=3,
                  stride_w=3, pad_h=1, pad_w=1),
        ConvShape(n=3, c=2, h=scale(7, 5), w=scale(37, 17), k=2, r=2, s=5, stride_w=3, pad_w=2),
    ],
    ids=["3x3-stride3", "2x5-stride13"],
)
def test_strides_above_two(device, lib, bufs, rng, shape: ConvShape):
    """Strides with no vector path: every lane is gathered on its own."""
    _run_all(device, lib, bufs, rng, shape)
    _run_all(device, lib, bufs, rng, shape, depthwise.GPU_DEFAULTS)


def test_vector_width_must_be_a_power_of_two_up_to_16(lib, bufs):
    shape = ConvShape(n=1, c=2, h=4, w=4, k=2, r=3, s=3)
    with pytest.raises(ValueError, match="vector width"):
        depthwise.depthwise_forward(
            lib, bufs.empty(32), bufs.empty(18), None, bufs.empty(8), shape=shape,
            tuning={"DW_FWD_PB": 3},
        )


def test_channel_multiplier_other_than_one_is_refused(lib, bufs):
    shape = ConvShape(n=1, c=2, h=4, w=4, k=4, r=3, s=3)
    with pytest.raises(ValueError, match="channel multiplier 1"):
        depthwise.depthwise_forward(
            lib, bufs.empty(32), bufs.empty(18), None, bufs.empty(16), shape=shape
        )
