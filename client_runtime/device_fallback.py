"""Opening the client's device so that a phone whose GPU driver fails still trains.

With the selection ``auto`` (``--device auto``, ``MGFL_DEVICE=auto`` or nothing set), the
preferred device is opened and a small program is built on it; if either fails on a device that
is not a CPU, the first CPU device is opened instead, with a warning that says why. An explicit
selection is never replaced: asking for a device and silently getting another would hide the
failure.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from typing import TypeVar

import pyopencl as cl

from client_runtime.device import DEVICE_ENV, Device, choose_device, list_devices
from kernels.device_errors import DeviceError
from kernels.library import KernelBuildError

PROBE_PROGRAM = "elementwise"
T = TypeVar("T")


class DeviceFallbackWarning(RuntimeWarning):
    """The preferred device failed and the CPU device is used instead."""


def _probe(device: Device) -> Device:
    device.kernels.program(PROBE_PROGRAM)
    return device


def open_client_device(selection: str | None = None,
                       opener: Callable[[str], Device] = Device.open) -> Device:
    """The device ``selection`` names, falling back to a CPU device under ``auto``."""
    wanted = (selection or os.environ.get(DEVICE_ENV) or "auto").strip()
    if wanted.lower() != "auto":
        return opener(wanted)
    preferred = choose_device("auto")
    try:
        return _probe(opener(str(preferred.index)))
    except (cl.Error, KernelBuildError, MemoryError) as err:
        if preferred.kind == "cpu":
            raise
        cpus = [info for info in list_devices() if info.kind == "cpu"]
        if not cpus:
            raise
        fallback = cpus[0]
        warnings.warn(f"OpenCL device {preferred.describe()} failed ({err}); training on "
                      f"{fallback.describe()} instead", DeviceFallbackWarning, stacklevel=2)
        return _probe(opener(str(fallback.index)))


def run_with_fallback(work: Callable[[Device], T], selection: str | None = None,
                      opener: Callable[[str], Device] = Device.open) -> tuple[T, Device]:
    """``work`` on the client's device; under ``auto``, if that device is lost or runs out of
    resources mid-way (a GPU driver reset on a phone), ``work`` runs again from its start on the
    CPU device, with a warning naming what failed. Returns the result and the device used."""
    wanted = (selection or os.environ.get(DEVICE_ENV) or "auto").strip()
    device = open_client_device(wanted, opener=opener)
    try:
        return work(device), device
    except DeviceError as err:
        if wanted.lower() != "auto" or device.info.kind == "cpu" or not err.device_lost:
            raise
        cpus = [info for info in list_devices() if info.kind == "cpu"]
        if not cpus:
            raise
        warnings.warn(f"OpenCL device {device.info.describe()} failed during the work ({err}); "
                      f"starting again on {cpus[0].describe()}", DeviceFallbackWarning,
                      stacklevel=2)
        cpu = _probe(opener(str(cpus[0].index)))
        return work(cpu), cpu
