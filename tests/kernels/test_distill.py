"""Distillation loss against its float64 reference and finite differences."""

from __future__ import annotations

import numpy as np
import pytest

from kernels import distill
from kernels.launch import run
from kernels.reference import distill as ref
from tests.kernels.conftest import assert_close, numeric_grad, odd_sizes, scale

LAYOUTS = [
    None,
    {"DISTILL_LANES": 1},
    {"DISTILL_LANES": 8},
    {"DISTILL_GROUP": 16, "DISTILL_LANES": 4},  # several passes over the rows
]


def _shapes(rng):
    n = odd_sizes(rng, 1, 3, scale(300, 20))[0]
    c = odd_sizes(rng, 1, 7, scale(70, 14))[0]
    c_old = odd_sizes(rng, 1, 2, c)[0] if c > 3 else c
    return [(n, c_old, c), (1, c_old, c), (n, c, c), (n, 1, c)]


def _run(device, lib, bufs, logits, old, dlogits, stats, *, layout=None, **hyper):
    n, c = logits.shape
    bdlogits, bstats = bufs.up(dlogits), bufs.up(stats)
    run(device.queue, distill.distill_xent(
        lib, bufs.up(logits), bufs.up(old), bdlogits, bstats, n=n, c_old=old.shape[1], c=c,
        defines=layout, **hyper,
    ))
    return bufs.down(bdlogits, (n, c)), bufs.down(bstats, 3)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_adds_gradient_and_loss_like_the_reference(device, lib, bufs, rng, layout):
    hyper = {"temperature": 2.0, "weight": 0.7, "grad_scale": 0.25}
    for n, c_old, c in _shapes(rng):
        logits = rng.normal(0, 3, (n, c)).astype(np.float32)
        old = rng.normal(0, 3, (n, c_old)).astype(np.float32)
        ce_grad = rng.normal(size=(n, c)).astype(np.float32)
        start = np.array([2.5, 7.0, 9.0], np.float32)
        grad, stats = _run(device, lib, bufs, logits, old, ce_grad, start, layout=layout, **hyper)
        expected = ref.distill_grad(logits, old, c_old=c_old, **hyper)
        assert_close(grad[:, :c_old] - ce_grad[:, :c_old], expected[:, :c_old])
        assert np.array_equal(grad[:, c_old:], ce_grad[:, c_old:])
        loss = ref.distill_loss(logits, old, c_old=c_old, temperature=2.0, weight=0.7).sum()
        assert_close(stats[:1] - start[:1], np.array([loss]))
        assert np.array_equal(stats[1:], start[1:])


@pytest.mark.parametrize("shape, temperature", [((5, 7, 9), 2.0), ((3, 4, 4), 1.0),
                                                ((2, 33, 40), 3.0)])
def test_gradient_is_that_of_the_mean_loss(device, lib, bufs, rng, shape, temperature):
    n, c_old, c = shape
    logits, old = rng.normal(0, 2, (n, c)), rng.normal(0, 2, (n, c_old)).astype(np.float32)

    def mean_loss(z):
        per_row = ref.distill_loss(z, old, c_old=c_old, temperature=temperature, weight=0.5)
        return float(per_row.mean())

    grad, _ = _run(device, lib, bufs, logits, old, np.zeros((n, c), np.float32),
                   np.zeros(3, np.float32), temperature=temperature, weight=0.5,
                   grad_scale=1.0 / n)
    z32 = logits.astype(np.float32).astype(np.float64)
    assert_close(grad, numeric_grad(mean_loss, z32), rtol=2e-3)


def test_identical_models_have_zero_loss_and_gradient(device, lib, bufs, rng):
    n, c = 7, 11
    logits = rng.normal(0, 3, (n, c)).astype(np.float32)
    grad, stats = _run(device, lib, bufs, logits, logits.copy(), np.zeros((n, c), np.float32),
                       np.zeros(3, np.float32), temperature=2.0, weight=1.0, grad_scale=1.0)
    assert np.max(np.abs(grad)) < 1e-6 and abs(stats[0]) < 1e-5


def test_large_logits_stay_finite(device, lib, bufs, rng):
    n, c_old, c = 5, 9, 13
    logits = (rng.normal(0, 1, (n, c)) * 1e3).astype(np.float32)
    old = (rng.normal(0, 1, (n, c_old)) * 1e3).astype(np.float32)
    hyper = {"temperature": 2.0, "weight": 1.0, "grad_scale": 1.0}
    grad, stats = _run(device, lib, bufs, logits, old, np.zeros((n, c), np.float32),
                       np.zeros(3, np.float32), **hyper)
    assert_close(grad, ref.distill_grad(logits, old, c_old=c_old, **hyper))
    loss = ref.distill_loss(logits, old, c_old=c_old, temperature=2.0, weight=1.0).sum()
    assert_close(stats[:1], np.array([loss]))


def test_inconsistent_sizes_are_rejected(lib, bufs):
    b = bufs.empty(4)
    with pytest.raises(ValueError, match="c_old <= c"):
        distill.distill_xent(lib, b, b, b, b, n=2, c_old=5, c=4, temperature=2.0, weight=1.0,
                             grad_scale=1.0)
    with pytest.raises(ValueError, match="temperature"):
        distill.distill_xent(lib, b, b, b, b, n=2, c_old=2, c=4, temperature=0.0, weight=1.0,
                             grad_scale=1.0)
