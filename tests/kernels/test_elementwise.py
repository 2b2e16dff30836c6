"""Element-wise kernels against their float64 references and finite differences."""

from __future__ import annotations

import numpy as np
import pytest

from kernels import elementwise
from kernels.launch import run
from kernels.reference import elementwise as ref
from tests.kernels.conftest import assert_close, numeric_grad, odd_sizes, scale

ACTIVATION_KINDS = ["relu", "relu6"]


def _mask_buffer(bufs, n):
    """A bit-mask buffer for n elements, every bit set beforehand."""
    return bufs.empty(elementwise.mask_bytes(n), np.uint8, poison=0xFF)


@pytest.mark.parametrize("kind", ["relu", "relu6"])
def test_activation_forward_and_backward_match_reference(device, lib, bufs, rng, kind):
    for n in odd_sizes(rng, 3, 1, scale(5000, 300)):
        x = rng.normal(0, 4, n).astype(np.float32)
        dy = rng.normal(size=n).astype(np.float32)
        bx, by, bdy, bdx = bufs.up(x), bufs.empty(n), bufs.up(dy), bufs.empty(n)
        run(device.queue, [elementwise.activation_forward(lib, kind, bx, by, n)])
        y = bufs.down(by, n)
        assert_close(y, ref.activation_forward(kind, x))
        run(device.queue, [elementwise.activation_backward(lib, kind, by, bdy, bdx, n)])
        assert_close(bufs.down(bdx, n), ref.activation_backward(kind, y, dy))


@pytest.mark.parametrize("kind", ["relu", "relu6"])
def test_activation_backward_matches_finite_differences(device, lib, bufs, rng, kind):
    n = 23
    x = rng.normal(0, 4, n)
    x[np.abs(x) < 0.05] += 0.2  # keep clear of the kinks, where the derivative is undefined
    x[np.abs(x - 6) < 0.05] += 0.2
    w = rng.normal(size=n)
    numeric = numeric_grad(lambda v: float(np.sum(ref.activation_forward(kind, v) * w)), x)
    by, bdx = bufs.empty(n), bufs.empty(n)
    run(
        device.queue,
        [
            elementwise.activation_forward(lib, kind, bufs.up(x), by, n),
            elementwise.activation_backward(lib, kind, by, bufs.up(w), bdx, n),
        ],
    )
    assert_close(bufs.down(bdx, n), numeric, rtol=2e-3)


@pytest.mark.parametrize("kind", ["relu", "relu6"])
def test_masked_activation_matches_reference(device, lib, bufs, rng, kind):
    """The forward that keeps a bit mask gives the same output, a mask equal to the reference's,
    and a backward from the mask equal to the backward from the float output."""
    for n in odd_sizes(rng, 3, 1, scale(5000, 300)):
        x = rng.normal(0, 4, n).astype(np.float32)
        x[: n // 4] = np.float32(6.0) * (rng.random(n // 4) < 0.5)  # exactly on both kinks
        dy = rng.normal(size=n).astype(np.float32)
        by, bmask, bdx = bufs.empty(n), _mask_buffer(bufs, n), bufs.empty(n)
        run(device.queue, [
            elementwise.activation_forward_mask(lib, kind, bufs.up(x), by, bmask, n),
            elementwise.masked_backward(lib, bmask, bufs.up(dy), bdx, n),
        ])
        y = bufs.down(by, n)
        assert_close(y, ref.activation_forward(kind, x))
        mask = bufs.down(bmask, elementwise.mask_bytes(n), np.uint8)
        np.testing.assert_array_equal(mask, ref.activation_mask(kind, x))
        np.testing.assert_array_equal(mask, ref.activation_mask(kind, y))
        expected = ref.masked_backward(mask, dy)
        assert_close(bufs.down(bdx, n), expected)
        assert_close(expected, ref.activation_backward(kind, y, dy))


@pytest.mark.parametrize("kind", ["relu", "relu6"])
def test_masked_backward_matches_finite_differences(device, lib, bufs, rng, kind):
    n = 23
    x = rng.normal(0, 4, n)
    x[np.abs(x) < 0.05] += 0.2
    x[np.abs(x - 6) < 0.05] += 0.2
    w = rng.normal(size=n)
    numeric = numeric_grad(lambda v: float(np.sum(ref.activation_forward(kind, v) * w)), x)
    by, bmask, bdx = bufs.empty(n), _mask_buffer(bufs, n), bufs.empty(n)
    run(device.queue, [
        elementwise.activation_forward_mask(lib, kind, bufs.up(x), by, bmask, n),
        elementwise.masked_backward(lib, bmask, bufs.up(w), bdx, n),
    ])
    assert_close(bufs.down(bdx, n), numeric, rtol=2e-3)


def test_add_accumulate_copy_fill(device, lib, bufs, rng):
    n = odd_sizes(rng, 1, 100, scale(3000, 200))[0]
    a, b = rng.normal(size=n).astype(np.float32), rng.normal(size=n).astype(np.float32)
    ba, bb, bo = bufs.up(a), bufs.up(b), bufs.empty(n)
    run(device.queue, [elementwise.add(lib, ba, bb, bo, n)])
    assert_close(bufs.down(bo, n), a.astype(np.float64) + b)
    run(device.queue, [elementwise.accumulate(lib, bo, ba, n)])
    assert_close(bufs.down(bo, n), 2.0 * a + b)
    bc = bufs.empty(n)
    run(device.queue, [elementwise.copy(lib, ba, bc, n)])
    assert_close(bufs.down(bc, n), a)
    run(device.queue, [elementwise.fill(lib, bc, 2.5, n)])
    assert np.all(bufs.down(bc, n) == 2.5)


def test_unknown_activation_is_a_clear_error(lib, bufs):
    with pytest.raises(ValueError, match="Unknown activation"):
        elementwise.activation_forward(lib, "gelu", bufs.empty(1), bufs.empty(1), 1)


WIDTHS = [
    {"EW_VW": 1, "EW_WG": 32},
    {"EW_VW": 2, "EW_WG": 7},
    {"EW_VW": 16, "EW_WG": 128},
    elementwise.GPU_DEFAULTS,
    elementwise.CPU_DEFAULTS,
]


@pytest.mark.parametrize("defines", WIDTHS, ids=["scalar", "2-wide", "16-wide", "gpu", "cpu"])
def test_vector_widths_and_tails_give_the_same_results(device, lib, bufs, rng, defines):
    """Sizes below, at and just past a vector, and large odd ones, in place and not."""
    width = defines["EW_VW"]
    for n in sorted({1, width, width + 1, 2 * width - 1, *odd_sizes(rng, 2, 20, scale(3000, 90))}):
        x = rng.normal(0, 4, n).astype(np.float32)
        dy = rng.normal(size=n).astype(np.float32)
        for kind in ACTIVATION_KINDS:
            by = bufs.empty(n)
            run(device.queue, [
                elementwise.activation_forward(lib, kind, bufs.up(x), by, n, defines=defines)
            ])
            y = bufs.down(by, n)
            assert_close(y, ref.activation_forward(kind, x))
            bdy = bufs.up(dy)  # in place: dx aliases dy
            run(device.queue, [
                elementwise.activation_backward(lib, kind, by, bdy, bdy, n, defines=defines)
            ])
            assert_close(bufs.down(bdy, n), ref.activation_backward(kind, y, dy))
            bx = bufs.up(x)  # in place: y aliases x
            run(device.queue, [
                elementwise.activation_forward(lib, kind, bx, bx, n, defines=defines)
            ])
            assert_close(bufs.down(bx, n), ref.activation_forward(kind, x))
            bx, bmask = bufs.up(x), _mask_buffer(bufs, n)  # masked, in place
            bdy = bufs.up(dy)
            run(device.queue, [
                elementwise.activation_forward_mask(lib, kind, bx, bx, bmask, n, defines=defines),
                elementwise.masked_backward(lib, bmask, bdy, bdy, n, defines=defines),
            ])
            assert_close(bufs.down(bx, n), ref.activation_forward(kind, x))
            mask = bufs.down(bmask, elementwise.mask_bytes(n), np.uint8)
            np.testing.assert_array_equal(mask, ref.activation_mask(kind, x))
            assert_close(bufs.down(bdy, n), ref.masked_backward(mask, dy))
        ba, bb, bo = bufs.up(x), bufs.up(dy), bufs.empty(n)
        run(device.queue, [
            elementwise.add(lib, ba, bb, bo, n, defines=defines),
            elementwise.accumulate(lib, bo, ba, n, defines=defines),
        ])
        assert_close(bufs.down(bo, n), 2.0 * x.astype(np.float64) + dy)
        bc = bufs.empty(n)
        run(device.queue, [elementwise.copy(lib, bb, bc, n, defines=defines)])
        assert_close(bufs.down(bc, n), dy)
        run(device.queue, [elementwise.fill(lib, bc, -1.5, n, defines=defines)])
        assert np.all(bufs.down(bc, n) == -1.5)


def test_writes_stop_at_the_end_of_the_tensor(device, lib, bufs, rng):
    """A tensor in a larger buffer: the element after it keeps its value."""
    n = 13
    x = rng.normal(size=n + 1).astype(np.float32)
    out = bufs.up(np.full(n + 1, 7.0, np.float32))
    run(device.queue, [elementwise.copy(lib, bufs.up(x), out, n)])
    got = bufs.down(out, n + 1)
    assert_close(got[:n], x[:n])
    assert got[n] == 7.0
    size = elementwise.mask_bytes(n)
    mask = bufs.up(np.full(size + 1, 9, np.uint8))
    run(device.queue, [elementwise.activation_forward_mask(lib, "relu", bufs.up(x), out, mask, n)])
    got_mask = bufs.down(mask, size + 1, np.uint8)
    np.testing.assert_array_equal(got_mask[:size], ref.activation_mask("relu", x[:n]))
    assert got_mask[size] == 9


def test_bad_vector_width_is_a_clear_error(lib, bufs):
    with pytest.raises(ValueError, match="EW_VW"):
        elementwise.copy(lib, bufs.empty(4), bufs.empty(4), 4, defines={"EW_VW": 3})
