"""OpenCL devices: what is there, and which one a client trains on.

A phone has one GPU; a development machine may list a CPU implementation twice (pip's PoCL and the
distribution's). Selection is explicit (``--device`` or ``MGFL_DEVICE``) and otherwise prefers a
GPU, then the newest driver, so results do not depend on the order platforms happen to be listed in.
"""

from __future__ import annotations

import atexit
import gc
import os
import re
from dataclasses import asdict, dataclass
from functools import cached_property

import pyopencl as cl

DEVICE_ENV = "MGFL_DEVICE"

INSTALL_HINT = (
    "No OpenCL device was found. Install an OpenCL implementation: `pip install 'pyopencl[pocl]'` "
    "brings PoCL for the CPU; on Debian or Ubuntu `apt-get install pocl-opencl-icd`; on a machine "
    "with a GPU, the vendor's driver (NVIDIA, AMD, Intel) provides one; on Android, pyopencl must "
    "find the vendor's libOpenCL.so."
)

_KIND_NAMES = {
    cl.device_type.GPU: "gpu",
    cl.device_type.CPU: "cpu",
    cl.device_type.ACCELERATOR: "accelerator",
}
_KIND_RANK = {"gpu": 0, "accelerator": 1, "cpu": 2, "other": 3}


class NoOpenCLDeviceError(RuntimeError):
    """Raised when no OpenCL platform or device is available at all."""


class DeviceNotFoundError(LookupError):
    """Raised when a ``--device`` selection matches none of the listed devices."""


@dataclass(frozen=True)
class DeviceInfo:
    """What the engine needs to know of a device to plan memory and tune kernels."""

    index: int
    platform: str
    platform_version: str
    name: str
    vendor: str
    kind: str
    driver_version: str
    opencl_version: str
    global_mem_bytes: int
    max_alloc_bytes: int
    compute_units: int
    local_mem_bytes: int
    max_work_group_size: int
    fp16: bool
    mem_base_addr_align_bytes: int
    # Whether the device shares memory with the host (CPU drivers, phone GPUs): uploads through
    # a mapped buffer cost no copy there, while a discrete GPU is better fed from pinned memory.
    host_unified_memory: bool = True

    def to_dict(self) -> dict:
        return asdict(self)

    @property
    def cache_key(self) -> str:
        """Identifies the device and driver, for caches of built programs and tuning results."""
        return f"{self.platform}|{self.platform_version}|{self.name}|{self.driver_version}"

    def describe(self) -> str:
        return f"[{self.index}] {self.name} ({self.kind}, {self.platform} {self.driver_version})"


def _kind_of(device: cl.Device) -> str:
    for flag, name in _KIND_NAMES.items():
        if device.type & flag:
            return name
    return "other"


def _version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", text)[:3])


def _info(index: int, platform: cl.Platform, device: cl.Device) -> DeviceInfo:
    return DeviceInfo(
        index=index,
        platform=platform.name.strip(),
        platform_version=platform.version.strip(),
        name=device.name.strip(),
        vendor=device.vendor.strip(),
        kind=_kind_of(device),
        driver_version=device.driver_version.strip(),
        opencl_version=device.version.strip(),
        global_mem_bytes=int(device.global_mem_size),
        max_alloc_bytes=int(device.max_mem_alloc_size),
        compute_units=int(device.max_compute_units),
        local_mem_bytes=int(device.local_mem_size),
        max_work_group_size=int(device.max_work_group_size),
        fp16="cl_khr_fp16" in device.extensions,
        mem_base_addr_align_bytes=int(device.mem_base_addr_align) // 8,
        host_unified_memory=_host_unified_memory(device),
    )


def _host_unified_memory(device: cl.Device) -> bool:
    """The driver's answer; a driver that no longer answers (the query is deprecated since
    OpenCL 2.0) is taken as unified, which keeps the upload path that works everywhere."""
    try:
        return bool(device.host_unified_memory)
    except (cl.Error, AttributeError):
        return True


def _raw_devices() -> list[tuple[cl.Platform, cl.Device]]:
    try:
        platforms = cl.get_platforms()
    except cl.Error as err:  # the ICD loader reports "no platforms" as an error
        raise NoOpenCLDeviceError(f"{INSTALL_HINT} (OpenCL said: {err})") from err
    found = []
    for platform in platforms:
        try:
            devices = platform.get_devices()
        except cl.Error:
            continue
        found.extend((platform, device) for device in devices)
    if not found:
        raise NoOpenCLDeviceError(INSTALL_HINT)
    return found


def list_devices() -> list[DeviceInfo]:
    """Every OpenCL device on every platform, numbered in listing order."""
    return [_info(i, p, d) for i, (p, d) in enumerate(_raw_devices())]


def _preference(info: DeviceInfo) -> tuple:
    newest_driver = tuple(-v for v in _version_tuple(info.driver_version))
    return (_KIND_RANK.get(info.kind, 3), newest_driver, info.index)


def choose_device(selection: str | None = None) -> DeviceInfo:
    """Pick a device by index, kind (``gpu``/``cpu``/``accelerator``) or a case-insensitive part of
    its name, vendor or platform; ``None`` or ``auto`` reads ``MGFL_DEVICE`` and otherwise prefers a
    GPU. Among several matches the preferred one (GPU, then newest driver) wins."""
    devices = list_devices()
    selection = (selection or os.environ.get(DEVICE_ENV) or "auto").strip()
    wanted = selection.lower()
    if wanted == "auto":
        matches = devices
    elif wanted.isdigit():
        matches = [d for d in devices if d.index == int(wanted)]
    elif wanted in _KIND_RANK:
        matches = [d for d in devices if d.kind == wanted]
    else:
        matches = [
            d
            for d in devices
            if wanted in d.name.lower()
            or wanted in d.vendor.lower()
            or wanted in d.platform.lower()
        ]
    if not matches:
        listing = "\n  ".join(d.describe() for d in devices)
        raise DeviceNotFoundError(
            f"No OpenCL device matches {selection!r}. Available devices:\n  {listing}\n"
            "Select one by index, kind (gpu, cpu, accelerator) or part of its name."
        )
    return min(matches, key=_preference)


_crash_prone_driver_opened = False


def crash_prone_driver_opened() -> bool:
    """Whether this process opened a device whose driver crashes when buffers that kernels used
    are released (seen with NVIDIA's OpenCL, driver 580.159): such a process should end without
    the interpreter's teardown once its output is flushed."""
    return _crash_prone_driver_opened


def _drain(queue: cl.CommandQueue) -> None:
    """At exit, finish queued work and free OpenCL objects while the driver is still loaded:
    NVIDIA's driver crashed when buffers and events were released during interpreter teardown."""
    try:
        queue.finish()
    except cl.Error:
        pass  # a lost device has nothing left to finish
    from client_runtime.step import close_all_steps

    close_all_steps()
    gc.collect()


class Device:
    """An opened device: its context, an in-order queue and its kernel library.

    The queue records profiling events unless opened with ``profiling=False``: NVIDIA's driver
    took about 12.5 us per enqueue on a profiling queue and 6-7 us on a plain one (H200), so
    wall-clock timing and training that reads no events run faster without them."""

    def __init__(self, info: DeviceInfo, profiling: bool = True):
        self.info = info
        self.profiling = profiling
        platform, device = _raw_devices()[info.index]
        self.cl_device = device
        self.context = cl.Context([device])
        properties = cl.command_queue_properties.PROFILING_ENABLE if profiling else 0
        self.queue = cl.CommandQueue(self.context, device, properties=properties)
        atexit.register(_drain, self.queue)
        if self.releases_crash:
            global _crash_prone_driver_opened
            _crash_prone_driver_opened = True

    @property
    def releases_crash(self) -> bool:
        return "NVIDIA" in self.info.platform

    @classmethod
    def open(cls, selection: str | None = None, profiling: bool = True) -> Device:
        return cls(choose_device(selection), profiling=profiling)

    def require_profiling(self, what: str) -> None:
        """Raise a ValueError naming the fix when ``what`` needs profiling events this device's
        queue does not record (the tuner's check, naming this device)."""
        from kernels.tuner import require_profiling_queue

        require_profiling_queue(self.queue, f"{what} on {self.info.describe()}")

    @cached_property
    def kernels(self):
        """The programs of ``kernels/``, built once per set of defines and cached on disk."""
        from kernels.library import KernelLibrary

        return KernelLibrary(self.context, self.cl_device, device_key=self.info.cache_key)

    def __repr__(self) -> str:
        plain = "" if self.profiling else ", profiling=False"
        return f"Device({self.info.describe()}{plain})"
