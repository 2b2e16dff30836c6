"""A measured profile of the test device: every figure measured, positive and plausible."""

from __future__ import annotations

import pytest

from client_runtime import calibration
from mgfl.cost_model import predict


def test_calibrated_profile_is_positive_and_usable(device, monkeypatch):
    monkeypatch.setattr(calibration, "COPY_ELEMENTS", 2**18)
    monkeypatch.setattr(calibration, "GEMM_SIZE", 64)
    monkeypatch.setattr(calibration, "LAUNCHES", 20)
    monkeypatch.setattr(calibration, "REPEATS", 2)
    profile = calibration.calibrate(device)
    assert profile.name.endswith(device.info.name)
    assert profile.sustained_flops == profile.peak_flops > 1e6
    assert profile.memory_bandwidth > 1e6
    assert profile.host_copy_bandwidth > 1e6
    assert 0 < profile.launch_overhead_s < 1.0
    assert profile.memory_budget_bytes == device.info.global_mem_bytes
    assert predict([], 0, profile).total_s == 0.0


def test_a_queue_without_profiling_events_is_refused_by_name(device):
    from client_runtime.device import Device

    with pytest.raises(ValueError, match="calibration on .*profiling=True"):
        calibration.calibrate(Device(device.info, profiling=False))
