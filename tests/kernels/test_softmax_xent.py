"""Fused softmax cross-entropy against its float64 reference and finite differences."""

from __future__ import annotations

import numpy as np
import pytest

from kernels import softmax_xent as xent
from kernels.launch import run
from kernels.library import KernelLibrary
from kernels.reference import softmax_xent as ref
from tests.kernels.conftest import assert_close, numeric_grad, odd_sizes, scale

# Row layouts: the default for the class count, one lane per row, a row split over many lanes,
# and a small work-group so that rows take several passes.
LAYOUTS = [None, {"XENT_LANES": 1}, {"XENT_LANES": 16}, {"XENT_GROUP": 16, "XENT_LANES": 4}]


def _labels(rng, n, c, ignored_fraction=0.2):
    labels = rng.integers(0, c, n).astype(np.int32)
    labels[rng.random(n) < ignored_fraction] = -1
    return labels


def _shapes(rng):
    n = odd_sizes(rng, 1, 3, scale(300, 20))[0]
    c = odd_sizes(rng, 1, 5, scale(70, 12))[0]
    return [(n, c), (1, c), (n, 1), (n, 2)]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_gradient_and_statistics_match_reference(device, lib, bufs, rng, layout):
    for n, c in _shapes(rng):
        logits = rng.normal(0, 3, (n, c)).astype(np.float32)
        labels = _labels(rng, n, c)
        start = np.array([1.5, 2.0, 3.0], np.float32)
        bdlogits, bstats = bufs.empty(n * c), bufs.up(start)
        run(device.queue, xent.softmax_xent(
            lib, bufs.up(logits), bufs.up(labels), bdlogits, bstats, n=n, c=c, grad_scale=0.37,
            defines=layout,
        ))
        assert_close(bufs.down(bdlogits, (n, c)), ref.softmax_xent_grad(logits, labels, 0.37))
        stats = bufs.down(bstats, 3)
        expected = ref.softmax_xent_stats(logits, labels)
        assert_close(stats[:1], start[:1] + expected[:1])
        assert np.array_equal(stats[1:], start[1:] + expected[1:])


@pytest.mark.parametrize("layout", LAYOUTS[:3])
def test_eval_adds_the_same_statistics(device, lib, bufs, rng, layout):
    for n, c in _shapes(rng):
        logits = rng.normal(0, 3, (n, c)).astype(np.float32)
        labels = _labels(rng, n, c)
        bstats = bufs.up(np.zeros(3, np.float32))
        launches = xent.softmax_xent_eval(
            lib, bufs.up(logits), bufs.up(labels), bstats, n=n, c=c, defines=layout
        )
        run(device.queue, launches + launches)  # accumulates across steps
        stats = bufs.down(bstats, 3)
        expected = 2 * ref.softmax_xent_stats(logits, labels)
        assert_close(stats[:1], expected[:1])
        assert np.array_equal(stats[1:], expected[1:])


@pytest.mark.parametrize("shape", [(5, 7), (3, 1), (4, 33)])
def test_gradient_is_that_of_the_mean_loss(device, lib, bufs, rng, shape):
    n, c = shape
    logits = rng.normal(0, 2, shape)
    labels = _labels(rng, n, c, ignored_fraction=0.3)
    labels[0] = 0  # at least one counted row
    counted = int(np.sum(labels != -1))

    def mean_loss(z):
        return float(ref.softmax_xent(z, labels)[0].sum()) / counted

    bdlogits = bufs.empty(n * c)
    run(device.queue, xent.softmax_xent(
        lib, bufs.up(logits), bufs.up(labels), bdlogits, bufs.up(np.zeros(3, np.float32)),
        n=n, c=c, grad_scale=1.0 / counted,
    ))
    z32 = logits.astype(np.float32).astype(np.float64)
    assert_close(bufs.down(bdlogits, shape), numeric_grad(mean_loss, z32), rtol=2e-3)


def test_ties_go_to_the_first_maximum_and_ignored_rows_are_zero(device, lib, bufs):
    logits = np.array([[1, 3, 3, 0], [1, 3, 3, 0], [5, 5, 5, 5], [0, 1, 2, 3]], np.float32)
    labels = np.array([1, 2, 0, -1], np.int32)
    bdlogits, bstats = bufs.empty(16), bufs.up(np.zeros(3, np.float32))
    run(device.queue, xent.softmax_xent(
        lib, bufs.up(logits), bufs.up(labels), bdlogits, bstats, n=4, c=4, grad_scale=1.0,
        defines={"XENT_LANES": 2},
    ))
    stats = bufs.down(bstats, 3)
    assert stats[1:].tolist() == [2.0, 3.0]
    assert np.all(bufs.down(bdlogits, (4, 4))[3] == 0.0)


def test_large_logits_stay_finite(device, lib, bufs, rng):
    n, c = 9, 13
    logits = (rng.normal(0, 1, (n, c)) * 1e3 + 5e3).astype(np.float32)
    labels = _labels(rng, n, c, ignored_fraction=0.0)
    bdlogits, bstats = bufs.empty(n * c), bufs.up(np.zeros(3, np.float32))
    run(device.queue, xent.softmax_xent(
        lib, bufs.up(logits), bufs.up(labels), bdlogits, bstats, n=n, c=c, grad_scale=1.0
    ))
    assert_close(bufs.down(bdlogits, (n, c)), ref.softmax_xent_grad(logits, labels, 1.0))
    assert_close(bufs.down(bstats, 3), ref.softmax_xent_stats(logits, labels))


def test_statistics_are_reproducible_bit_for_bit(device, lib, bufs, rng):
    n, c = scale(201, 19), 11
    logits = rng.normal(0, 3, (n, c)).astype(np.float32)
    labels = _labels(rng, n, c)
    results = []
    for _ in range(2):
        bstats = bufs.up(np.zeros(3, np.float32))
        run(device.queue, xent.softmax_xent(
            lib, bufs.up(logits), bufs.up(labels), bufs.empty(n * c), bstats, n=n, c=c,
            grad_scale=1.0,
        ))
        results.append(bufs.down(bstats, 3))
    assert results[0].tobytes() == results[1].tobytes()


def test_a_label_out_of_range_shows_as_nan_loss(device, lib, bufs, rng):
    logits = rng.normal(size=(3, 5)).astype(np.float32)
    labels = np.array([1, 5, -1], np.int32)
    bdlogits, bstats = bufs.empty(15), bufs.up(np.zeros(3, np.float32))
    run(device.queue, xent.softmax_xent(
        lib, bufs.up(logits), bufs.up(labels), bdlogits, bstats, n=3, c=5, grad_scale=1.0
    ))
    stats = bufs.down(bstats, 3)
    assert np.isnan(stats[0]) and stats[2] == 2.0
    assert np.all(np.isnan(bufs.down(bdlogits, (3, 5))[1]))


def test_layout_defines_are_checked(lib, bufs):
    b = bufs.empty(4)
    with pytest.raises(ValueError, match="powers of two"):
        xent.softmax_xent(lib, b, b, b, b, n=2, c=2, grad_scale=1.0, defines={"XENT_LANES": 3})


class _NarrowKernels:
    """A library whose kernels report a work-group limit below the requested group size."""

    group_kernel = KernelLibrary.group_kernel  # the real check, over the narrow kernels

    def __init__(self, lib, limit: int):
        self.device, self._lib, self._limit = lib.device, lib, limit

    def kernel(self, program, name, defines=None):
        limit, kernel = self._limit, self._lib.kernel(program, name, defines)

        class Narrow:
            def get_work_group_info(self, _param, _device):
                return limit

            def __getattr__(self, attr):
                return getattr(kernel, attr)

        return Narrow()


def test_a_group_above_the_kernel_limit_is_a_clear_error(lib, bufs):
    b = bufs.empty(4)
    with pytest.raises(ValueError, match="smaller XENT_GROUP"):
        xent.softmax_xent(_NarrowKernels(lib, 32), b, b, b, b, n=2, c=2, grad_scale=1.0,
                          defines={"XENT_GROUP": 64})
