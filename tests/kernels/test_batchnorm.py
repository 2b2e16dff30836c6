"""Batch-normalization kernels against their float64 references and finite differences."""

from __future__ import annotations

import numpy as np
import pytest

from kernels import batchnorm
from kernels.launch import run
from kernels.reference import batchnorm as ref
from tests.kernels.conftest import assert_close, numeric_grad, odd_sizes, scale


def _shapes(rng) -> list[tuple[int, int, int]]:
    """Odd random shapes, plus a Linear output (HW = 1), a single sample and a single channel."""
    highs = (scale(12, 6), scale(70, 8), scale(60, 8))
    n, c, hw = (odd_sizes(rng, 1, 3, high)[0] for high in highs)
    return [(n, c, hw), (n, c, 1), (1, c, hw), (n, 1, hw)]


def _params(rng, c):
    gamma = rng.normal(1.0, 0.5, c).astype(np.float32)
    beta = rng.normal(0.0, 0.5, c).astype(np.float32)
    running_mean = rng.normal(0.0, 1.0, c).astype(np.float32)
    running_var = rng.uniform(0.5, 2.0, c).astype(np.float32)
    return gamma, beta, running_mean, running_var


def _forward_train(device, lib, bufs, x, gamma, beta, running_mean, running_var, momentum=0.1):
    n, c, hw = x.shape
    bx, by, bmean, binv = bufs.up(x), bufs.empty(x.size), bufs.empty(c), bufs.empty(c)
    brm, brv = bufs.up(running_mean), bufs.up(running_var)
    run(device.queue, batchnorm.batchnorm_forward_train(
        lib, bx, bufs.up(gamma), bufs.up(beta), by, bmean, binv, brm, brv,
        n=n, c=c, hw=hw, momentum=momentum,
    ))
    return {
        "y": bufs.down(by, x.shape), "mean": bufs.down(bmean, c), "invstd": bufs.down(binv, c),
        "running_mean": bufs.down(brm, c), "running_var": bufs.down(brv, c),
    }


def test_forward_train_matches_reference_with_running_statistics(device, lib, bufs, rng):
    for n, c, hw in _shapes(rng):
        x = rng.normal(3.0, 2.0, (n, c, hw)).astype(np.float32)
        gamma, beta, running_mean, running_var = _params(rng, c)
        got = _forward_train(device, lib, bufs, x, gamma, beta, running_mean, running_var, 0.3)
        y, mean, invstd, new_mean, new_var = ref.batchnorm_forward_train(
            x, gamma, beta, running_mean, running_var, momentum=0.3
        )
        assert_close(got["y"], y)
        assert_close(got["mean"], mean)
        assert_close(got["invstd"], invstd)
        assert_close(got["running_mean"], new_mean)
        assert_close(got["running_var"], new_var)


def test_forward_eval_matches_reference(device, lib, bufs, rng):
    for n, c, hw in _shapes(rng):
        x = rng.normal(0.0, 2.0, (n, c, hw)).astype(np.float32)
        gamma, beta, running_mean, running_var = _params(rng, c)
        by = bufs.empty(x.size)
        run(device.queue, batchnorm.batchnorm_forward_eval(
            lib, bufs.up(x), bufs.up(gamma), bufs.up(beta), by, bufs.up(running_mean),
            bufs.up(running_var), n=n, c=c, hw=hw,
        ))
        expected = ref.batchnorm_forward_eval(x, gamma, beta, running_mean, running_var)
        assert_close(bufs.down(by, x.shape), expected)


@pytest.mark.parametrize("accumulate", [False, True])
def test_backward_matches_reference(device, lib, bufs, rng, accumulate):
    for n, c, hw in _shapes(rng):
        x = rng.normal(1.0, 2.0, (n, c, hw)).astype(np.float32)
        dy = rng.normal(size=(n, c, hw)).astype(np.float32)
        gamma, beta, running_mean, running_var = _params(rng, c)
        saved = _forward_train(device, lib, bufs, x, gamma, beta, running_mean, running_var)
        old_dgamma, old_dbeta = rng.normal(size=c), rng.normal(size=c)
        bdx = bufs.empty(x.size)
        bdgamma = bufs.up(old_dgamma) if accumulate else bufs.empty(c)
        bdbeta = bufs.up(old_dbeta) if accumulate else bufs.empty(c)
        run(device.queue, batchnorm.batchnorm_backward(
            lib, bufs.up(x), bufs.up(dy), bufs.up(gamma), bufs.up(saved["mean"]),
            bufs.up(saved["invstd"]), bdx, bdgamma, bdbeta, n=n, c=c, hw=hw, accumulate=accumulate,
        ))
        dx, dgamma, dbeta = ref.batchnorm_backward(x, dy, gamma, saved["mean"], saved["invstd"])
        if accumulate:
            dgamma = dgamma + old_dgamma.astype(np.float32)
            dbeta = dbeta + old_dbeta.astype(np.float32)
        assert_close(bufs.down(bdx, x.shape), dx)
        assert_close(bufs.down(bdgamma, c), dgamma)
        assert_close(bufs.down(bdbeta, c), dbeta)


@pytest.mark.parametrize("shape", [(3, 2, 5), (5, 3, 1), (1, 2, 7)])
def test_backward_matches_finite_differences(device, lib, bufs, rng, shape):
    n, c, hw = shape
    x = rng.normal(0.5, 1.5, shape)
    gamma, beta = rng.normal(1.0, 0.5, c), rng.normal(0.0, 0.5, c)
    weights = rng.normal(size=shape)
    zeros, ones = np.zeros(c), np.ones(c)

    def loss(x_, gamma_, beta_):
        y = ref.batchnorm_forward_train(x_, gamma_, beta_, zeros, ones)[0]
        return float(np.sum(y * weights))

    saved = _forward_train(device, lib, bufs, x, gamma, beta, zeros, ones)
    bdx, bdgamma, bdbeta = bufs.empty(x.size), bufs.empty(c), bufs.empty(c)
    run(device.queue, batchnorm.batchnorm_backward(
        lib, bufs.up(x), bufs.up(weights), bufs.up(gamma), bufs.up(saved["mean"]),
        bufs.up(saved["invstd"]), bdx, bdgamma, bdbeta, n=n, c=c, hw=hw,
    ))
    x32, gamma32, beta32 = (v.astype(np.float32).astype(np.float64) for v in (x, gamma, beta))
    assert_close(
        bufs.down(bdx, shape), numeric_grad(lambda v: loss(v, gamma32, beta32), x32), rtol=2e-3
    )
    assert_close(
        bufs.down(bdgamma, c), numeric_grad(lambda v: loss(x32, v, beta32), gamma32), rtol=2e-3
    )
    assert_close(
        bufs.down(bdbeta, c), numeric_grad(lambda v: loss(x32, gamma32, v), beta32), rtol=2e-3
    )


def test_frozen_parameters_and_first_layer_skip_their_gradients(device, lib, bufs, rng):
    n, c, hw = 5, 7, 11
    x = rng.normal(size=(n, c, hw)).astype(np.float32)
    dy = rng.normal(size=(n, c, hw)).astype(np.float32)
    gamma, beta, running_mean, running_var = _params(rng, c)
    saved = _forward_train(device, lib, bufs, x, gamma, beta, running_mean, running_var)
    dx, dgamma, dbeta = ref.batchnorm_backward(x, dy, gamma, saved["mean"], saved["invstd"])
    args = (bufs.up(x), bufs.up(dy), bufs.up(gamma), bufs.up(saved["mean"]),
            bufs.up(saved["invstd"]))

    bdx = bufs.empty(x.size)
    run(device.queue, batchnorm.batchnorm_backward(lib, *args, bdx, None, None, n=n, c=c, hw=hw))
    assert_close(bufs.down(bdx, x.shape), dx)

    untouched, bdgamma, bdbeta = bufs.empty(x.size), bufs.empty(c), bufs.empty(c)
    run(device.queue, batchnorm.batchnorm_backward(
        lib, *args, untouched, bdgamma, bdbeta, n=n, c=c, hw=hw, input_grad=False,
    ))
    assert np.all(np.isnan(bufs.down(untouched, x.size))), "dx was written with input_grad=False"
    assert_close(bufs.down(bdgamma, c), dgamma)
    assert_close(bufs.down(bdbeta, c), dbeta)

    assert batchnorm.batchnorm_backward(
        lib, *args, None, None, None, n=n, c=c, hw=hw, input_grad=False
    ) == []


def _backward_frozen(device, lib, bufs, x, dy, gamma, running_mean, running_var, *,
                     with_dx=True, with_dgamma=True, with_dbeta=True, in_place=False,
                     accumulate_from=None, defines=None):
    """Runs the frozen-statistics backward; returns the gradients it was asked for."""
    n, c, hw = x.shape
    bdy = bufs.up(dy)
    bdx = (bdy if in_place else bufs.empty(x.size)) if with_dx else None
    start = accumulate_from
    bdgamma = (bufs.up(start[0]) if start else bufs.empty(c)) if with_dgamma else None
    bdbeta = (bufs.up(start[1]) if start else bufs.empty(c)) if with_dbeta else None
    run(device.queue, batchnorm.batchnorm_backward_frozen(
        lib, bufs.up(x) if with_dgamma else None, bdy, bufs.up(gamma), bufs.up(running_mean),
        bufs.up(running_var), bdx, bdgamma, bdbeta, n=n, c=c, hw=hw,
        accumulate=start is not None, defines=defines,
    ))
    return (
        bufs.down(bdx, x.shape) if with_dx else None,
        bufs.down(bdgamma, c) if with_dgamma else None,
        bufs.down(bdbeta, c) if with_dbeta else None,
    )


@pytest.mark.parametrize("accumulate", [False, True])
def test_backward_with_frozen_statistics_matches_reference(device, lib, bufs, rng, accumulate):
    for n, c, hw in [*_shapes(rng), (1, 3, 1)]:
        x = rng.normal(1.0, 2.0, (n, c, hw)).astype(np.float32)
        dy = rng.normal(size=(n, c, hw)).astype(np.float32)
        gamma, _, running_mean, running_var = _params(rng, c)
        start = (rng.normal(size=c), rng.normal(size=c)) if accumulate else None
        got = _backward_frozen(device, lib, bufs, x, dy, gamma, running_mean, running_var,
                               accumulate_from=start)
        dx, dgamma, dbeta = ref.batchnorm_backward_frozen(x, dy, gamma, running_mean, running_var)
        if accumulate:
            dgamma = dgamma + start[0].astype(np.float32)
            dbeta = dbeta + start[1].astype(np.float32)
        assert_close(got[0], dx)
        assert_close(got[1], dgamma)
        assert_close(got[2], dbeta)


def test_backward_with_frozen_statistics_matches_finite_differences(device, lib, bufs, rng):
    n, c, hw = 3, 2, 5
    x = rng.normal(0.5, 1.5, (n, c, hw))
    gamma, beta, running_mean, running_var = (v.astype(np.float64) for v in _params(rng, c))
    weights = rng.normal(size=x.shape)

    def loss(x_, gamma_, beta_):
        y = ref.batchnorm_forward_eval(x_, gamma_, beta_, running_mean, running_var)
        return float(np.sum(y * weights))

    got = _backward_frozen(device, lib, bufs, x, weights, gamma, running_mean, running_var)
    x32, gamma32, beta32 = (v.astype(np.float32).astype(np.float64) for v in (x, gamma, beta))
    assert_close(got[0], numeric_grad(lambda v: loss(v, gamma32, beta32), x32), rtol=2e-3)
    assert_close(got[1], numeric_grad(lambda v: loss(x32, v, beta32), gamma32), rtol=2e-3)
    assert_close(got[2], numeric_grad(lambda v: loss(x32, gamma32, v), beta32), rtol=2e-3)


def test_frozen_statistics_backward_reads_x_only_for_gamma(device, lib, bufs, rng):
    """Without gamma's gradient no input is bound at all; dx may overwrite dy; each gradient can
    be left out on its own."""
    n, c, hw = 4, 5, 9
    x = rng.normal(size=(n, c, hw)).astype(np.float32)
    dy = rng.normal(size=(n, c, hw)).astype(np.float32)
    gamma, _, running_mean, running_var = _params(rng, c)
    dx, dgamma, dbeta = ref.batchnorm_backward_frozen(x, dy, gamma, running_mean, running_var)
    args = (device, lib, bufs, x, dy, gamma, running_mean, running_var)
    got = _backward_frozen(*args, with_dgamma=False, in_place=True)
    assert got[1] is None
    assert_close(got[0], dx)
    assert_close(got[2], dbeta)
    got = _backward_frozen(*args, with_dx=False, with_dbeta=False)
    assert_close(got[1], dgamma)
    got = _backward_frozen(*args, with_dgamma=False, with_dbeta=False)
    assert_close(got[0], dx)
    b = bufs.empty(c)
    with pytest.raises(ValueError, match="forward input"):
        batchnorm.batchnorm_backward_frozen(lib, None, b, b, b, b, None, b, None, n=n, c=c, hw=hw)
    assert batchnorm.batchnorm_backward_frozen(
        lib, None, b, b, b, b, None, None, None, n=n, c=c, hw=hw
    ) == []


def test_a_single_value_per_channel_cannot_train(lib, bufs):
    b = bufs.empty(4)
    with pytest.raises(ValueError, match="more than one value per channel"):
        batchnorm.batchnorm_forward_train(lib, b, b, b, b, b, b, b, b, n=1, c=4, hw=1)


DEFINES = [
    {"BN_GROUP": 1, "BN_VW": 1},
    {"BN_GROUP": 4, "BN_VW": 16, "BN_CONTIGUOUS": 1},
    {"BN_GROUP": 32, "BN_VW": 2, "BN_CONTIGUOUS": 0},
    batchnorm.GPU_DEFAULTS,
    batchnorm.CPU_DEFAULTS,
]


@pytest.mark.parametrize("defines", DEFINES, ids=["scalar", "16-wide", "2-wide", "gpu", "cpu"])
def test_group_shapes_and_vector_widths_give_the_same_results(device, lib, bufs, rng, defines):
    """Every kernel with other build-time defines, on odd shapes and on runs of whole vectors."""
    shapes = [*_shapes(rng), (3, 5, 16), (2, 3, scale(400, 24))]
    for n, c, hw in shapes:
        x = rng.normal(2.0, 3.0, (n, c, hw)).astype(np.float32)
        dy = rng.normal(size=(n, c, hw)).astype(np.float32)
        gamma, beta, running_mean, running_var = _params(rng, c)
        bx, by, bmean, binv = bufs.up(x), bufs.empty(x.size), bufs.empty(c), bufs.empty(c)
        brm, brv = bufs.up(running_mean), bufs.up(running_var)
        bgamma, bbeta = bufs.up(gamma), bufs.up(beta)
        if n * hw > 1:
            run(device.queue, batchnorm.batchnorm_forward_train(
                lib, bx, bgamma, bbeta, by, bmean, binv, brm, brv, n=n, c=c, hw=hw,
                defines=defines,
            ))
            y, mean, invstd, new_mean, new_var = ref.batchnorm_forward_train(
                x, gamma, beta, running_mean, running_var
            )
            assert_close(bufs.down(by, x.shape), y)
            assert_close(bufs.down(brm, c), new_mean)
            assert_close(bufs.down(brv, c), new_var)
            saved_mean, saved_invstd = bufs.down(bmean, c), bufs.down(binv, c)
            assert_close(saved_mean, mean)
            assert_close(saved_invstd, invstd)
            bdx, bdgamma, bdbeta = bufs.empty(x.size), bufs.empty(c), bufs.empty(c)
            run(device.queue, batchnorm.batchnorm_backward(
                lib, bx, bufs.up(dy), bgamma, bmean, binv, bdx, bdgamma, bdbeta,
                n=n, c=c, hw=hw, defines=defines,
            ))
            dx, dgamma, dbeta = ref.batchnorm_backward(x, dy, gamma, saved_mean, saved_invstd)
            assert_close(bufs.down(bdx, x.shape), dx)
            assert_close(bufs.down(bdgamma, c), dgamma)
            assert_close(bufs.down(bdbeta, c), dbeta)
        run(device.queue, batchnorm.batchnorm_forward_eval(
            lib, bx, bgamma, bbeta, bx, bufs.up(running_mean), bufs.up(running_var),
            n=n, c=c, hw=hw, defines=defines,
        ))  # in place
        expected = ref.batchnorm_forward_eval(x, gamma, beta, running_mean, running_var)
        assert_close(bufs.down(bx, x.shape), expected)
        for in_place in (False, True):
            got = _backward_frozen(device, lib, bufs, x, dy, gamma, running_mean, running_var,
                                   in_place=in_place, defines=defines)
            want = ref.batchnorm_backward_frozen(x, dy, gamma, running_mean, running_var)
            for got_one, want_one in zip(got, want, strict=True):
                assert_close(got_one, want_one)


def test_statistics_stay_accurate_far_from_zero(device, lib, bufs, rng):
    """A common offset 1000 times the spread: E[x^2] - E[x]^2 in float32 would lose the variance
    to cancellation; the two passes keep it."""
    n, c, hw = 4, 3, 301
    x = (1000.0 + rng.normal(0.0, 1.0, (n, c, hw))).astype(np.float32)
    gamma, beta, running_mean, running_var = _params(rng, c)
    got = _forward_train(device, lib, bufs, x, gamma, beta, running_mean, running_var)
    y, mean, invstd, _, _ = ref.batchnorm_forward_train(x, gamma, beta, running_mean, running_var)
    assert_close(got["mean"], mean)
    assert_close(got["invstd"], invstd)
    assert_close(got["y"], y, rtol=1e-3)


def test_bad_vector_width_is_a_clear_error(lib, bufs):
    b = bufs.empty(8)
    with pytest.raises(ValueError, match="BN_VW"):
        batchnorm.batchnorm_forward_train(
            lib, b, b, b, b, b, b, b, b, n=2, c=1, hw=4, defines={"BN_VW": 3}
        )
