"""Device selection under ``auto``: a GPU that fails to open or build falls back to the CPU
device with a warning; an explicit selection or a failing CPU is never replaced."""

from __future__ import annotations

from dataclasses import replace

import pyopencl as cl
import pytest

import client_runtime.device_fallback as fallback
from client_runtime.device import Device, list_devices
from client_runtime.device_fallback import (
    DeviceFallbackWarning,
    open_client_device,
    run_with_fallback,
)
from kernels.device_errors import DeviceError
from kernels.library import KernelBuildError


@pytest.fixture
def fake_gpu(monkeypatch):
    """The machine's devices, with a GPU (index 99) in front whose driver fails."""
    cpus = [info for info in list_devices() if info.kind == "cpu"]
    if not cpus:
        pytest.skip("falling back needs a CPU OpenCL device (e.g. PoCL) beside the GPU")
    cpu = cpus[0]
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


def _lost(what: str) -> DeviceError:
    record = cl._cl._ErrorRecord("clFinish", cl.status_code.OUT_OF_RESOURCES, "lost")
    return DeviceError(what, cl.RuntimeError(record))


def opener_with_gpu(gpu, cpu):
    """Opens the CPU device for both; the one opened for index 99 describes itself as the GPU."""
    def opener(selection: str) -> Device:
        device = Device.open(str(cpu.index))
        if selection == "99":
            device.info = gpu
        return device
    return opener


def test_a_device_lost_mid_work_starts_again_on_the_cpu_under_auto(fake_gpu):
    gpu, cpu = fake_gpu
    seen = []

    def work(device: Device) -> str:
        seen.append(device.info.kind)
        if device.info.kind == "gpu":
            raise _lost("kernel gemm_local of conv1.forward")
        return "trained"

    with pytest.warns(DeviceFallbackWarning, match="conv1.forward"):
        result, used = run_with_fallback(work, "auto", opener=opener_with_gpu(gpu, cpu))
    assert (result, seen, used.info.kind) == ("trained", ["gpu", "cpu"], "cpu")


def test_mid_work_failures_are_raised_when_no_fallback_applies(fake_gpu):
    gpu, cpu = fake_gpu

    def lost(device: Device) -> None:
        raise _lost("kernel x")

    with pytest.raises(DeviceError):  # an explicit selection is never replaced
        run_with_fallback(lost, "99", opener=opener_with_gpu(gpu, cpu))

    def invalid(device: Device) -> None:  # not a lost device: a bug, shown as it is
        record = cl._cl._ErrorRecord("clEnqueueNDRangeKernel",
                                     cl.status_code.INVALID_KERNEL_ARGS, "bad")
        raise DeviceError("kernel x", cl.RuntimeError(record))

    with pytest.raises(DeviceError, match="INVALID_KERNEL_ARGS"):
        run_with_fallback(invalid, "auto", opener=opener_with_gpu(gpu, cpu))
