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


# -- multi-tensor updates: every tensor in one launch over one shared buffer -----------------------


class _Arena:
    """Tensors of several odd sizes packed into one float buffer at unaligned element offsets
    (gaps of 1-3 floats), followed by the update table and the step counter."""

    def __init__(self, device, rng, sizes, states_per_tensor):
        self.device = device
        offset, self.tensors = 0, []
        for n in sizes:
            fields = []
            for _ in range(2 + states_per_tensor):  # param, grad, states
                offset += int(rng.integers(1, 4))
                fields.append(offset)
                offset += n
            self.tensors.append(optimizer.ArenaTensor(n, fields[0], fields[1], tuple(fields[2:])))
        table = optimizer.update_table(self.tensors)
        self.table_offset = offset + 1
        self.step_offset = self.table_offset + len(table) + 1
        self.host = np.full(self.step_offset + 1, np.nan, np.float32)
        self.host.view(np.int32)[self.table_offset : self.table_offset + len(table)] = table
        self.host.view(np.int32)[self.step_offset] = 1
        flags = cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR
        self.buffer = cl.Buffer(device.context, flags, hostbuf=self.host)

    # Whole-buffer copies only: oclgrind's --uninitialized check loses track of the rest of a
    # buffer after a write at an offset into it.
    def _download(self) -> np.ndarray:
        out = np.empty_like(self.host)
        cl.enqueue_copy(self.device.queue, out, self.buffer)
        self.device.queue.finish()
        return out

    def write(self, element_offset: int, array) -> None:
        host = self._download()
        data = np.ascontiguousarray(array, np.float32)
        host[element_offset : element_offset + data.size] = data
        cl.enqueue_copy(self.device.queue, self.buffer, host)

    def set_step(self, t: int) -> None:
        host = self._download()
        host.view(np.int32)[self.step_offset] = t
        cl.enqueue_copy(self.device.queue, self.buffer, host)

    def read(self, element_offset: int, n: int) -> np.ndarray:
        return self._download()[element_offset : element_offset + n]


def _multi_sizes(rng):
    return [1, 2, 3, 5, 8, *odd_sizes(rng, 3, 7, scale(3000, 150))]


@pytest.mark.parametrize("settings", SGD_SETTINGS)
@pytest.mark.parametrize("zero_grads", [False, True])
def test_multi_tensor_sgd_matches_reference(device, lib, rng, settings, zero_grads):
    sizes = _multi_sizes(rng)
    momentum = settings["momentum"]
    arena = _Arena(device, rng, sizes, 1 if momentum else 0)
    expected, velocity = [], []
    for t in arena.tensors:
        param = rng.normal(size=t.n).astype(np.float32)
        arena.write(t.param, param)
        expected.append(param.astype(np.float64))
        if momentum:
            arena.write(t.states[0], np.zeros(t.n, np.float32))
        velocity.append(np.zeros(t.n) if momentum else None)
    launches = optimizer.sgd_update_multi(lib, arena.buffer, arena.tensors,
                                          table_offset=arena.table_offset, lr=0.05,
                                          zero_grads=zero_grads, **settings)
    assert len(launches) == 1
    for _ in range(STEPS):
        for i, t in enumerate(arena.tensors):
            grad = rng.normal(size=t.n).astype(np.float32)
            arena.write(t.grad, grad)
            expected[i], velocity[i] = ref.sgd_update(expected[i], grad, velocity[i], lr=0.05,
                                                      **settings)
        run(device.queue, launches)
    for i, t in enumerate(arena.tensors):
        assert_close(arena.read(t.param, t.n), expected[i])
        if momentum:
            assert_close(arena.read(t.states[0], t.n), velocity[i])
        grad = arena.read(t.grad, t.n)
        assert np.all(grad == 0) if zero_grads else np.all(np.isfinite(grad))
    gaps = np.ones(len(arena.host), bool)  # nothing between the tensors is written
    gaps[arena.table_offset :] = False
    for t in arena.tensors:
        for offset in (t.param, t.grad, *t.states):
            gaps[offset : offset + t.n] = False
    assert np.all(np.isnan(arena.read(0, len(arena.host))[gaps]))


@pytest.mark.parametrize("weight_decay", [0.0, 0.02])
def test_multi_tensor_adam_over_several_steps_matches_reference(device, lib, rng, weight_decay):
    hyper = {"lr": 0.01, "beta1": 0.85, "beta2": 0.995, "eps": 1e-6, "weight_decay": weight_decay}
    arena = _Arena(device, rng, _multi_sizes(rng), 2)
    expected = []
    for t in arena.tensors:
        param = rng.normal(size=t.n).astype(np.float32)
        arena.write(t.param, param)
        for state in t.states:
            arena.write(state, np.zeros(t.n, np.float32))
        expected.append((param.astype(np.float64), np.zeros(t.n), np.zeros(t.n)))
    launches = optimizer.adam_update_multi(lib, arena.buffer, arena.tensors,
                                           table_offset=arena.table_offset,
                                           step_offset=arena.step_offset, **hyper)
    for step in range(1, STEPS + 1):
        arena.set_step(step)
        for i, t in enumerate(arena.tensors):
            grad = rng.normal(size=t.n).astype(np.float32)
            arena.write(t.grad, grad)
            expected[i] = ref.adam_update(*expected[i][:1], grad, *expected[i][1:], step, **hyper)
        run(device.queue, launches)
    for (param, m, v), t in zip(expected, arena.tensors, strict=True):
        assert_close(arena.read(t.param, t.n), param)
        assert_close(arena.read(t.states[0], t.n), m)
        assert_close(arena.read(t.states[1], t.n), v)


@pytest.mark.parametrize("name", ["sgd", "nesterov", "adam"])
def test_multi_tensor_update_is_bitwise_the_single_tensor_update(device, lib, bufs, rng, name):
    """Same arithmetic per element: the one-launch update reproduces the per-tensor kernels."""
    states = 2 if name == "adam" else 1
    arena = _Arena(device, rng, _multi_sizes(rng), states)
    arena.set_step(3)
    hyper = {"lr": 0.03, "weight_decay": 0.01}
    if name != "adam":
        hyper.update(momentum=0.9, nesterov=name == "nesterov")
    singles = []
    for t in arena.tensors:
        values = [rng.normal(size=t.n).astype(np.float32) for _ in range(2 + states)]
        if name == "adam":
            values[3] = np.abs(values[3])
        for offset, value in zip((t.param, t.grad, *t.states), values, strict=True):
            arena.write(offset, value)
        single = [bufs.up(value) for value in values]
        if name == "adam":
            launches = optimizer.adam_update(lib, *single, bufs.up(np.array([3], np.int32)),
                                             n=t.n, **hyper)
        else:
            launches = optimizer.sgd_update(lib, *single, n=t.n, **hyper)
        run(device.queue, launches)
        singles.append(single)
    if name == "adam":
        run(device.queue, optimizer.adam_update_multi(
            lib, arena.buffer, arena.tensors, table_offset=arena.table_offset,
            step_offset=arena.step_offset, **hyper))
    else:
        run(device.queue, optimizer.sgd_update_multi(
            lib, arena.buffer, arena.tensors, table_offset=arena.table_offset, **hyper))
    for t, single in zip(arena.tensors, singles, strict=True):
        for offset, buf in zip((t.param, *t.states), (single[0], *single[2:]), strict=True):
            np.testing.assert_array_equal(arena.read(offset, t.n), bufs.down(buf, t.n))


def test_set_learning_rate_changes_multi_tensor_launches(device, lib, rng):
    arena = _Arena(device, rng, [7, 13], 0)
    params, grads = [], []
    for t in arena.tensors:
        params.append(rng.normal(size=t.n).astype(np.float32))
        grads.append(rng.normal(size=t.n).astype(np.float32))
        arena.write(t.param, params[-1])
        arena.write(t.grad, grads[-1])
    launches = optimizer.sgd_update_multi(lib, arena.buffer, arena.tensors,
                                          table_offset=arena.table_offset, lr=1.0)
    optimizer.set_learning_rate(launches, 0.003)
    run(device.queue, launches)
    for t, param, grad in zip(arena.tensors, params, grads, strict=True):
        assert_close(arena.read(t.param, t.n), ref.sgd_update(param, grad, lr=0.003)[0])


def test_update_table_layout_and_checks(lib, bufs):
    tensors = [optimizer.ArenaTensor(5, 0, 8, (16,)), optimizer.ArenaTensor(8, 24, 32, (40,))]
    table = optimizer.update_table(tensors)
    assert table.dtype == np.int32
    assert len(table) == optimizer.update_table_length(2)
    assert list(table[:3]) == [0, 2, 4]  # ceil(5/4), then + 8/4 work-items
    assert list(table[3:]) == [5, 0, 8, 16, 0, 8, 24, 32, 40, 0]
    assert optimizer.element_offset(1024) == 256
    with pytest.raises(ValueError, match="whole number of floats"):
        optimizer.element_offset(1026)
    with pytest.raises(ValueError, match="at least one tensor"):
        optimizer.update_table([])
    with pytest.raises(ValueError, match="n >= 1"):
        optimizer.update_table([optimizer.ArenaTensor(0, 0, 0)])
    with pytest.raises(OverflowError):
        optimizer.update_table([optimizer.ArenaTensor(4, 2**31, 0)])
    b = bufs.empty(4)
    with pytest.raises(ValueError, match="one velocity state"):
        optimizer.sgd_update_multi(lib, b, tensors[:1] + [optimizer.ArenaTensor(3, 0, 4)],
                                   table_offset=0, lr=0.1, momentum=0.9)
    with pytest.raises(ValueError, match="two states"):
        optimizer.adam_update_multi(lib, b, tensors, table_offset=0, step_offset=0, lr=0.1)
    with pytest.raises(ValueError, match="Nesterov"):
        optimizer.sgd_update_multi(lib, b, tensors, table_offset=0, lr=0.1, nesterov=True)
