"""OpenCL failures at run time, re-raised with what failed: the kernel, buffer or copy.

pyopencl reports only the API call and the status ("clEnqueueNDRangeKernel failed:
OUT_OF_RESOURCES"); on a phone the user needs to know which of a step's hundreds of launches or
which buffer it was, and whether the device itself is gone (a driver reset after a GPU fault),
in which case nothing on that device can be trusted any more.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pyopencl as cl

# Status codes after which the device (or its context) is unusable: the driver lost it, or a
# kernel faulted (NVIDIA reports illegal addresses as OUT_OF_RESOURCES at the next sync).
_LOST = {
    cl.status_code.DEVICE_NOT_AVAILABLE,
    cl.status_code.OUT_OF_RESOURCES,
    cl.status_code.INVALID_COMMAND_QUEUE,
    cl.status_code.INVALID_CONTEXT,
}
_MEMORY = {
    cl.status_code.MEM_OBJECT_ALLOCATION_FAILURE,
    cl.status_code.OUT_OF_HOST_MEMORY,
    cl.status_code.INVALID_BUFFER_SIZE,
}

_HINTS = {
    cl.status_code.OUT_OF_RESOURCES: (
        "the device ran out of resources or faulted (drivers report a lost GPU this way); "
        "restart the process, and give a smaller --memory-budget or batch if it repeats"
    ),
    cl.status_code.DEVICE_NOT_AVAILABLE: "the device is gone (driver reset or GPU lost)",
    cl.status_code.INVALID_COMMAND_QUEUE: (
        "the command queue is unusable, usually after a lost device"
    ),
    cl.status_code.INVALID_CONTEXT: "the context is unusable, usually after a lost device",
    cl.status_code.MEM_OBJECT_ALLOCATION_FAILURE: (
        "the device could not allocate the memory; give a smaller --memory-budget or batch"
    ),
    cl.status_code.OUT_OF_HOST_MEMORY: "the host is out of memory",
    cl.status_code.INVALID_BUFFER_SIZE: "the buffer is larger than the device allocates at once",
    cl.status_code.INVALID_WORK_GROUP_SIZE: (
        "the work-group shape does not suit this device (above its limit for this kernel?)"
    ),
    cl.status_code.INVALID_WORK_ITEM_SIZE: (
        "the work-group is larger than this device allows in one dimension"
    ),
}


class DeviceError(RuntimeError):
    """An OpenCL call failed at run time; ``subject`` names the kernel, buffer or copy."""

    def __init__(self, subject: str, cause: cl.Error):
        self.subject = subject
        self.code = _code(cause)
        self.status = _status_name(self.code)
        self.device_lost = self.code in _LOST
        self.out_of_memory = self.code in _MEMORY
        hint = _HINTS.get(self.code)
        message = f"OpenCL failed in {subject}: {self.status}"
        super().__init__(f"{message}: {hint}" if hint else message)


@contextmanager
def naming(subject: str) -> Iterator[None]:
    """Re-raise an OpenCL failure inside the block as a DeviceError naming ``subject``."""
    try:
        yield
    except cl.Error as err:
        raise DeviceError(subject, err) from err


def _code(err: cl.Error) -> int | None:
    try:
        return int(err.code)
    except (AttributeError, TypeError, ValueError):
        return None


def _status_name(code: int | None) -> str:
    if code is None:
        return "unknown status"
    for name in dir(cl.status_code):
        if not name.startswith("_") and getattr(cl.status_code, name) == code:
            return f"CL_{name} ({code})"
    return f"status {code}"
