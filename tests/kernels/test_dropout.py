"""Dropout kernels: the mask equals the NumPy reference bit for bit; values and gradients match."""

from __future__ import annotations

import numpy as np
import pytest

from kernels import dropout
from kernels.launch import run
from kernels.reference import dropout as ref
from tests.kernels.conftest import assert_close, numeric_grad, odd_sizes, scale


def _step(bufs, t: int):
    return bufs.up(np.array([t], np.int32))


def _forward(device, lib, bufs, x, t, **kwargs):
    by = bufs.empty(x.size)
    run(device.queue, dropout.dropout_forward(lib, bufs.up(x), by, _step(bufs, t), n=x.size,
                                              **kwargs))
    return bufs.down(by, x.size)


@pytest.mark.parametrize(
    "p, seed, t, index_offset",
    [
        (0.5, 0, 1, 0),
        (0.1, 12345, 7, 0),
        (0.9, 2**32 - 1, 2**31 - 1, 2**32 - 3),  # every sum wraps around 32 bits
        (0.37, 99, 3, 1000),
    ],
)
def test_mask_equals_reference_bit_for_bit(device, lib, bufs, rng, p, seed, t, index_offset):
    for n in [1, 2, 3, 5, *odd_sizes(rng, 2, 7, scale(4000, 300))]:
        x = rng.uniform(0.5, 2.0, n).astype(np.float32)  # nonzero, so a zero output means dropped
        y = _forward(device, lib, bufs, x, t, p=p, seed=seed, index_offset=index_offset)
        mask = ref.dropout_mask(n, p, seed, t, index_offset)
        assert np.array_equal(y != 0, mask)
        assert_close(y, ref.dropout_forward(x, p, seed, t, index_offset))


def test_kept_fraction_is_near_one_minus_p(device, lib, bufs):
    n = scale(200_001, 4001)
    for p in (0.1, 0.5, 0.8):
        y = _forward(device, lib, bufs, np.ones(n, np.float32), 5, p=p, seed=42)
        tolerance = 6 * np.sqrt(p * (1 - p) / n)
        assert abs(np.mean(y == 0) - p) < tolerance


def test_masks_differ_between_steps_and_offsets(device, lib, bufs):
    n = scale(2001, 301)
    x = np.ones(n, np.float32)
    first = _forward(device, lib, bufs, x, 1, p=0.5, seed=7)
    second = _forward(device, lib, bufs, x, 2, p=0.5, seed=7)
    shifted = _forward(device, lib, bufs, x, 1, p=0.5, seed=7, index_offset=n)
    assert np.array_equal(second != 0, ref.dropout_mask(n, 0.5, 7, 2))
    assert np.array_equal(shifted != 0, ref.dropout_mask(2 * n, 0.5, 7, 1)[n:])
    assert not np.array_equal(first != 0, second != 0)
    assert not np.array_equal(first != 0, shifted != 0)


def test_probability_zero_keeps_all_and_one_drops_all(device, lib, bufs, rng):
    x = rng.normal(size=37).astype(np.float32)
    assert np.array_equal(_forward(device, lib, bufs, x, 3, p=0.0, seed=1), x)
    assert np.all(_forward(device, lib, bufs, x, 3, p=1.0, seed=1) == 0.0)
    assert not ref.dropout_mask(37, 1.0, 1, 3).any()


def test_backward_matches_reference_and_finite_differences(device, lib, bufs, rng):
    p, seed, t = 0.3, 2024, 11
    for n in odd_sizes(rng, 2, 5, scale(3000, 200)):
        dy = rng.normal(size=n).astype(np.float32)
        bdx = bufs.empty(n)
        run(device.queue, dropout.dropout_backward(
            lib, bufs.up(dy), bdx, _step(bufs, t), n=n, p=p, seed=seed, index_offset=5
        ))
        assert_close(bufs.down(bdx, n), ref.dropout_backward(dy, p, seed, t, index_offset=5))

    n = 19
    x, w = rng.normal(size=n), rng.normal(size=n)
    numeric = numeric_grad(lambda v: float(np.sum(ref.dropout_forward(v, p, seed, t) * w)), x)
    bdx = bufs.empty(n)
    run(device.queue, dropout.dropout_backward(lib, bufs.up(w), bdx, _step(bufs, t), n=n, p=p,
                                               seed=seed))
    assert_close(bufs.down(bdx, n), numeric, rtol=2e-3)


def test_in_place_forward(device, lib, bufs, rng):
    n = 23
    x = rng.normal(size=n).astype(np.float32)
    bx = bufs.up(x)
    run(device.queue, dropout.dropout_forward(lib, bx, bx, _step(bufs, 2), n=n, p=0.4, seed=3))
    assert_close(bufs.down(bx, n), ref.dropout_forward(x, 0.4, 3, 2))


def test_probability_outside_unit_interval_is_rejected(lib, bufs):
    b = bufs.empty(4)
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        dropout.dropout_forward(lib, b, b, b, n=4, p=1.5, seed=0)
