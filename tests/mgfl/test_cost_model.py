"""The cost model: a roofline per launch at the launch's occupancy and its kernel class's
efficiency, plus launch overhead and the batch copy; every engine kernel has a class; and a real
compiled step's prediction on the calibrated local device is of the order of its event time."""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from mgfl.cost_model import (
    kernel_seconds,
    occupancy,
    predict,
    predict_step,
    step_launches,
    uplink_seconds,
)
from mgfl.device_profiles import PROFILES, DeviceProfile
from mgfl.kernel_classes import CLASSES, KERNEL_CLASS, kernel_class

CL_DIR = Path(__file__).resolve().parents[2] / "kernels" / "cl"


@dataclass
class Work:
    flops: int
    bytes_moved: int
    global_size: tuple[int, ...] = (1 << 20,)
    name: str = "relu_forward"


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


def test_occupancy_scales_small_launches_and_saturates():
    wide = replace(PROFILE, lanes=1000)
    assert occupancy(250, 1000) == 0.25
    assert occupancy(5000, 1000) == occupancy(1000, 1000) == 1.0
    assert occupancy(0, 1000) == occupancy(1, 1000)  # an empty launch still occupies one lane
    full = kernel_seconds(10**9, 0, wide, work_items=1000)
    assert kernel_seconds(10**9, 0, wide, work_items=250) == pytest.approx(4 * full)
    assert kernel_seconds(10**9, 0, wide, work_items=10**6) == pytest.approx(full)
    # the same work in a quarter of the lanes: four times the time, in the step total too
    small = predict([Work(0, 10**8, (250,))], 0, wide).memory_s
    assert small == pytest.approx(4 * predict([Work(0, 10**8, (10, 100))], 0, wide).memory_s)


def test_class_efficiency_divides_the_roofline():
    slow_norm = replace(PROFILE, efficiency={"normalisation": 0.25})
    norm = Work(0, 10**8, name="batchnorm_backward")
    gemm = Work(0, 10**8, name="gemm_register")
    assert predict([norm], 0, slow_norm).memory_s == pytest.approx(
        4 * predict([norm], 0, PROFILE).memory_s)
    assert predict([gemm], 0, slow_norm).memory_s == pytest.approx(
        predict([gemm], 0, PROFILE).memory_s)


def test_a_faster_device_is_never_predicted_slower():
    work = [Work(10**7 * i, 10**6 * (7 - i)) for i in range(7)]
    slow = predict(work, 10**5, PROFILE).total_s
    fast = predict(work, 10**5, replace(PROFILE, peak_flops=4e9, memory_bandwidth=3e9)).total_s
    assert fast < slow


def test_uplink_time_and_bad_bandwidth():
    assert uplink_seconds(125_000, 1e6) == pytest.approx(1.0)
    with pytest.raises(ValueError):
        uplink_seconds(1, 0)


def _kernels_defined_in_cl_sources() -> set[str]:
    """Every kernel function in kernels/cl/*.cl, including those a macro defines per name."""
    names = set()
    for path in CL_DIR.glob("*.cl"):
        source = re.sub(r"//[^\n]*", "", path.read_text()).replace("\\\n", " ")
        lines = source.splitlines()
        defines = [line for line in lines if line.lstrip().startswith("#define")]
        body = "\n".join(line for line in lines if not line.lstrip().startswith("#define"))
        names |= set(re.findall(r"__kernel\b[^;{]*?\bvoid\s+(\w+)\s*\(", body))
        for define in defines:
            macro = re.match(r"\s*#define\s+(\w+)\((\w+)", define)
            if macro and re.search(rf"\bvoid\s+{macro.group(2)}\s*\(", define):
                names |= set(re.findall(rf"\b{macro.group(1)}\(\s*(\w+)\s*,", body))
    return names


def test_every_kernel_of_the_engine_has_a_class():
    defined = _kernels_defined_in_cl_sources()
    assert {"gemm_register", "relu6_forward", "maxpool_backward", "im2col"} <= defined
    missing = sorted(defined - set(KERNEL_CLASS))
    assert not missing, f"kernels without a cost-model class: {missing}"
    assert set(KERNEL_CLASS.values()) == set(CLASSES)
    with pytest.raises(KeyError, match="no cost-model class"):
        kernel_class("a_kernel_added_tomorrow")


def test_launches_of_every_zoo_step_have_a_class(device):
    from client_runtime.graph import OptimizerConfig
    from client_runtime.step import CompiledStep
    from mgfl.models import build_model

    model = build_model("lenet5")
    step = CompiledStep(device, model, 2, model.init_state(0), profile=False,
                        optimizer=OptimizerConfig(name="adam"))
    names = {launch.name for launch in step_launches(step)}
    assert {"maxpool_backward", "adam_update_multi", "im2col"} <= names
    assert all(kernel_class(name) in CLASSES for name in names)


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


def test_prediction_is_of_the_order_of_the_measured_step(device, monkeypatch):
    """Calibrate the local device, then predict a DS-CNN step (not the calibration network) and
    compare with the event time of its launches measured right after: a ratio, not a speed."""
    from client_runtime import calibration
    from client_runtime.step import CompiledStep
    from mgfl.models import build_model

    monkeypatch.setattr(calibration, "COPY_ELEMENTS", 2**20)
    monkeypatch.setattr(calibration, "GEMM_SIZE", 128)
    monkeypatch.setattr(calibration, "LAUNCHES", 20)
    monkeypatch.setattr(calibration, "REPEATS", 3)
    profile = calibration.calibrate(device)
    assert profile.lanes >= 1 and set(profile.efficiency) == set(CLASSES)
    model = build_model("dscnn", channels=16)
    step = CompiledStep(device, model, 4, model.init_state(0), profile=False)
    step.train_step(*_batch(model, 4))
    device.queue.finish()
    launches = step_launches(step)
    measured = sum(calibration.launch_event_seconds(device, launches, 3))
    predicted = predict_step(step, profile)
    kernels = predicted.compute_s + predicted.memory_s
    assert measured / 4 < kernels < measured * 4, (kernels, measured)


def _batch(model, batch):
    import numpy as np

    rng = np.random.default_rng(1)
    x = rng.standard_normal((batch, *model.input_shape)).astype(np.float32)
    return x, rng.integers(0, model.num_classes, batch).astype(np.int32)
