"""Device selection under ``auto``: a GPU that fails to open or build falls back to the CPU
device with a warning; an explicit selection or a failing CPU is never replaced."""

from __future__ import annotations

from dataclasses import replace

import pyopencl as cl
import pytest

import client_runtime.device_fallback as fallback
from client_runtime.device import Device, list_devices
from client_runtime.device_fallback import DeviceFallbackWarning, open_client_device
from kernels.library import KernelBuildError


@pytest.fixture
def fake_gpu(monkeypatch):
    """The machine's devices, with a GPU (index 99) in front whose driver fails."""
    cpu = list_devices()[0]
    gpu = replace(cpu, index=99, kind="gpu", name="Broken Mobile GPU")
    monkeypatch.setattr(fallback, "choose_device", lambda selection: gpu)
    monkeypatch.setattr(fallback, "list_devices", lambda: [gpu, cpu])
    return gpu, cpu


def failing_gpu(error: Exception):
    def opener(selection: str) -> Device:
        if selection == "99":
            raise error
        return Device.open(selection)
    return opener


@pytest.mark.parametrize("error", [
    cl.RuntimeError("clCreateContext failed: DEVICE_NOT_AVAILABLE"),
    KernelBuildError("Kernel source elementwise.cl failed to build on Broken Mobile GPU"),
])
def test_auto_falls_back_to_the_cpu_with_a_warning(fake_gpu, error):
    gpu, cpu = fake_gpu
    with pytest.warns(DeviceFallbackWarning, match="Broken Mobile GPU"):
        device = open_client_device("auto", opener=failing_gpu(error))
    assert device.info.index == cpu.index


def test_an_explicit_selection_is_not_replaced(fake_gpu):
    with pytest.raises(cl.RuntimeError):
        open_client_device("99", opener=failing_gpu(cl.RuntimeError("lost")))


def test_a_working_auto_device_is_used_without_warning(recwarn):
    device = open_client_device("auto")
    assert device.info.kind in {"cpu", "gpu", "accelerator"}
    assert not [w for w in recwarn if issubclass(w.category, DeviceFallbackWarning)]
