"""Run-time OpenCL failures name the kernel or buffer, and say whether the device is gone."""

from __future__ import annotations

import numpy as np
import pyopencl as cl
import pytest

from kernels import elementwise
from kernels.device_errors import DeviceError, naming
from tests.conftest import UNDER_OCLGRIND


def _status(code: int, routine: str = "clFinish") -> cl.RuntimeError:
    return cl.RuntimeError(cl._cl._ErrorRecord(routine, code, "injected by the test"))


def test_a_launch_the_device_refuses_names_its_kernel_and_sizes(device, lib, bufs):
    launch = elementwise.fill(lib, bufs.empty(64), 1.0, 64)
    too_big = device.cl_device.max_work_group_size * 2
    launch.global_size, launch.local_size = (too_big,), (too_big,)
    launch.tensors = "layer3.forward (reads x; writes y)"
    with pytest.raises(DeviceError) as caught:
        launch.enqueue(device.queue)
    message = str(caught.value)
    assert f"kernel {launch.name}" in message
    assert "layer3.forward (reads x; writes y)" in message
    assert f"local ({too_big},)" in message
    assert caught.value.status.split()[0] in ("CL_INVALID_WORK_GROUP_SIZE",
                                              "CL_INVALID_WORK_ITEM_SIZE")
    assert not caught.value.device_lost


@pytest.mark.skipif(UNDER_OCLGRIND, reason="oclgrind's simulated device allocates any size")
def test_a_buffer_the_device_cannot_allocate_is_named(device):
    # Twice the device's whole memory, touched at its end: some drivers refuse the size at once,
    # others (NVIDIA) allocate lazily and fail at the first use.
    too_big = 2 * device.cl_device.global_mem_size
    with pytest.raises(DeviceError) as caught, naming(f"buffer conv1.out ({too_big} bytes)"):
        buf = cl.Buffer(device.context, cl.mem_flags.READ_WRITE, too_big)
        cl.enqueue_fill_buffer(device.queue, buf, np.float32(0), too_big - 4, 4).wait()
    assert "buffer conv1.out" in str(caught.value)
    assert caught.value.out_of_memory or caught.value.device_lost


@pytest.mark.parametrize(
    ("code", "lost", "memory"),
    [
        (cl.status_code.OUT_OF_RESOURCES, True, False),
        (cl.status_code.DEVICE_NOT_AVAILABLE, True, False),
        (cl.status_code.MEM_OBJECT_ALLOCATION_FAILURE, False, True),
        (cl.status_code.INVALID_KERNEL_ARGS, False, False),
    ],
)
def test_status_codes_are_classified_and_explained(code, lost, memory):
    with pytest.raises(DeviceError) as caught, naming("kernel gemm_local"):
        raise _status(code)
    err = caught.value
    assert (err.device_lost, err.out_of_memory) == (lost, memory)
    assert str(err).startswith("OpenCL failed in kernel gemm_local: CL_")
    assert isinstance(err.__cause__, cl.Error)


def test_errors_other_than_opencl_pass_through():
    with pytest.raises(ValueError), naming("kernel x"):
        raise ValueError("not an OpenCL failure")
