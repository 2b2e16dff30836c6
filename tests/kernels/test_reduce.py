"""Bias-gradient reductions against float64 references and finite differences."""

from __future__ import annotations

import numpy as np
import pytest

from kernels import reduce
from kernels.launch import run
from kernels.reference import reduce as ref
from kernels.reference.gemm import linear_forward
from tests.kernels.conftest import assert_close, numeric_grad, odd_sizes, scale


def _row_shapes(rng) -> list[tuple[int, int]]:
    high = scale(300, 40)
    shapes = [tuple(odd_sizes(rng, 2, 1, high)) for _ in range(scale(3, 2))]
    return shapes + [(1, 1), (scale(4099, 67), 1), (1, scale(263, 19)), (scale(257, 17), 3)]


def _channel_shapes(rng) -> list[tuple[int, int, int]]:
    shapes = [tuple(odd_sizes(rng, 3, 1, scale(60, 12))) for _ in range(scale(3, 2))]
    # hw = 1 (a Linear output seen as channels), a single image, and hw above the group size.
    return shapes + [(scale(37, 5), 11, 1), (1, 5, scale(331, 23)), (2, 3, scale(1031, 67))]


@pytest.mark.parametrize("accumulate", [False, True])
def test_sum_rows_matches_reference(device, lib, bufs, rng, accumulate):
    for rows, cols in _row_shapes(rng):
        x = rng.normal(size=rows * cols).astype(np.float32)
        before = rng.normal(size=cols).astype(np.float32)
        out = bufs.up(before) if accumulate else bufs.empty(cols)
        run(device.queue, [reduce.sum_rows(lib, bufs.up(x), out, rows=rows, cols=cols,
                                           accumulate=accumulate)])
        expected = ref.sum_rows(x, rows=rows, cols=cols, out=before, accumulate=accumulate)
        assert_close(bufs.down(out, cols), expected)


@pytest.mark.parametrize("accumulate", [False, True])
def test_sum_channels_matches_reference(device, lib, bufs, rng, accumulate):
    for n, c, hw in _channel_shapes(rng):
        x = rng.normal(size=n * c * hw).astype(np.float32)
        before = rng.normal(size=c).astype(np.float32)
        out = bufs.up(before) if accumulate else bufs.empty(c)
        run(device.queue, [reduce.sum_channels(lib, bufs.up(x), out, n=n, c=c, hw=hw,
                                               accumulate=accumulate)])
        expected = ref.sum_channels(x, n=n, c=c, hw=hw, out=before, accumulate=accumulate)
        assert_close(bufs.down(out, c), expected)


def test_results_are_identical_from_run_to_run(device, lib, bufs, rng):
    rows, cols = scale(2001, 33), 7
    x = bufs.up(rng.normal(size=rows * cols).astype(np.float32))
    first, second = bufs.empty(cols), bufs.empty(cols)
    run(device.queue, [reduce.sum_rows(lib, x, first, rows=rows, cols=cols),
                       reduce.sum_rows(lib, x, second, rows=rows, cols=cols)])
    assert np.array_equal(bufs.down(first, cols), bufs.down(second, cols))
    n, c, hw = 3, 5, scale(301, 29)
    y = bufs.up(rng.normal(size=n * c * hw).astype(np.float32))
    first, second = bufs.empty(c), bufs.empty(c)
    run(device.queue, [reduce.sum_channels(lib, y, first, n=n, c=c, hw=hw),
                       reduce.sum_channels(lib, y, second, n=n, c=c, hw=hw)])
    assert np.array_equal(bufs.down(first, c), bufs.down(second, c))


def test_sum_rows_is_the_linear_bias_gradient(device, lib, bufs, rng):
    batch, fin, fout = 6, 4, 5
    x, w, bias = rng.normal(size=(batch, fin)), rng.normal(size=(fout, fin)), rng.normal(size=fout)
    g = rng.normal(size=(batch, fout))
    numeric = numeric_grad(lambda b: float(np.sum(linear_forward(x, w, b) * g)), bias)
    out = bufs.empty(fout)
    run(device.queue, [reduce.sum_rows(lib, bufs.up(g), out, rows=batch, cols=fout)])
    assert_close(bufs.down(out, fout), numeric, rtol=2e-3)


def test_sum_channels_is_the_convolution_bias_gradient(device, lib, bufs, rng):
    n, c, hw = 2, 3, 5
    y, g = rng.normal(size=(n, c, hw)), rng.normal(size=(n, c, hw))
    numeric = numeric_grad(lambda b: float(np.sum((y + b.reshape(1, c, 1)) * g)), np.zeros(c))
    out = bufs.empty(c)
    run(device.queue, [reduce.sum_channels(lib, bufs.up(g), out, n=n, c=c, hw=hw)])
    assert_close(bufs.down(out, c), numeric, rtol=2e-3)


def test_launches_fit_the_device_and_report_their_work(lib, bufs):
    limit = lib.device.max_work_group_size
    rows_launch = reduce.sum_rows(lib, bufs.empty(300), bufs.empty(3), rows=100, cols=3)
    channels_launch = reduce.sum_channels(lib, bufs.empty(60), bufs.empty(4), n=3, c=4, hw=5,
                                          accumulate=True)
    for launch in (rows_launch, channels_launch):
        assert int(np.prod(launch.local_size)) <= limit
        assert len(launch.keep_alive) == 2
    assert rows_launch.flops == 300 and rows_launch.bytes_moved == 4 * (300 + 3)
    assert channels_launch.flops == 60 + 4 and channels_launch.bytes_moved == 4 * (60 + 8)


@pytest.mark.parametrize("sizes", [dict(rows=0, cols=3), dict(rows=3, cols=0)])
def test_empty_rows_are_clear_errors(lib, bufs, sizes):
    with pytest.raises(ValueError, match="positive sizes"):
        reduce.sum_rows(lib, bufs.empty(1), bufs.empty(1), **sizes)


@pytest.mark.parametrize(
    "sizes", [dict(n=0, c=2, hw=2), dict(n=2, c=0, hw=2), dict(n=2, c=2, hw=0)]
)
def test_empty_channels_are_clear_errors(lib, bufs, sizes):
    with pytest.raises(ValueError, match="positive sizes"):
        reduce.sum_channels(lib, bufs.empty(1), bufs.empty(1), **sizes)
