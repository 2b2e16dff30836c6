"""The roofline cost model: each launch bound by the slower of arithmetic and memory traffic,
plus launch overhead and the batch copy; and its use on a real compiled step."""

from __future__ import annotations

from dataclasses import dataclass, replace

import pytest

from mgfl.cost_model import kernel_seconds, predict, predict_step, step_launches, uplink_seconds
from mgfl.device_profiles import PROFILES, DeviceProfile


@dataclass
class Work:
    flops: int
    bytes_moved: int


PROFILE = DeviceProfile(
    name="test", soc="", peak_flops=2e9, sustained_fraction=0.5, memory_bandwidth=1e9,
    host_copy_bandwidth=0.5e9, launch_overhead_s=1e-3, memory_budget_bytes=2**20, sources=(),
)


def test_each_launch_takes_the_slower_of_compute_and_memory():
    assert kernel_seconds(10**9, 10, PROFILE) == pytest.approx(1.0)  # 1 GFLOP at 1 GFLOP/s
    assert kernel_seconds(10, 2 * 10**9, PROFILE) == pytest.approx(2.0)  # 2 GB at 1 GB/s


def test_step_sums_rooflines_overheads_and_the_copy():
    cost = predict([Work(10**9, 10), Work(10, 2 * 10**9), Work(0, 0)], 10**8, PROFILE)
    assert cost.compute_s == pytest.approx(1.0)
    assert cost.memory_s == pytest.approx(2.0)
    assert cost.launch_s == pytest.approx(3e-3)
    assert cost.copy_s == pytest.approx(0.2)
    assert cost.total_s == pytest.approx(3.203)
    assert (cost.launches, cost.flops, cost.bytes_moved) == (3, 10**9 + 10, 2 * 10**9 + 10)


def test_a_faster_device_is_never_predicted_slower():
    work = [Work(10**7 * i, 10**6 * (7 - i)) for i in range(7)]
    slow = predict(work, 10**5, PROFILE).total_s
    fast = predict(work, 10**5, replace(PROFILE, peak_flops=4e9, memory_bandwidth=3e9)).total_s
    assert fast < slow


def test_uplink_time_and_bad_bandwidth():
    assert uplink_seconds(125_000, 1e6) == pytest.approx(1.0)
    with pytest.raises(ValueError):
        uplink_seconds(1, 0)


def test_prediction_of_a_compiled_step(device):
    from client_runtime.step import CompiledStep
    from mgfl.models import build_model

    model = build_model("mlp", input_shape=(1, 8, 8), num_classes=4, hidden=(16,))
    whole = CompiledStep(device, model, 8, model.init_state(0), profile=False)
    split = CompiledStep(device, model, 8, model.init_state(0), profile=False,
                         accumulation_steps=2)
    profile = PROFILES["adreno-650"]
    cost = predict_step(whole, profile)
    assert cost.launches == len(whole.train_launches)
    assert cost.flops == sum(launch.flops for launch in whole.train_launches) > 0
    assert cost.copy_s == pytest.approx(whole.h2d_bytes_per_step / profile.host_copy_bandwidth)
    # two micro-batches: the micro-batch launches twice, and the deferred update launches
    assert len(step_launches(split)) == 2 * len(split.train_launches) + len(
        split.accumulated_update_launches)
    assert predict_step(split, profile).total_s > cost.total_s
