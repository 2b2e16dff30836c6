"""A failing step names the launch, the layer's tensors, or the copy: not only an API call."""

from __future__ import annotations

import numpy as np
import pyopencl as cl
import pytest

from client_runtime.step import CompiledStep
from kernels.device_errors import DeviceError
from mgfl.models import build_model


class _LostQueue:
    """A queue whose device is gone: every wait reports what NVIDIA's driver reports then."""

    def __init__(self, queue):
        self._queue = queue

    def finish(self):
        raise cl.RuntimeError(cl._cl._ErrorRecord("clFinish", cl.status_code.OUT_OF_RESOURCES,
                                                  "device lost"))

    def __getattr__(self, name):
        return getattr(self._queue, name)


class _DeviceWithLostQueue:
    def __init__(self, device):
        self._device = device
        self.queue = _LostQueue(device.queue)

    def __getattr__(self, name):
        return getattr(self._device, name)


@pytest.fixture
def mlp_step(device):
    model = build_model("mlp")
    step = CompiledStep(device, model, 8, model.init_state(0))
    yield step
    step.close()


def _batch(step, rng):
    x = rng.normal(size=(8, *step.model.input_shape)).astype(np.float32)
    y = rng.integers(0, step.model.num_classes, 8).astype(np.int32)
    return x, y


def test_a_launch_failing_in_a_step_names_its_layer_and_tensors(device, mlp_step, rng):
    broken = mlp_step.train_launches[3]
    good_local = broken.local_size
    too_big = device.cl_device.max_work_group_size * 2
    broken.global_size, broken.local_size = (too_big,) * len(broken.global_size), (too_big,) * len(
        broken.global_size)
    try:
        with pytest.raises(DeviceError) as caught:
            mlp_step.train_step(*_batch(mlp_step, rng))
    finally:
        broken.local_size = good_local
    message = str(caught.value)
    assert f"kernel {broken.name} of " in message
    assert "reads " in message and "writes " in message


def test_a_lost_device_at_the_next_wait_names_the_last_launch(device, mlp_step, rng):
    mlp_step.train_step(*_batch(mlp_step, rng))
    mlp_step.synchronize()
    real = mlp_step.device
    mlp_step.device = _DeviceWithLostQueue(real)
    try:
        with pytest.raises(DeviceError) as caught:
            mlp_step.synchronize()
    finally:
        mlp_step.device = real
    err = caught.value
    assert err.device_lost
    assert "waiting for the device, after kernel " in str(err)
    assert mlp_step.train_launches[-1].name in str(err)
    assert "lost GPU" in str(err)
