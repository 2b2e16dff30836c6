"""Optimizer updates over several steps against the float64 reference, with the device counter."""

from __future__ import annotations

import numpy as np
import pyopencl as cl
import pytest

from kernels import elementwise, optimizer
from kernels.launch import run
from kernels.reference import optimizer as ref
from tests.kernels.conftest import assert_close, odd_sizes, scale

STEPS = 4
SGD_SETTINGS = [
    {"momentum": 0.0, "weight_decay": 0.0, "nesterov": False},
    {"momentum": 0.0, "weight_decay": 0.01, "nesterov": False},
    {"momentum": 0.9, "weight_decay": 0.0, "nesterov": False},
    {"momentum": 0.8, "weight_decay": 0.05, "nesterov": True},
]


def _sizes(rng):
    return [1, 2, 3, 5, *odd_sizes(rng, 2, 7, scale(5000, 200))]


def _write(device, buf, array):
    cl.enqueue_copy(device.queue, buf, np.ascontiguousarray(array, np.float32))


@pytest.mark.parametrize("settings", SGD_SETTINGS)
def test_sgd_over_several_steps_matches_reference(device, lib, bufs, rng, settings):
    for n in _sizes(rng):
        param = rng.normal(size=n).astype(np.float32)
        velocity = np.zeros(n) if settings["momentum"] else None
        bparam, bgrad = bufs.up(param), bufs.empty(n)
        bvelocity = bufs.up(np.zeros(n, np.float32)) if settings["momentum"] else None
        launches = optimizer.sgd_update(lib, bparam, bgrad, bvelocity, n=n, lr=0.05, **settings)
        expected = param.astype(np.float64)
        for _ in range(STEPS):
            grad = rng.normal(size=n).astype(np.float32)
            _write(device, bgrad, grad)
            run(device.queue, launches)
            expected, velocity = ref.sgd_update(expected, grad, velocity, lr=0.05, **settings)
        assert_close(bufs.down(bparam, n), expected)
        if settings["momentum"]:
            assert_close(bufs.down(bvelocity, n), velocity)


@pytest.mark.parametrize("weight_decay", [0.0, 0.02])
def test_adam_over_several_steps_matches_reference(device, lib, bufs, rng, weight_decay):
    hyper = {"lr": 0.01, "beta1": 0.85, "beta2": 0.995, "eps": 1e-6, "weight_decay": weight_decay}
    for n in _sizes(rng):
        param = rng.normal(size=n).astype(np.float32)
        bparam, bgrad, step = bufs.up(param), bufs.empty(n), bufs.up(np.array([1], np.int32))
        bm, bv = bufs.up(np.zeros(n, np.float32)), bufs.up(np.zeros(n, np.float32))
        launches = optimizer.adam_update(lib, bparam, bgrad, bm, bv, step, n=n, **hyper)
        launches += optimizer.increment_step(lib, step)
        expected, m, v = param.astype(np.float64), np.zeros(n), np.zeros(n)
        for t in range(1, STEPS + 1):
            grad = rng.normal(size=n).astype(np.float32)
            _write(device, bgrad, grad)
            run(device.queue, launches)
            expected, m, v = ref.adam_update(expected, grad, m, v, t, **hyper)
        assert_close(bufs.down(bparam, n), expected)
        assert_close(bufs.down(bm, n), m)
        assert_close(bufs.down(bv, n), v)
        assert bufs.down(step, 1, np.int32)[0] == STEPS + 1


def test_adam_bias_correction_follows_the_device_counter(device, lib, bufs, rng):
    n, t = 17, 1000
    param, grad = rng.normal(size=n).astype(np.float32), rng.normal(size=n).astype(np.float32)
    m, v = rng.normal(size=n).astype(np.float32), rng.uniform(0.1, 1, n).astype(np.float32)
    bparam = bufs.up(param)
    run(device.queue, optimizer.adam_update(
        lib, bparam, bufs.up(grad), bufs.up(m), bufs.up(v), bufs.up(np.array([t], np.int32)),
        n=n, lr=0.1,
    ))
    assert_close(bufs.down(bparam, n), ref.adam_update(param, grad, m, v, t, lr=0.1)[0])


def test_set_learning_rate_changes_bound_launches(device, lib, bufs, rng):
    n = 29
    param, grad = rng.normal(size=n).astype(np.float32), rng.normal(size=n).astype(np.float32)
    step = bufs.up(np.array([1], np.int32))
    sgd_param, adam_param = bufs.up(param), bufs.up(param)
    bgrad = bufs.up(grad)
    zeros = np.zeros(n, np.float32)
    launches = optimizer.sgd_update(lib, sgd_param, bgrad, bufs.up(zeros), n=n, lr=1.0,
                                    momentum=0.5)
    launches += optimizer.adam_update(lib, adam_param, bgrad, bufs.up(zeros), bufs.up(zeros),
                                      step, n=n, lr=1.0)
    optimizer.set_learning_rate(launches, 0.003)
    run(device.queue, launches)
    sgd_expected = ref.sgd_update(param, grad, zeros, lr=0.003, momentum=0.5)[0]
    adam_expected = ref.adam_update(param, grad, zeros, zeros, 1, lr=0.003)[0]
    assert_close(bufs.down(sgd_param, n), sgd_expected)
    assert_close(bufs.down(adam_param, n), adam_expected)


def test_set_learning_rate_refuses_other_launches(lib, bufs):
    b = bufs.empty(4)
    with pytest.raises(ValueError, match="optimizer update launches"):
        optimizer.set_learning_rate([elementwise.copy(lib, b, b, 4)], 0.1)
    with pytest.raises(ValueError, match="optimizer update launches"):
        optimizer.set_learning_rate(optimizer.increment_step(lib, b), 0.1)


def test_increment_step_counts_training_steps(device, lib, bufs):
    step = bufs.up(np.array([1], np.int32))
    launches = optimizer.increment_step(lib, step)
    for _ in range(3):
        run(device.queue, launches)
    assert bufs.down(step, 1, np.int32)[0] == 4


def test_inconsistent_settings_are_rejected(lib, bufs):
    b = bufs.empty(4)
    with pytest.raises(ValueError, match="Nesterov"):
        optimizer.sgd_update(lib, b, b, b, n=4, lr=0.1, nesterov=True)
    with pytest.raises(ValueError, match="velocity buffer"):
        optimizer.sgd_update(lib, b, b, None, n=4, lr=0.1, momentum=0.9)
    with pytest.raises(ValueError, match="beta2"):
        optimizer.adam_update(lib, b, b, b, b, b, n=4, lr=0.1, beta2=1.0)
