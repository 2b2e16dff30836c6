"""The vectorised float64 layer maths against direct loop definitions and finite differences."""

from __future__ import annotations

import numpy as np
import pytest

from mgfl.models import reference_ops as ops
from tests.kernels.conftest import assert_close, numeric_grad


def _naive_conv(x, w, b, stride, padding, depthwise=False):
    n, c, h, wd = x.shape
    k, _, r, s = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (padding[0],) * 2, (padding[1],) * 2))
    oh = (h + 2 * padding[0] - r) // stride[0] + 1
    ow = (wd + 2 * padding[1] - s) // stride[1] + 1
    y = np.zeros((n, k, oh, ow))
    for ni in range(n):
        for ki in range(k):
            for i in range(oh):
                for j in range(ow):
                    window = xp[
                        ni, :, i * stride[0] : i * stride[0] + r, j * stride[1] : j * stride[1] + s
                    ]
                    if depthwise:
                        y[ni, ki, i, j] = np.sum(window[ki] * w[ki, 0])
                    else:
                        y[ni, ki, i, j] = np.sum(window * w[ki])
            if b is not None:
                y[ni, ki] += b[ki]
    return y


def _naive_pool(x, kernel, stride, padding, kind):
    n, c, h, w = x.shape
    fill = -np.inf if kind == "max" else 0.0
    xp = np.pad(x, ((0, 0), (0, 0), (padding[0],) * 2, (padding[1],) * 2), constant_values=fill)
    oh = (h + 2 * padding[0] - kernel[0]) // stride[0] + 1
    ow = (w + 2 * padding[1] - kernel[1]) // stride[1] + 1
    y = np.zeros((n, c, oh, ow))
    for i in range(oh):
        for j in range(ow):
            window = xp[:, :, i * stride[0] :][:, :, : kernel[0], j * stride[1] :][..., : kernel[1]]
            y[:, :, i, j] = window.max(axis=(2, 3)) if kind == "max" else window.mean(axis=(2, 3))
    return y


CONV_CASES = [
    ((2, 3, 7, 9), (4, 3, 3, 3), (2, 2), (1, 1)),
    ((1, 2, 5, 6), (3, 2, 1, 1), (1, 1), (0, 0)),
    ((2, 2, 1, 11), (5, 2, 1, 4), (1, 3), (0, 2)),
    ((1, 1, 9, 6), (2, 1, 4, 3), (2, 1), (2, 1)),
]


@pytest.mark.parametrize(("x_shape", "w_shape", "stride", "padding"), CONV_CASES)
def test_conv2d_matches_the_definition_and_finite_differences(
    rng, x_shape, w_shape, stride, padding
):
    x, w, b = rng.normal(size=x_shape), rng.normal(size=w_shape), rng.normal(size=w_shape[0])
    y, cols = ops.conv2d_forward(x, w, b, stride, padding)
    assert_close(y, _naive_conv(x, w, b, stride, padding), rtol=1e-12)
    dy = rng.normal(size=y.shape)
    dx, dw, db = ops.conv2d_backward(cols, x.shape, w, dy, stride, padding)

    def loss(xv, wv, bv):
        return float(np.sum(ops.conv2d_forward(xv, wv, bv, stride, padding)[0] * dy))

    assert_close(dx, numeric_grad(lambda v: loss(v, w, b), x), rtol=1e-7)
    assert_close(dw, numeric_grad(lambda v: loss(x, v, b), w), rtol=1e-7)
    assert_close(db, numeric_grad(lambda v: loss(x, w, v), b), rtol=1e-7)


@pytest.mark.parametrize(
    ("stride", "padding"), [((1, 1), (1, 1)), ((2, 2), (1, 1)), ((2, 1), (0, 2))]
)
def test_depthwise_matches_the_definition_and_finite_differences(rng, stride, padding):
    x, w, b = rng.normal(size=(2, 3, 7, 6)), rng.normal(size=(3, 1, 3, 3)), rng.normal(size=3)
    y, xp = ops.depthwise_forward(x, w, b, stride, padding)
    assert_close(y, _naive_conv(x, w, b, stride, padding, depthwise=True), rtol=1e-12)
    dy = rng.normal(size=y.shape)
    dx, dw, db = ops.depthwise_backward(xp, x.shape, w, dy, stride, padding)

    def loss(xv, wv, bv):
        return float(np.sum(ops.depthwise_forward(xv, wv, bv, stride, padding)[0] * dy))

    assert_close(dx, numeric_grad(lambda v: loss(v, w, b), x), rtol=1e-7)
    assert_close(dw, numeric_grad(lambda v: loss(x, v, b), w), rtol=1e-7)
    assert_close(db, numeric_grad(lambda v: loss(x, w, v), b), rtol=1e-7)


POOL_CASES = [
    ((2, 2), (2, 2), (0, 0)),
    ((3, 3), (2, 2), (1, 1)),
    ((3, 2), (1, 1), (1, 0)),
    ((1, 2), (1, 2), (0, 0)),
]


@pytest.mark.parametrize(("kernel", "stride", "padding"), POOL_CASES)
def test_pools_match_the_definition_and_finite_differences(rng, kernel, stride, padding):
    x = rng.normal(size=(2, 3, 7, 8))
    y, argmax = ops.maxpool_forward(x, kernel, stride, padding)
    assert_close(y, _naive_pool(x, kernel, stride, padding, "max"), rtol=1e-15)
    dy = rng.normal(size=y.shape)
    dx = ops.maxpool_backward(argmax, x.shape, dy, kernel, stride, padding)
    numeric = numeric_grad(
        lambda v: float(np.sum(ops.maxpool_forward(v, kernel, stride, padding)[0] * dy)), x
    )
    assert_close(dx, numeric, rtol=1e-7)

    avg = ops.avgpool_forward(x, kernel, stride, padding)
    assert_close(avg, _naive_pool(x, kernel, stride, padding, "avg"), rtol=1e-12)
    dx = ops.avgpool_backward(x.shape, dy, kernel, stride, padding)
    numeric = numeric_grad(
        lambda v: float(np.sum(ops.avgpool_forward(v, kernel, stride, padding) * dy)), x
    )
    assert_close(dx, numeric, rtol=1e-7)


def test_maxpool_gradient_goes_to_the_first_maximum_and_never_to_padding():
    x = np.full((1, 1, 4, 4), -5.0)
    x[0, 0, 1, 1] = x[0, 0, 1, 2] = -1.0  # a tie inside one window
    y, argmax = ops.maxpool_forward(x, (2, 2), (2, 2), (1, 1))
    assert y.shape == (1, 1, 3, 3)
    assert np.all(np.isfinite(y))
    dx = ops.maxpool_backward(argmax, x.shape, np.ones(y.shape), (2, 2), (2, 2), (1, 1))
    expected = np.zeros((4, 4))
    # The windows cover real rows (and columns) {0}, {1, 2} and {3}; each sends its gradient to
    # its first real cell in row-major order, and the middle one to (1, 1), the first of the tie.
    for row in (0, 1, 3):
        for col in (0, 1, 3):
            expected[row, col] = 1
    np.testing.assert_array_equal(dx[0, 0], expected)


def test_avgpool_counts_zero_padding_in_the_divisor():
    y = ops.avgpool_forward(np.ones((1, 1, 2, 2)), (2, 2), (2, 2), (1, 1))
    np.testing.assert_array_equal(y[0, 0], np.full((2, 2), 0.25))


@pytest.mark.parametrize("shape", [(5, 3, 4, 2), (6, 4)])
def test_batchnorm_training_forward_and_backward(rng, shape):
    x = rng.normal(2.0, 3.0, size=shape)
    w, b = rng.normal(size=shape[1]), rng.normal(size=shape[1])
    axes = (0, 2, 3) if len(shape) == 4 else (0,)
    y, (xhat, inv_std, mean, var) = ops.batchnorm_train_forward(x, w, b, 1e-5)
    assert_close(mean, x.mean(axis=axes), rtol=1e-14)
    assert_close(var, x.var(axis=axes), rtol=1e-12)
    bshape = (1, -1, 1, 1) if len(shape) == 4 else (1, -1)
    expected = w.reshape(bshape) * (x - x.mean(axis=axes, keepdims=True)) / np.sqrt(
        x.var(axis=axes, keepdims=True) + 1e-5
    ) + b.reshape(bshape)
    assert_close(y, expected, rtol=1e-12)
    dy = rng.normal(size=shape)
    dx, dw, db = ops.batchnorm_train_backward(xhat, inv_std, w, dy)

    def loss(xv, wv, bv):
        return float(np.sum(ops.batchnorm_train_forward(xv, wv, bv, 1e-5)[0] * dy))

    assert_close(dx, numeric_grad(lambda v: loss(v, w, b), x), rtol=1e-6)
    assert_close(dw, numeric_grad(lambda v: loss(x, v, b), w), rtol=1e-7)
    assert_close(db, numeric_grad(lambda v: loss(x, w, v), b), rtol=1e-7)


def test_softmax_cross_entropy_and_its_gradient(rng):
    logits, labels = rng.normal(0, 5, size=(4, 6)), np.array([0, 5, 2, 2])
    loss, grad = ops.softmax_cross_entropy(logits, labels)
    probs = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    assert loss == pytest.approx(-np.mean(np.log(probs[np.arange(4), labels])), rel=1e-12)
    numeric = numeric_grad(lambda v: ops.softmax_cross_entropy(v, labels)[0], logits)
    assert_close(grad, numeric, rtol=1e-7)
    big, _ = ops.softmax_cross_entropy(np.array([[1000.0, 0.0]]), np.array([1]))
    assert big == pytest.approx(1000.0)
