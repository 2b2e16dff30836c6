"""tinygrad as a reference on the same OpenCL device, when it is installed (the ``bench`` extra).

A zoo model is written with tinygrad tensors from mgfl's description and initial state (same
layers, weights, BatchNorm statistics; softmax cross-entropy; SGD with momentum like PyTorch's),
and its training step runs jitted (``TinyJit``) on tinygrad's OpenCL device.

tinygrad 0.14's OpenCL device takes the first platform its ``libOpenCL`` lists (GPUs first,
``CL:n`` choosing among that platform's devices) and has no setting for another platform. To run
on the device mgfl opened, tinygrad is pointed (``OPENCL_PATH``, read when tinygrad loads OpenCL)
at the ICD loader pyopencl loaded, so both see the same platforms, and its device list is preset
to mgfl's device handle before tinygrad opens it; the opened device's name and driver are checked.

tinygrad compiles every kernel on first use, which may take very long on PoCL, and a running
compilation cannot be interrupted; the step suite therefore measures tinygrad in a child process
(``python -m mgfl.bench.tinygrad_reference REQUEST RESULT``) that a time budget can end.
"""

from __future__ import annotations

import ctypes
import os
import pickle
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from mgfl.bench.report import median_wall_seconds

TINYGRAD_DEVICE = "CL"
LOADER_ENV = "OPENCL_PATH"


def tinygrad_or_none():
    try:
        import tinygrad
    except ImportError:
        return None
    return tinygrad


# -- the device ------------------------------------------------------------------------------


def opencl_loader_path() -> str | None:
    """The OpenCL ICD loader this process loaded (pyopencl's), read from the process's mappings;
    None where that cannot be read (tinygrad then searches the system's library paths)."""
    maps = Path("/proc/self/maps")
    if not maps.exists():
        return None
    found = [line.split()[-1] for line in maps.read_text().splitlines() if "libOpenCL" in line]
    pyopencl_first = sorted(set(found), key=lambda path: "pyopencl" not in path)
    return pyopencl_first[0] if pyopencl_first else None


def use_opencl_device(cl_device) -> str:
    """Make tinygrad's ``CL`` device the given pyopencl device (the one mgfl trains on) and
    return its description. Raises RuntimeError when tinygrad already opened another device in
    this process or when the opened device is not the one asked for."""
    loader = opencl_loader_path()
    if loader and "tinygrad.runtime.autogen.opencl" not in sys.modules:
        os.environ[LOADER_ENV] = loader
    from tinygrad import Device
    from tinygrad.runtime.autogen import opencl as cl
    from tinygrad.runtime.ops_cl import CLDevice

    wanted = cl_device.int_ptr
    if CLDevice.device_ids is None:
        handle = ctypes.cast(ctypes.c_void_p(wanted), cl.cl_device_id)
        CLDevice.device_ids = (cl.cl_device_id * 1)(handle)
    held = ctypes.cast(CLDevice.device_ids[0], ctypes.c_void_p).value
    if held != wanted:
        raise RuntimeError("tinygrad already uses another OpenCL device in this process")
    opened = Device[TINYGRAD_DEVICE]
    name, driver = cl_device.name.strip(), cl_device.driver_version.strip()
    if (opened.device_name.strip(), opened.driver_version.strip()) != (name, driver):
        raise RuntimeError(
            f"tinygrad opened {opened.device_name} ({opened.driver_version}), not {name} ({driver})"
        )
    return f"{name} ({cl_device.platform.name.strip()} {driver})"


# -- the model -------------------------------------------------------------------------------


class TinygradModel:
    """A zoo model as tinygrad tensor operations; ``parameters`` in mgfl's state order.

    Training or evaluation behaviour (BatchNorm statistics, dropout) follows tinygrad's
    ``TRAINING`` context, as tinygrad's own layers do."""

    def __init__(self, forward: Callable, parameters: dict, buffers: dict):
        self._forward = forward
        self.parameters = parameters
        self.buffers = buffers

    def __call__(self, x):
        return self._forward(x)


def build_tinygrad_model(model, state: dict, device: str = TINYGRAD_DEVICE) -> TinygradModel:
    """tinygrad tensors computing ``model`` (an mgfl Model), parameters and BatchNorm statistics
    copied from ``state`` (names are the resolved layer paths, as in the torch reference)."""
    from tinygrad import Tensor

    from mgfl.models import layers as L

    tensors, trainable = {}, {}
    for name, value in state.items():
        trainable[name] = not name.endswith(("running_mean", "running_var"))
        data = np.ascontiguousarray(value, np.float32)
        tensors[name] = Tensor(data, device=device).is_param_(trainable[name]).realize()

    def get(path: str, attribute: str):
        return tensors.get(f"{path}.{attribute}")

    def convert(layer, in_shape, path) -> Callable:
        if isinstance(layer, L.Linear):
            weight, bias = get(path, "weight"), get(path, "bias")
            return lambda x: x.linear(weight.T, bias)
        if isinstance(layer, (L.Conv2d, L.DepthwiseConv2d)):
            weight, bias = get(path, "weight"), get(path, "bias")
            groups = in_shape[0] if isinstance(layer, L.DepthwiseConv2d) else 1
            return lambda x: x.conv2d(weight, bias, groups=groups, stride=layer.stride,
                                      padding=layer.padding)
        if isinstance(layer, L.BatchNorm):
            return _batch_norm(layer, *(get(path, a) for a in
                                        ("weight", "bias", "running_mean", "running_var")))
        if isinstance(layer, L.ReLU):
            return lambda x: x.relu()
        if isinstance(layer, L.ReLU6):
            return lambda x: x.relu6()
        if isinstance(layer, L.MaxPool2d):
            return lambda x: x.max_pool2d(layer.kernel_size, layer.stride, padding=layer.padding)
        if isinstance(layer, L.AvgPool2d):
            return lambda x: x.avg_pool2d(layer.kernel_size, layer.stride, padding=layer.padding,
                                          count_include_pad=True)
        if isinstance(layer, L.GlobalAvgPool):
            return lambda x: x.mean(axis=(2, 3))
        if isinstance(layer, L.Flatten):
            return lambda x: x.flatten(1)
        if isinstance(layer, L.Dropout):
            return lambda x: x.dropout(layer.p)
        if isinstance(layer, L.Residual):
            body = sequence(layer.body, in_shape, f"{path}.body")
            return lambda x: x + body(x)
        raise ValueError(f"No tinygrad equivalent for {type(layer).__name__} at {path}")

    def sequence(layer_list, shape, prefix) -> Callable:
        steps = []
        for index, layer in enumerate(layer_list):
            steps.append(convert(layer, shape, f"{prefix}.{index}"))
            shape = layer.output_shape(shape)

        def run(x):
            for step in steps:
                x = step(x)
            return x

        return run

    forward = sequence(model.layers, model.input_shape, "layers")
    parameters = {n: t for n, t in tensors.items() if trainable[n]}
    buffers = {n: t for n, t in tensors.items() if not trainable[n]}
    return TinygradModel(forward, parameters, buffers)


def _batch_norm(layer, weight, bias, running_mean, running_var) -> Callable:
    """Batch statistics (biased variance) in training, with the running statistics updated as
    PyTorch does (unbiased variance); the running statistics in evaluation."""
    from tinygrad.helpers import TRAINING

    def run(x):
        axes = tuple(a for a in range(x.ndim) if a != 1)
        shape = (1, -1, *([1] * (x.ndim - 2)))
        if not TRAINING:
            return x.batchnorm(weight, bias, running_mean, (running_var + layer.eps).rsqrt())
        mean = x.mean(axis=axes)
        centred = x - mean.detach().reshape(shape)
        var = (centred * centred).mean(axis=axes)
        count = x.numel() // x.shape[1]
        m = layer.momentum
        running_mean.assign((1 - m) * running_mean + m * mean.detach())
        running_var.assign((1 - m) * running_var + m * count / (count - 1) * var.detach())
        return x.batchnorm(weight, bias, mean, (var + layer.eps).rsqrt())

    return run


# -- the training step -----------------------------------------------------------------------


def jitted_train_step(net: TinygradModel, lr: float, momentum: float) -> Callable:
    """``step(x, y) -> loss``: softmax cross-entropy (mean over the batch), backward and an SGD
    update with momentum (PyTorch's rule), BatchNorm statistics updated, all realized."""
    from tinygrad import Context, Tensor, TinyJit
    from tinygrad.nn.optim import SGD

    optimizer = SGD(list(net.parameters.values()), lr=lr, momentum=momentum)
    buffers = list(net.buffers.values())

    @TinyJit
    def step(x, y):
        with Context(TRAINING=1):
            optimizer.zero_grad()
            loss = net(x).sparse_categorical_crossentropy(y).backward()
            Tensor.realize(loss, *optimizer.schedule_step(), *buffers)
        return loss

    return step


@dataclass
class TinygradTiming:
    """One model's tinygrad measurement: median step seconds, the first step's loss, the time
    the warm-up (compilation and jit capture) took, and the device it ran on."""

    step_s: float
    first_loss: float
    warmup_s: float
    device: str


def tinygrad_step_seconds(model, state: dict, x: np.ndarray, y: np.ndarray, repeats: int,
                          lr: float, momentum: float, warmup: int = 3) -> TinygradTiming:
    """Median wall-clock seconds of a jitted tinygrad training step on the ``CL`` device (chosen
    with ``use_opencl_device`` beforehand), each step realized and the queue finished."""
    from tinygrad import Device, Tensor

    net = build_tinygrad_model(model, state)
    step = jitted_train_step(net, lr, momentum)
    tx = Tensor(x, device=TINYGRAD_DEVICE).realize()
    ty = Tensor(y.astype(np.int32), device=TINYGRAD_DEVICE).realize()
    device = Device[TINYGRAD_DEVICE]

    def one():
        loss = step(tx, ty)
        device.synchronize()
        return loss

    start = time.perf_counter()
    first_loss = float(one().item())
    for _ in range(warmup - 1):
        one()
    warmup_s = time.perf_counter() - start
    seconds = median_wall_seconds(one, repeats, warmup=0)
    return TinygradTiming(seconds, first_loss, warmup_s,
                          f"{device.device_name} ({device.driver_version})")


# -- measured in a child process under a time budget -----------------------------------------


class TinygradBudgetExceeded(RuntimeError):
    """tinygrad did not finish (compile, warm up and time) within its budget."""


class TinygradFailed(RuntimeError):
    """The child process measuring tinygrad ended without a result."""


def measure_in_child(device_info, model, state: dict, x: np.ndarray, y: np.ndarray,
                     repeats: int, lr: float, momentum: float,
                     budget_s: float) -> TinygradTiming:
    """``tinygrad_step_seconds`` in a child process on the device mgfl opened (``device_info``,
    a DeviceInfo); the child is killed when ``budget_s`` runs out (TinygradBudgetExceeded)."""
    with tempfile.TemporaryDirectory(prefix="mgfl-tinygrad-") as folder:
        request, result = Path(folder) / "request.pkl", Path(folder) / "result.pkl"
        request.write_bytes(pickle.dumps({
            "device_index": device_info.index, "device_key": device_info.cache_key,
            "model": model, "state": state, "x": x, "y": y,
            "repeats": repeats, "lr": lr, "momentum": momentum,
        }))
        command = [sys.executable, "-m", "mgfl.bench.tinygrad_reference", str(request),
                   str(result)]
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=budget_s)
        except subprocess.TimeoutExpired as err:
            raise TinygradBudgetExceeded(
                f"tinygrad took more than {budget_s:.0f} s (compiling and warming up)") from err
        if not result.exists():
            tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
            raise TinygradFailed(f"tinygrad ended with status {done.returncode}: "
                                 + " | ".join(tail))
        outcome = pickle.loads(result.read_bytes())
    if "error" in outcome:
        raise TinygradFailed(outcome["error"])
    return TinygradTiming(**outcome)


def _child(request_path: str, result_path: str) -> None:
    from client_runtime.device import Device as MgflDevice
    from client_runtime.device import list_devices

    request = pickle.loads(Path(request_path).read_bytes())
    try:
        info = list_devices()[request["device_index"]]
        if info.cache_key != request["device_key"]:
            raise RuntimeError(f"device {info.index} is {info.cache_key} in the child process")
        description = use_opencl_device(MgflDevice(info).cl_device)
        timing = tinygrad_step_seconds(request["model"], request["state"], request["x"],
                                       request["y"], request["repeats"], request["lr"],
                                       request["momentum"])
        timing.device = description
        outcome = asdict(timing)
    except Exception as err:  # reported to the parent, which notes it beside the table
        outcome = {"error": f"{type(err).__name__}: {err}"}
    Path(result_path).write_bytes(pickle.dumps(outcome))


if __name__ == "__main__":
    _child(sys.argv[1], sys.argv[2])
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # no interpreter teardown: NVIDIA's OpenCL crashes releasing buffers there
