"""Helpers for kernel tests: moving arrays, comparing against float64, finite differences."""

from __future__ import annotations

import numpy as np
import pyopencl as cl
import pytest

from tests.conftest import UNDER_OCLGRIND

RTOL = 1e-4
FD_RTOL = 2e-3


class Bufs:
    """Uploads float32/int32 arrays and reads them back, for one test."""

    def __init__(self, device):
        self.context = device.context
        self.queue = device.queue

    def up(self, array: np.ndarray) -> cl.Buffer:
        array = np.ascontiguousarray(array)
        if array.dtype == np.float64:
            array = array.astype(np.float32)
        flags = cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR
        return cl.Buffer(
            self.context, flags, hostbuf=array if array.nbytes else np.zeros(1, array.dtype)
        )

    def empty(self, count: int, dtype=np.float32, poison: float = np.nan) -> cl.Buffer:
        """A buffer pre-filled with NaN, so that an element a kernel forgets to write shows up."""
        return self.up(np.full(max(count, 1), poison, dtype=dtype))

    def down(self, buf: cl.Buffer, shape, dtype=np.float32) -> np.ndarray:
        out = np.empty(shape, dtype=dtype)
        cl.enqueue_copy(self.queue, out, buf)
        self.queue.finish()
        return out


@pytest.fixture
def bufs(device):
    return Bufs(device)


def rel_error(actual: np.ndarray, expected: np.ndarray) -> float:
    """max |actual - expected| / max |expected|: relative to the array's scale, so that entries
    near zero do not dominate."""
    actual = np.asarray(actual, np.float64)
    expected = np.asarray(expected, np.float64)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    assert np.all(np.isfinite(actual)), (
        "kernel output holds NaN or Inf (an element left unwritten?)"
    )
    scale = max(float(np.max(np.abs(expected))) if expected.size else 0.0, 1e-30)
    return float(np.max(np.abs(actual - expected))) / scale if expected.size else 0.0


def assert_close(actual, expected, rtol: float = RTOL) -> None:
    err = rel_error(actual, expected)
    assert err < rtol, f"relative error {err:.3g} exceeds {rtol:g}"


def numeric_grad(f, x: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    """Central finite differences of a scalar float64 function f at x."""
    x = np.array(x, dtype=np.float64)
    grad = np.zeros_like(x)
    flat, gflat = x.reshape(-1), grad.reshape(-1)
    for i in range(flat.size):
        old = flat[i]
        flat[i] = old + eps
        hi = f(x)
        flat[i] = old - eps
        lo = f(x)
        flat[i] = old
        gflat[i] = (hi - lo) / (2 * eps)
    return grad


def odd_sizes(rng: np.random.Generator, count: int, low: int, high: int) -> list[int]:
    """Random sizes that are not multiples of 2, 4 or any tile size."""
    sizes = []
    while len(sizes) < count:
        s = int(rng.integers(low, high))
        if s % 2 == 1 and s % 3 != 0:
            sizes.append(s)
    return sizes


def scale(full: int, small: int) -> int:
    """Problem sizes shrink under oclgrind, which interprets every instruction."""
    return small if UNDER_OCLGRIND else full
