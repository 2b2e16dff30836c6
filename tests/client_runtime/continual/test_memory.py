"""Exemplar memory: budgets in samples and bytes, balance, rebalancing, storage precision."""

from __future__ import annotations

import numpy as np
import pytest

from client_runtime.continual.memory import ExemplarMemory, MemoryBudget
from client_runtime.continual.storage import StoredSamples, bytes_per_sample

SHAPE = (1, 4, 5)


def _ordered(rng, label, count):
    return rng.normal(size=(count, *SHAPE)).astype(np.float32) + label


def test_rebalancing_keeps_the_first_exemplars_of_each_class(rng):
    memory = ExemplarMemory(MemoryBudget(samples=12), "float32", SHAPE)
    first = {c: _ordered(rng, c, 30) for c in (0, 1)}
    memory.add_classes(first)
    assert memory.counts() == {0: 6, 1: 6}
    memory.add_classes({c: _ordered(rng, c, 30) for c in (2, 3)})
    assert memory.counts() == {0: 3, 1: 3, 2: 3, 3: 3}
    np.testing.assert_array_equal(memory.class_samples(0), first[0][:3])
    memory.add_classes({4: _ordered(rng, 4, 30)})
    assert memory.counts() == {c: 2 for c in range(5)}  # 12 // 5, the remainder stays free
    x, y = memory.samples()
    assert x.shape == (10, *SHAPE) and y.tolist() == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4]


def test_a_class_with_fewer_samples_than_its_quota_keeps_them_all(rng):
    memory = ExemplarMemory(MemoryBudget(samples=20), "float32", SHAPE)
    memory.add_classes({0: _ordered(rng, 0, 3), 1: _ordered(rng, 1, 30)})
    assert memory.counts() == {0: 3, 1: 10}


def test_byte_budget_holds_more_int8_exemplars(rng):
    per_f32, per_i8 = bytes_per_sample(SHAPE, "float32"), bytes_per_sample(SHAPE, "int8")
    assert (per_f32, per_i8, bytes_per_sample(SHAPE, "float16")) == (80, 24, 40)
    budget = MemoryBudget(samples=1000, bytes=800)
    f32 = ExemplarMemory(budget, "float32", SHAPE)
    i8 = ExemplarMemory(budget, "int8", SHAPE)
    assert (f32.capacity, i8.capacity) == (10, 33)
    for memory in (f32, i8):
        memory.add_classes({0: _ordered(rng, 0, 50), 1: _ordered(rng, 1, 50)})
        assert memory.nbytes <= 800
        assert memory.nbytes == len(memory) * memory.sample_bytes
    assert (len(f32), len(i8)) == (10, 32)


@pytest.mark.parametrize("dtype, tolerance", [("float32", 0.0), ("float16", 1e-3), ("int8", 0.5)])
def test_storage_round_trip_error(rng, dtype, tolerance):
    x = rng.normal(0, 2, size=(9, *SHAPE)).astype(np.float32)
    x[3] = 0.0  # an all-zero exemplar must survive int8 scaling
    stored = StoredSamples.encode(x, dtype)
    back = stored.decode()
    peak = np.abs(x).reshape(9, -1).max(axis=1)
    error = np.abs(back - x).reshape(9, -1).max(axis=1)
    # float16 rounds relative to the value, int8 to half a step of its exemplar's scale
    bound = peak * tolerance / (127 if dtype == "int8" else 1) + 1e-7
    assert np.all(error <= bound)
    assert np.all(back[3] == 0.0)
    assert stored.nbytes == 9 * bytes_per_sample(SHAPE, dtype)


def test_adding_a_known_class_or_a_wrong_shape_is_refused(rng):
    memory = ExemplarMemory(MemoryBudget(samples=10), "int8", SHAPE)
    memory.add_classes({0: _ordered(rng, 0, 5)})
    with pytest.raises(ValueError, match="already"):
        memory.add_classes({0: _ordered(rng, 0, 5)})
    with pytest.raises(ValueError, match="shape"):
        memory.add_classes({1: np.zeros((4, 2, 2), np.float32)})
