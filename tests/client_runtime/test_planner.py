"""The arena planner: no two tensors alive at the same time share bytes; sharing does happen."""

from __future__ import annotations

import numpy as np
import pytest

from client_runtime.planner import TensorRequest, align_up, plan_memory


def _random_requests(rng, count):
    out = []
    for i in range(count):
        a, b = sorted(rng.integers(0, 40, 2))
        out.append(TensorRequest(f"t{i}", int(rng.integers(1, 5000)), int(a), int(b)))
    return out


@pytest.mark.parametrize("seed", range(20))
def test_random_plans_never_overlap_live_tensors(seed):
    rng = np.random.default_rng(seed)
    requests = _random_requests(rng, 60)
    plan = plan_memory(requests, alignment=64)
    plan.check_no_live_overlap()
    for p in plan.placements.values():
        assert p.offset % 64 == 0
        assert p.end <= plan.peak_bytes
    # the peak is at least the largest set of simultaneously live tensors
    for t in range(40):
        live = sum(align_up(r.nbytes, 64) for r in requests if r.first <= t <= r.last)
        assert plan.peak_bytes >= live


def test_tensors_with_disjoint_lifetimes_share_memory():
    plan = plan_memory([TensorRequest("a", 1000, 0, 1), TensorRequest("b", 1000, 2, 3)], 256)
    assert plan.offset("a") == plan.offset("b") == 0
    assert plan.peak_bytes == 1024


def test_overlapping_lifetimes_are_stacked():
    plan = plan_memory([TensorRequest("a", 1000, 0, 2), TensorRequest("b", 500, 2, 3)], 256)
    assert plan.peak_bytes == 1024 + 512
    plan.check_no_live_overlap()


def test_overlap_check_catches_a_bad_plan():
    plan = plan_memory([TensorRequest("a", 100, 0, 2), TensorRequest("b", 100, 3, 4)], 64)
    bad = plan.placements["b"].__class__(TensorRequest("b", 100, 1, 4), plan.offset("a"))
    plan.placements["b"] = bad
    with pytest.raises(AssertionError, match="overlap"):
        plan.check_no_live_overlap()


def test_duplicate_names_are_refused():
    with pytest.raises(ValueError):
        plan_memory([TensorRequest("a", 1, 0, 0), TensorRequest("a", 1, 0, 0)])
