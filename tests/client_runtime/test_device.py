"""The device layer: listing, selection by index, kind or name, and clear errors."""

from __future__ import annotations

import dataclasses
import json

import pyopencl as cl
import pytest
from typer.testing import CliRunner

from client_runtime import device as dev_module
from client_runtime.device import (
    DeviceNotFoundError,
    NoOpenCLDeviceError,
    choose_device,
    list_devices,
)
from mgfl.cli import app


def test_listing_has_the_figures_planning_needs():
    found = list_devices()
    assert found, "the test machine has at least PoCL"
    for d in found:
        assert d.global_mem_bytes > 0 and d.compute_units > 0
        assert d.local_mem_bytes > 0 and d.max_work_group_size > 0
        assert isinstance(d.fp16, bool)
        assert d.kind in ("gpu", "cpu", "accelerator", "other")


def test_selection_by_index_kind_and_name(monkeypatch):
    monkeypatch.delenv("MGFL_DEVICE", raising=False)
    first = list_devices()[0]
    assert choose_device(str(first.index)).index == first.index
    assert choose_device(first.kind).kind == first.kind
    assert choose_device(first.name[:6].upper()).name.startswith(first.name[:6])
    monkeypatch.setenv("MGFL_DEVICE", str(first.index))
    assert choose_device(None).index == first.index


def test_gpu_and_newer_driver_are_preferred(monkeypatch):
    base = list_devices()[0]
    fake = [
        dataclasses.replace(base, index=0, kind="cpu", driver_version="3.0"),
        dataclasses.replace(base, index=1, kind="cpu", driver_version="3.1"),
        dataclasses.replace(base, index=2, kind="gpu", driver_version="1.0"),
    ]
    monkeypatch.setattr(dev_module, "list_devices", lambda: fake)
    monkeypatch.delenv("MGFL_DEVICE", raising=False)
    assert choose_device(None).index == 2
    assert choose_device("cpu").index == 1


def test_unknown_selection_lists_what_exists(monkeypatch):
    monkeypatch.delenv("MGFL_DEVICE", raising=False)
    with pytest.raises(DeviceNotFoundError, match="Available devices"):
        choose_device("no-such-device-anywhere")


def test_no_opencl_at_all_says_how_to_install(monkeypatch):
    def no_platforms():
        raise cl.LogicError("clGetPlatformIDs", cl.status_code.PLATFORM_NOT_FOUND_KHR, "none")

    monkeypatch.setattr(cl, "get_platforms", no_platforms)
    with pytest.raises(NoOpenCLDeviceError, match="pocl"):
        list_devices()
    result = CliRunner().invoke(app, ["devices"])
    assert result.exit_code == 2
    assert "PoCL" in result.output and "No OpenCL device" in result.output


def test_devices_json_is_a_list_with_one_default():
    result = CliRunner().invoke(app, ["devices", "--json"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.output)
    assert isinstance(rows, list) and sum(r["default"] for r in rows) == 1
    assert {
        "global_mem_bytes",
        "compute_units",
        "local_mem_bytes",
        "max_work_group_size",
        "fp16",
    } <= set(rows[0])


@pytest.fixture(scope="module")
def plain_device(device):
    """The session's OpenCL device opened again without profiling events."""
    from client_runtime.device import Device

    return Device(device.info, profiling=False)


def test_a_device_opens_without_profiling_on_request(device, plain_device):
    profiling = cl.command_queue_properties.PROFILING_ENABLE
    assert device.profiling and device.queue.properties & profiling
    assert not plain_device.profiling and not plain_device.queue.properties & profiling
    assert plain_device.info == device.info
    assert "profiling=False" in repr(plain_device)


def test_a_plain_queue_trains_bitwise_like_a_profiling_one(device, plain_device):
    """Same kernels, same batches, same arena plan: the queue's properties change no result."""
    import numpy as np

    from client_runtime.graph import OptimizerConfig
    from client_runtime.step import CompiledStep
    from mgfl.models import build_model

    model = build_model("mlp")
    rng = np.random.default_rng(3)
    xs = rng.normal(size=(4, 5, *model.input_shape)).astype(np.float32)
    ys = rng.integers(0, model.num_classes, size=(4, 5)).astype(np.int32)
    runs = []
    for dev in (device, plain_device):
        step = CompiledStep(dev, model, 5, model.init_state(1),
                            optimizer=OptimizerConfig("adam", lr=1e-3))
        assert step.profiler.enabled == dev.profiling  # the default follows the device
        losses = []
        for x, y in zip(xs, ys, strict=True):
            step.train_step(x, y)
            losses.append(step.read_train_stats()["loss"])
        runs.append((losses, step.get_state()))
        step.close()
    (losses_a, state_a), (losses_b, state_b) = runs
    assert losses_a == losses_b
    for name in state_a:
        assert np.array_equal(state_a[name], state_b[name]), name


def test_profiling_on_a_plain_device_names_the_fix(plain_device):
    from client_runtime.step import CompiledStep
    from mgfl.models import build_model

    model = build_model("mlp")
    with pytest.raises(ValueError, match=r"profile=True.*profiling=True"):
        CompiledStep(plain_device, model, 2, model.init_state(0), profile=True)
    step = CompiledStep(plain_device, model, 2, model.init_state(0), profile=False)
    assert not step.profiler.enabled
    step.close()
